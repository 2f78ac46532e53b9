//! Which container a process runs in, from its cgroup path, named from what the runtime keeps
//! on disk (no daemon is asked):
//!
//! | runtime | cgroup paths (v1 cgroupfs, v2 systemd) | name from |
//! |---|---|---|
//! | podman | `/libpod_parent/libpod-<id>`, `…/libpod-<id>.scope` | `*-containers/containers.json` (`names`) |
//! | docker | `/docker/<id>`, `/system.slice/docker-<id>.scope` | `/var/lib/docker/containers/<id>/config.v2.json` (`Name`) |
//! | Kubernetes (containerd, CRI-O, docker) | `/kubepods/<qos>/pod<uid>/<id>`, `kubepods-…-pod<uid>.slice/cri-containerd-<id>.scope`, `crio-<id>.scope` | `/var/log/containers/<pod>_<ns>_<container>-<id>.log`, else `/var/log/pods/<ns>_<pod>_<uid>/<container>/` |
//! | systemd | `/system.slice/<unit>.service`, a process directly in a `.slice` | the unit |
//!
//! A container whose runtime keeps no name readable here is named by its cgroup path. A cgroup of
//! any other layout (a batch scheduler's, one made by hand) is its own container, runtime
//! `cgroup`, named and identified by its path. The host is the root, systemd's own slices
//! (`system.slice`, `user.slice`, `user-<uid>.slice`, `machine.slice`, `kubepods*`), login
//! sessions (`session-<n>.scope`), user managers (`user@<uid>.service` and below), `init.scope`
//! and a runtime's monitor (`libpod-conmon-<id>.scope`).
//! State files are read under the host's root as pid 1 sees it (`<proc>/1/root`), so a
//! tracekit that runs in a container with the host's /proc at `TRACEKIT_PROC` still finds them.
//! Results are cached per cgroup path (bounded), never looked up per event.

use std::{
    collections::HashMap,
    os::unix::ffi::OsStrExt,
    path::PathBuf,
    sync::{Arc, Mutex},
};

use serde::Serialize;

use super::{read_capped, LARGE_FILE, SMALL_FILE};

/// A container runtime (or systemd, whose services are the containers of a node without one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Runtime {
    Podman,
    Docker,
    Containerd,
    CriO,
    /// A Kubernetes pod's container whose runtime the path does not say (cgroupfs driver).
    Cri,
    Systemd,
    /// A cgroup of a layout no runtime above uses (a batch scheduler's, a hand-made one): the
    /// container is the cgroup, named and identified by its path.
    Cgroup,
}

impl Runtime {
    pub fn name(self) -> &'static str {
        match self {
            Runtime::Podman => "podman",
            Runtime::Docker => "docker",
            Runtime::Containerd => "containerd",
            Runtime::CriO => "cri-o",
            Runtime::Cri => "cri",
            Runtime::Systemd => "systemd",
            Runtime::Cgroup => "cgroup",
        }
    }
}

/// A container, as its cgroup path and the runtime's state files say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Container {
    pub runtime: Runtime,
    /// The runtime's container id (64 hex digits), or the unit for systemd.
    pub id: String,
    /// The name the runtime gave it (`pg-main`; the container's name in its pod for
    /// Kubernetes); the cgroup path when no state file names it.
    pub name: String,
    /// Kubernetes: the pod's name and namespace.
    pub pod: Option<String>,
    pub namespace: Option<String>,
}

impl Container {
    /// How a table names it: `pg-main`, `shop/web-7d9f/nginx` for a pod's container.
    pub fn label(&self) -> String {
        match (&self.namespace, &self.pod) {
            (Some(ns), Some(pod)) => format!("{ns}/{pod}/{}", self.name),
            (None, Some(pod)) => format!("{pod}/{}", self.name),
            _ => self.name.clone(),
        }
    }

    /// Whether `--container q` names this container: its name, label, id, or an id prefix of at
    /// least 4 characters (as `podman`/`docker` accept).
    pub fn matches(&self, q: &str) -> bool {
        q == self.name
            || q == self.label()
            || q == self.id
            || (q.len() >= 4
                && !matches!(self.runtime, Runtime::Systemd | Runtime::Cgroup)
                && self.id.starts_with(q))
    }
}

fn is_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `<prefix><id><suffix>` → id, when id is a container id.
fn id_between<'a>(c: &'a str, prefix: &str, suffix: &str) -> Option<&'a str> {
    let id = c.strip_prefix(prefix)?.strip_suffix(suffix)?;
    is_id(id).then_some(id)
}

/// What a cgroup path alone says: runtime, id and (Kubernetes) the pod's UID.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathMatch {
    pub runtime: Runtime,
    pub id: String,
    pub pod_uid: Option<String>,
}

/// Classifies cgroup `path` (as `/proc/<pid>/cgroup` shows it, v1 or v2): a runtime's
/// container, a systemd unit, else (an unknown layout) the cgroup itself as
/// [`Runtime::Cgroup`]. `None`: the host (the root, systemd's own slices, login sessions and
/// user managers, init.scope, a runtime's monitor such as conmon).
pub fn classify(path: &str) -> Option<PathMatch> {
    let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    let kube = comps.iter().any(|c| c.starts_with("kubepods"));
    let pod_uid = comps.iter().find_map(|c| pod_uid_of(c));
    // The innermost component that names a container wins (a container's own sub-cgroups, such
    // as systemd's `init.scope` inside one, stay with it).
    for (i, c) in comps.iter().enumerate().rev() {
        let parent = i.checked_sub(1).map(|p| comps[p]);
        let found = if let Some(id) =
            id_between(c, "libpod-", ".scope").or_else(|| id_between(c, "libpod-", ""))
        {
            Some((Runtime::Podman, id))
        } else if let Some(id) = id_between(c, "docker-", ".scope") {
            Some((Runtime::Docker, id))
        } else if let Some(id) = id_between(c, "cri-containerd-", ".scope") {
            Some((Runtime::Containerd, id))
        } else if let Some(id) = id_between(c, "crio-", ".scope") {
            Some((Runtime::CriO, id))
        } else if is_id(c) && parent == Some("docker") {
            Some((Runtime::Docker, *c))
        } else if is_id(c) && kube {
            Some((Runtime::Cri, *c))
        } else {
            None
        };
        if let Some((runtime, id)) = found {
            return Some(PathMatch {
                runtime,
                id: id.to_string(),
                pod_uid: pod_uid.clone(),
            });
        }
    }
    let last = *comps.last()?;
    if comps.iter().any(|c| is_host_noise(c)) {
        return None;
    }
    // systemd: a service or scope (a user's too), or a process placed directly in a slice
    // (not the root slices).
    let unit = last.ends_with(".service") || last.ends_with(".scope") || last.ends_with(".slice");
    if unit && !is_root_slice(last) {
        return Some(PathMatch {
            runtime: Runtime::Systemd,
            id: last.to_string(),
            pod_uid: None,
        });
    }
    // Only systemd's own slices on the way: the host.
    if comps.iter().all(|c| is_root_slice(c)) {
        return None;
    }
    Some(PathMatch {
        runtime: Runtime::Cgroup,
        id: format!("/{}", comps.join("/")),
        pod_uid: None,
    })
}

/// Slices systemd and Kubernetes make for everything (no workload of their own).
fn is_root_slice(c: &str) -> bool {
    matches!(
        c,
        "system.slice" | "user.slice" | "machine.slice" | "app.slice"
    ) || (c.ends_with(".slice") && (c.starts_with("kubepods") || c.starts_with("user-")))
        || (c.starts_with("user@") && c.ends_with(".service"))
}

/// Components that make a cgroup the host's own: a login session, a user's service manager
/// itself, systemd's `init.scope`, a runtime's monitor (`libpod-conmon-<id>.scope`). The
/// units a user's manager runs (`user@1000.service/app.slice/foo.service`) are units.
fn is_host_noise(c: &str) -> bool {
    (c.starts_with("session-") && c.ends_with(".scope"))
        || c == "init.scope"
        || c.starts_with("libpod-conmon-")
}

/// The pod UID in a cgroup component: `pod<uid>` (cgroupfs) or `kubepods-<qos>-pod<uid>.slice`
/// (systemd, dashes as underscores).
fn pod_uid_of(c: &str) -> Option<String> {
    let s = c.strip_suffix(".slice").unwrap_or(c);
    let uid = &s[s.rfind("pod")? + 3..];
    let uid = uid.replace('_', "-");
    let ok = uid.len() == 36 && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
    ok.then_some(uid)
}

/// Where the runtimes keep their state: the host's root (`/`, or a test's fixture tree).
#[derive(Clone, Debug)]
pub struct StateRoot(pub PathBuf);

impl StateRoot {
    /// The host's root as pid 1 sees it (`<proc>/1/root`), else `/`.
    pub fn host() -> StateRoot {
        let p = super::proc_path("1/root");
        StateRoot(if std::fs::read_dir(&p).is_ok() {
            p
        } else {
            PathBuf::from("/")
        })
    }

    fn at(&self, rel: &str) -> PathBuf {
        self.0.join(rel)
    }

    /// The container `m` names, named from the runtime's state (else by `path`).
    pub fn resolve(&self, m: &PathMatch, path: &str) -> Container {
        let mut c = Container {
            runtime: m.runtime,
            id: m.id.clone(),
            name: path.to_string(),
            pod: None,
            namespace: None,
        };
        if matches!(m.runtime, Runtime::Systemd | Runtime::Cgroup) {
            c.name = m.id.clone();
            return c;
        }
        if let Some(uid) = &m.pod_uid {
            if let Some((ns, pod, name)) = self.kube_names(&m.id, uid) {
                c.namespace = Some(ns);
                c.pod = Some(pod);
                if let Some(n) = name {
                    c.name = n;
                }
                return c;
            }
        }
        let name = match m.runtime {
            Runtime::Podman => self.podman_name(&m.id),
            _ => self.docker_name(&m.id),
        };
        if let Some(n) = name {
            c.name = n;
        }
        c
    }

    /// podman (containers/storage): `<driver>-containers/containers.json`, an array of
    /// `{"id", "names": [..]}`, for root's storage.
    fn podman_name(&self, id: &str) -> Option<String> {
        #[derive(serde::Deserialize)]
        struct Entry {
            id: String,
            #[serde(default)]
            names: Vec<String>,
        }
        let dir = self.at("var/lib/containers/storage");
        for e in std::fs::read_dir(dir).ok()?.flatten() {
            if !e.file_name().as_bytes().ends_with(b"-containers") {
                continue;
            }
            let Ok(bytes) = read_capped(&e.path().join("containers.json"), LARGE_FILE) else {
                continue;
            };
            let entries: Vec<Entry> = serde_json::from_slice(&bytes).unwrap_or_default();
            if let Some(n) = entries
                .into_iter()
                .find(|x| x.id == id)
                .and_then(|x| x.names.into_iter().next())
            {
                return Some(n);
            }
        }
        None
    }

    /// docker: `Name` (`/web`) in `/var/lib/docker/containers/<id>/config.v2.json`.
    fn docker_name(&self, id: &str) -> Option<String> {
        let p = self.at(&format!("var/lib/docker/containers/{id}/config.v2.json"));
        let v: serde_json::Value =
            serde_json::from_slice(&read_capped(&p, SMALL_FILE).ok()?).ok()?;
        let n = v.get("Name")?.as_str()?.trim_start_matches('/');
        (!n.is_empty()).then(|| n.to_string())
    }

    /// Kubernetes: (namespace, pod, container) from the kubelet's log links
    /// `/var/log/containers/<pod>_<ns>_<container>-<id>.log`, else namespace and pod from
    /// `/var/log/pods/<ns>_<pod>_<uid>/` (and the container when the pod has only one).
    fn kube_names(&self, id: &str, uid: &str) -> Option<(String, String, Option<String>)> {
        let suffix = format!("-{id}.log");
        if let Ok(rd) = std::fs::read_dir(self.at("var/log/containers")) {
            for e in rd.flatten() {
                let f = e.file_name();
                let Some(stem) = f.to_str().and_then(|f| f.strip_suffix(&suffix)) else {
                    continue;
                };
                let mut parts = stem.splitn(3, '_');
                if let (Some(pod), Some(ns), Some(c)) = (parts.next(), parts.next(), parts.next()) {
                    return Some((ns.into(), pod.into(), Some(c.into())));
                }
            }
        }
        let tail = format!("_{uid}");
        for e in std::fs::read_dir(self.at("var/log/pods")).ok()?.flatten() {
            let f = e.file_name();
            let Some((ns, pod)) = f
                .to_str()
                .and_then(|f| f.strip_suffix(&tail))
                .and_then(|s| s.split_once('_'))
            else {
                continue;
            };
            let dirs: Vec<String> = std::fs::read_dir(e.path())
                .map(|rd| {
                    rd.flatten()
                        .filter(|d| d.path().is_dir())
                        .filter_map(|d| d.file_name().to_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            let only = (dirs.len() == 1).then(|| dirs[0].clone());
            return Some((ns.into(), pod.into(), only));
        }
        None
    }
}

/// The container among `/proc/<pid>/cgroup` lines (`ID:controllers:path`): the innermost
/// container any hierarchy names (v1 controllers, v2 `0::`), a runtime's over a systemd unit's
/// over an unknown layout's; among unknown layouts, the memory controller's line, then v2's,
/// then the first.
pub fn pick(proc_cgroup: &[u8]) -> Option<(PathMatch, String)> {
    let score = |m: &PathMatch, ctl: &[u8]| -> u8 {
        match m.runtime {
            Runtime::Cgroup if ctl.split(|&b| b == b',').any(|c| c == b"memory") => 3,
            Runtime::Cgroup if ctl.is_empty() => 2,
            Runtime::Cgroup => 1,
            Runtime::Systemd => 4,
            _ => 5,
        }
    };
    let mut best: Option<(u8, PathMatch, String)> = None;
    for line in proc_cgroup.split(|&b| b == b'\n') {
        let mut parts = line.splitn(3, |&b| b == b':');
        let (Some(_), Some(ctl), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let Ok(path) = std::str::from_utf8(path) else {
            continue;
        };
        if let Some(m) = classify(path) {
            let r = score(&m, ctl);
            if best.as_ref().is_none_or(|(b, _, _)| r > *b) {
                best = Some((r, m, path.to_string()));
            }
        }
    }
    best.map(|(_, m, p)| (m, p))
}

/// tracekit's own cgroup, from its `/proc/self/cgroup`, when it is of no runtime's layout: such a
/// cgroup holds the host's processes (a sandbox's or a login's), not a container.
fn own_unknown(own_proc_cgroup: &[u8]) -> Option<String> {
    pick(own_proc_cgroup)
        .filter(|(m, _)| m.runtime == Runtime::Cgroup)
        .map(|(_, path)| path)
}

/// [`pick`], with tracekit's own unknown-layout cgroup (`own`, see [`own_unknown`]) the host's.
fn pick_beside(proc_cgroup: &[u8], own: Option<&str>) -> Option<(PathMatch, String)> {
    pick(proc_cgroup)
        .filter(|(m, path)| !(m.runtime == Runtime::Cgroup && own == Some(path.as_str())))
}

/// Containers of one runtime on the node (`doctor`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RuntimeCount {
    pub runtime: Runtime,
    pub containers: u64,
    pub processes: u64,
}

/// Which container layouts this node's live processes are in, as every tool will attribute
/// them (`doctor`'s "containers" line): what was recognised, what counts as the host and why.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Census {
    pub processes: u64,
    /// Per runtime recognised, most processes first (`cgroup`: of no runtime's layout, named
    /// by path).
    pub runtimes: Vec<RuntimeCount>,
    /// In the root cgroup, systemd's own slices, a login session, a user manager, or
    /// tracekit's own cgroup of no runtime's layout.
    pub host_processes: u64,
    /// tracekit's own cgroup, when it is of no runtime's layout (so it counts as the host's).
    pub own_cgroup_as_host: Option<String>,
    /// The cgroups of no runtime's layout with the most processes (at most 32; the text shows
    /// 3), each a container named by its path.
    pub by_path: Vec<(String, u64)>,
}

impl Census {
    /// From tracekit's own `/proc/self/cgroup` and every process's.
    pub fn of<'a>(own: &[u8], procs: impl IntoIterator<Item = &'a [u8]>) -> Census {
        let own = own_unknown(own);
        let mut c = Census {
            own_cgroup_as_host: own.clone(),
            ..Census::default()
        };
        let mut ids: HashMap<Runtime, (std::collections::HashSet<String>, u64)> = HashMap::new();
        let mut paths: HashMap<String, u64> = HashMap::new();
        for text in procs {
            c.processes += 1;
            let Some((m, path)) = pick_beside(text, own.as_deref()) else {
                c.host_processes += 1;
                continue;
            };
            let e = ids.entry(m.runtime).or_default();
            e.0.insert(m.id);
            e.1 += 1;
            if m.runtime == Runtime::Cgroup {
                *paths.entry(path).or_default() += 1;
            }
        }
        c.runtimes = ids
            .into_iter()
            .map(|(runtime, (set, processes))| RuntimeCount {
                runtime,
                containers: set.len() as u64,
                processes,
            })
            .collect();
        c.runtimes
            .sort_by(|a, b| (b.processes, a.runtime.name()).cmp(&(a.processes, b.runtime.name())));
        let mut by_path: Vec<(String, u64)> = paths.into_iter().collect();
        by_path.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        by_path.truncate(32);
        c.by_path = by_path;
        c
    }

    /// Every live process under `<proc>`, read now.
    pub fn read() -> Census {
        let own = super::cgroup::proc_cgroup(std::process::id()).unwrap_or_default();
        let pids: Vec<u32> = std::fs::read_dir(super::proc_path(""))
            .map(|d| {
                d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        let texts: Vec<Vec<u8>> = pids
            .into_iter()
            .filter_map(super::cgroup::proc_cgroup)
            .collect();
        Census::of(&own, texts.iter().map(Vec::as_slice))
    }

    /// One line: `podman 2 containers (5 processes), systemd 14 units (40); host 63
    /// processes (the root, systemd's slices, login sessions; tracekit's own cgroup /x, of no
    /// runtime's layout); by path: /y (3)`.
    pub fn text(&self) -> String {
        let procs = |n: u64| format!("{n} process{}", if n == 1 { "" } else { "es" });
        if self.processes == 0 {
            return "no process's cgroup readable".into();
        }
        let mut parts: Vec<String> = self
            .runtimes
            .iter()
            .filter(|r| r.runtime != Runtime::Cgroup)
            .map(|r| {
                let what = if r.runtime == Runtime::Systemd {
                    "unit"
                } else {
                    "container"
                };
                format!(
                    "{} {} {what}{} ({})",
                    r.runtime.name(),
                    r.containers,
                    if r.containers == 1 { "" } else { "s" },
                    procs(r.processes)
                )
            })
            .collect();
        if parts.is_empty() {
            parts.push("no container runtime's layout".into());
        }
        let mut out = format!("recognised {}", parts.join(", "));
        let own = self.own_cgroup_as_host.as_ref().map_or(String::new(), |o| {
            format!(
                "; tracekit's own cgroup {}, of no runtime's layout",
                crate::report::sanitize::text(o.as_bytes())
            )
        });
        out.push_str(&format!(
            "; host {} (the root, systemd's slices, login sessions{own})",
            procs(self.host_processes)
        ));
        if let Some(r) = self.runtimes.iter().find(|r| r.runtime == Runtime::Cgroup) {
            let top: Vec<String> = self
                .by_path
                .iter()
                .take(3)
                .map(|(p, n)| format!("{} ({n})", crate::report::sanitize::text(p.as_bytes())))
                .collect();
            out.push_str(&format!(
                "; {} cgroup(s) of no runtime's layout, each a container named by its path ({}): {}{}",
                r.containers,
                procs(r.processes),
                top.join(", "),
                if r.containers as usize > top.len() { ", …" } else { "" }
            ));
        }
        out
    }
}

/// Cached answers: containers by cgroup path, and by pid for processes that have exited.
#[derive(Default)]
struct Cache {
    by_path: HashMap<String, Option<Arc<Container>>>,
    by_pid: HashMap<u32, Option<Arc<Container>>>,
    root: Option<StateRoot>,
    /// tracekit's own cgroup where its layout is unknown (`Some(None)`: none, or a runtime's).
    own: Option<Option<String>>,
}

/// Entries each cache keeps at most (a node rarely runs more containers; a churning one
/// re-reads a state file per container after a reset).
const CACHE_CAP: usize = 4096;

impl Cache {
    /// Remembers `pid`'s container. At `cap` entries, the pids that are gone are forgotten
    /// first (`alive` says which live), then everything if all still live: the cache stays
    /// bounded however many processes come and go.
    fn remember_pid(
        &mut self,
        pid: u32,
        c: Option<Arc<Container>>,
        cap: usize,
        alive: impl Fn(u32) -> bool,
    ) {
        if self.by_pid.len() >= cap && !self.by_pid.contains_key(&pid) {
            self.by_pid.retain(|p, _| alive(*p));
            // Keep room for a while: only a cache at most half full of live pids is kept.
            if self.by_pid.len() >= cap / 2 {
                self.by_pid.clear();
            }
        }
        self.by_pid.insert(pid, c);
    }

    /// Remembers the container of cgroup `path`, starting over at `cap` paths.
    fn remember_path(&mut self, path: String, c: Option<Arc<Container>>, cap: usize) {
        if self.by_path.len() >= cap && !self.by_path.contains_key(&path) {
            self.by_path.clear();
        }
        self.by_path.insert(path, c);
    }
}

static CACHE: Mutex<Option<Cache>> = Mutex::new(None);

/// The container process `pid` runs in (`None`: the host), read from `/proc/<pid>/cgroup` while
/// it lives and remembered after it exits.
pub fn of_pid(pid: u32) -> Option<Arc<Container>> {
    if pid == 0 {
        return None;
    }
    let text = super::cgroup::proc_cgroup(pid);
    let mut guard = CACHE.lock().unwrap_or_else(|e| e.into_inner());
    let cache = guard.get_or_insert_with(Cache::default);
    let Some(text) = text else {
        return cache.by_pid.get(&pid).cloned().flatten();
    };
    let own = cache
        .own
        .get_or_insert_with(|| {
            super::cgroup::proc_cgroup(std::process::id()).and_then(|t| own_unknown(&t))
        })
        .clone();
    let found = pick_beside(&text, own.as_deref()).and_then(|(m, path)| {
        if let Some(c) = cache.by_path.get(&path) {
            return c.clone();
        }
        let root = cache.root.get_or_insert_with(StateRoot::host);
        let c = Some(Arc::new(root.resolve(&m, &path)));
        cache.remember_path(path, c.clone(), CACHE_CAP);
        c
    });
    cache.remember_pid(pid, found.clone(), CACHE_CAP, |p| {
        super::proc_path(&p.to_string()).exists()
    });
    found
}

/// Every live process whose container [`Container::matches`] `q`, and the container.
pub fn pids_of(q: &str) -> (Vec<u32>, Option<Arc<Container>>) {
    let mut pids = Vec::new();
    let mut which = None;
    if let Ok(rd) = std::fs::read_dir(super::proc_path("")) {
        for e in rd.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(c) = of_pid(pid).filter(|c| c.matches(q)) {
                pids.push(pid);
                which.get_or_insert(c);
            }
        }
    }
    pids.sort_unstable();
    (pids, which)
}

/// The directory of fixture state files for tests (`cli/tests/fixtures/containers`).
#[cfg(test)]
fn fixture_root() -> StateRoot {
    StateRoot(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/containers"))
}

#[cfg(test)]
mod tests;
