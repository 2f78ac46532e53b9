//! `why` kernel programs: where the wall-clock time of the threads in scope goes, from one pass
//! over the scheduler's events (the state machine is described in `probes_common::why`).
//!
//! - `tk_why_switch` (`sched:sched_switch`, tp_btf else raw_tp): the outgoing thread (`prev`,
//!   still `current`) ends its running interval and becomes runnable (a preemption, a yield,
//!   `prev_state` TASK_RUNNING), blocked (with its kernel stack, `bpf_get_stackid`) or gone
//!   (after `sched_process_exit`); the incoming one (`next`) ends its runnable interval, whose
//!   culprit is `prev` (it held the CPU last), or its block when the wakeup was not seen.
//! - `tk_why_waking` (`sched:sched_waking`, in the waker's context): a blocked thread's block
//!   ends; its culprit is the waker (`current`).
//! - `tk_why_wakeup_new` (`sched:sched_wakeup_new`): a thread created in scope starts runnable.
//! - `tk_why_exit` (`sched:sched_process_exit`, in the exiting thread): its running interval
//!   ends there, and its last switch-out forgets it.
//! - `tk_why_{direct,memcg}_{begin,end}` (`vmscan:mm_vmscan_*_reclaim_begin/end`, in the
//!   reclaiming thread): its time on a CPU inside reclaim is memory time (`RECLAIM_RUN`), as
//!   `memstall` times it; blocks inside reclaim are memory by their stack anyway.
//!
//! The pid filter comes first: only threads in `WHY_TASKS` cost more than one hash lookup, and
//! only a thread whose process passes `--pid`/`--comm` gets there. With `--pid N` alone the
//! filter is a compare of tgids (`may_pass_pid`) on the outgoing, incoming and woken task, and
//! another process's switch costs no lookup at all. Task fields read:
//! `task_struct.pid` and `.tgid` (offsets from BTF).
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map, raw_tracepoint},
    maps::{Array, HashMap, PerCpuArray, StackTrace},
    programs::{tracing::StackIdContext, BtfTracePointContext, RawTracePointContext},
};
use probes_common::{
    profile::NO_STACK,
    stats,
    why::{
        ByKey, ByVal, WhyKey, WhyTask, WhyVal, BLOCKED, EXITING, MEM_DIRECT, MEM_MEMCG,
        RECLAIM_RUN, RUNNABLE_PREEMPT, RUNNABLE_WAKEUP, RUNNING, STAT_BY_FULL, STAT_NO_WAKEUP,
        STAT_UNSEEN,
    },
};
use probes_ebpf::{
    allowed, atomic_add, filtering_pids, generation, get_or_insert_copy, hist_record, may_pass_pid,
    kread::{Direct, Kread, Probe},
    ro, slot, stat,
};

/// `task_struct.pid` and `.tgid`, from the kernel's BTF.
#[no_mangle]
static WHY_PID_OFF: u32 = 0;
#[no_mangle]
static WHY_TGID_OFF: u32 = 0;
/// The tracepoint passes `prev_state` (kernels ≥ 5.18; see `sched.rs` for why the read sits
/// behind this frozen flag). Without it every switch-out that is not a preemption is a block.
#[no_mangle]
static WHY_HAS_STATE: u8 = 1;

/// `TASK_DEAD` (include/linux/sched.h): the `prev_state` of an exiting task's last switch-out.
const TASK_DEAD: u64 = 0x80;

#[map]
static WHY_STACKS: StackTrace = StackTrace::with_max_entries(8192, 0);

/// Threads in scope by tid, sized by userspace, which seeds the threads alive at the start.
#[map]
static WHY_TASKS: HashMap<u32, WhyTask> = HashMap::with_max_entries(16384, BPF_F_NO_PREALLOC);

#[map]
static WHY_PARTS: HashMap<WhyKey, WhyVal> = HashMap::with_max_entries(16384, BPF_F_NO_PREALLOC);
#[map]
static WHY_OTHER: Array<WhyVal> = Array::with_max_entries(2, 0);
#[map]
static WHY_SCRATCH: PerCpuArray<WhyVal> = PerCpuArray::with_max_entries(1, 0);

#[map]
static WHY_BY: HashMap<ByKey, ByVal> = HashMap::with_max_entries(16384, BPF_F_NO_PREALLOC);

/// The id of the current kernel stack, or [`NO_STACK`] (a hash collision in a full stack map:
/// the block is then shown as `[stack not recorded]`, never under another wait).
#[inline(always)]
fn kernel_stack<C: StackIdContext>(ctx: &C) -> i32 {
    match ctx.get_stackid(&WHY_STACKS, 0) {
        Ok(id) => id as i32,
        Err(_) => NO_STACK,
    }
}

/// Adds one interval of `t`'s (thread `pid`) state `state` to its aggregate.
#[inline(always)]
fn credit(t: &WhyTask, pid: u32, state: u32, stack: i32, ns: u64, gen: u32) {
    let key = WhyKey {
        tgid: t.tgid,
        pid,
        state,
        stack,
        gen,
        _pad: 0,
    };
    let comm = t.comm;
    let init = |v: *mut WhyVal| {
        // SAFETY: this CPU's scratch slot (see `slot`); only the comm is written.
        unsafe { (*v).comm = comm };
    };
    if let Some(s) = slot(&WHY_PARTS, &WHY_OTHER, &WHY_SCRATCH, &key, gen, init) {
        // SAFETY: a live map value from this run.
        unsafe { hist_record(&raw mut (*s.ptr).hist, ns) };
    }
}

/// Adds `t`'s time on a CPU up to `now`: running, or reclaim when it is inside reclaim.
#[inline(always)]
fn credit_running(t: &WhyTask, pid: u32, now: u64, gen: u32) {
    let ns = now.saturating_sub(t.since_ns);
    if t.mem != 0 {
        credit(t, pid, RECLAIM_RUN, t.mem as i32, ns, gen);
    } else {
        credit(t, pid, RUNNING, NO_STACK, ns, gen);
    }
}

/// Charges `ns` of `t`'s interval to the current task (the waker, or the CPU's last holder).
#[inline(always)]
fn credit_by(t: &WhyTask, pid: u32, state: u32, stack: i32, ns: u64, gen: u32) {
    let cur = bpf_get_current_pid_tgid();
    let key = ByKey {
        tgid: t.tgid,
        pid,
        state,
        stack,
        by_tgid: (cur >> 32) as u32,
        by_pid: cur as u32,
        gen,
        _pad: 0,
    };
    let init = ByVal {
        by_comm: bpf_get_current_comm().unwrap_or([0; 16]),
        ns: 0,
        count: 0,
    };
    match get_or_insert_copy(&WHY_BY, &key, init) {
        // SAFETY: a live map value from this run.
        Some(v) => unsafe {
            atomic_add(&raw mut (*v).ns, ns);
            atomic_add(&raw mut (*v).count, 1);
        },
        None => stat(STAT_BY_FULL),
    }
}

#[inline(always)]
fn on_switch<C: StackIdContext, R: Kread>(ctx: &C, preempt: bool, next: u64, state: u64) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, pid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    // With --pid the filter comes first: a switch-out of a process out of scope costs one
    // lookup, and the clock is read only for threads in scope.
    if pid != 0 && (!filtering_pids() || allowed(tgid)) {
        on_switch_out(ctx, preempt, state, tgid, pid);
    }
    let npid = R::u32(next, ro(&WHY_PID_OFF));
    if npid == 0 || !may_pass_pid(|| R::u32(next, ro(&WHY_TGID_OFF))) {
        return;
    }
    let Some(t) = WHY_TASKS.get_ptr_mut(npid) else {
        return;
    };
    // SAFETY: a live map value; only this thread's own events change it.
    let t = unsafe { &mut *t };
    // SAFETY: no arguments; reads the monotonic clock.
    let now = unsafe { bpf_ktime_get_ns() };
    let gen = generation();
    let ns = now.saturating_sub(t.since_ns);
    match t.state {
        RUNNABLE_WAKEUP | RUNNABLE_PREEMPT => {
            let s = t.state;
            credit(t, npid, s, NO_STACK, ns, gen);
            credit_by(t, npid, s, NO_STACK, ns, gen);
        }
        BLOCKED => {
            stat(STAT_NO_WAKEUP);
            let stack = t.stack;
            credit(t, npid, BLOCKED, stack, ns, gen);
        }
        // Seeded as running (`R` in /proc) but it was waiting for a CPU.
        RUNNING => credit(t, npid, RUNNABLE_PREEMPT, NO_STACK, ns, gen),
        // Blocked since before tracing began, woken unseen.
        s => credit(t, npid, s, NO_STACK, ns, gen),
    }
    t.state = RUNNING;
    t.stack = NO_STACK;
    t.since_ns = now;
}

/// The outgoing thread (`current`, in scope as far as `--pid` goes) ends its time on the CPU.
#[inline(always)]
fn on_switch_out<C: StackIdContext>(ctx: &C, preempt: bool, state: u64, tgid: u32, pid: u32) {
    let runnable = preempt || (ro(&WHY_HAS_STATE) != 0 && state == 0);
    if let Some(t) = WHY_TASKS.get_ptr_mut(pid) {
        // SAFETY: a live map value; only this thread's own events change it.
        let t = unsafe { &mut *t };
        stat(stats::EVENTS);
        // SAFETY: no arguments; reads the monotonic clock.
        let now = unsafe { bpf_ktime_get_ns() };
        let gen = generation();
        if t.state == EXITING {
            let _ = WHY_TASKS.remove(pid);
        } else if ro(&WHY_HAS_STATE) != 0 && state & TASK_DEAD != 0 && !preempt {
            credit_running(t, pid, now, gen);
            let _ = WHY_TASKS.remove(pid);
        } else {
            credit_running(t, pid, now, gen);
            t.since_ns = now;
            if runnable {
                t.state = RUNNABLE_PREEMPT;
                t.stack = NO_STACK;
            } else {
                t.state = BLOCKED;
                t.stack = kernel_stack(ctx);
            }
        }
    } else if allowed(tgid) {
        // In scope but never seen: created before the wakeup_new hook was attached, renamed
        // into --comm, or missed by the seeding. Its time from here on counts.
        stat(STAT_UNSEEN);
        let t = WhyTask {
            // SAFETY: no arguments; reads the monotonic clock.
            since_ns: unsafe { bpf_ktime_get_ns() },
            tgid,
            state: if runnable { RUNNABLE_PREEMPT } else { BLOCKED },
            stack: if runnable { NO_STACK } else { kernel_stack(ctx) },
            mem: 0,
            comm: bpf_get_current_comm().unwrap_or([0; 16]),
        };
        if WHY_TASKS.insert(pid, t, 0).is_err() {
            stat(stats::START_MAP_FULL);
        }
    }
}

/// `sched_switch`'s `prev_state` argument, or 0 on kernels that do not pass it.
#[inline(always)]
fn prev_state(read: impl FnOnce() -> u64) -> u64 {
    if ro(&WHY_HAS_STATE) != 0 {
        read() & 0xffff_ffff
    } else {
        0
    }
}

#[btf_tracepoint(function = "sched_switch")]
pub fn tk_why_switch(ctx: BtfTracePointContext) -> i32 {
    let preempt = ctx.arg::<u64>(0) & 1 != 0;
    on_switch::<_, Direct>(&ctx, preempt, ctx.arg(2), prev_state(|| ctx.arg::<u64>(3)));
    0
}

#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn tk_why_switch_raw(ctx: RawTracePointContext) -> i32 {
    let preempt = ctx.arg::<u64>(0) & 1 != 0;
    on_switch::<_, Probe>(&ctx, preempt, ctx.arg(2), prev_state(|| ctx.arg::<u64>(3)));
    0
}

/// A blocked thread in scope is woken: its block ends, charged to the waker.
#[inline(always)]
fn on_waking<R: Kread>(task: u64) {
    if !may_pass_pid(|| R::u32(task, ro(&WHY_TGID_OFF))) {
        return;
    }
    let pid = R::u32(task, ro(&WHY_PID_OFF));
    let Some(t) = WHY_TASKS.get_ptr_mut(pid) else {
        return;
    };
    // SAFETY: a live map value. A wakeup racing the thread's own switch-out on another CPU is
    // seen before it (the thread then switches out runnable).
    let t = unsafe { &mut *t };
    if t.state != BLOCKED && t.state != probes_common::why::BLOCKED_BEFORE {
        return;
    }
    // SAFETY: no arguments; reads the monotonic clock.
    let now = unsafe { bpf_ktime_get_ns() };
    let ns = now.saturating_sub(t.since_ns);
    let (s, stack, gen) = (t.state, t.stack, generation());
    credit(t, pid, s, stack, ns, gen);
    credit_by(t, pid, s, stack, ns, gen);
    t.state = RUNNABLE_WAKEUP;
    t.stack = NO_STACK;
    t.since_ns = now;
}

#[btf_tracepoint(function = "sched_waking")]
pub fn tk_why_waking(ctx: BtfTracePointContext) -> i32 {
    on_waking::<Direct>(ctx.arg(0));
    0
}

#[raw_tracepoint(tracepoint = "sched_waking")]
pub fn tk_why_waking_raw(ctx: RawTracePointContext) -> i32 {
    on_waking::<Probe>(ctx.arg(0));
    0
}

/// A new thread of a process in scope (or a new process forked by one, for `--comm`) starts
/// runnable.
#[inline(always)]
fn on_wakeup_new<R: Kread>(task: u64) {
    let tgid = R::u32(task, ro(&WHY_TGID_OFF));
    if !allowed(tgid) {
        return;
    }
    let pid = R::u32(task, ro(&WHY_PID_OFF));
    let t = WhyTask {
        // SAFETY: no arguments; reads the monotonic clock.
        since_ns: unsafe { bpf_ktime_get_ns() },
        tgid,
        state: RUNNABLE_WAKEUP,
        stack: NO_STACK,
        mem: 0,
        comm: bpf_get_current_comm().unwrap_or([0; 16]),
    };
    if WHY_TASKS.insert(pid, t, 0).is_err() {
        stat(stats::START_MAP_FULL);
    }
}

#[btf_tracepoint(function = "sched_wakeup_new")]
pub fn tk_why_wakeup_new(ctx: BtfTracePointContext) -> i32 {
    on_wakeup_new::<Direct>(ctx.arg(0));
    0
}

#[raw_tracepoint(tracepoint = "sched_wakeup_new")]
pub fn tk_why_wakeup_new_raw(ctx: RawTracePointContext) -> i32 {
    on_wakeup_new::<Probe>(ctx.arg(0));
    0
}

/// The exiting thread (`current`) ends its running interval here; its last switch-out forgets
/// it (on kernels without `prev_state` that switch-out could not tell an exit from a block).
#[inline(always)]
fn on_exit() {
    let pid = bpf_get_current_pid_tgid() as u32;
    let Some(t) = WHY_TASKS.get_ptr_mut(pid) else {
        return;
    };
    // SAFETY: a live map value of the current thread.
    let t = unsafe { &mut *t };
    if t.state == RUNNING {
        // SAFETY: no arguments; reads the monotonic clock.
        let now = unsafe { bpf_ktime_get_ns() };
        credit_running(t, pid, now, generation());
        t.since_ns = now;
    }
    t.state = EXITING;
}

#[btf_tracepoint(function = "sched_process_exit")]
pub fn tk_why_exit(_ctx: BtfTracePointContext) -> i32 {
    on_exit();
    0
}

#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn tk_why_exit_raw(_ctx: RawTracePointContext) -> i32 {
    on_exit();
    0
}

/// The current thread enters (`kind` != 0) or leaves (0) reclaim: its time on a CPU so far is
/// credited, and from here on counts as `kind`'s (or as running again).
#[inline(always)]
fn on_reclaim(kind: u32) {
    let pid = bpf_get_current_pid_tgid() as u32;
    let Some(t) = WHY_TASKS.get_ptr_mut(pid) else {
        return;
    };
    // SAFETY: a live map value of the current thread.
    let t = unsafe { &mut *t };
    if t.state != RUNNING {
        return;
    }
    // SAFETY: no arguments; reads the monotonic clock.
    let now = unsafe { bpf_ktime_get_ns() };
    credit_running(t, pid, now, generation());
    t.since_ns = now;
    t.mem = kind;
}

#[btf_tracepoint(function = "mm_vmscan_direct_reclaim_begin")]
pub fn tk_why_direct_begin(_ctx: BtfTracePointContext) -> i32 {
    on_reclaim(MEM_DIRECT);
    0
}

#[raw_tracepoint(tracepoint = "mm_vmscan_direct_reclaim_begin")]
pub fn tk_why_direct_begin_raw(_ctx: RawTracePointContext) -> i32 {
    on_reclaim(MEM_DIRECT);
    0
}

#[btf_tracepoint(function = "mm_vmscan_direct_reclaim_end")]
pub fn tk_why_direct_end(_ctx: BtfTracePointContext) -> i32 {
    on_reclaim(0);
    0
}

#[raw_tracepoint(tracepoint = "mm_vmscan_direct_reclaim_end")]
pub fn tk_why_direct_end_raw(_ctx: RawTracePointContext) -> i32 {
    on_reclaim(0);
    0
}

#[btf_tracepoint(function = "mm_vmscan_memcg_reclaim_begin")]
pub fn tk_why_memcg_begin(_ctx: BtfTracePointContext) -> i32 {
    on_reclaim(MEM_MEMCG);
    0
}

#[raw_tracepoint(tracepoint = "mm_vmscan_memcg_reclaim_begin")]
pub fn tk_why_memcg_begin_raw(_ctx: RawTracePointContext) -> i32 {
    on_reclaim(MEM_MEMCG);
    0
}

#[btf_tracepoint(function = "mm_vmscan_memcg_reclaim_end")]
pub fn tk_why_memcg_end(_ctx: BtfTracePointContext) -> i32 {
    on_reclaim(0);
    0
}

#[raw_tracepoint(tracepoint = "mm_vmscan_memcg_reclaim_end")]
pub fn tk_why_memcg_end_raw(_ctx: RawTracePointContext) -> i32 {
    on_reclaim(0);
    0
}
