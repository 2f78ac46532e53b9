//! `ctxsw` and `runq-lat`: shared types for the `sched:sched_switch` programs.
//!
//! Both tools read the kernel's own per-task counters (`nvcsw`, `nivcsw`,
//! `sched_info.run_delay`, `se.nr_migrations`) from the task being switched out and keep the
//! difference since that task's previous switch-out. That is what makes the counts agree with
//! `/proc/<pid>/status` and `/proc/<pid>/schedstat` by construction, and it needs neither a
//! timestamp nor a wakeup hook (see `probes-ebpf/src/sched.rs` for the cost argument).

use crate::{hist::LatHist, COMM_LEN};

/// Per-CPU stats slot (see [`crate::stats`], which reserves 5..8 for tools): a new
/// (victim, preemptor) pair did not fit the preemptor map.
pub const STAT_PREEMPT_MAP_FULL: u32 = 5;
/// A task already running when tracing began was seen for the first time: that one switch was
/// classified from the tracepoint's arguments and its run-queue wait is unknown (window edge).
pub const STAT_NO_BASELINE: u32 = 6;
/// Switches away from the idle task (pid 0): not a process, so in no row, but counted so the
/// system total adds up to the kernel's own `ctxt` in /proc/stat.
pub const STAT_IDLE_SWITCHES: u32 = 7;

/// Snapshot of a task's counters at its previous switch-out (`TASKS` map, keyed by tid).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskSnap {
    pub nvcsw: u64,
    pub nivcsw: u64,
    pub run_delay: u64,
    pub nr_migrations: u64,
    /// 1 when the previous switch-out was involuntary (the task stayed runnable), so the next
    /// wait on the run queue is a preemption wait, not a wakeup wait.
    pub preempted: u32,
    pub _pad: u32,
}

/// Aggregation key: a process (or thread) in one interval generation.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SchedKey {
    /// tgid, or tid with `--threads`.
    pub id: u32,
    pub gen: u32,
}

/// Aggregated value per key.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedVal {
    /// `comm` of the thread that created the key, replaced by the new name when the task
    /// execs (`sched_process_exec`).
    pub comm: [u8; COMM_LEN],
    /// The name right before the last exec seen in this interval (all zero: no exec), so a row
    /// that spans an exec can show both.
    pub exec_from: [u8; COMM_LEN],
    pub tgid: u32,
    pub _pad: u32,
    /// Switches counted in `nvcsw` by the kernel.
    pub voluntary: u64,
    /// Switches counted in `nivcsw` by the kernel.
    pub involuntary: u64,
    /// Increase of `se.nr_migrations` (moves to another CPU).
    pub migrations: u64,
    /// Run-queue waits that began with a wakeup (the previous switch-out was voluntary).
    pub wake: LatHist,
    /// Run-queue waits that began with a preemption (the task stayed runnable).
    pub preempt: LatHist,
}

impl SchedVal {
    pub const ZERO: SchedVal = SchedVal {
        comm: [0; COMM_LEN],
        exec_from: [0; COMM_LEN],
        tgid: 0,
        _pad: 0,
        voluntary: 0,
        involuntary: 0,
        migrations: 0,
        wake: LatHist::ZERO,
        preempt: LatHist::ZERO,
    };
}

/// Who took the CPU from whom: counted on involuntary switches.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PreemptKey {
    /// Aggregation id of the task switched out (tgid, or tid with `--threads`).
    pub victim: u32,
    /// tgid of the task switched in (0: the idle task).
    pub by: u32,
    pub gen: u32,
    pub _pad: u32,
}

/// Byte offsets into `struct task_struct`, computed in userspace from the kernel's BTF.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskOffsets {
    pub pid: u32,
    pub tgid: u32,
    pub nvcsw: u32,
    pub nivcsw: u32,
    /// `sched_info.run_delay`.
    pub run_delay: u32,
    /// `se.nr_migrations`.
    pub nr_migrations: u32,
    /// `start_time` (CLOCK_MONOTONIC ns at fork).
    pub start_time: u32,
    pub _pad: u32,
}

crate::impl_pod!(TaskSnap, SchedKey, SchedVal, PreemptKey, TaskOffsets);

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(size_of::<TaskSnap>(), 40);
        assert_eq!(size_of::<SchedKey>(), 8);
        assert_eq!(size_of::<PreemptKey>(), 16);
        assert_eq!(size_of::<TaskOffsets>(), 32);
        assert_eq!(size_of::<SchedVal>(), 64 + 2 * size_of::<LatHist>());
    }
}
