//! Memory cgroups at their limit, every one ([`MemoryCounters`] of each): v1 `memory.failcnt` (times usage hit the limit) and v2
//! `memory.events` (`max`: times reclaim ran because usage hit `memory.max`; `oom`, `oom_kill`).
//! A walk over the memory hierarchy, bounded in depth and count (a node has hundreds of
//! cgroups, not millions).

use std::{collections::BTreeMap, path::Path};

use super::cgroup::{Layout, MemoryCounters};

const MAX_CGROUPS: usize = 4096;
const MAX_DEPTH: usize = 8;

/// Counters of every memory cgroup, by path relative to the hierarchy's root (`/` for it).
pub fn snapshot(layout: &Layout) -> BTreeMap<String, MemoryCounters> {
    let mut out = BTreeMap::new();
    if let Some(root) = layout.memory_root() {
        walk(root, root, 0, &mut out);
    }
    out
}

fn walk(root: &Path, dir: &Path, depth: usize, out: &mut BTreeMap<String, MemoryCounters>) {
    if out.len() >= MAX_CGROUPS || depth > MAX_DEPTH {
        return;
    }
    if let Some(c) = MemoryCounters::read_dir(dir) {
        let rel = dir
            .strip_prefix(root)
            .map(|r| format!("/{}", r.display()))
            .unwrap_or_default();
        out.insert(rel, c);
    }
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.filter_map(Result::ok) {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            walk(root, &e.path(), depth + 1, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_fixture_tree_of_both_versions() {
        let d = std::env::temp_dir().join(format!("tk-memcg-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let v1 = d.join("v1");
        std::fs::create_dir_all(v1.join("app")).unwrap();
        std::fs::write(v1.join("memory.failcnt"), "0\n").unwrap();
        std::fs::write(v1.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
        std::fs::write(v1.join("app/memory.failcnt"), "42\n").unwrap();
        std::fs::write(v1.join("app/memory.limit_in_bytes"), "33554432\n").unwrap();
        std::fs::write(
            v1.join("app/memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
        )
        .unwrap();
        let l = Layout {
            v1_memory: Some(v1.clone()),
            v2_root: None,
        };
        let s = snapshot(&l);
        assert_eq!(s["/"].limit_bytes, None);
        assert_eq!(s["/app"].hit_limit(), 42);
        assert_eq!(s["/app"].oom_kills(), 2);
        assert_eq!(s["/app"].limit_bytes, Some(32 << 20));
        let v2 = d.join("v2");
        std::fs::create_dir_all(v2.join("svc")).unwrap();
        std::fs::write(
            v2.join("svc/memory.events"),
            "low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\n",
        )
        .unwrap();
        std::fs::write(v2.join("svc/memory.max"), "max\n").unwrap();
        let l = Layout {
            v1_memory: None,
            v2_root: Some(v2),
        };
        let s = snapshot(&l);
        assert_eq!(s["/svc"].hit_limit(), 7);
        assert_eq!(s["/svc"].oom_kills(), 1);
        assert_eq!(s["/svc"].limit_bytes, None);
        let _ = std::fs::remove_dir_all(&d);
    }
}
