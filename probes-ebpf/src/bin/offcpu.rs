//! `profile --off-cpu` kernel programs: where threads wait instead of running, as blocked time
//! by stack (the bcc `offcputime` approach).
//!
//! `tk_offcpu_switch` on `sched_switch` (tp_btf, else raw_tp) does two things:
//! - switch-out of `prev` (still `current` there): when it blocks (`prev_state` is not
//!   TASK_RUNNING and the switch is not a preemption) and passes the scope filter, its kernel
//!   stack and frame-pointer user stack (`bpf_get_stackid`, `OFFCPU_STACKS`), its comm and the
//!   time go to `OFFCPU_START[tid]` (a full map is counted, `START_MAP_FULL`). Runnable
//!   switch-outs (preemptions, yields) are only counted (`STAT_RUNNABLE`).
//! - switch-in of `next`: its `OFFCPU_START` entry (if any) is taken; the blocked time is the
//!   wakeup time (`tk_offcpu_waking` on `sched_waking` stamps it) minus the switch-out, or the
//!   switch-in minus the switch-out when the wakeup was not seen; run-queue time after the
//!   wakeup is not blocked time. At least `OFFCPU_MIN_NS` of it adds time and one block to
//!   `OFFCPU_COUNTS[(tgid, tid, user stack, kernel stack, generation)]` (`[other]` when full).
//!
//! Scope: `--pid`/`--comm` are checked at the switch-out, where the blocking task is current;
//! the switch-in only finds tasks that passed.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, BPF_F_USER_STACK},
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map, raw_tracepoint},
    maps::{Array, HashMap, PerCpuArray, StackTrace},
    programs::{tracing::StackIdContext, BtfTracePointContext, RawTracePointContext},
};
use probes_common::{
    profile::{
        OffCpuStart, OffCpuVal, ProfileKey, NO_STACK, STAT_RUNNABLE, STAT_STACK_COLLIDED,
        STAT_USTACK_FAILED,
    },
    stats,
};
use probes_common::python::{PyProc, PyStack, PY_NSTATS};
use probes_ebpf::{
    allowed, atomic_add, generation,
    python::python_stack,
    kread::{Direct, Kread, Probe},
    ro, slot, stat,
};

/// Blocks shorter than this are not recorded (`--min-block`).
#[no_mangle]
static OFFCPU_MIN_NS: u64 = 1_000_000;
/// `task_struct.pid`, from the kernel's BTF.
#[no_mangle]
static OFFCPU_PID_OFF: u32 = 0;
/// The tracepoint passes `prev_state` (kernels ≥ 5.18; see `sched.rs` for why the read sits
/// behind this frozen flag). Without it every switch-out that is not a preemption is a block.
#[no_mangle]
static OFFCPU_HAS_STATE: u8 = 1;

/// Stacks by id (innermost first). Sized by userspace.
#[map]
static OFFCPU_STACKS: StackTrace = StackTrace::with_max_entries(16384, 0);

/// Blocked tasks by tid, sized by userspace. Not preallocated (as `sched.rs`'s `TASKS`).
#[map]
static OFFCPU_START: HashMap<u32, OffCpuStart> =
    HashMap::with_max_entries(16384, BPF_F_NO_PREALLOC);

/// Blocked time per key. Sized by userspace.
#[map]
static OFFCPU_COUNTS: HashMap<ProfileKey, OffCpuVal> =
    HashMap::with_max_entries(16384, BPF_F_NO_PREALLOC);

/// Blocked time whose key did not fit, one row per generation.
#[map]
static OFFCPU_OTHER: Array<OffCpuVal> = Array::with_max_entries(2, 0);

/// Initial value for new keys.
#[map]
static OFFCPU_SCRATCH: PerCpuArray<OffCpuVal> = PerCpuArray::with_max_entries(1, 0);

/// Python processes in scope, by tgid (filled by userspace; see `probes_ebpf::python`).
#[map]
static PY_PROCS: HashMap<u32, PyProc> = HashMap::with_max_entries(1024, BPF_F_NO_PREALLOC);

/// Python stacks by id. Sized by userspace.
#[map]
static PY_STACKS: HashMap<u32, PyStack> = HashMap::with_max_entries(4096, BPF_F_NO_PREALLOC);

#[map]
static PY_SCRATCH: PerCpuArray<PyStack> = PerCpuArray::with_max_entries(1, 0);

/// Python walk counters (`probes_common::python::PY_STAT_*`).
#[map]
static PY_STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(PY_NSTATS, 0);

const EEXIST: i32 = 17;
const EFAULT: i32 = 14;

/// The id of the current stack of one kind, or [`NO_STACK`]; a collision is counted.
#[inline(always)]
fn stack_id<C: StackIdContext>(ctx: &C, flags: u64) -> i32 {
    match ctx.get_stackid(&OFFCPU_STACKS, flags) {
        Ok(id) => id as i32,
        Err(e) => {
            if e == -EEXIST {
                stat(STAT_STACK_COLLIDED);
            } else if flags != 0 && e != -EFAULT {
                // EFAULT: no user stack (kernel threads).
                stat(STAT_USTACK_FAILED);
            }
            NO_STACK
        }
    }
}

#[inline(always)]
fn on_switch<C: StackIdContext, R: Kread>(ctx: &C, preempt: bool, next: u64, state: u64) {
    // SAFETY: no arguments; reads the monotonic clock.
    let now = unsafe { bpf_ktime_get_ns() };
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, pid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    if pid != 0 {
        if preempt || (ro(&OFFCPU_HAS_STATE) != 0 && state == 0) {
            stat(STAT_RUNNABLE);
        } else if allowed(tgid) {
            let s = OffCpuStart {
                start_ns: now,
                wake_ns: 0,
                tgid,
                user_stack: stack_id(ctx, BPF_F_USER_STACK as u64),
                kernel_stack: stack_id(ctx, 0),
                py_stack: python_stack(tgid, pid, &PY_PROCS, &PY_STACKS, &PY_SCRATCH, &PY_STATS),
                comm: bpf_get_current_comm().unwrap_or([0; 16]),
            };
            if OFFCPU_START.insert(pid, s, 0).is_err() {
                stat(stats::START_MAP_FULL);
            }
        }
    }
    let npid = R::u32(next, ro(&OFFCPU_PID_OFF));
    if npid == 0 {
        return;
    }
    // SAFETY: a map value copied out before it is removed.
    let Some(s) = (unsafe { OFFCPU_START.get(npid) }).copied() else {
        return;
    };
    let _ = OFFCPU_START.remove(npid);
    let end = if s.wake_ns != 0 { s.wake_ns } else { now };
    let ns = end.saturating_sub(s.start_ns);
    if ns < ro(&OFFCPU_MIN_NS) {
        return;
    }
    stat(stats::EVENTS);
    let gen = generation();
    let key = ProfileKey {
        tgid: s.tgid,
        pid: npid,
        user_stack: s.user_stack,
        kernel_stack: s.kernel_stack,
        gen,
        py_stack: s.py_stack,
    };
    let init = |v: *mut OffCpuVal| {
        // SAFETY: this CPU's scratch slot (see `slot`).
        unsafe { (*v).comm = s.comm };
    };
    if let Some(slot) = slot(
        &OFFCPU_COUNTS,
        &OFFCPU_OTHER,
        &OFFCPU_SCRATCH,
        &key,
        gen,
        init,
    ) {
        // SAFETY: a live map value from this run.
        unsafe {
            atomic_add(&raw mut (*slot.ptr).ns, ns);
            atomic_add(&raw mut (*slot.ptr).blocks, 1);
        }
    }
}

/// `sched_switch`'s `prev_state` argument, or 0 on kernels that do not pass it.
#[inline(always)]
fn prev_state(read: impl FnOnce() -> u64) -> u64 {
    if ro(&OFFCPU_HAS_STATE) != 0 {
        read() & 0xffff_ffff
    } else {
        0
    }
}

#[btf_tracepoint(function = "sched_switch")]
pub fn tk_offcpu_switch(ctx: BtfTracePointContext) -> i32 {
    let preempt = ctx.arg::<u64>(0) & 1 != 0;
    on_switch::<_, Direct>(&ctx, preempt, ctx.arg(2), prev_state(|| ctx.arg::<u64>(3)));
    0
}

#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn tk_offcpu_switch_raw(ctx: RawTracePointContext) -> i32 {
    let preempt = ctx.arg::<u64>(0) & 1 != 0;
    on_switch::<_, Probe>(&ctx, preempt, ctx.arg(2), prev_state(|| ctx.arg::<u64>(3)));
    0
}

/// Stamps the wakeup of a blocked task in scope (the first one: a task woken twice before it
/// runs was runnable from the first).
#[inline(always)]
fn on_waking<R: Kread>(task: u64) {
    let pid = R::u32(task, ro(&OFFCPU_PID_OFF));
    if let Some(s) = OFFCPU_START.get_ptr_mut(pid) {
        // SAFETY: a live map value; a racing stamp writes a time just as right.
        unsafe {
            if (*s).wake_ns == 0 {
                (*s).wake_ns = bpf_ktime_get_ns();
            }
        }
    }
}

#[btf_tracepoint(function = "sched_waking")]
pub fn tk_offcpu_waking(ctx: BtfTracePointContext) -> i32 {
    on_waking::<Direct>(ctx.arg(0));
    0
}

#[raw_tracepoint(tracepoint = "sched_waking")]
pub fn tk_offcpu_waking_raw(ctx: RawTracePointContext) -> i32 {
    on_waking::<Probe>(ctx.arg(0));
    0
}
