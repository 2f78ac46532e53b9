//! Memory cgroups at their limit: v1 `memory.failcnt` (times usage hit the limit) and v2
//! `memory.events` (`max`: times reclaim ran because usage hit `memory.max`; `oom`, `oom_kill`).
//! A walk over the memory hierarchy, bounded in depth and count (a node has hundreds of
//! cgroups, not millions).

use std::{collections::BTreeMap, path::Path};

use super::{cgroup::Layout, read_text_capped, read_trim, SMALL_FILE};

/// One memory cgroup's limit counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemcgCounters {
    /// Times usage hit the limit (v1 `failcnt`, v2 `memory.events` `max`).
    pub hit_limit: u64,
    /// OOM kills inside it (v2 `oom_kill`; v1 `memory.oom_control` `oom_kill` where present).
    pub oom_kills: u64,
    /// The limit in bytes (`None`: unlimited).
    pub limit_bytes: Option<u64>,
    pub usage_bytes: Option<u64>,
}

const MAX_CGROUPS: usize = 4096;
const MAX_DEPTH: usize = 8;

/// Counters of every memory cgroup, by path relative to the hierarchy's root (`/` for it).
pub fn snapshot(layout: &Layout) -> BTreeMap<String, MemcgCounters> {
    let mut out = BTreeMap::new();
    let (root, v1) = match (&layout.v1_memory, &layout.v2_root) {
        (Some(r), _) => (r.clone(), true),
        (None, Some(r)) => (r.clone(), false),
        _ => return out,
    };
    walk(&root, &root, v1, 0, &mut out);
    out
}

fn num(s: Option<String>) -> Option<u64> {
    s?.trim().parse().ok()
}

fn read(dir: &Path, v1: bool) -> Option<MemcgCounters> {
    if v1 {
        let failcnt = num(read_trim(&dir.join("memory.failcnt")))?;
        let limit = num(read_trim(&dir.join("memory.limit_in_bytes")))
            // v1 "unlimited" is a huge page-aligned number.
            .filter(|&l| l < (1u64 << 62));
        let oom = read_text_capped(&dir.join("memory.oom_control"), SMALL_FILE)
            .ok()
            .and_then(|t| events(&t).get("oom_kill").copied())
            .unwrap_or(0);
        Some(MemcgCounters {
            hit_limit: failcnt,
            oom_kills: oom,
            limit_bytes: limit,
            usage_bytes: num(read_trim(&dir.join("memory.usage_in_bytes"))),
        })
    } else {
        let ev = events(&read_text_capped(&dir.join("memory.events"), SMALL_FILE).ok()?);
        Some(MemcgCounters {
            hit_limit: ev.get("max").copied().unwrap_or(0),
            oom_kills: ev.get("oom_kill").copied().unwrap_or(0),
            limit_bytes: num(read_trim(&dir.join("memory.max"))),
            usage_bytes: num(read_trim(&dir.join("memory.current"))),
        })
    }
}

/// `key value` lines (`memory.events`, `memory.oom_control`).
pub fn events(text: &str) -> BTreeMap<String, u64> {
    super::numa::parse_key_values(text)
}

fn walk(
    root: &Path,
    dir: &Path,
    v1: bool,
    depth: usize,
    out: &mut BTreeMap<String, MemcgCounters>,
) {
    if out.len() >= MAX_CGROUPS || depth > MAX_DEPTH {
        return;
    }
    if let Some(c) = read(dir, v1) {
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
            walk(root, &e.path(), v1, depth + 1, out);
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
        assert_eq!(s["/app"].hit_limit, 42);
        assert_eq!(s["/app"].oom_kills, 2);
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
        assert_eq!(s["/svc"].hit_limit, 7);
        assert_eq!(s["/svc"].limit_bytes, None);
        let _ = std::fs::remove_dir_all(&d);
    }
}
