//! why's per-thread bookkeeping in userspace: the threads alive at the start (seeded from
//! `/proc`), a window's parts per thread while it is added up, and the part of a wait still
//! going at a window's end that the window counted.

use std::collections::BTreeMap;

use probes_common::{
    hist::LatHist,
    why::{BLOCKED_BEFORE, RUNNING},
};

use super::classify::{self, Part};
use crate::engine::Scope;

/// A thread's state as `/proc/<tid>/stat` tells it, for seeding.
pub(super) fn seed_of(pid: u32, tid: u32) -> Option<(u32, Vec<u8>, Vec<String>)> {
    let base = format!("{pid}/task/{tid}");
    let stat = crate::host::read_text_capped(
        &crate::host::proc_path(&format!("{base}/stat")),
        crate::host::SMALL_FILE,
    )
    .ok()?;
    // `tid (comm) S ...`: the comm may hold spaces and parentheses; the state follows the last `)`.
    let (head, rest) = stat.rsplit_once(')')?;
    let comm = head.split_once('(')?.1.as_bytes().to_vec();
    let state = rest.trim_start().chars().next()?;
    if matches!(state, 'S' | 'D' | 'I') {
        let stack = crate::host::read_text_capped(
            &crate::host::proc_path(&format!("{base}/stack")),
            crate::host::SMALL_FILE,
        )
        .map(|t| classify::proc_stack(&t))
        .unwrap_or_default();
        Some((BLOCKED_BEFORE, comm, stack))
    } else if matches!(state, 'R') {
        Some((RUNNING, comm, Vec::new()))
    } else {
        None
    }
}

/// The processes in scope now (by `--pid`/`--container`, else every process whose comm or a
/// thread's comm is `--comm`).
pub(super) fn processes(scope: &Scope) -> Vec<u32> {
    if !scope.pids.is_empty() {
        return scope.pids.clone();
    }
    let Ok(dir) = std::fs::read_dir(crate::host::proc_path("")) else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// The part of an interval still going at a window's end that the window counted.
#[derive(Clone, Debug)]
pub(super) struct Carry {
    pub(super) since_ns: u64,
    pub(super) part: Part,
    pub(super) what: String,
}

/// A row's threads added up: tgid, comm, threads, parts, waits.
pub(super) type Group = (u32, Vec<u8>, u64, [u64; 8], BTreeMap<(Part, String), Wait>);

/// One thread's window.
#[derive(Default)]
pub(super) struct ThreadAcc {
    pub(super) tgid: u32,
    pub(super) comm: Vec<u8>,
    pub(super) parts: [u64; 8],
    pub(super) waits: BTreeMap<(Part, String), Wait>,
}

#[derive(Clone)]
pub(super) struct Wait {
    pub(super) ns: u64,
    pub(super) hist: LatHist,
    /// Who ended them: (tgid, tid) → (comm, ns).
    pub(super) by: BTreeMap<(u32, u32), (Vec<u8>, u64)>,
}

impl Default for Wait {
    fn default() -> Wait {
        Wait {
            ns: 0,
            hist: LatHist::ZERO,
            by: BTreeMap::new(),
        }
    }
}

impl ThreadAcc {
    pub(super) fn add(&mut self, part: Part, what: &str, ns: i128, hist: Option<&LatHist>) {
        let w = self.waits.entry((part, what.to_string())).or_default();
        w.ns = (w.ns as i128 + ns).max(0) as u64;
        let p = &mut self.parts[part as usize];
        *p = (*p as i128 + ns).max(0) as u64;
        if let Some(h) = hist {
            w.hist.merge(h);
        }
    }
}

/// Whether process `tgid` holds a socket (a poll or epoll wait is then a network wait).
pub(super) fn holds_sockets(tgid: u32) -> bool {
    let Ok(dir) = std::fs::read_dir(crate::host::proc_path(&format!("{tgid}/fd"))) else {
        return false;
    };
    dir.take(4096).filter_map(|e| e.ok()).any(|e| {
        std::fs::read_link(e.path())
            .map(|l| l.to_string_lossy().starts_with("socket:"))
            .unwrap_or(false)
    })
}
