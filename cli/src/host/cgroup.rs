//! Cgroup paths for processes, on cgroup v2 and on v1 (or hybrid) hosts.
//!
//! The kernel side records `bpf_get_current_cgroup_id()`, the id of the task's cgroup in the v2
//! (unified) hierarchy, which is the inode number of that cgroup's directory. On a pure v2 host
//! that names the cgroup even after the process is gone. On a v1 or hybrid host the unified tree
//! is usually empty (every id is its root), so the path that matters (the memory controller's)
//! comes from `/proc/<pid>/cgroup`, read while the process lives.

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
        crate::host::read_text_capped(Path::new("/proc/self/mountinfo"), crate::host::LARGE_FILE)
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
    memory_path(
        &crate::host::read_capped(
            Path::new(&format!("/proc/{pid}/cgroup")),
            crate::host::SMALL_FILE,
        )
        .ok()?,
    )
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
        let _ = std::fs::remove_dir_all(d);
    }
}
