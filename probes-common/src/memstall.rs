//! `memstall`: shared types for the memory-stall tracepoints (`compaction:mm_compaction_*`,
//! `vmscan:mm_vmscan_{direct,memcg}_reclaim_*`, `huge_memory:*`, and
//! `syscalls:sys_{enter,exit}_madvise` to time `MADV_COLLAPSE`).

use crate::{hist::LatHist, COMM_LEN};

/// Direct compaction (`mm_compaction_begin/end` in the allocating task; kcompactd too).
pub const KIND_COMPACTION: u32 = 0;
/// Direct reclaim (`mm_vmscan_direct_reclaim_begin/end`).
pub const KIND_RECLAIM: u32 = 1;
/// Memory-cgroup reclaim (`mm_vmscan_memcg_reclaim_begin/end`): the cgroup hit its limit.
pub const KIND_MEMCG_RECLAIM: u32 = 2;
/// THP collapse: `huge_memory:*` counts, timed by `madvise(MADV_COLLAPSE)` calls.
pub const KIND_THP_COLLAPSE: u32 = 3;
pub const NKINDS: u32 = 4;
pub const KIND_NAMES: [&str; NKINDS as usize] =
    ["compaction", "reclaim", "memcg_reclaim", "thp_collapse"];

/// Slots for `mm_compaction_end.status` values; larger values share the last slot.
pub const NOUTCOMES: usize = 16;

/// `madvise` advice that collapses a range into huge pages synchronously (6.1+).
pub const MADV_COLLAPSE: u64 = 25;

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
    /// `bpf_get_current_cgroup_id()` of the thread that created the key (cgroup v2 id).
    pub cgroup_id: u64,
    /// Compaction: end events per raw `status` value (names from the format file).
    pub outcomes: [u64; NOUTCOMES],
    /// Reclaim kinds: pages reclaimed (`nr_reclaimed` of the end events).
    pub reclaimed: u64,
    /// THP: `mm_khugepaged_scan_pmd` events (one per PMD range scanned).
    pub scans: u64,
    /// THP: `mm_collapse_huge_page_isolate` events.
    pub isolates: u64,
    /// THP: `mm_collapse_huge_page` events (collapse attempts).
    pub collapses: u64,
    /// THP: `mm_collapse_huge_page` events whose status was "succeeded".
    pub collapsed: u64,
    /// Stall times (THP: `MADV_COLLAPSE` call durations).
    pub hist: LatHist,
}

impl MsVal {
    pub const ZERO: MsVal = MsVal {
        comm: [0; COMM_LEN],
        tgid: 0,
        _pad: 0,
        cgroup_id: 0,
        outcomes: [0; NOUTCOMES],
        reclaimed: 0,
        scans: 0,
        isolates: 0,
        collapses: 0,
        collapsed: 0,
        hist: LatHist::ZERO,
    };

    /// Adds another value's counters (not its identity) into this one.
    pub fn merge(&mut self, o: &MsVal) {
        for (a, b) in self.outcomes.iter_mut().zip(o.outcomes.iter()) {
            *a += *b;
        }
        self.reclaimed += o.reclaimed;
        self.scans += o.scans;
        self.isolates += o.isolates;
        self.collapses += o.collapses;
        self.collapsed += o.collapsed;
        self.hist.merge(&o.hist);
    }
}

/// Streamed once per new key so userspace reads the process's cgroup, comm and kthread flag
/// while it lives (a short-lived process is gone by the end of the window).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MsNew {
    pub tgid: u32,
    pub tid: u32,
    pub kind: u32,
    pub _pad: u32,
}

crate::impl_pod!(MsKey, MsVal, MsNew);

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(size_of::<MsKey>(), 16);
        assert_eq!(size_of::<MsNew>(), 16);
        assert_eq!(
            size_of::<MsVal>(),
            32 + 8 * NOUTCOMES + 40 + size_of::<LatHist>()
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
        b.hist.record(5);
        a.merge(&b);
        a.merge(&b);
        assert_eq!((a.outcomes[8], a.collapsed, a.hist.count), (4, 6, 2));
    }
}
