//! Cgroup paths for processes, on cgroup v2 and on v1 (or hybrid) hosts.
//!
//! A cgroup's id is its kernfs node id, the inode number of its directory in the hierarchy's
//! mount: `bpf_get_current_cgroup_id()` gives the task's id in the v2 (unified) hierarchy, and a
//! kernel program that reads `task->cgroups->subsys[memory_cgrp_id]->cgroup->kn->id` gets its
//! id in the v1 memory hierarchy. [`IdResolver`] turns either back into a path (while the
//! cgroup exists), so the cgroup of a process that is gone can still be named. On a v1 or
//! hybrid host the unified tree is usually empty (every v2 id is its root); where no kernel id
//! is at hand, [`memory_path_of`] reads `/proc/<pid>/cgroup` while the process lives.

use std::{
    collections::HashMap,
    os::unix::{ffi::OsStrExt, fs::MetadataExt},
    path::{Path, PathBuf},
};

/// Where the hierarchies are mounted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    /// Mount point of the v2 (unified) hierarchy, if mounted.
    pub v2_root: Option<PathBuf>,
    /// Mount point of the v1 hierarchy with the memory controller, if any.
    pub v1_memory: Option<PathBuf>,
}

impl Layout {
    /// The running system's layout, from `/proc/self/mountinfo`.
    pub fn detect() -> Layout {
        crate::host::read_text_capped(
            &crate::host::proc_path("self/mountinfo"),
            crate::host::LARGE_FILE,
        )
        .map(|s| Layout::from_mountinfo(&s))
        .unwrap_or_default()
    }

    pub fn from_mountinfo(info: &str) -> Layout {
        let mut l = Layout::default();
        for line in info.lines() {
            // `30 23 0:26 / /sys/fs/cgroup/memory rw,... shared:12 - cgroup cgroup rw,memory`
            let Some((pre, post)) = line.split_once(" - ") else {
                continue;
            };
            let mut post = post.split_whitespace();
            let fstype = post.next().unwrap_or("");
            let super_opts = post.nth(1).unwrap_or("");
            let Some(mp) = pre.split_whitespace().nth(4) else {
                continue;
            };
            match fstype {
                "cgroup2" if l.v2_root.is_none() => l.v2_root = Some(PathBuf::from(mp)),
                "cgroup" if super_opts.split(',').any(|o| o == "memory") => {
                    l.v1_memory = Some(PathBuf::from(mp))
                }
                _ => {}
            }
        }
        l
    }

    /// Memory is governed by the v2 hierarchy (no v1 memory controller mounted).
    pub fn memory_on_v2(&self) -> bool {
        self.v1_memory.is_none() && self.v2_root.is_some()
    }

    /// Where the memory controller's cgroups are: the v1 memory hierarchy when mounted, else
    /// the v2 root.
    pub fn memory_root(&self) -> Option<&Path> {
        self.v1_memory.as_deref().or(self.v2_root.as_deref())
    }
}

/// A memory cgroup's limit counters, as its files say: v1 `memory.failcnt` (times usage hit the
/// limit) and `memory.oom_control`'s `oom_kill`; v2 `memory.events` (`max`: times usage hit
/// `memory.max`, `high`, `oom`, `oom_kill`, `oom_group_kill`). Counters are cumulative since
/// the cgroup was created. With them, the limit and the usage now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryCounters {
    /// v1 `memory.failcnt`.
    pub failcnt: Option<u64>,
    /// v2 `memory.events` and v1 `memory.oom_control` lines, by name.
    pub events: std::collections::BTreeMap<String, u64>,
    /// The limit in bytes (v1 `memory.limit_in_bytes`, v2 `memory.max`); `None`: unlimited.
    pub limit_bytes: Option<u64>,
    /// Usage in bytes (v1 `memory.usage_in_bytes`, v2 `memory.current`).
    pub usage_bytes: Option<u64>,
}

impl MemoryCounters {
    /// Reads the counters of memory cgroup `path` (as `/proc/<pid>/cgroup` shows it) under
    /// `root`; `None` when the cgroup is gone or has none of the files.
    pub fn read(root: &Path, path: &[u8]) -> Option<MemoryCounters> {
        let rel = std::ffi::OsStr::from_bytes(path.strip_prefix(b"/").unwrap_or(path));
        MemoryCounters::read_dir(&root.join(rel))
    }

    /// Reads the counters in cgroup directory `dir`; `None` when it is gone or has no counter
    /// files.
    pub fn read_dir(dir: &Path) -> Option<MemoryCounters> {
        use crate::host::read_u64;
        let failcnt = read_u64(&dir.join("memory.failcnt"));
        let mut events = std::collections::BTreeMap::new();
        for f in ["memory.events", "memory.oom_control"] {
            if let Ok(t) = crate::host::read_text_capped(&dir.join(f), crate::host::SMALL_FILE) {
                events.extend(parse_flat_keyed(&t));
            }
        }
        let either =
            |v1: &str, v2: &str| read_u64(&dir.join(v1)).or_else(|| read_u64(&dir.join(v2)));
        (failcnt.is_some() || !events.is_empty()).then(|| MemoryCounters {
            failcnt,
            events,
            // v1 "unlimited" is a huge page-aligned number; v2 says `max` (which does not parse).
            limit_bytes: either("memory.limit_in_bytes", "memory.max")
                .filter(|&l| l < (1u64 << 62)),
            usage_bytes: either("memory.usage_in_bytes", "memory.current"),
        })
    }

    /// Counter `key` (`failcnt`, or an event name).
    pub fn get(&self, key: &str) -> Option<u64> {
        if key == "failcnt" {
            return self.failcnt;
        }
        self.events.get(key).copied()
    }

    /// Times usage hit the limit: v1 `failcnt`, else v2 `memory.events` `max`.
    pub fn hit_limit(&self) -> u64 {
        self.failcnt.or_else(|| self.get("max")).unwrap_or(0)
    }

    /// OOM kills inside the cgroup (`oom_kill` of v2 `memory.events` or v1 `memory.oom_control`,
    /// where the kernel has it).
    pub fn oom_kills(&self) -> u64 {
        self.get("oom_kill").unwrap_or(0)
    }

    /// `self - before`, per counter present in both (cumulative counters only grow; a
    /// recreated cgroup of the same path restarts them, which saturates at 0).
    pub fn since(&self, before: &MemoryCounters) -> MemoryCounters {
        MemoryCounters {
            failcnt: self
                .failcnt
                .zip(before.failcnt)
                .map(|(a, b)| a.saturating_sub(b)),
            events: self
                .events
                .iter()
                .filter_map(|(k, a)| {
                    before
                        .events
                        .get(k)
                        .map(|b| (k.clone(), a.saturating_sub(*b)))
                })
                .collect(),
            limit_bytes: self.limit_bytes,
            usage_bytes: self.usage_bytes,
        }
    }
}

/// `key value` lines (cgroup `memory.events`, `memory.stat`, `memory.oom_control`); lines that
/// do not parse are skipped.
pub fn parse_flat_keyed(text: &str) -> Vec<(String, u64)> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let (k, v) = (it.next()?, it.next()?);
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// The memory cgroup path in a `/proc/<pid>/cgroup` text (`ID:controllers:path` lines): the v1
/// line naming the `memory` controller, else the v2 `0::` line. Bytes: a cgroup is a directory
/// anyone allowed to create one may name, so its path need not be UTF-8.
pub fn memory_path(proc_cgroup: &[u8]) -> Option<Vec<u8>> {
    let mut v2 = None;
    for line in proc_cgroup.split(|&b| b == b'\n') {
        // The path is everything after the second colon (it may hold colons itself).
        let mut parts = line.splitn(3, |&b| b == b':');
        let (Some(id), Some(ctl), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if id == b"0" && ctl.is_empty() {
            v2 = Some(path.to_vec());
        } else if ctl.split(|&b| b == b',').any(|c| c == b"memory") {
            return Some(path.to_vec());
        }
    }
    v2
}

/// The memory cgroup of a live process.
pub fn memory_path_of(pid: u32) -> Option<Vec<u8>> {
    memory_path(&proc_cgroup(pid)?)
}

/// `/proc/<pid>/cgroup` of a live process (every hierarchy's line).
pub fn proc_cgroup(pid: u32) -> Option<Vec<u8>> {
    crate::host::read_capped(
        &crate::host::proc_path(&format!("{pid}/cgroup")),
        crate::host::SMALL_FILE,
    )
    .ok()
}

/// Resolves v2 cgroup ids to paths (relative to the v2 root, as `/proc/<pid>/cgroup` shows
/// them) by finding the directory with that inode number; results are cached.
#[derive(Debug, Default)]
pub struct IdResolver {
    root: Option<PathBuf>,
    cache: HashMap<u64, Option<Vec<u8>>>,
}

impl IdResolver {
    pub fn new(layout: &Layout) -> IdResolver {
        IdResolver {
            root: layout.v2_root.clone(),
            cache: HashMap::new(),
        }
    }

    /// Resolves ids of cgroups in the hierarchy mounted at `root` (on v1 every hierarchy has
    /// its own ids: a cgroup's id is its directory's inode number in that mount).
    pub fn at(root: Option<PathBuf>) -> IdResolver {
        IdResolver {
            root,
            cache: HashMap::new(),
        }
    }

    /// The path of `id` if already resolved (no walk).
    pub fn cached(&self, id: u64) -> Option<&[u8]> {
        self.cache.get(&id).and_then(|p| p.as_deref())
    }

    /// Whether `path` (relative to `root`, as `/proc/<pid>/cgroup` shows it) is the cgroup
    /// `id`; if so it is cached, sparing a walk of the hierarchy.
    pub fn verify(&mut self, root: &Path, id: u64, path: &[u8]) -> bool {
        let rel = std::ffi::OsStr::from_bytes(path.strip_prefix(b"/").unwrap_or(path));
        let ok = std::fs::metadata(root.join(rel)).is_ok_and(|m| m.ino() == id);
        if ok {
            self.cache.insert(id, Some(path.to_vec()));
        }
        ok
    }

    pub fn path(&mut self, id: u64) -> Option<Vec<u8>> {
        if let Some(p) = self.cache.get(&id) {
            return p.clone();
        }
        let found = self.root.as_deref().and_then(|r| find_ino(r, r, id, 0));
        self.cache.insert(id, found.clone());
        found
    }
}

fn find_ino(root: &Path, dir: &Path, ino: u64, depth: u32) -> Option<Vec<u8>> {
    if std::fs::metadata(dir).ok()?.ino() == ino {
        let rel = dir.strip_prefix(root).ok()?;
        let mut p = b"/".to_vec();
        p.extend_from_slice(rel.as_os_str().as_bytes());
        return Some(p);
    }
    if depth >= 16 {
        return None;
    }
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            if let Some(p) = find_ino(root, &e.path(), ino, depth + 1) {
                return Some(p);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "25 23 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n\
26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid shared:5 - cgroup2 cgroup2 rw,nsdelegate\n\
30 25 0:27 / /sys/fs/cgroup/memory rw,nosuid shared:12 - cgroup cgroup rw,memory\n\
31 25 0:28 / /sys/fs/cgroup/cpu,cpuacct rw shared:13 - cgroup cgroup rw,cpu,cpuacct\n";
    const PURE_V2: &str = "35 24 0:30 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n";

    #[test]
    fn layouts() {
        let h = Layout::from_mountinfo(HYBRID);
        assert_eq!(h.v2_root, Some(PathBuf::from("/sys/fs/cgroup/unified")));
        assert_eq!(h.v1_memory, Some(PathBuf::from("/sys/fs/cgroup/memory")));
        assert!(!h.memory_on_v2());
        let v2 = Layout::from_mountinfo(PURE_V2);
        assert_eq!(v2.v2_root, Some(PathBuf::from("/sys/fs/cgroup")));
        assert!(v2.memory_on_v2());
        assert_eq!(Layout::from_mountinfo("garbage\n"), Layout::default());
    }

    #[test]
    fn memory_paths() {
        let hybrid = b"9:name=systemd:/\n4:memory:/process_api/abc\n1:cpu,cpuacct:/\n0::/\n";
        assert_eq!(
            memory_path(hybrid).as_deref(),
            Some(&b"/process_api/abc"[..])
        );
        let v2 = b"0::/system.slice/postgresql.service\n";
        assert_eq!(
            memory_path(v2).as_deref(),
            Some(&b"/system.slice/postgresql.service"[..])
        );
        assert_eq!(memory_path(b""), None);
        // Not UTF-8, with a colon: kept byte for byte.
        assert_eq!(
            memory_path(b"0::/a:b\xff\n").as_deref(),
            Some(&b"/a:b\xff"[..])
        );
    }

    #[test]
    fn memory_counters_v1_and_v2() {
        let d = std::env::temp_dir().join(format!("tk-cgmem-{}", std::process::id()));
        let v1 = d.join("v1/tkrw");
        let v2 = d.join("v2/a:b");
        std::fs::create_dir_all(&v1).unwrap();
        std::fs::create_dir_all(&v2).unwrap();
        std::fs::write(v1.join("memory.failcnt"), "17\n").unwrap();
        std::fs::write(
            v1.join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
        )
        .unwrap();
        std::fs::write(
            v2.join("memory.events"),
            "low 0\nhigh 4\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\ngarbage\n",
        )
        .unwrap();
        let a = MemoryCounters::read(&d.join("v1"), b"/tkrw").unwrap();
        assert_eq!((a.get("failcnt"), a.get("oom_kill")), (Some(17), Some(3)));
        let b = MemoryCounters::read(&d.join("v2"), b"/a:b").unwrap();
        assert_eq!(b.failcnt, None);
        assert_eq!((b.get("max"), b.get("oom_kill")), (Some(12), Some(1)));
        assert_eq!(b.events.len(), 6, "{b:?}");
        let mut later = b.clone();
        later.events.insert("max".into(), 20);
        assert_eq!(later.since(&b).get("max"), Some(8));
        assert_eq!(later.since(&a).get("max"), None);
        assert!(MemoryCounters::read(&d, b"/nonexistent").is_none());
        let _ = std::fs::remove_dir_all(d);
        assert_eq!(
            Layout::from_mountinfo(HYBRID).memory_root(),
            Some(Path::new("/sys/fs/cgroup/memory"))
        );
        assert_eq!(
            Layout::from_mountinfo(PURE_V2).memory_root(),
            Some(Path::new("/sys/fs/cgroup"))
        );
    }

    #[test]
    fn resolves_an_inode_under_a_root() {
        let d = std::env::temp_dir().join(format!("tk-cg-{}", std::process::id()));
        std::fs::create_dir_all(d.join("a/b")).unwrap();
        let ino = std::fs::metadata(d.join("a/b")).unwrap().ino();
        let mut r = IdResolver::new(&Layout {
            v2_root: Some(d.clone()),
            v1_memory: None,
        });
        assert_eq!(r.path(ino).as_deref(), Some(&b"/a/b"[..]));
        assert_eq!(r.path(u64::MAX), None);
        let mut r = IdResolver::at(Some(d.clone()));
        assert!(!r.verify(&d, ino, b"/a"));
        assert!(r.verify(&d, ino, b"/a/b"));
        assert_eq!(r.cached(ino), Some(&b"/a/b"[..]));
        let _ = std::fs::remove_dir_all(d);
    }
}
