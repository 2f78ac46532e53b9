//! `numa`: shared types for the NUMA placement programs (`probes-ebpf/src/bin/numa.rs`).
//!
//! CPU time per node comes from the kernel's own accounting: at each `sched_switch` the
//! outgoing task's `se.sum_exec_runtime` minus its value when that task was switched in on this
//! CPU (kept per CPU, [`Stint`]) is exactly the run that just ended, on this CPU's node. So the
//! per-node times of a task add up to its `/proc/<pid>/schedstat` run time, with no timestamp.

use crate::COMM_LEN;

/// Node ids the per-node arrays hold (`cpu_ns[node]`); a machine with a node id at or above
/// this is refused by userspace.
pub const MAX_NODES: usize = 64;

/// Per-CPU stats slot (see [`crate::stats`]): a task switched out without its switch-in seen on
/// this CPU whose run could not be measured another way, so its time is not counted. Such a run
/// is normally measured from `se.prev_sum_exec_runtime`, which the fair class sets when it picks
/// the task (`set_next_entity`); other classes (RT, deadline: `prio` < 100) do not keep it.
/// Past the slots the `sched` object uses (5–7), so the same run code counts it there when the
/// node time is recorded by the shared object (`SCHED_NODE_TIME`).
pub const STAT_NO_BASELINE: u32 = 8;
/// A CPU missing from the CPU→node map (hot-added after start): its time went to node 0.
pub const STAT_NO_NODE: u32 = 9;
/// A task move or swap whose node pair did not fit `NUMA_PAIRS`: not counted by pair.
pub const STAT_PAIR_FULL: u32 = 7;

/// [`PairKey::kind`] of `sched:sched_move_numa`: the task moved to its preferred node.
pub const PAIR_MOVE: u32 = 0;
/// [`PairKey::kind`] of `sched:sched_swap_numa`: two tasks swapped CPUs across nodes (one event;
/// the source task goes `src`→`dst`, the other the opposite way).
pub const PAIR_SWAP: u32 = 1;

/// What this CPU switched in last: the task and its run time at that moment (`LAST_IN`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stint {
    pub tid: u32,
    /// 0 until this CPU's first switch was seen.
    pub valid: u32,
    pub sum_exec_runtime: u64,
}

/// Aggregation key: a process (or thread) in one interval generation.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NumaKey {
    /// tgid, or tid with `--threads`.
    pub id: u32,
    pub gen: u32,
}

/// Everything known about one key in one window.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NumaVal {
    /// `comm` of the task that created the key.
    pub comm: [u8; COMM_LEN],
    pub tgid: u32,
    pub _pad: u32,
    /// Runs (switch-outs) counted in `cpu_ns`.
    pub runs: u64,
    /// NUMA hinting faults (calls of `task_numa_fault`, one per fault; needs fentry or kprobe).
    pub hint_faults: u64,
    /// Of which on memory of the faulting CPU's node (`TNF_FAULT_LOCAL`).
    pub hint_faults_local: u64,
    /// Pages those faults covered (a huge page fault covers 512).
    pub hint_pages: u64,
    /// Pages the faults migrated (`TNF_MIGRATED`): `numa_pages_migrated` of `/proc/<pid>/sched`.
    pub hint_pages_migrated: u64,
    /// Pages moved by NUMA balancing (`migrate:mm_migrate_pages`, reason NUMA_MISPLACED,
    /// `succeeded`) in this task's context.
    pub pages_migrated: u64,
    /// Pages it failed to move (same event, `failed`).
    pub pages_failed: u64,
    /// `sched:sched_move_numa`: the scheduler moved the task to its preferred node.
    pub moves: u64,
    /// `sched:sched_swap_numa`: the task was swapped with one on another node (either side).
    pub swaps: u64,
    /// `sched:sched_stick_numa`: the scheduler wanted to move it but found no place.
    pub sticks: u64,
    /// On-CPU time (ns) per node id, from `se.sum_exec_runtime`.
    pub cpu_ns: [u64; MAX_NODES],
    /// Pages its hinting faults migrated, by destination node: `task_numa_fault`'s `mem_node`
    /// when `TNF_MIGRATED` is set (the node the page is on after the fault). Sums to
    /// `hint_pages_migrated`.
    pub migrated_to: [u64; MAX_NODES],
}

impl NumaVal {
    pub const ZERO: NumaVal = NumaVal {
        comm: [0; COMM_LEN],
        tgid: 0,
        _pad: 0,
        runs: 0,
        hint_faults: 0,
        hint_faults_local: 0,
        hint_pages: 0,
        hint_pages_migrated: 0,
        pages_migrated: 0,
        pages_failed: 0,
        moves: 0,
        swaps: 0,
        sticks: 0,
        cpu_ns: [0; MAX_NODES],
        migrated_to: [0; MAX_NODES],
    };

    /// Adds `o`'s counters (identity fields kept).
    pub fn add(&mut self, o: &NumaVal) {
        crate::add_counters!(self, o; runs, hint_faults, hint_faults_local, hint_pages,
            hint_pages_migrated, pages_migrated, pages_failed, moves, swaps, sticks);
        for (a, b) in self.cpu_ns.iter_mut().zip(o.cpu_ns.iter()) {
            *a += b;
        }
        for (a, b) in self.migrated_to.iter_mut().zip(o.migrated_to.iter()) {
            *a += b;
        }
    }
}

/// Byte offsets into `struct task_struct`, from the kernel's BTF.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NumaOffsets {
    pub pid: u32,
    pub tgid: u32,
    pub comm: u32,
    pub run: RunOffsets,
}

/// The `task_struct` members a run's length is read from (numa's own object, and the shared
/// `sched` object when it records node time: `sched::TaskOffsets::run`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunOffsets {
    /// `se.sum_exec_runtime`.
    pub sum_exec_runtime: u32,
    /// `se.prev_sum_exec_runtime`: `sum_exec_runtime` when the fair class last picked the task.
    pub prev_sum_exec_runtime: u32,
    /// `prio`: below 100 for RT and deadline tasks.
    pub prio: u32,
}

impl RunOffsets {
    pub const ZERO: RunOffsets = RunOffsets {
        sum_exec_runtime: 0,
        prev_sum_exec_runtime: 0,
        prio: 0,
    };
}

/// Key of `NUMA_PAIRS`: scheduler NUMA moves or swaps (`kind`) from node `src` to node `dst`
/// in one generation (nodes of the event's CPUs; the value is the event count).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PairKey {
    pub gen: u32,
    pub kind: u32,
    pub src: u32,
    pub dst: u32,
}

crate::gen_keys!(NumaKey, PairKey);
crate::impl_pod!(Stint, NumaKey, NumaVal, NumaOffsets, RunOffsets, PairKey);

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(size_of::<Stint>(), 16);
        assert_eq!(size_of::<NumaKey>(), 8);
        assert_eq!(size_of::<NumaOffsets>(), 24);
        assert_eq!(size_of::<NumaVal>(), 16 + 8 + 10 * 8 + 2 * 8 * MAX_NODES);
        assert_eq!(size_of::<PairKey>(), 16);
    }

    #[test]
    fn add_sums_counters_and_nodes() {
        let mut a = NumaVal::ZERO;
        a.cpu_ns[1] = 5;
        a.hint_faults = 2;
        let mut b = NumaVal::ZERO;
        b.cpu_ns[1] = 7;
        b.cpu_ns[0] = 1;
        b.hint_faults = 3;
        b.tgid = 9;
        b.migrated_to[1] = 512;
        a.migrated_to[1] = 1;
        a.add(&b);
        assert_eq!(a.migrated_to[1], 513);
        assert_eq!(a.cpu_ns[1], 12);
        assert_eq!(a.cpu_ns[0], 1);
        assert_eq!(a.hint_faults, 5);
        assert_eq!(a.tgid, 0);
    }
}
