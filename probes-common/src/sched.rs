//! `ctxsw` and `runq-lat`: shared types for the `sched` programs.
//!
//! Counts and the preemption waits come from the kernel's own per-task counters (`nvcsw`,
//! `nivcsw`, `sched_info.run_delay`, `se.nr_migrations`), diffed at each switch-out against a
//! per-task snapshot: that is what makes the counts agree with `/proc/<pid>/status` and the
//! kernel's run-delay total with `/proc/<pid>/schedstat` by construction.
//!
//! Waits after a wakeup are timed on the wall clock instead (issue #17): `run_delay` runs on the
//! run queue's clock, which the scheduler does not update when a wakeup preempts the running
//! task, so those waits read as zero. A timestamp taken at `sched_waking` (or
//! `sched_wakeup_new`) is kept in a tid-indexed [`WakeSlot`] and consumed at the task's
//! switch-in, where the wait is charged to the tasks that held the CPU meanwhile ([`Holders`],
//! see `probes-ebpf/src/bin/sched.rs`).

use crate::{hist::LatHist, COMM_LEN};

/// Per-CPU stats slot (see [`crate::stats`], which reserves 5..8 for tools): a new pair did not
/// fit one of the pair maps (preemptors, wait culprits, wakers).
pub const STAT_PAIR_MAP_FULL: u32 = 5;
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
    /// Bit 0: the previous switch-out was involuntary (the task stayed runnable), so the next
    /// wait on the run queue is a preemption wait, not a wakeup wait. Bit 1: no baseline.
    pub preempted: u32,
    pub _pad: u32,
}

/// `WakeSlot::wait` bit: the slot holds a measured wait (set at the switch-in, consumed at the
/// switch-out).
pub const WAKE_WAITED: u64 = 1 << 63;
/// `WakeSlot::wait` bit: the wakeup that ended the wait came from a thread of the same process.
pub const WAKE_OWN: u64 = 1 << 62;

/// A task's last wakeup and, once it ran, the wait it measured (`WAKE` array, indexed by
/// `tid & mask`, tagged with the tid: a slot shared by two live tids is simply overwritten and
/// the loser's wait falls back to the kernel's `run_delay`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WakeSlot {
    pub tid: u32,
    /// tgid of the task that woke it (`current` at `sched_waking`), 0 for a new task.
    pub waker_tgid: u32,
    /// `bpf_ktime_get_ns()` at the last wakeup not yet followed by a switch-in; 0: none.
    pub ts: u64,
    /// The wait of the current run in ns, with [`WAKE_WAITED`] (and [`WAKE_OWN`]); 0: none.
    pub wait: u64,
    /// The run queue the wakeup put the task on (`struct rq *`, read at `sched_wakeup` when
    /// steal is charged) and that queue's steal clock then (`rq->prev_steal_time_rq`, fresh:
    /// the enqueue has just updated the queue's clock); `steal_rq` 0: not read.
    pub steal_rq: u64,
    pub steal: u64,
}

/// The holder a wait is charged to for the part of it the hypervisor ran another vCPU (CPU
/// steal, measured on the run queue's steal clock): no task id reaches it (pid_max is at most
/// 2^22), and no one on the node can be reniced for it.
pub const STEAL_ID: u32 = u32::MAX;

/// Who held a CPU lately (`HOLDERS`, per CPU): the task running since `since`, and the one
/// before it since `before_since`. Ids are tgids, or tids with `--threads`; 0: idle.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Holders {
    pub id: u32,
    pub tgid: u32,
    pub since: u64,
    pub before_id: u32,
    pub before_tgid: u32,
    pub before_since: u64,
    /// This CPU's steal clock at `since` and at `before_since` (when steal is charged).
    pub steal_at: u64,
    pub before_steal_at: u64,
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
    /// Increase of the kernel's `sched_info.run_delay` over the waits recorded here: what
    /// `/proc/<pid>/schedstat` says (it misses most of a wait after a wakeup that preempts).
    pub run_delay_ns: u64,
    /// Waits after a wakeup whose wakeup was not seen (before tracing, a shared slot): timed by
    /// `run_delay` instead of the wall clock.
    pub wake_unmeasured: u64,
    /// Wakeups by a thread of the same process (`sched_waking`'s `current`).
    pub own_wakeups: u64,
    /// When the process (the thread with `--threads`) started: `task_struct.start_time` of its
    /// group leader (CLOCK_MONOTONIC), read when the key is created. Rates are per second of
    /// a task's life in the window, which begins at the later of this and the window's start.
    pub born_ns: u64,
    /// When the process died (`sched_process_exit` of its last thread, `signal->live` down to
    /// zero; the thread's own exit with `--threads`); 0: not in this generation.
    pub exit_ns: u64,
    /// Run-queue waits that began with a wakeup, wakeup to running on the wall clock.
    pub wake: LatHist,
    /// Run-queue waits that began with a preemption (the task stayed runnable), by `run_delay`.
    /// Must follow `wake`: the programs pick one of the two by offset.
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
        run_delay_ns: 0,
        wake_unmeasured: 0,
        own_wakeups: 0,
        born_ns: 0,
        exit_ns: 0,
        wake: LatHist::ZERO,
        preempt: LatHist::ZERO,
    };

    /// Adds `o`'s counters and histograms (identity fields kept; a sum of tasks has no one
    /// life, so `born_ns` and `exit_ns` keep `self`'s).
    pub fn add(&mut self, o: &SchedVal) {
        crate::add_counters!(self, o; voluntary, involuntary, migrations, run_delay_ns,
            wake_unmeasured, own_wakeups);
        self.wake.merge(&o.wake);
        self.preempt.merge(&o.preempt);
    }
}

/// Two tasks in one interval: victim and preemptor (`PREEMPTORS`), victim and the task it
/// waited behind after a wakeup (`CULPRITS`), waker and wakee (`WAKERS`). Ids are tgids, or
/// tids with `--threads`; the tgids name the processes either way.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PairKey {
    pub a: u32,
    pub a_tgid: u32,
    pub b: u32,
    pub b_tgid: u32,
    pub gen: u32,
    pub _pad: u32,
}

/// Events of a pair, and the time they cost (waits; 0 for preemptions and wakeups).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PairVal {
    pub count: u64,
    pub ns: u64,
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
    /// `group_leader` (the process's first thread, whose `start_time` is the process's).
    pub group_leader: u32,
    /// `signal` and `signal_struct.live` (threads not yet exited; zero at the tracepoint
    /// `sched_process_exit` of the last one, decremented just before it in `do_exit`).
    pub signal: u32,
    pub signal_live: u32,
    /// The steal clock of a task's run queue: `task_struct.se.cfs_rq` (CONFIG_FAIR_GROUP_SCHED),
    /// `cfs_rq.rq`, `rq.prev_steal_time_rq` (CONFIG_PARAVIRT_TIME_ACCOUNTING); read only when
    /// `SCHED_STEAL` is set.
    pub se_cfs_rq: u32,
    pub cfs_rq_rq: u32,
    pub rq_steal: u32,
    /// What a run's length is read from, when the object records node time for `numa`.
    pub run: crate::numa::RunOffsets,
}

impl TaskOffsets {
    /// All zero: the initial value of a program's offsets global, patched by userspace before
    /// load.
    pub const ZERO: TaskOffsets = TaskOffsets {
        pid: 0,
        tgid: 0,
        nvcsw: 0,
        nivcsw: 0,
        run_delay: 0,
        nr_migrations: 0,
        start_time: 0,
        group_leader: 0,
        signal: 0,
        signal_live: 0,
        se_cfs_rq: 0,
        cfs_rq_rq: 0,
        rq_steal: 0,
        run: crate::numa::RunOffsets::ZERO,
    };
}

crate::gen_keys!(SchedKey, PairKey);
crate::impl_pod!(
    TaskSnap,
    WakeSlot,
    Holders,
    SchedKey,
    SchedVal,
    PairKey,
    PairVal,
    TaskOffsets
);

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(size_of::<TaskSnap>(), 40);
        assert_eq!(size_of::<WakeSlot>(), 40);
        assert_eq!(size_of::<Holders>(), 48);
        assert_eq!(size_of::<SchedKey>(), 8);
        assert_eq!(size_of::<PairKey>(), 24);
        assert_eq!(size_of::<PairVal>(), 16);
        assert_eq!(size_of::<TaskOffsets>(), 64);
        assert_eq!(
            size_of::<SchedVal>(),
            2 * COMM_LEN + 8 + 8 * 8 + 2 * size_of::<LatHist>()
        );
        // The programs pick `preempt` by offset from `wake`.
        let v = SchedVal::ZERO;
        let (w, p) = (&raw const v.wake as usize, &raw const v.preempt as usize);
        assert_eq!(p - w, size_of::<LatHist>());
    }
}
