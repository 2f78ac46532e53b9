//! `sched` kernel programs, the one object behind both `ctxsw` and `runq-lat` (they differ
//! only in userspace, and in flags: ctxsw records who preempted whom and, with `--threads`,
//! who woke whom; runq-lat records whom each wait after a wakeup was spent behind).
//!
//! Hooks: `sched:sched_switch` (tp_btf, else raw_tp); `sched:sched_waking` and
//! `sched:sched_wakeup_new` (wakeup timestamps); `sched:sched_process_free` (to forget a task's
//! snapshot once its tid can be reused) and `sched:sched_process_exec` (rare: renames the task's
//! aggregate to the new program, keeping the old name, so a row is not reported under the name
//! of the shell that exec'd it). The wakeup side and the switch-in's wait are in `sched/wake.rs`,
//! the process-life hooks in `sched/life.rs`; the switch-out and the aggregates here.
//!
//! Counts: the kernel already counts, per task, voluntary (`nvcsw`) and involuntary (`nivcsw`)
//! switches, the time spent waiting on a run queue (`sched_info.run_delay`) and CPU migrations
//! (`se.nr_migrations`). At `sched_switch` the outgoing task's counters are already updated for
//! this switch (`++*switch_count` precedes the tracepoint), so diffing them against a per-task
//! snapshot yields exact counts, including the one case the tracepoint's arguments cannot tell
//! right (a task going to sleep with a signal pending is counted voluntary by the kernel
//! although `prev_state` reads TASK_RUNNING, kernels >= 6.13, `try_to_block_task`).
//!
//! Waits (issue #17): `run_delay` is measured on the run queue's clock, which `__schedule` does
//! not update after a wakeup asked to preempt the running task (`rq_clock_skip_update` in
//! `wakeup_preempt`/`check_preempt_curr`): the woken task's wait then reads as zero although the
//! waker kept the CPU until its next preemption point. So a wait after a wakeup is timed on the
//! wall clock: `sched_waking` stores `bpf_ktime_get_ns()` in a tid-indexed array slot (no hash:
//! an array lookup is inlined by the verifier, a few instructions), the wakee's switch-in turns
//! it into the wait and records the task switched out there as the one it waited behind (the
//! culprit), and the wakee's switch-out records the wait with its counters (one aggregate
//! lookup per run, as before). Waits after a preemption stay the kernel's `run_delay` (its clock
//! is up to date there), and the kernel's `run_delay` total is kept beside them.
//!
//! Why `sched_waking`, not `sched_wakeup`: it runs in the waker's context on every kernel (the
//! waker is known), and the wait starts when the wakeup was issued (for a wakeup sent to an idle
//! CPU by IPI: with the IPI and the idle exit, which runqlat leaves out).
//!
//! Verifier discipline (start-up, and the 6.1 verifier's complexity limits): every path ends in
//! one shared tail with no path-specific constants in live registers; choices that feed the tail
//! are made by arithmetic on `opaque` values, not by branches.
//!
//! Fields read from `struct task_struct` (offsets from /sys/kernel/btf/vmlinux, `TaskOffsets`):
//! `pid`, `tgid`, `nvcsw`, `nivcsw`, `sched_info.run_delay`, `se.nr_migrations`, `start_time`.
//!
//! CPU steal (guests, runq-lat's culprits): the time a wait was spent with the vCPU not running
//! at all is the hypervisor's, not the task's on it. Each wait's steal is the difference of its
//! run queue's steal clock (`rq->prev_steal_time_rq`, via `se.cfs_rq` and `cfs_rq.rq`, which
//! exist with CONFIG_FAIR_GROUP_SCHED and CONFIG_PARAVIRT_TIME_ACCOUNTING) between the enqueue
//! (`sched:sched_wakeup`, attached only then, or `sched_wakeup_new`) and the switch-in; it is
//! charged to `STEAL_ID` and taken off the holders. On a 2-vCPU guest with 18 % steal a 0.5 ms
//! burster was charged 7.8 ms per long wait of a page-cache writer before.
//!
//! Node time (`SCHED_NODE_TIME`, `numa` run beside ctxsw or runq-lat): the switch also records
//! the run that ends on this CPU's node (`probes_ebpf::node_time`, the code of numa's own
//! switch program) into `NUMA_AGG`, so `numa` attaches no `sched_switch` program of its own and
//! a switch pays one program, one pid filter and one read of `prev`'s identity for all three.

#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel,
    },
    macros::{btf_tracepoint, map, raw_tracepoint},
    maps::{Array, HashMap, PerCpuArray},
    programs::{BtfTracePointContext, RawTracePointContext},
};
use probes_common::{
    hist::{opaque, LatHist},
    numa::Stint,
    sched::{
        Holders, PairKey, PairVal, SchedKey, SchedVal, TaskOffsets, TaskSnap, WakeSlot,
        STAT_IDLE_SWITCHES, STEAL_ID, STAT_NO_BASELINE, STAT_PAIR_MAP_FULL, WAKE_OWN, WAKE_WAITED,
    },
    stats,
};
use probes_ebpf::{
    allowed, atomic_add, generation, get_or_insert, hist_record, kread,
    node_time::RunCfg,
    ro, slot, stat,
};

#[no_mangle]
static SCHED_OFFS: TaskOffsets = TaskOffsets::ZERO;
/// CLOCK_MONOTONIC ns just before load: tasks started later have all counters from zero.
#[no_mangle]
static SCHED_START_NS: u64 = 0;
#[no_mangle]
static SCHED_PER_THREAD: u8 = 0;
/// Record who preempted whom (ctxsw).
#[no_mangle]
static SCHED_PREEMPTORS: u8 = 0;
/// Record whom each wait after a wakeup was spent behind (runq-lat, ctxsw).
#[no_mangle]
static SCHED_CULPRITS: u8 = 0;
/// Waits after a wakeup shorter than this are not attributed to a culprit (set by userspace;
/// see `tools::sched` for the value and why).
#[no_mangle]
static SCHED_CULPRIT_MIN_NS: u64 = 0;
/// Waits of this long or more are also charged to `LATE_CULPRITS` (the harm model's floor of a
/// late wait, see `report::harm` for the value and why).
#[no_mangle]
static SCHED_LATE_MIN_NS: u64 = u64::MAX;
/// Charge the part of each wait the hypervisor ran another vCPU (CPU steal) to `STEAL_ID`
/// instead of the task on this CPU (set by userspace with `SCHED_CULPRITS` on a guest whose
/// kernel has a run-queue steal clock).
#[no_mangle]
static SCHED_STEAL: u8 = 0;
/// Time waits after a wakeup from `sched_wakeup` (the task on its run queue), as runqlat and
/// `perf sched` do, instead of from `sched_waking` (runq-lat `--from wakeup`).
#[no_mangle]
static SCHED_FROM_WAKEUP: u8 = 0;
/// Record who woke whom (ctxsw --threads).
#[no_mangle]
static SCHED_WAKERS: u8 = 0;
/// `WAKE` has `mask + 1` slots (a power of two); a slot is `tid & mask`.
#[no_mangle]
static SCHED_WAKE_MASK: u32 = 0;
/// The tracepoint passes `prev_state` (kernels ≥ 5.18).
#[no_mangle]
static SCHED_HAS_STATE: u8 = 1;
/// Record each run's on-CPU time per NUMA node in `NUMA_AGG` (for `numa`).
#[no_mangle]
static SCHED_NODE_TIME: u8 = 0;

/// `sched_switch`'s `prev_state` argument (the 4th), or 0 on kernels that do not pass it.
///
/// KERNEL-NOTES: `prev_state` was appended to the tracepoint's arguments in 5.18 (commit
/// 9c2136be0878, "sched/tracing: Append prev_state to tp args instead"). Before that, any read of
/// ctx[3] sinks the whole tool: the 5.10 verifier refuses the tp_btf program ("func
/// 'sched_switch' doesn't have 4-th argument") and `bpf_raw_tracepoint_open` refuses the raw_tp
/// one with EINVAL (the program reads past `num_args * 8` bytes of context). So the read sits
/// behind a branch on a frozen read-only global: with `SCHED_HAS_STATE` = 0 the verifier knows
/// the branch is dead, never checks the read, and records no context access beyond ctx[2].
#[inline(always)]
fn prev_state(read: impl FnOnce() -> u64) -> u64 {
    if ro(&SCHED_HAS_STATE) != 0 {
        read() & 0xffff_ffff
    } else {
        0
    }
}

/// Per-task counters at the previous switch-out, by tid, sized by userspace from pid_max;
/// entries are removed at `sched_process_free`. Not preallocated: preallocating 32 Ki entries
/// cost 1.1-5 ms of start-up (strace -T on BPF_MAP_CREATE), and only a task's first switch
/// inserts (the per-switch lookup is the same code either way). Kernels before 6.1 allocate
/// with kmalloc there; for tp_btf (BPF_PROG_TYPE_TRACING) that is allowed silently, for the
/// raw_tp fallback 5.x kernels print a one-time "trace type BPF program uses run-time
/// allocation" warning and PREEMPT_RT kernels refuse the program.
///
/// Not task-local storage: it exists from 5.11 (tracing programs: 5.12), an object holding one
/// fails to load whole on 5.10, and raw_tp programs cannot pass `next` to it (untyped pointer).
#[map]
static TASKS: HashMap<u32, TaskSnap> = HashMap::with_max_entries(16384, BPF_F_NO_PREALLOC);

/// The last wakeup of each task and, once it ran, its wait, at `tid & SCHED_WAKE_MASK`. An
/// array, not a hash: the wakeup and both ends of the switch touch it, and an array lookup
/// compiles to a bounds check and an add.
#[map]
static WAKE: Array<WakeSlot> = Array::with_max_entries(65536, 0);

/// Aggregates per process (or thread) and generation, sized by userspace (`--max-keys` × 2).
#[map]
static SCHED_AGG: HashMap<SchedKey, SchedVal> = HashMap::with_max_entries(8192, BPF_F_NO_PREALLOC);

/// What did not fit `SCHED_AGG`, one row per generation: the `[other]` row.
#[map]
static SCHED_OTHER: Array<SchedVal> = Array::with_max_entries(2, 0);

/// Initial value for new aggregate keys.
#[map]
static SCHED_SCRATCH: PerCpuArray<SchedVal> = PerCpuArray::with_max_entries(1, 0);

/// Who held each CPU lately (for charging a wait to the tasks that ran meanwhile).
#[map]
static HOLDERS: PerCpuArray<Holders> = PerCpuArray::with_max_entries(1, 0);

/// Involuntary switches by (victim, preemptor), ctxsw only.
#[map]
static PREEMPTORS: HashMap<PairKey, PairVal> =
    HashMap::with_max_entries(8192, BPF_F_NO_PREALLOC);

/// Waits after a wakeup by (victim, a task that held the CPU meanwhile): waits and the part of
/// them, in wall-clock ns, that task ran. Not filtered in the kernel (the victim's switch-in
/// runs in another task's context, where `--comm` cannot be checked): userspace keeps the
/// victims it has rows for.
#[map]
static CULPRITS: HashMap<PairKey, PairVal> = HashMap::with_max_entries(8192, BPF_F_NO_PREALLOC);

/// As `CULPRITS`, for the long waits only (`SCHED_LATE_MIN_NS` or more): who held the CPU
/// during the waits a latency-sensitive victim felt, which the short waits' holders (the
/// task it usually follows) need not be.
#[map]
static LATE_CULPRITS: HashMap<PairKey, PairVal> =
    HashMap::with_max_entries(8192, BPF_F_NO_PREALLOC);

/// Wakeups by (waker, wakee), ctxsw --threads only.
#[map]
static WAKERS: HashMap<PairKey, PairVal> = HashMap::with_max_entries(8192, BPF_F_NO_PREALLOC);

// Node time (`SCHED_NODE_TIME`), as numa's own object keeps it; sized by userspace (one
// entry each when off).

probes_ebpf::node_time_maps!(1);

/// How task fields are read: direct loads (tp_btf, where the verifier knows the pointer's BTF
/// type and checks each load against the struct layout) or `bpf_probe_read_kernel` (raw_tp).
trait Reader {
    /// The same reader for the shared helpers (`probes_ebpf::node_time`).
    type K: kread::Kread;
    fn u64(task: *const u8, off: u32) -> u64;
    fn i32(task: *const u8, off: u32) -> i32;
}

struct Direct;
struct Probe;

impl Reader for Direct {
    type K = kread::Direct;
    #[inline(always)]
    fn u64(task: *const u8, off: u32) -> u64 {
        // SAFETY: `task` is a BTF-typed task_struct pointer from a tp_btf argument and `off` a
        // member offset from the kernel's own BTF; the verifier checks the access and turns a
        // faulting load into a zero.
        unsafe { core::ptr::read_volatile(task.add(off as usize) as *const u64) }
    }
    #[inline(always)]
    fn i32(task: *const u8, off: u32) -> i32 {
        // SAFETY: as above.
        unsafe { core::ptr::read_volatile(task.add(off as usize) as *const i32) }
    }
}

impl Reader for Probe {
    type K = kread::Probe;
    #[inline(always)]
    fn u64(task: *const u8, off: u32) -> u64 {
        // SAFETY: the helper checks the address; a failed read yields 0.
        unsafe { bpf_probe_read_kernel(task.add(off as usize) as *const u64) }.unwrap_or(0)
    }
    #[inline(always)]
    fn i32(task: *const u8, off: u32) -> i32 {
        // SAFETY: as above.
        unsafe { bpf_probe_read_kernel(task.add(off as usize) as *const i32) }.unwrap_or(0)
    }
}

/// `TaskSnap::preempted` bit: the previous switch-out was involuntary (the next run-queue wait
/// is a preemption wait, not a wakeup wait).
const SNAP_PREEMPTED: u32 = 1;
/// `TaskSnap::preempted` bit: no counter baseline yet (first switch of a task that was running
/// before tracing began): the wait since the last switch-in is unknown.
const SNAP_NO_WAIT: u32 = 2;

/// Per-CPU fallback snapshot for a task whose first switch found `TASKS` full.
#[map]
static SNAP_SCRATCH: PerCpuArray<TaskSnap> = PerCpuArray::with_max_entries(1, 0);

#[path = "sched/life.rs"]
mod life;
#[path = "sched/wake.rs"]
mod wake;
use life::{on_exec, on_exit, on_free};
use wake::{on_wakeup, on_waking, switch_in};

/// The id a row (or pair) uses for a task: its tgid, or its tid with `--threads`.
#[inline(always)]
fn row_id(tid: u32, tgid: u32) -> u32 {
    if ro(&SCHED_PER_THREAD) != 0 {
        tid
    } else {
        tgid
    }
}

/// The `WAKE` slot of `tid`.
#[inline(always)]
fn wake_slot(tid: u32) -> Option<*mut WakeSlot> {
    WAKE.get_ptr_mut(tid & ro(&SCHED_WAKE_MASK))
}

/// Adds `count` and `ns` to `key` of a pair map, creating it; a full map is counted.
#[inline(always)]
fn pair_add(map: &HashMap<PairKey, PairVal>, key: &PairKey, count: u64, ns: u64) {
    match get_or_insert(map, key, &PairVal::default()) {
        // SAFETY: a live map value pointer from the lookup just above.
        Some(v) => unsafe {
            atomic_add(&raw mut (*v).count, count);
            if ns != 0 {
                atomic_add(&raw mut (*v).ns, ns);
            }
        },
        None => stat(STAT_PAIR_MAP_FULL),
    }
}

/// 1 if `a == b`, else 0, without a branch (`a ^ b` is below 2^32, so `- 1` only sets the top
/// bit when it is zero).
#[inline(always)]
fn eq01(a: u32, b: u32) -> u64 {
    ((a ^ b) as u64).wrapping_sub(1) >> 63
}

/// `sched_switch(preempt, prev, next, prev_state)`.
///
/// Shaped for the verifier: every path reaches one shared tail with a pointer to a baseline
/// snapshot (`TASKS`, or the per-CPU fallback) and no path-specific constants, so the verifier
/// walks the tail a handful of times instead of once per combination of branches (17,153
/// verified instructions before, ~21 ms of start-up). The first-switch cases only differ in the
/// baseline they write (see `first_switch`).
#[inline(always)]
fn on_switch<R: Reader>(preempt: bool, prev: *const u8, next: *const u8, prev_state: u64) {
    switch_in::<R>(prev, next);
    let o = ro(&SCHED_OFFS);
    let node_time = ro(&SCHED_NODE_TIME) != 0;
    let cfg = RunCfg {
        offs: o.run,
        per_thread: ro(&SCHED_PER_THREAD) != 0,
        start_ns: ro(&SCHED_START_NS),
    };
    // A plain value on both paths: 5.10's verifier refuses a read of a stack slot one path
    // left unwritten (an `Option` whose payload only one arm writes).
    let stint = if node_time {
        NODES
            .switch_in::<R::K>(next as u64, o.pid, &cfg)
            .unwrap_or_default()
    } else {
        Stint::default()
    };
    let tid = R::i32(prev, o.pid) as u32;
    if tid == 0 {
        // The idle task: not a process, but its switches count in the system total.
        stat(STAT_IDLE_SWITCHES);
        return;
    }
    let tgid = R::i32(prev, o.tgid) as u32;
    if !allowed(tgid) {
        return;
    }
    stat(stats::EVENTS);
    if node_time {
        NODES.switch_out::<R::K>(prev as u64, tid, tgid, stint, &cfg);
    }
    let now = TaskSnap {
        nvcsw: R::u64(prev, o.nvcsw),
        nivcsw: R::u64(prev, o.nivcsw),
        run_delay: R::u64(prev, o.run_delay),
        nr_migrations: R::u64(prev, o.nr_migrations),
        preempted: 0,
        _pad: 0,
    };
    let s = match TASKS.get_ptr_mut(tid) {
        Some(s) => s,
        None => match first_switch::<R>(tid, prev, preempt, prev_state, &now) {
            Some(s) => s,
            None => return,
        },
    };
    // SAFETY: live map value; only this task's switch-out (one CPU at a time) writes it.
    let s = unsafe { &mut *s };
    let vol = now.nvcsw.wrapping_sub(s.nvcsw);
    let invol = now.nivcsw.wrapping_sub(s.nivcsw);
    let migr = now.nr_migrations.wrapping_sub(s.nr_migrations);
    let delay = now.run_delay.wrapping_sub(s.run_delay);
    let flags = s.preempted;
    s.nvcsw = now.nvcsw;
    s.nivcsw = now.nivcsw;
    s.run_delay = now.run_delay;
    s.nr_migrations = now.nr_migrations;
    // invol != 0, without a branch: the top bit of invol | -invol.
    s.preempted = ((invol | invol.wrapping_neg()) >> 63) as u32;
    // The `WAKE` slot of this task: the measured wait of the run that ends now (consumed
    // here), if its wakeup was seen. Its timestamp is left alone: a wakeup racing with this
    // very switch-out from another CPU ends the sleep that begins now. The index is always in
    // range; the check is for the verifier.
    let Some(w) = wake_slot(tid) else {
        return;
    };
    // SAFETY: a live array slot (see on_waking for the races).
    let w = unsafe { &mut *w };
    let wv = w.wait;
    let measured = opaque((wv >> 63) & eq01(w.tid, tid));
    if measured != 0 {
        w.wait = 0;
    }
    let wall = wv & !(WAKE_WAITED | WAKE_OWN);
    let own = opaque(((wv & WAKE_OWN) >> 62) & measured);

    let gen = generation();
    let key = SchedKey {
        id: row_id(tid, tgid),
        gen,
    };
    // `current` is still `prev` here.
    let Some(val) = agg_slot::<R>(prev, tgid, &key) else {
        return;
    };
    // Which wait this run began with, as 0/1 values the verifier cannot see as constants (so
    // the tail below is verified once, not once per combination).
    let has_wait = opaque((((flags & SNAP_NO_WAIT) >> 1) ^ 1) as u64);
    let preempted = opaque((flags & SNAP_PREEMPTED) as u64);
    // A wait after a wakeup is the wall-clock one when its wakeup was seen.
    let wall_used = opaque((1 - preempted) * measured);
    let wait = delay.wrapping_add(wall.wrapping_sub(delay).wrapping_mul(wall_used));
    // SAFETY: `val` is a live map value pointer.
    unsafe {
        if vol != 0 {
            atomic_add(&raw mut (*val).voluntary, vol);
        }
        if invol != 0 {
            atomic_add(&raw mut (*val).involuntary, invol);
        }
        if migr != 0 {
            atomic_add(&raw mut (*val).migrations, migr);
        }
        if own != 0 {
            atomic_add(&raw mut (*val).own_wakeups, 1);
        }
        if has_wait != 0 {
            if delay != 0 {
                atomic_add(&raw mut (*val).run_delay_ns, delay);
            }
            if (1 - preempted) * (1 - measured) != 0 {
                atomic_add(&raw mut (*val).wake_unmeasured, 1);
            }
            // `preempt` follows `wake` in SchedVal: pick it by offset, not by branch, so the
            // histogram update is verified once.
            let h = (&raw mut (*val).wake as *mut u8)
                .add(preempted as usize * core::mem::size_of::<LatHist>())
                as *mut LatHist;
            hist_record(h, wait);
        }
    }

    if invol != 0 && ro(&SCHED_PREEMPTORS) != 0 {
        let (btid, btgid) = if next.is_null() {
            (0, 0)
        } else {
            (R::i32(next, o.pid) as u32, R::i32(next, o.tgid) as u32)
        };
        let pk = PairKey {
            a: key.id,
            a_tgid: tgid,
            b: row_id(btid, btgid),
            b_tgid: btgid,
            gen,
            _pad: 0,
        };
        pair_add(&PREEMPTORS, &pk, invol, 0);
    }
}

/// The aggregate of `key` (created for `task`, which must be `current`, if new; the `[other]`
/// row when the map is full).
#[inline(always)]
fn agg_slot<R: Reader>(task: *const u8, tgid: u32, key: &SchedKey) -> Option<*mut SchedVal> {
    let s = slot(&SCHED_AGG, &SCHED_OTHER, &SCHED_SCRATCH, key, key.gen, |init| {
        // SAFETY: this CPU's scratch slot; only the identity fields are ever written, so its
        // counters stay zero.
        unsafe {
            (*init).comm = bpf_get_current_comm().unwrap_or_default();
            (*init).tgid = tgid;
            (*init).born_ns = born_ns::<R>(task);
        }
    })?;
    Some(s.ptr)
}

/// When a row's task started: the thread's `start_time` with `--threads`, else its group
/// leader's (the process's). Read once per key, when it is created.
#[inline(always)]
fn born_ns<R: Reader>(task: *const u8) -> u64 {
    let o = ro(&SCHED_OFFS);
    if ro(&SCHED_PER_THREAD) != 0 {
        return R::u64(task, o.start_time);
    }
    let leader = R::u64(task, o.group_leader) as *const u8;
    // SAFETY: the helper checks the address (a leader pointer loaded as a plain number has no
    // BTF type left for a direct load); a failed read yields 0, i.e. "before the window".
    unsafe { bpf_probe_read_kernel(leader.wrapping_add(o.start_time as usize) as *const u64) }
        .unwrap_or(0)
}

/// The first switch-out of `tid` seen: stores a baseline in `TASKS` chosen so that the shared
/// tail's differences come out right, and returns it (or the per-CPU fallback when `TASKS` is
/// full).
/// - Task started under tracing: every counter began at zero at fork, so the baseline is zero
///   and the current values are exactly what happened since (first run's wait included).
/// - Otherwise: this switch is classified from the tracepoint's arguments (`preempt`, or
///   `prev_state` running) and its wait is unknown (`SNAP_NO_WAIT`).
#[inline(always)]
fn first_switch<R: Reader>(
    tid: u32,
    prev: *const u8,
    preempt: bool,
    prev_state: u64,
    now: &TaskSnap,
) -> Option<*mut TaskSnap> {
    let o = ro(&SCHED_OFFS);
    let born_after = R::u64(prev, o.start_time) >= ro(&SCHED_START_NS);
    let by_args_invol = (preempt || (ro(&SCHED_HAS_STATE) != 0 && prev_state == 0)) as u64;
    let by_args = TaskSnap {
        nvcsw: now.nvcsw.wrapping_sub(1 - by_args_invol),
        nivcsw: now.nivcsw.wrapping_sub(by_args_invol),
        run_delay: now.run_delay,
        nr_migrations: now.nr_migrations,
        preempted: SNAP_NO_WAIT,
        _pad: 0,
    };
    if !born_after {
        stat(STAT_NO_BASELINE);
    }
    let base = if born_after {
        TaskSnap::default()
    } else {
        by_args
    };
    if TASKS.insert(tid, base, 0).is_ok() {
        if let Some(s) = TASKS.get_ptr_mut(tid) {
            return Some(s);
        }
    }
    stat(stats::START_MAP_FULL);
    let s = SNAP_SCRATCH.get_ptr_mut(0)?;
    // SAFETY: this CPU's scratch slot, owned by this program run.
    unsafe { *s = by_args };
    Some(s)
}

// Entry points: tp_btf where the kernel has BTF for the tracepoint, raw_tp otherwise.

#[btf_tracepoint(function = "sched_switch")]
pub fn tk_sched_switch(ctx: BtfTracePointContext) -> i32 {
    on_switch::<Direct>(
        ctx.arg::<u64>(0) & 1 != 0,
        ctx.arg(1),
        ctx.arg(2),
        prev_state(|| ctx.arg::<u64>(3)),
    );
    0
}

#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn tk_sched_switch_raw(ctx: RawTracePointContext) -> i32 {
    on_switch::<Probe>(
        ctx.arg::<u64>(0) & 1 != 0,
        ctx.arg(1),
        ctx.arg(2),
        prev_state(|| ctx.arg::<u64>(3)),
    );
    0
}

#[btf_tracepoint(function = "sched_waking")]
pub fn tk_sched_waking(ctx: BtfTracePointContext) -> i32 {
    on_waking::<Direct>(ctx.arg(0), false);
    0
}

#[raw_tracepoint(tracepoint = "sched_waking")]
pub fn tk_sched_waking_raw(ctx: RawTracePointContext) -> i32 {
    on_waking::<Probe>(ctx.arg(0), false);
    0
}

#[btf_tracepoint(function = "sched_wakeup")]
pub fn tk_sched_wakeup(ctx: BtfTracePointContext) -> i32 {
    on_wakeup::<Direct>(ctx.arg(0));
    0
}

#[raw_tracepoint(tracepoint = "sched_wakeup")]
pub fn tk_sched_wakeup_raw(ctx: RawTracePointContext) -> i32 {
    on_wakeup::<Probe>(ctx.arg(0));
    0
}

#[btf_tracepoint(function = "sched_wakeup_new")]
pub fn tk_sched_wakeup_new(ctx: BtfTracePointContext) -> i32 {
    on_waking::<Direct>(ctx.arg(0), true);
    0
}

#[raw_tracepoint(tracepoint = "sched_wakeup_new")]
pub fn tk_sched_wakeup_new_raw(ctx: RawTracePointContext) -> i32 {
    on_waking::<Probe>(ctx.arg(0), true);
    0
}

#[btf_tracepoint(function = "sched_process_free")]
pub fn tk_sched_free(ctx: BtfTracePointContext) -> i32 {
    on_free::<Direct>(ctx.arg(0));
    0
}

#[raw_tracepoint(tracepoint = "sched_process_free")]
pub fn tk_sched_free_raw(ctx: RawTracePointContext) -> i32 {
    on_free::<Probe>(ctx.arg(0));
    0
}

#[btf_tracepoint(function = "sched_process_exit")]
pub fn tk_sched_exit(ctx: BtfTracePointContext) -> i32 {
    on_exit::<Direct>(ctx.arg(0));
    0
}

#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn tk_sched_exit_raw(ctx: RawTracePointContext) -> i32 {
    on_exit::<Probe>(ctx.arg(0));
    0
}

#[btf_tracepoint(function = "sched_process_exec")]
pub fn tk_sched_exec(_ctx: BtfTracePointContext) -> i32 {
    on_exec();
    0
}

#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn tk_sched_exec_raw(_ctx: RawTracePointContext) -> i32 {
    on_exec();
    0
}
