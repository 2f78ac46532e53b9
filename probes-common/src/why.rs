//! `why`: one process's wall-clock time split into parts, from one pass over the scheduler's
//! events (`probes-ebpf/src/bin/why.rs`). Each thread in scope has a state (running, runnable
//! after a wakeup or a preemption, blocked with the kernel stack it blocked in); every state
//! change ends an interval, which is added to the thread's aggregate for that state (and stack),
//! and to the one who ended it (the waker of a block, the task that held the CPU when a
//! runnable wait ended).

use crate::{hist::LatHist, COMM_LEN};

/// On a CPU, from its switch-in to its switch-out.
pub const RUNNING: u32 = 0;
/// Runnable after a wakeup (`sched_waking` or `sched_wakeup_new`) until its switch-in.
pub const RUNNABLE_WAKEUP: u32 = 1;
/// Runnable after a preemption or a yield (switched out still `TASK_RUNNING`).
pub const RUNNABLE_PREEMPT: u32 = 2;
/// Blocked: from a switch-out in a sleeping state to the wakeup (to the switch-in when the
/// wakeup was not seen); `stack` is the kernel stack it blocked in.
pub const BLOCKED: u32 = 3;
/// Blocked since before tracing began (seeded by userspace from `/proc/<tid>/stat`, which
/// read `S` or `D`; userspace classifies it from `/proc/<tid>/stack`).
pub const BLOCKED_BEFORE: u32 = 4;
/// Exiting (`sched_process_exit` ran): its last switch-out forgets it.
pub const EXITING: u32 = 5;
/// On a CPU inside direct or memcg reclaim (between `mm_vmscan_*_reclaim_begin` and `_end`):
/// the aggregate's `stack` is [`MEM_DIRECT`] or [`MEM_MEMCG`]. Only in keys: the thread's state
/// stays [`RUNNING`], with [`WhyTask::mem`] set.
pub const RECLAIM_RUN: u32 = 6;
/// [`WhyTask::mem`]: in direct reclaim (the node short of free memory).
pub const MEM_DIRECT: u32 = 1;
/// [`WhyTask::mem`]: in memcg reclaim (its memory cgroup at its limit).
pub const MEM_MEMCG: u32 = 2;

/// Per-CPU stats slots of the why object (after the shared ones of [`crate::stats`]).
/// A switch-in of a blocked thread whose wakeup was not seen: the block ran to the switch-in
/// (the runnable wait after it is in the blocked part).
pub const STAT_NO_WAKEUP: u32 = 5;
/// A thread in scope seen first at a switch-out, not seeded and not created under tracing:
/// its time before that is not counted.
pub const STAT_UNSEEN: u32 = 6;
/// A culprit (waker, CPU holder) did not fit `WHY_BY`: the part is counted, its culprit not.
pub const STAT_BY_FULL: u32 = 7;

/// One thread in scope, by tid (`WHY_TASKS`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WhyTask {
    /// `bpf_ktime_get_ns()` when the current state began.
    pub since_ns: u64,
    pub tgid: u32,
    /// [`RUNNING`], [`RUNNABLE_WAKEUP`], ...
    pub state: u32,
    /// The kernel stack it blocked in (an id in `WHY_STACKS`), or -1.
    pub stack: i32,
    /// Inside reclaim ([`MEM_DIRECT`], [`MEM_MEMCG`]) or 0: its time on a CPU is memory time.
    pub mem: u32,
    pub comm: [u8; COMM_LEN],
}

/// The aggregate of one thread's intervals in one state (and stack).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WhyKey {
    pub tgid: u32,
    pub pid: u32,
    pub state: u32,
    /// Kernel stack id for [`BLOCKED`], -1 otherwise.
    pub stack: i32,
    pub gen: u32,
    pub _pad: u32,
}

/// Every interval of a key, whole (an interval is counted in the window where it ends; userspace
/// takes out what it already counted of it in earlier windows).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WhyVal {
    pub comm: [u8; COMM_LEN],
    pub hist: LatHist,
}

/// Who ended a thread's intervals of one state (and stack): the waker of a block, the task
/// switched out when a runnable wait ended (it held the CPU last; 0 is the idle task).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ByKey {
    pub tgid: u32,
    pub pid: u32,
    pub state: u32,
    pub stack: i32,
    pub by_tgid: u32,
    pub by_pid: u32,
    pub gen: u32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ByVal {
    pub by_comm: [u8; COMM_LEN],
    pub ns: u64,
    pub count: u64,
}

crate::gen_keys!(WhyKey, ByKey);
crate::impl_pod!(WhyTask, WhyKey, WhyVal, ByKey, ByVal);

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(size_of::<WhyTask>(), 24 + COMM_LEN);
        assert_eq!(size_of::<WhyKey>(), 24);
        assert_eq!(size_of::<WhyVal>(), COMM_LEN + size_of::<LatHist>());
        assert_eq!(size_of::<ByKey>(), 32);
        assert_eq!(size_of::<ByVal>(), COMM_LEN + 16);
    }
}
