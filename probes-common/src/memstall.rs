//! `memstall`: shared types for the memory-stall hooks: `compaction:mm_compaction_*`,
//! `vmscan:mm_vmscan_{direct,memcg}_reclaim_*`, `huge_memory:*`,
//! `syscalls:sys_{enter,exit}_madvise` (to time `MADV_COLLAPSE`), `oom:mark_victim`,
//! `sched:sched_process_exit` (process lifetimes) and, where the kernel allows it, the entry and
//! exit of `do_huge_pmd_anonymous_page` (whole THP faults).

use crate::{hist::LatHist, COMM_LEN};

/// Direct compaction, timed per allocation that stalled (`mm_compaction_try_to_compact_pages`
/// to the end of its last zone: one per `/proc/vmstat compact_stall`); compaction that serves no
/// allocation (kcompactd, `/proc/sys/vm/compact_memory`) is timed per zone.
pub const KIND_COMPACTION: u32 = 0;
/// Direct reclaim (`mm_vmscan_direct_reclaim_begin/end`).
pub const KIND_RECLAIM: u32 = 1;
/// Memory-cgroup reclaim (`mm_vmscan_memcg_reclaim_begin/end`): the cgroup hit its limit.
pub const KIND_MEMCG_RECLAIM: u32 = 2;
/// THP collapse: `huge_memory:*` counts, timed by `madvise(MADV_COLLAPSE)` calls.
pub const KIND_THP_COLLAPSE: u32 = 3;
/// Whole anonymous THP faults (`do_huge_pmd_anonymous_page`, entry to return): allocation with
/// its compaction and reclaim, zeroing 2 MiB, mapping. Only where fentry or kprobes exist.
pub const KIND_THP_FAULT: u32 = 4;
pub const NKINDS: u32 = 5;
pub const KIND_NAMES: [&str; NKINDS as usize] = [
    "compaction",
    "reclaim",
    "memcg_reclaim",
    "thp_collapse",
    "thp_fault",
];

/// Slots for `mm_compaction_end.status` values; larger values share the last slot.
pub const NOUTCOMES: usize = 16;

/// `madvise` advice that collapses a range into huge pages synchronously (6.1+).
pub const MADV_COLLAPSE: u64 = 25;

/// Per-CPU stats slot (see `crate::stats`): a process lifetime could not be tracked (its
/// "% of the time" then uses the whole window).
pub const STAT_LIFE_MAP_FULL: u32 = 5;

/// Key of the in-flight map: a thread can be inside several kinds at once (a `MADV_COLLAPSE`
/// allocates its huge page and may compact or reclaim on the way).
#[inline(always)]
pub const fn start_key(tid: u32, kind: u32) -> u64 {
    ((tid as u64) << 8) | kind as u64
}

/// Aggregation key.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MsKey {
    /// tgid, or tid with `--threads`.
    pub id: u32,
    /// One of the `KIND_*` constants.
    pub kind: u32,
    /// Interval generation (see [`crate::stats::Control`]).
    pub gen: u32,
    pub _pad: u32,
}

/// Aggregated value per key.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MsVal {
    /// `comm` of the thread that created the key.
    pub comm: [u8; COMM_LEN],
    pub tgid: u32,
    pub _pad: u32,
    /// The memory cgroup of the thread that created the key, read in the kernel at the event:
    /// the id (kernfs node id, the directory's inode number) of its cgroup in the v1 memory
    /// hierarchy when one is mounted, else in the unified (v2) hierarchy.
    pub cgroup_id: u64,
    /// Compaction: zone compactions (`mm_compaction_end`) per raw `status` value.
    pub outcomes: [u64; NOUTCOMES],
    /// Compaction: allocations that stalled in direct compaction (each also one timed value of
    /// `hist`); the rest of `hist` are zone compactions that served no allocation.
    pub direct: u64,
    /// Reclaim kinds: pages reclaimed (`nr_reclaimed` of the end events).
    pub reclaimed: u64,
    /// THP collapse: `mm_khugepaged_scan_pmd` events (one per PMD range scanned).
    pub scans: u64,
    /// THP collapse: `mm_collapse_huge_page_isolate` events.
    pub isolates: u64,
    /// THP collapse: `mm_collapse_huge_page` events (collapse attempts).
    pub collapses: u64,
    /// THP collapse: `mm_collapse_huge_page` events whose status was "succeeded".
    pub collapsed: u64,
    /// THP faults that fell back to small pages (`VM_FAULT_FALLBACK`).
    pub fallbacks: u64,
    /// Stall times (THP collapse: `MADV_COLLAPSE` call durations; THP fault: whole faults).
    pub hist: LatHist,
}

impl MsVal {
    pub const ZERO: MsVal = MsVal {
        comm: [0; COMM_LEN],
        tgid: 0,
        _pad: 0,
        cgroup_id: 0,
        outcomes: [0; NOUTCOMES],
        direct: 0,
        reclaimed: 0,
        scans: 0,
        isolates: 0,
        collapses: 0,
        collapsed: 0,
        fallbacks: 0,
        hist: LatHist::ZERO,
    };

    /// Adds another value's counters (not its identity) into this one.
    pub fn merge(&mut self, o: &MsVal) {
        for (a, b) in self.outcomes.iter_mut().zip(o.outcomes.iter()) {
            *a += *b;
        }
        crate::add_counters!(self, o; direct, reclaimed, scans, isolates, collapses, collapsed,
            fallbacks);
        self.hist.merge(&o.hist);
    }

    /// Zone compactions that ended (the sum of `outcomes`).
    pub fn zones(&self) -> u64 {
        self.outcomes.iter().sum()
    }
}

/// One direct-compaction attempt of a thread in flight (`mm_compaction_try_to_compact_pages`).
/// The kernel counts `compact_stall` for an attempt unless every zone was skipped; an attempt
/// is recorded as a stall at its first zone that was compacted, deferred or found ready
/// (`mm_compaction_begin`, `_deferred`, `_defer_reset`), and its time is extended to the end of
/// each later zone.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MsAttempt {
    /// When the attempt began.
    pub start_ns: u64,
    /// Last activity of the attempt (begin, a zone's end), to tell a stale attempt.
    pub last_ns: u64,
    /// The duration recorded so far plus one (0: not recorded yet).
    pub recorded_plus1: u64,
    /// The generation it was recorded in.
    pub gen: u32,
    pub _pad: u32,
}

/// A process (or, with `--threads`, a thread) whose stalls are aggregated: when it started and,
/// once its last thread exited, when it ended (monotonic ns, as `bpf_ktime_get_ns`; 0 unknown),
/// so "share of the time" uses the time it was alive in the window.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MsLife {
    pub start_ns: u64,
    pub exit_ns: u64,
}

/// Levels of a cgroup path the kernel copies (deeper paths lose their top levels).
pub const CG_LEVELS: usize = 8;
/// Bytes kept of each level's name, NUL included (longer names are cut).
pub const CG_NAME_LEN: usize = 64;

/// A memory cgroup as the kernel saw it at the event: its id and the names of its directories
/// from the cgroup up (`names[0]` is the cgroup's own), so a cgroup removed before userspace
/// looked is still named.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MsCgroup {
    pub id: u64,
    /// Levels copied into `names`.
    pub depth: u32,
    /// 1 when the path has more than [`CG_LEVELS`] levels.
    pub truncated: u32,
    pub names: [[u8; CG_NAME_LEN]; CG_LEVELS],
}

impl MsCgroup {
    pub const ZERO: MsCgroup = MsCgroup {
        id: 0,
        depth: 0,
        truncated: 0,
        names: [[0; CG_NAME_LEN]; CG_LEVELS],
    };
}

/// Streamed once per new key (without waking userspace, which polls) so userspace learns the
/// process's facts while it lives and names its cgroup.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MsNew {
    pub tgid: u32,
    pub tid: u32,
    pub kind: u32,
    pub _pad: u32,
    pub cgroup: MsCgroup,
}

/// One OOM kill (`oom:mark_victim`), streamed (rare).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MsOom {
    pub ts_ns: u64,
    /// The victim's memory cgroup (see [`MsVal::cgroup_id`]); with `victim_task` 0 it is the
    /// killing task's, on kernels whose tracepoint does not pass the victim's task.
    pub cgroup: MsCgroup,
    /// The victim (its thread-group id where the kernel passes the task, else its pid).
    pub victim_pid: u32,
    /// The task that was allocating when the kernel chose to kill.
    pub killer_pid: u32,
    pub victim_comm: [u8; COMM_LEN],
    pub killer_comm: [u8; COMM_LEN],
    /// 1 when `cgroup_id` and `victim_comm` are the victim's own.
    pub victim_task: u32,
    pub _pad: u32,
}

impl MsOom {
    pub const ZERO: MsOom = MsOom {
        ts_ns: 0,
        cgroup: MsCgroup::ZERO,
        victim_pid: 0,
        killer_pid: 0,
        victim_comm: [0; COMM_LEN],
        killer_comm: [0; COMM_LEN],
        victim_task: 0,
        _pad: 0,
    };
}

crate::gen_keys!(MsKey);
crate::impl_pod!(MsKey, MsVal, MsNew, MsAttempt, MsLife, MsOom, MsCgroup);

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(size_of::<MsKey>(), 16);
        assert_eq!(size_of::<MsCgroup>(), 16 + CG_LEVELS * CG_NAME_LEN);
        assert_eq!(size_of::<MsNew>(), 16 + size_of::<MsCgroup>());
        assert_eq!(size_of::<MsAttempt>(), 32);
        assert_eq!(size_of::<MsLife>(), 16);
        assert_eq!(
            size_of::<MsOom>(),
            8 + size_of::<MsCgroup>() + 8 + 2 * COMM_LEN + 8
        );
        assert_eq!(
            size_of::<MsVal>(),
            32 + 8 * NOUTCOMES + 8 * 7 + size_of::<LatHist>()
        );
    }

    #[test]
    fn start_keys_differ_per_kind_and_thread() {
        assert_ne!(start_key(1, KIND_RECLAIM), start_key(1, KIND_COMPACTION));
        assert_ne!(start_key(2, 0), start_key(1, 0));
        assert_eq!(start_key(u32::MAX, 3) >> 8, u32::MAX as u64);
    }

    #[test]
    fn merge_adds_counters() {
        let mut a = MsVal::ZERO;
        let mut b = MsVal::ZERO;
        b.outcomes[8] = 2;
        b.collapsed = 3;
        b.direct = 1;
        b.fallbacks = 4;
        b.hist.record(5);
        a.merge(&b);
        a.merge(&b);
        assert_eq!((a.outcomes[8], a.collapsed, a.hist.count), (4, 6, 2));
        assert_eq!((a.direct, a.fallbacks, a.zones()), (2, 8, 4));
    }
}
