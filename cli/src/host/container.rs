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
mod tests {
    use super::*;

    const PODMAN_ID: &str = "3f1b2c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f809";
    const DOCKER_ID: &str = "aa11bb22cc33dd44ee55ff6600778899aabbccddeeff00112233445566778899";
    const CRI_ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const CRIO_ID: &str = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";
    const UID: &str = "6b3f0e6a-1c2d-4e5f-8a9b-0c1d2e3f4a5b";
    const UID2: &str = "11111111-2222-3333-4444-555555555555";

    fn m(path: &str) -> Option<(Runtime, String, Option<String>)> {
        classify(path).map(|m| (m.runtime, m.id, m.pod_uid))
    }

    #[test]
    fn path_patterns() {
        let p = |r, id: &str| Some((r, id.to_string(), None));
        // podman: v1 cgroupfs (this host), v2 systemd (root and rootless), in a pod.
        assert_eq!(
            m(&format!("/libpod_parent/libpod-{PODMAN_ID}")),
            p(Runtime::Podman, PODMAN_ID)
        );
        assert_eq!(
            m(&format!("/machine.slice/libpod-{PODMAN_ID}.scope")),
            p(Runtime::Podman, PODMAN_ID)
        );
        assert_eq!(
            m(&format!(
                "/machine.slice/libpod-{PODMAN_ID}.scope/container"
            )),
            p(Runtime::Podman, PODMAN_ID)
        );
        assert_eq!(
            m(&format!(
                "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{PODMAN_ID}.scope"
            )),
            p(Runtime::Podman, PODMAN_ID)
        );
        // conmon is not in the container.
        assert_eq!(
            m(&format!("/machine.slice/libpod-conmon-{PODMAN_ID}.scope")),
            None
        );
        // docker: cgroupfs and systemd drivers.
        assert_eq!(
            m(&format!("/docker/{DOCKER_ID}")),
            p(Runtime::Docker, DOCKER_ID)
        );
        assert_eq!(
            m(&format!("/system.slice/docker-{DOCKER_ID}.scope")),
            p(Runtime::Docker, DOCKER_ID)
        );
        // Kubernetes: cgroupfs (v1), systemd with containerd and CRI-O (v2).
        let k = |r, id: &str, uid: &str| Some((r, id.to_string(), Some(uid.to_string())));
        assert_eq!(
            m(&format!("/kubepods/burstable/pod{UID}/{CRI_ID}")),
            k(Runtime::Cri, CRI_ID, UID)
        );
        let u = UID.replace('-', "_");
        assert_eq!(
            m(&format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{CRI_ID}.scope"
            )),
            k(Runtime::Containerd, CRI_ID, UID)
        );
        assert_eq!(
            m(&format!(
                "/kubepods.slice/kubepods-pod{u}.slice/crio-{CRIO_ID}.scope"
            )),
            k(Runtime::CriO, CRIO_ID, UID)
        );
        // systemd units; the root, sessions and unknown layouts are the host.
        let s = |u: &str| Some((Runtime::Systemd, u.to_string(), None));
        assert_eq!(
            m("/system.slice/postgresql.service"),
            s("postgresql.service")
        );
        assert_eq!(m("/batch.slice"), s("batch.slice"));
        assert_eq!(m("/system.slice/run-r3c1f.scope"), s("run-r3c1f.scope"));
        assert_eq!(
            m("/user.slice/user-1000.slice/user@1000.service/app.slice/syncthing.service"),
            s("syncthing.service")
        );
        // The root, systemd's own slices, sessions, user managers, init and conmon: the host.
        for host in [
            "/",
            "",
            "/system.slice",
            "/user.slice",
            "/user.slice/user-1000.slice",
            "/user.slice/user-1000.slice/session-3.scope",
            "/user.slice/user-1000.slice/user@1000.service",
            "/user.slice/user-1000.slice/user@1000.service/app.slice",
            "/user.slice/user-1000.slice/user@1000.service/init.scope",
            "/init.scope",
            "/kubepods.slice/kubepods-burstable.slice",
        ] {
            assert_eq!(m(host), None, "{host}");
        }
        // Any other layout falls back to the path: the cgroup is the container.
        let g = |p: &str| Some((Runtime::Cgroup, p.to_string(), None));
        assert_eq!(m("/tk-unknown/app1"), g("/tk-unknown/app1"));
        assert_eq!(m("/tk-unknown/app1/"), g("/tk-unknown/app1"));
        assert_eq!(
            m("/process_api/8650c0330e01b5cecace5756ef9d93a6"),
            g("/process_api/8650c0330e01b5cecace5756ef9d93a6")
        );
        assert_eq!(m("/docker/not-an-id"), g("/docker/not-an-id"));
        assert_eq!(m("/slurm/uid_1000/job_42"), g("/slurm/uid_1000/job_42"));
    }

    #[test]
    fn picks_the_runtime_over_systemd_in_v1_lines() {
        let text = format!(
            "12:memory:/libpod_parent/libpod-{PODMAN_ID}\n1:name=systemd:/system.slice/foo.service\n0::/\n"
        );
        let (m, path) = pick(text.as_bytes()).unwrap();
        assert_eq!(m.runtime, Runtime::Podman);
        assert_eq!(path, format!("/libpod_parent/libpod-{PODMAN_ID}"));
        let (m, _) = pick(b"1:name=systemd:/system.slice/foo.service\n0::/\n").unwrap();
        assert_eq!(m.id, "foo.service");
        assert!(pick(b"4:memory:/\n0::/\n").is_none());
        assert!(pick(b"garbage").is_none());
        // This host's shape: a process in an unknown v1 memory cgroup, the rest at the root.
        let (m, path) =
            pick(b"9:name=systemd:/\n4:memory:/tk-unknown/app1\n1:cpu:/\n0::/\n").unwrap();
        assert_eq!(
            (m.runtime, m.id.as_str()),
            (Runtime::Cgroup, "/tk-unknown/app1")
        );
        assert_eq!(path, "/tk-unknown/app1");
        // A unit beats an unknown layout; among unknown layouts memory, then v2, then the first.
        let (m, _) =
            pick(b"9:name=systemd:/system.slice/foo.service\n4:memory:/tk/a\n0::/tk/b\n").unwrap();
        assert_eq!(m.id, "foo.service");
        let (m, _) = pick(b"3:cpu:/tk/c\n0::/tk/b\n4:memory:/tk/a\n").unwrap();
        assert_eq!(m.id, "/tk/a");
        let (m, _) = pick(b"3:cpu:/tk/c\n0::/tk/b\n").unwrap();
        assert_eq!(m.id, "/tk/b");
        let (m, _) = pick(b"3:cpu:/tk/c\n5:pids:/tk/d\n").unwrap();
        assert_eq!(m.id, "/tk/c");
        // Named and matched by its path; no id prefix match for a path.
        let c = fixture_root().resolve(&m, "/tk/c");
        assert_eq!((c.name.as_str(), c.label()), ("/tk/c", "/tk/c".to_string()));
        assert!(c.matches("/tk/c") && !c.matches("/tk/"));
    }

    /// doctor's census: this sandbox's shape (every command in its own memory cgroup under
    /// /process_api, tracekit in one of them), a podman container, a unit, a login session.
    #[test]
    fn census_says_what_was_recognised_and_what_is_the_host() {
        let own = b"4:memory:/process_api/aaa\n1:cpu:/\n0::/\n".as_slice();
        let podman = format!("12:memory:/libpod_parent/libpod-{PODMAN_ID}\n0::/\n");
        let procs: Vec<&[u8]> = vec![
            own,
            own,
            b"4:memory:/process_api/bbb\n0::/\n",
            b"4:memory:/\n1:name=systemd:/user.slice/user-0.slice/session-3.scope\n0::/\n",
            b"1:name=systemd:/system.slice/nginx.service\n0::/\n",
            b"0::/\n",
            podman.as_bytes(),
            podman.as_bytes(),
        ];
        let c = Census::of(own, procs);
        assert_eq!(c.processes, 8);
        assert_eq!(c.host_processes, 4);
        assert_eq!(c.own_cgroup_as_host.as_deref(), Some("/process_api/aaa"));
        assert_eq!(c.by_path, vec![("/process_api/bbb".to_string(), 1)]);
        assert_eq!(
            c.text(),
            "recognised podman 1 container (2 processes), systemd 1 unit (1 process); host 4 processes (the root, systemd's slices, login sessions; tracekit's own cgroup /process_api/aaa, of no runtime's layout); 1 cgroup(s) of no runtime's layout, each a container named by its path (1 process): /process_api/bbb (1)"
        );
        let bare = Census::of(b"0::/\n", [b"0::/\n".as_slice()]);
        assert_eq!(
            bare.text(),
            "recognised no container runtime's layout; host 1 process (the root, systemd's slices, login sessions)"
        );
    }

    #[test]
    fn names_from_state_files() {
        let root = fixture_root();
        let name = |path: String| {
            let m = classify(&path).unwrap();
            root.resolve(&m, &path)
        };
        let c = name(format!("/libpod_parent/libpod-{PODMAN_ID}"));
        assert_eq!((c.runtime, c.name.as_str()), (Runtime::Podman, "pg-main"));
        assert_eq!(c.label(), "pg-main");
        let s = crate::report::findings::Subject::process(812, "postgres").with_container(Some(&c));
        assert_eq!(s.text(), "postgres (pid 812) in container pg-main");
        let c = name(format!("/system.slice/docker-{DOCKER_ID}.scope"));
        assert_eq!((c.runtime, c.name.as_str()), (Runtime::Docker, "web"));
        let u = UID.replace('-', "_");
        let c = name(format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{CRI_ID}.scope"
        ));
        assert_eq!(
            (c.namespace.as_deref(), c.pod.as_deref(), c.name.as_str()),
            (Some("shop"), Some("web-7d9f"), "nginx")
        );
        assert_eq!(c.label(), "shop/web-7d9f/nginx");
        assert!(c.matches("nginx") && c.matches(&CRI_ID[..12]) && !c.matches("web"));
        // No log link: namespace and pod from /var/log/pods, the pod's only container.
        let c = name(format!("/kubepods/besteffort/pod{UID2}/{CRIO_ID}"));
        assert_eq!(c.label(), "batch/report-1/worker");
        // Nothing on disk: named by the path.
        let path = format!("/docker/{CRIO_ID}");
        let c = name(path.clone());
        assert_eq!((c.runtime, c.name), (Runtime::Docker, path));
        let c = name("/system.slice/postgresql.service".into());
        assert!(c.matches("postgresql.service") && !c.matches("post"));
    }

    #[test]
    fn caches_stay_bounded_as_processes_come_and_go() {
        let c = Some(Arc::new(Container {
            runtime: Runtime::Cgroup,
            id: "/tk/a".into(),
            name: "/tk/a".into(),
            pod: None,
            namespace: None,
        }));
        let mut cache = Cache::default();
        // 10,000 short-lived processes, each gone soon after it was seen; pids 1..=10 live on.
        let alive = |p: u32| p <= 10;
        for pid in 1..=10_000u32 {
            cache.remember_pid(pid, c.clone(), 64, alive);
            assert!(
                cache.by_pid.len() <= 64,
                "{} at pid {pid}",
                cache.by_pid.len()
            );
            cache.remember_path(format!("/tk/{pid}"), c.clone(), 64);
            assert!(cache.by_path.len() <= 64);
        }
        // The dead are forgotten first: the live ones are still known.
        for pid in 1..=10 {
            assert!(cache.by_pid.contains_key(&pid), "live pid {pid} kept");
        }
        assert!(cache.by_pid.contains_key(&10_000));
        // All alive and the cache full: it starts over rather than grow.
        let mut full = Cache::default();
        for pid in 1..=200u32 {
            full.remember_pid(pid, None, 64, |_| true);
            assert!(full.by_pid.len() <= 64);
        }
    }

    #[test]
    fn own_process_is_resolved_and_cached() {
        let me = std::process::id();
        let a = of_pid(me);
        assert_eq!(a, of_pid(me));
        assert_eq!(of_pid(0), None);
        let (pids, _) = pids_of("no-such-container-anywhere");
        assert!(pids.is_empty());
    }
}
