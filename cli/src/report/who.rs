//! The process title beside the comm: every PostgreSQL process is "postgres" and every nginx
//! worker "nginx" by comm; their titles ("postgres: walwriter", "nginx: worker process") say
//! which is which. A row type flattens a [`Title`] into its JSON (`cmdline`, and
//! `cmdline_bytes` when not UTF-8) and shows [`Title::beside`] in its COMM column.
//!
//! [`Id`] is the whole identity of a row about a process: pid (tid with `--threads`), comm,
//! title and the container it runs in. Every row type that names a process flattens one, so the
//! JSON keys (`pid`, `tid`, `comm`, `comm_bytes`, `cmdline`, `container`, `container_id`,
//! `runtime`, `pod`, `namespace`) and the text cells (PID/TID, COMM, CONTAINER) are declared once.

use std::{collections::HashMap, sync::Arc};

use serde::Serialize;

use crate::{
    host::{container::Container, facts::FactsCache, proc},
    report::sanitize,
};

/// The numbers an [`Id`] (or an [`Owner`]) puts in a row: ids, never measures; every row
/// declaration that flattens one lists this group.
pub const ID_FIELDS: &[crate::report::schema::Field] = {
    use crate::report::schema::Field;
    &[
        Field::key("pid"),
        Field::key("tid"),
        Field::key("processes"),
    ]
};

/// Who a row is about (flatten it into the row: `#[serde(flatten)] pub who: Id`).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Id {
    /// The process (tgid); 0 for an `[other]` row.
    pub pid: u32,
    /// The thread, with `--threads`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tid: Option<u32>,
    pub comm: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comm_bytes: Option<Vec<u8>>,
    #[serde(flatten)]
    pub title: Title,
    #[serde(flatten)]
    pub container: InContainer,
    /// `--by container`: the processes (or threads) folded into this row.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub processes: Option<u32>,
    /// The comm as the kernel or /proc gave it (text cells escape it).
    #[serde(skip)]
    pub comm_raw: Vec<u8>,
}

impl Id {
    /// Row `id` (tid with `threads`, else the process) of process `tgid`, named `comm`, with its
    /// title and the container it runs in (looked up per cgroup, cached).
    pub fn new(id: u32, tgid: u32, threads: bool, comm: Vec<u8>, title: Title) -> Id {
        let (name, bytes) = sanitize::name_fields(&comm);
        Id {
            pid: if threads { tgid } else { id },
            tid: threads.then_some(id),
            comm: name,
            comm_bytes: bytes,
            title,
            container: InContainer::of(crate::host::container::of_pid(tgid)),
            processes: None,
            comm_raw: comm,
        }
    }

    /// A row that is no process (`[other]`, a container's total): a name only.
    pub fn named(comm: &[u8]) -> Id {
        Id::new(0, 0, false, comm.to_vec(), Title::default())
    }

    /// The id column's cell: the tid with `--threads`, else the pid; `-` for a row of many
    /// processes (`--by container`).
    pub fn id_text(&self) -> String {
        if self.processes.is_some() {
            return "-".to_string();
        }
        self.tid.unwrap_or(self.pid).to_string()
    }

    /// The COMM cell: the comm with the title beside it.
    pub fn comm_text(&self) -> String {
        self.title.beside(&self.comm_raw)
    }

    /// The subject of a finding about this row's process, naming its container.
    pub fn subject(&self) -> crate::report::findings::Subject {
        // The text form: escapes shown as `\x1b`, never sent to the terminal.
        let name = crate::report::sanitize::text(&self.comm_raw);
        crate::report::findings::Subject::process(self.pid, name)
            .with_title(&self.title)
            .with_container(self.container.get())
    }
}

/// A process a row names besides what the row is about (the process holding a socket), as
/// [`Id`]'s keys: `pid`, `comm` (`comm_bytes` when not UTF-8), the title and the container,
/// each omitted when unknown (no process holds the socket any more, or it exited).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Owner {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comm: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comm_bytes: Option<Vec<u8>>,
    #[serde(flatten)]
    pub title: Title,
    #[serde(flatten)]
    pub container: InContainer,
}

impl Owner {
    /// Process `pid` now: its comm, title and container while it lives, the pid alone once it
    /// is gone; nothing for `None`.
    pub fn of(pid: Option<u32>) -> Owner {
        let Some((pid, comm)) = pid.and_then(|p| Some((p, proc::comm(p)?))) else {
            return Owner {
                pid,
                ..Owner::default()
            };
        };
        let (comm, comm_bytes) = sanitize::name_fields(&comm);
        Owner {
            pid: Some(pid),
            comm: Some(comm),
            comm_bytes,
            title: Title::of(pid),
            container: InContainer::of(crate::host::container::of_pid(pid)),
        }
    }

    /// The COMM cell: the name with its title beside it, `-` when no process is known.
    pub fn comm_text(&self) -> String {
        self.comm
            .as_deref()
            .map_or("-".into(), |c| self.title.beside(c.as_bytes()))
    }

    /// The subject of a finding about this process (`None` without a pid).
    pub fn subject(&self) -> Option<crate::report::findings::Subject> {
        let pid = self.pid?;
        Some(
            crate::report::findings::Subject::process(pid, self.comm.clone().unwrap_or_default())
                .with_title(&self.title)
                .with_container(self.container.get()),
        )
    }
}

/// The name of the row that folds the processes outside any container (`--by container`).
pub const HOST_ROW: &str = "[host]";

/// `--by container`, once for every tool: each process maps to its container's
/// representative (the first of its processes seen in the window; one for the processes
/// outside any container), a tool aggregates its kernel keys under the representatives
/// (counters summed, histograms merged, so percentiles come from the merged histogram), and
/// [`Folding::relabel`] turns each representative's row into its container's row.
#[derive(Debug, Default)]
pub struct Folding {
    on: bool,
    reps: HashMap<String, u32>,
    members: HashMap<u32, std::collections::BTreeSet<u32>>,
}

impl Folding {
    pub fn new(on: bool) -> Folding {
        Folding {
            on,
            ..Folding::default()
        }
    }

    pub fn on(&self) -> bool {
        self.on
    }

    /// The key process `tgid` aggregates under: itself unless folding; 0 (`[other]`) stays.
    pub fn rep(&mut self, tgid: u32) -> u32 {
        if !self.on || tgid == 0 {
            return tgid;
        }
        let key = crate::host::container::of_pid(tgid)
            .map(|c| c.id.clone())
            .unwrap_or_default();
        let rep = *self.reps.entry(key).or_insert(tgid);
        self.members.entry(rep).or_default().insert(tgid);
        rep
    }

    /// Whether `tgid` is a representative: its row stands for its container.
    pub fn is_rep(&self, tgid: u32) -> bool {
        self.on && self.members.contains_key(&tgid)
    }

    /// Makes a representative's row identity its container's: the container's label (or
    /// `[host]`) as the name, no pid, and how many processes it folds.
    pub fn relabel(&self, who: &mut Id) {
        if !self.on {
            return;
        }
        let Some(m) = self.members.get(&who.pid) else {
            return;
        };
        let label = who
            .container
            .get()
            .map_or_else(|| HOST_ROW.to_string(), |c| c.label());
        who.pid = 0;
        who.tid = None;
        who.comm = label.clone();
        who.comm_bytes = None;
        who.comm_raw = label.into_bytes();
        who.title = Title::default();
        who.processes = Some(m.len() as u32);
    }

    /// Ends a window: the next one folds afresh.
    pub fn end_window(&mut self) {
        self.reps.clear();
        self.members.clear();
    }
}

/// The container a process runs in, as JSON keys (all omitted on the host).
#[derive(Clone, Debug, Default, Serialize)]
pub struct InContainer {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(skip)]
    found: Option<Arc<Container>>,
}

impl InContainer {
    /// The CONTAINER cell: `namespace/pod/name`, `pod/name` or the name, escaped for text;
    /// `None` on the host.
    pub fn cell(&self) -> Option<String> {
        let name = self.container.as_deref()?;
        let label = match (self.namespace.as_deref(), self.pod.as_deref()) {
            (Some(ns), Some(pod)) => format!("{ns}/{pod}/{name}"),
            (None, Some(pod)) => format!("{pod}/{name}"),
            _ => name.to_string(),
        };
        Some(sanitize::text(label.as_bytes()))
    }
}

impl InContainer {
    pub fn of(c: Option<Arc<Container>>) -> InContainer {
        match c {
            None => InContainer::default(),
            Some(c) => InContainer {
                container: Some(c.name.clone()),
                container_id: Some(c.id.clone()),
                runtime: Some(c.runtime.name()),
                pod: c.pod.clone(),
                namespace: c.namespace.clone(),
                found: Some(c),
            },
        }
    }

    /// The process's container, `None` on the host.
    pub fn get(&self) -> Option<&Container> {
        self.found.as_deref()
    }
}

pub use super::sanitize::{bracket, bracket_beside, TEXT_WIDTH};

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Title {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cmdline: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cmdline_bytes: Option<Vec<u8>>,
    #[serde(skip)]
    raw: Option<Vec<u8>>,
}

impl Title {
    /// The title of process `pid` now (empty for kernel threads and processes that are gone).
    pub fn of(pid: u32) -> Title {
        Title::from_bytes(proc::title(pid))
    }

    /// The title of `pid` now, else `learnt` (a title read while it lived, empty when none).
    pub fn of_or(pid: u32, learnt: &[u8]) -> Title {
        match proc::title(pid) {
            Some(raw) => Title::from_bytes(Some(raw)),
            None => Title::from_bytes((!learnt.is_empty()).then(|| learnt.to_vec())),
        }
    }

    pub fn from_bytes(raw: Option<Vec<u8>>) -> Title {
        let (cmdline, cmdline_bytes) = match raw.as_deref().map(sanitize::name_fields) {
            Some((s, b)) => (Some(s), b),
            None => (None, None),
        };
        Title {
            cmdline,
            cmdline_bytes,
            raw,
        }
    }

    /// `comm` for a text table, with the title in brackets when it says more than the comm
    /// does, cut to [`TEXT_WIDTH`] characters: `postgres [postgres: walwriter]`.
    pub fn beside(&self, comm: &[u8]) -> String {
        let name = sanitize::text(comm);
        match self.raw.as_deref() {
            Some(raw) if raw != comm => format!("{name}{}", bracket_beside(comm, raw)),
            _ => name,
        }
    }
}

impl Title {
    /// `pid`'s title as the run's facts cache knows it ([`FactsCache::title`]: fresh while the
    /// process lives, remembered after it exits).
    pub fn cached(facts: &mut FactsCache, pid: u32) -> Title {
        Title::from_bytes(facts.title(pid).map(<[u8]>::to_vec))
    }
}

/// What a row's identity adds to a finding's subject (here, not in `findings`, which knows
/// nothing of rows: findings sit below who).
impl crate::report::findings::Subject {
    /// Adds the process title, when it says more than the name does.
    pub fn with_title(mut self, t: &Title) -> Self {
        self.cmdline = t.cmdline.clone().filter(|c| Some(c) != self.name.as_ref());
        self
    }

    /// Names the container the subject runs in (its label: `pg-main`, `shop/web/nginx`), and
    /// for Kubernetes its pod and namespace.
    pub fn with_container(mut self, c: Option<&crate::host::container::Container>) -> Self {
        self.container = c.map(|c| c.label());
        self.pod = c.and_then(|c| c.pod.clone());
        self.namespace = c.and_then(|c| c.namespace.clone());
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beside_the_comm_and_in_json() {
        let t = Title::from_bytes(Some(b"postgres: walwriter".to_vec()));
        assert_eq!(t.beside(b"postgres"), "postgres [walwriter]");
        assert_eq!(
            serde_json::to_value(&t).unwrap(),
            serde_json::json!({"cmdline": "postgres: walwriter"})
        );
        let same = Title::from_bytes(Some(b"sleep".to_vec()));
        assert_eq!(same.beside(b"sleep"), "sleep");
        let none = Title::from_bytes(None);
        assert_eq!(none.beside(b"kworker/0:1"), "kworker/0:1");
        assert_eq!(serde_json::to_value(&none).unwrap(), serde_json::json!({}));
        let long = Title::from_bytes(Some(
            b"java -Xmx8g -cp /opt/app/lib/* com.example.Main".to_vec(),
        ));
        assert_eq!(
            long.beside(b"java"),
            "java [java -Xmx8g -cp /o…ib/* com.example.Main]"
        );
        // Escapes in a title never reach the terminal; JSON keeps the exact bytes.
        let evil = Title::from_bytes(Some(b"x\x1b[2J\xff".to_vec()));
        assert_eq!(evil.beside(b"x"), "x [x\\x1b[2J\\xff]");
        let v = serde_json::to_value(&evil).unwrap();
        assert_eq!(
            v["cmdline_bytes"],
            serde_json::json!([120, 27, 91, 50, 74, 255])
        );
    }

    #[test]
    fn ids_serialise_once_and_fold_per_container() {
        let id = Id::new(42, 42, false, b"postgres".to_vec(), Title::default());
        assert_eq!(
            (id.id_text(), id.comm_text()),
            ("42".to_string(), "postgres".to_string())
        );
        let v = serde_json::to_value(&id).unwrap();
        assert_eq!(v["pid"], 42);
        assert!(v.get("tid").is_none() && v.get("processes").is_none());
        let t = Id::new(43, 42, true, b"worker".to_vec(), Title::default());
        assert_eq!(
            (t.pid, t.tid, t.id_text()),
            (42, Some(43), "43".to_string())
        );
        // Off: every process is its own key and keeps its identity.
        let mut off = Folding::new(false);
        assert_eq!((off.rep(7), off.rep(8)), (7, 8));
        let mut same = id.clone();
        off.relabel(&mut same);
        assert_eq!(same.pid, 42);
        // On: processes outside any container share one key, relabelled `[host]`; `[other]`
        // (0) stays apart. This test runs on the host (or in one container): all fold in one.
        let me = std::process::id();
        let mut on = Folding::new(true);
        let rep = on.rep(me);
        assert_eq!(on.rep(me), rep);
        assert_eq!(on.rep(0), 0);
        assert!(on.is_rep(rep));
        let mut r = Id::new(rep, rep, false, b"x".to_vec(), Title::default());
        on.relabel(&mut r);
        assert_eq!(r.pid, 0);
        assert_eq!(r.processes, Some(1));
        assert_eq!(r.id_text(), "-");
        let label = r
            .container
            .get()
            .map_or(HOST_ROW.to_string(), |c| c.label());
        assert_eq!(r.comm, label);
        on.end_window();
        assert!(!on.is_rep(rep));
    }
}
