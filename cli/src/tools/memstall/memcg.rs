//! Memory cgroups as memstall reports them: named from the id the kernel read at the event
//! (resolved as soon as the id is announced, so a cgroup removed right after its processes
//! exited is still named), with their limit counters (v1 `memory.failcnt`, v2 `memory.events`)
//! over the window, and the OOM kills of the window.

use std::collections::{BTreeMap, HashMap};

use crate::report::schema::{Direction::*, Field, Rows};
use probes_common::memstall::{MsCgroup, MsOom, CG_LEVELS};
use serde::Serialize;

use crate::{
    host::cgroup::{IdResolver, Layout, MemoryCounters},
    report::{
        rows::Column,
        sanitize::{self, name_fields},
    },
};

/// What memstall says on kernels without `MADV_COLLAPSE`.
pub const NO_MADV_COLLAPSE: &str = "no MADV_COLLAPSE (6.1+) on this kernel: madvise(MADV_COLLAPSE) fails with EINVAL before any work, so such calls are neither timed nor reported as collapse stalls";

/// Cgroup names and counters for a run.
pub struct Cgroups {
    layout: Layout,
    resolver: IdResolver,
    /// No kernel-read ids (v1 host without BTF offsets): paths come from /proc.
    from_proc: bool,
    /// Counters at the end of the previous window (or when first seen), by path.
    prev: HashMap<Vec<u8>, MemoryCounters>,
    /// Paths the kernel copied, by id: names cgroups removed before their id was resolved.
    kernel_paths: HashMap<u64, Vec<u8>>,
    /// The memory cgroups' limit counters when the run began (walked in the background so
    /// start-up does not wait), so a cgroup's growth counts its events before memstall first
    /// saw it (a kill before its first reclaim was announced); one created since has counted
    /// everything during the run.
    at_start: Option<std::thread::JoinHandle<BTreeMap<String, MemoryCounters>>>,
    start: Option<BTreeMap<String, MemoryCounters>>,
}

/// Beyond this many cgroups the walk stops, and the start set is not trusted.
const WALK_CAP: usize = 4096;

/// The baseline of a cgroup first seen with counters `first`: its limit counters (v1
/// `failcnt`, `oom_kill`, v2 `max`) as they were when the run began (`at_start`), zeros for a
/// cgroup created during the run (`start_known` and no `at_start`), else `first`.
pub fn baseline(
    first: &MemoryCounters,
    at_start: Option<&MemoryCounters>,
    start_known: bool,
) -> MemoryCounters {
    let mut b = first.clone();
    let (hit, kills) = match at_start {
        Some(s) => (s.hit_limit(), s.oom_kills()),
        None if start_known => (0, 0),
        None => return b,
    };
    if let Some(f) = b.failcnt.as_mut() {
        *f = hit;
    } else if let Some(m) = b.events.get_mut("max") {
        *m = hit;
    }
    if let Some(k) = b.events.get_mut("oom_kill") {
        *k = kills;
    }
    if at_start.is_none() {
        b.events.values_mut().for_each(|v| *v = 0);
    }
    b
}

/// The path the kernel copied (as `/proc/<pid>/cgroup` shows it, `/` for the root, `/…` first
/// when it has more levels than were copied); `None` when it copied nothing.
pub fn kernel_path(c: &MsCgroup) -> Option<Vec<u8>> {
    if c.id == 0 {
        return None;
    }
    let depth = (c.depth as usize).min(CG_LEVELS);
    let mut p = Vec::new();
    if c.truncated != 0 {
        p.extend_from_slice("/…".as_bytes());
    }
    for n in c.names[..depth].iter().rev() {
        p.push(b'/');
        p.extend_from_slice(sanitize::comm_bytes(n));
    }
    if p.is_empty() {
        p.push(b'/');
    }
    Some(p)
}

impl Cgroups {
    pub fn new(from_proc: bool) -> Cgroups {
        let layout = Layout::detect();
        let walk = layout.clone();
        Cgroups {
            resolver: IdResolver::at(layout.memory_root().map(Into::into)),
            layout,
            from_proc,
            prev: HashMap::new(),
            kernel_paths: HashMap::new(),
            at_start: std::thread::Builder::new()
                .name("memcg-walk".into())
                .spawn(move || crate::host::memcg::snapshot(&walk))
                .ok(),
            start: None,
        }
    }

    /// `v1`, `v2` or `none`: which hierarchy governs memory here.
    pub fn hierarchy(&self) -> &'static str {
        if self.layout.v1_memory.is_some() {
            "v1"
        } else if self.layout.v2_root.is_some() {
            "v2"
        } else {
            "none"
        }
    }

    pub fn reads_proc(&self) -> bool {
        self.from_proc
    }

    /// A cgroup the kernel just announced: name it by id (its copied path is checked against
    /// the id first, which spares a walk of the hierarchy) and take its counters now, while it
    /// exists.
    pub fn learn(&mut self, c: &MsCgroup) {
        if self.from_proc || c.id == 0 || self.resolver.cached(c.id).is_some() {
            return;
        }
        let copied = kernel_path(c);
        if let Some(p) = &copied {
            self.kernel_paths.insert(c.id, p.clone());
            let root = self.layout.memory_root().map(|r| r.to_path_buf());
            if let Some(root) = root {
                if self.resolver.verify(&root, c.id, p) {
                    self.first_seen(p);
                    return;
                }
            }
        }
        if let Some(p) = self.resolver.path(c.id) {
            self.first_seen(&p);
        }
    }

    /// Takes the counters of a cgroup seen for the first time.
    pub fn first_seen(&mut self, path: &[u8]) {
        if self.prev.contains_key(path) {
            return;
        }
        if let Some(c) = self.read(path) {
            if let Some(h) = self.at_start.take() {
                self.start = h.join().ok().filter(|s| s.len() < WALK_CAP);
            }
            let at = self
                .start
                .as_ref()
                .and_then(|s| s.get(String::from_utf8_lossy(path).as_ref()));
            let base = baseline(&c, at, self.start.is_some());
            self.prev.insert(path.to_vec(), base);
        }
    }

    fn read(&self, path: &[u8]) -> Option<MemoryCounters> {
        MemoryCounters::read(self.layout.memory_root()?, path)
    }

    /// The path of a kernel-read id: resolved by id, else (a cgroup removed before it could be
    /// resolved) the path the kernel copied at the event; `None` for an unknown id.
    pub fn path(&mut self, id: u64) -> Option<Vec<u8>> {
        if self.from_proc || id == 0 {
            return None;
        }
        self.resolver
            .path(id)
            .or_else(|| self.kernel_paths.get(&id).cloned())
    }

    /// The counters of `path` now and their growth since the previous window's end (or since
    /// first seen in this run); the window's values become the next baseline.
    pub fn window_counters(&mut self, path: &[u8]) -> Option<(MemoryCounters, MemoryCounters)> {
        let Some(now) = self.read(path) else {
            // Removed since: what was read when it was first seen, growth unknown.
            return self
                .prev
                .get(path)
                .map(|b| (b.clone(), MemoryCounters::default()));
        };
        let delta = match self.prev.get(path) {
            Some(b) => now.since(b),
            None => now.since(&now),
        };
        self.prev.insert(path.to_vec(), now.clone());
        Some((now, delta))
    }
}

/// The text of a cgroup cell: its path, `[removed] id N` when the kernel's id could no longer
/// be named, `?` when unknown.
pub fn cgroup_text(path: Option<&[u8]>, id: u64) -> String {
    match path {
        Some(p) => sanitize::text(p),
        None if id > 1 => format!("[removed] id {id}"),
        None => "?".into(),
    }
}

/// One memory cgroup involved in the window (memcg reclaim or OOM kills in it).
#[derive(Serialize)]
pub struct CgroupRow {
    pub cgroup: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup_bytes: Option<Vec<u8>>,
    /// v1 `memory.failcnt`, cumulative, and its growth over the window (since first seen).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failcnt: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failcnt_delta: Option<u64>,
    /// v2 `memory.events` (and v1 `memory.oom_control`) counters, cumulative and their growth.
    pub events: BTreeMap<String, u64>,
    pub events_delta: BTreeMap<String, u64>,
    /// Processes that stalled in memcg reclaim in it.
    pub reclaiming: usize,
    /// OOM kills traced in it.
    pub oom_kills: usize,
    #[serde(skip)]
    pub path: Vec<u8>,
}

impl crate::report::rows::Row for CgroupRow {}

const MEMSTALL_CGROUP: &[Field] = &[
    Field::count("failcnt", LowerIsBetter),
    Field::count("failcnt_delta", LowerIsBetter),
    Field::count("reclaiming", LowerIsBetter),
    Field::count("oom_kills", LowerIsBetter),
];

/// Memory cgroups that reclaimed or hit their limit.
pub const CGROUP_ROWS: Rows = Rows {
    kind: "cgroup",
    labels: &[],
    fields: &[MEMSTALL_CGROUP],
    dists: &[],
};

pub const CGROUP_COLUMNS: &[Column<CgroupRow>] = &[
    Column::left("CGROUP", |r, _| sanitize::text(&r.path)),
    Column::right("FAILCNT", |r, _| counter(r.failcnt, r.failcnt_delta)),
    Column::right("MAX", |r, _| event(r, "max")),
    Column::right("OOM_KILL", |r, _| event(r, "oom_kill")),
    Column::right("RECLAIMING", |r, _| r.reclaiming.to_string()),
    Column::right("OOM_TRACED", |r, _| r.oom_kills.to_string()),
];

fn counter(total: Option<u64>, delta: Option<u64>) -> String {
    match (total, delta) {
        (Some(t), Some(d)) => format!("{t} (+{d})"),
        (Some(t), None) => t.to_string(),
        _ => "-".into(),
    }
}

fn event(r: &CgroupRow, k: &str) -> String {
    counter(r.events.get(k).copied(), r.events_delta.get(k).copied())
}

impl CgroupRow {
    pub fn new(
        path: &[u8],
        counters: Option<(MemoryCounters, MemoryCounters)>,
        reclaiming: usize,
        oom_kills: usize,
    ) -> CgroupRow {
        let (c, cb) = name_fields(path);
        let (now, delta) = counters.unwrap_or_default();
        CgroupRow {
            cgroup: c,
            cgroup_bytes: cb,
            failcnt: now.failcnt,
            failcnt_delta: delta.failcnt,
            events: now.events,
            events_delta: delta.events,
            reclaiming,
            oom_kills,
            path: path.to_vec(),
        }
    }
}

/// One OOM kill.
#[derive(Serialize)]
pub struct OomRow {
    pub pid: u32,
    pub comm: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comm_bytes: Option<Vec<u8>>,
    pub cgroup: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup_bytes: Option<Vec<u8>>,
    pub cgroup_id: u64,
    /// Whether `cgroup` is the victim's own (else the killing task's, on kernels whose
    /// tracepoint passes only the victim's pid).
    pub victim_cgroup: bool,
    pub killer_pid: u32,
    pub killer_comm: String,
    #[serde(skip)]
    pub comm_raw: Vec<u8>,
    #[serde(skip)]
    pub cgroup_raw: Option<Vec<u8>>,
    #[serde(skip)]
    pub killer_raw: Vec<u8>,
}

impl crate::report::rows::Row for OomRow {}

const MEMSTALL_OOM: &[Field] = &[
    Field::key("pid"),
    Field::key("cgroup_id"),
    Field::key("killer_pid"),
];

/// OOM kills.
pub const OOM_ROWS: Rows = Rows {
    kind: "oom_kill",
    labels: &[],
    fields: &[MEMSTALL_OOM],
    dists: &[],
};

pub const OOM_COLUMNS: &[Column<OomRow>] = &[
    Column::right("PID", |r, _| r.pid.to_string()),
    Column::left("COMM", |r, _| sanitize::text(&r.comm_raw)),
    Column::left("CGROUP", |r, _| {
        cgroup_text(r.cgroup_raw.as_deref(), r.cgroup_id)
    }),
    Column::left("KILLED_WHILE", |r, _| {
        format!(
            "{} (pid {}) allocated",
            sanitize::text(&r.killer_raw),
            r.killer_pid
        )
    }),
];

impl OomRow {
    /// `comm`: the victim's name (from the event, else learnt while it lived).
    pub fn new(e: &MsOom, comm: Vec<u8>, cgroup: Option<Vec<u8>>) -> OomRow {
        let (c, cb) = name_fields(&comm);
        let (g, gb) = match &cgroup {
            Some(p) => {
                let (g, gb) = name_fields(p);
                (Some(g), gb)
            }
            None => (None, None),
        };
        let killer = sanitize::comm_bytes(&e.killer_comm).to_vec();
        OomRow {
            pid: e.victim_pid,
            comm: c,
            comm_bytes: cb,
            cgroup: g,
            cgroup_bytes: gb,
            cgroup_id: e.cgroup.id,
            victim_cgroup: e.victim_task != 0,
            killer_pid: e.killer_pid,
            killer_comm: String::from_utf8_lossy(&killer).into_owned(),
            comm_raw: comm,
            cgroup_raw: cgroup,
            killer_raw: killer,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_from_kernel_names() {
        let mut c = MsCgroup::ZERO;
        assert_eq!(kernel_path(&c), None);
        c.id = 1;
        assert_eq!(kernel_path(&c).unwrap(), b"/");
        c.id = 77;
        c.depth = 2;
        c.names[0][..4].copy_from_slice(b"tkrw");
        c.names[1][..4].copy_from_slice(b"a:b\xff");
        assert_eq!(kernel_path(&c).unwrap(), b"/a:b\xff/tkrw");
        c.truncated = 1;
        let mut want = "/…".as_bytes().to_vec();
        want.extend_from_slice(b"/a:b\xff/tkrw");
        assert_eq!(kernel_path(&c).unwrap(), want);
    }

    #[test]
    fn cgroup_cells() {
        assert_eq!(cgroup_text(Some(b"/tkrw"), 9), "/tkrw");
        assert_eq!(cgroup_text(None, 4242), "[removed] id 4242");
        assert_eq!(cgroup_text(None, 0), "?");
        let mut now = MemoryCounters {
            failcnt: Some(17),
            ..Default::default()
        };
        now.events.insert("oom_kill".into(), 3);
        let mut d = MemoryCounters {
            failcnt: Some(5),
            ..Default::default()
        };
        d.events.insert("oom_kill".into(), 3);
        let r = CgroupRow::new(b"/tkrw", Some((now, d)), 1, 3);
        let ctx = crate::report::rows::Ctx { secs: 1.0 };
        let cells: Vec<String> = CGROUP_COLUMNS.iter().map(|c| (c.cell)(&r, &ctx)).collect();
        assert_eq!(cells, ["/tkrw", "17 (+5)", "-", "3 (+3)", "1", "3"]);
        let j = serde_json::to_value(&r).unwrap();
        assert_eq!(j["failcnt_delta"], 5);
        assert_eq!(j["events_delta"]["oom_kill"], 3);
    }

    #[test]
    fn growth_counts_from_the_start_of_the_run() {
        let mut first = MemoryCounters {
            failcnt: Some(200),
            ..Default::default()
        };
        first.events.insert("oom_kill".into(), 1);
        first.events.insert("under_oom".into(), 0);
        let now = MemoryCounters {
            failcnt: Some(220),
            events: [("oom_kill".to_string(), 3), ("under_oom".to_string(), 0)].into(),
            ..Default::default()
        };
        // Older than the run: counted from its counters at the start, not when first seen.
        let s = MemoryCounters {
            failcnt: Some(20),
            ..Default::default()
        };
        let d = now.since(&baseline(&first, Some(&s), true));
        assert_eq!((d.failcnt, d.get("oom_kill")), (Some(200), Some(3)));
        // Created during the run: all of it.
        let d = now.since(&baseline(&first, None, true));
        assert_eq!((d.failcnt, d.get("oom_kill")), (Some(220), Some(3)));
        // Start unknown: since first seen.
        let d = now.since(&baseline(&first, None, false));
        assert_eq!((d.failcnt, d.get("oom_kill")), (Some(20), Some(2)));
        // v2: `max` is the limit counter.
        let v2 = MemoryCounters {
            failcnt: None,
            events: [("max".to_string(), 9), ("oom_kill".to_string(), 1)].into(),
            ..Default::default()
        };
        let s = MemoryCounters {
            events: [("max".to_string(), 4), ("oom_kill".to_string(), 1)].into(),
            ..Default::default()
        };
        let d = v2.since(&baseline(&v2, Some(&s), true));
        assert_eq!((d.get("max"), d.get("oom_kill")), (Some(5), Some(0)));
    }
}
