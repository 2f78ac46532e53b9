//! `sched` kernel programs, the one object behind both `ctxsw` and `runq-lat` (they differ
//! only in userspace, and in `SCHED_PREEMPTORS`: ctxsw also records who preempted whom).
//!
//! Hooks: `sched:sched_switch` (tp_btf, else raw_tp), `sched:sched_process_free` (to forget
//! a task's snapshot once its tid can be reused) and `sched:sched_process_exec` (rare: renames
//! the task's aggregate to the new program, keeping the old name, so a row is not reported
//! under the name of the shell that exec'd it).
//!
//! Why this design is cheap: the kernel already counts, per task, voluntary (`nvcsw`) and
//! involuntary (`nivcsw`) switches, the total time spent waiting on a run queue
//! (`sched_info.run_delay`) and CPU migrations (`se.nr_migrations`). At `sched_switch` the
//! outgoing task's counters are already updated for this switch (`++*switch_count` precedes the
//! tracepoint), and its run_delay includes the wait before the run that just ended
//! (`sched_info_arrive` ran at its switch-in). So one program on `sched_switch` that diffs the
//! outgoing task's counters against a per-task snapshot yields exact counts and one run-queue
//! wait sample per run, with:
//! - no wakeup hook (runqlat pays a second program on every wakeup), no timestamps
//!   (no `bpf_ktime_get_ns`), no ring buffer;
//! - on tp_btf, plain loads from the BTF-typed `prev`/`next` pointers at offsets the verifier
//!   sees as constants (frozen read-only globals), instead of `bpf_probe_read_kernel` calls;
//! - two hash lookups (per-task snapshot by tid, per-process aggregate) and a handful of atomic
//!   adds per switch.
//!
//! Diffing the kernel's counters (instead of classifying each switch from `preempt` and
//! `prev_state`) also gets the one case the arguments cannot tell right: a task going to sleep
//! with a signal pending is counted voluntary by the kernel although `prev_state` reads
//! TASK_RUNNING (kernels ≥ 6.13, `try_to_block_task`).
//!
//! Fields read from `struct task_struct` (offsets from /sys/kernel/btf/vmlinux, `TaskOffsets`):
//! `pid`, `tgid`, `nvcsw`, `nivcsw`, `sched_info.run_delay`, `se.nr_migrations`, `start_time`.

#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_probe_read_kernel},
    macros::{btf_tracepoint, map, raw_tracepoint},
    maps::{Array, HashMap, PerCpuArray},
    programs::{BtfTracePointContext, RawTracePointContext},
};
use probes_common::{
    hist::LatHist,
    sched::{
        PreemptKey, SchedKey, SchedVal, TaskOffsets, TaskSnap, STAT_IDLE_SWITCHES,
        STAT_NO_BASELINE, STAT_PREEMPT_MAP_FULL,
    },
    stats,
};
use probes_ebpf::{allowed, atomic_add, generation, get_or_insert, hist_record, ro, stat};

#[no_mangle]
static SCHED_OFFS: TaskOffsets = TaskOffsets {
    pid: 0,
    tgid: 0,
    nvcsw: 0,
    nivcsw: 0,
    run_delay: 0,
    nr_migrations: 0,
    start_time: 0,
    _pad: 0,
};
/// CLOCK_MONOTONIC ns just before load: tasks started later have all counters from zero.
#[no_mangle]
static SCHED_START_NS: u64 = 0;
#[no_mangle]
static SCHED_PER_THREAD: u8 = 0;
/// Record who preempted whom (ctxsw only).
#[no_mangle]
static SCHED_PREEMPTORS: u8 = 0;
/// The tracepoint passes `prev_state` (kernels ≥ 5.18).
#[no_mangle]
static SCHED_HAS_STATE: u8 = 1;

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
pub fn prev_state(read: impl FnOnce() -> u64) -> u64 {
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
#[map]
static TASKS: HashMap<u32, TaskSnap> = HashMap::with_max_entries(16384, BPF_F_NO_PREALLOC);

/// Aggregates per process (or thread) and generation, sized by userspace (`--max-keys` × 2).
#[map]
static SCHED_AGG: HashMap<SchedKey, SchedVal> = HashMap::with_max_entries(8192, BPF_F_NO_PREALLOC);

/// What did not fit `SCHED_AGG`, one row per generation: the `[other]` row.
#[map]
static SCHED_OTHER: Array<SchedVal> = Array::with_max_entries(2, 0);

/// Initial value for new aggregate keys.
#[map]
static SCHED_SCRATCH: PerCpuArray<SchedVal> = PerCpuArray::with_max_entries(1, 0);

/// Involuntary switches by (victim, preemptor), ctxsw only.
#[map]
static PREEMPTORS: HashMap<PreemptKey, u64> = HashMap::with_max_entries(8192, BPF_F_NO_PREALLOC);

/// How task fields are read: direct loads (tp_btf, where the verifier knows the pointer's BTF
/// type and checks each load against the struct layout) or `bpf_probe_read_kernel` (raw_tp).
pub trait Reader {
    fn u64(task: *const u8, off: u32) -> u64;
    fn i32(task: *const u8, off: u32) -> i32;
}

pub struct Direct;
pub struct Probe;

impl Reader for Direct {
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
/// is a preemption wait).
const SNAP_PREEMPTED: u32 = 1;
/// `TaskSnap::preempted` bit: no counter baseline yet (first switch of a task that was running
/// before tracing began): the wait since the last switch-in is unknown.
const SNAP_NO_WAIT: u32 = 2;

/// Per-CPU fallback snapshot for a task whose first switch found `TASKS` full.
#[map]
static SNAP_SCRATCH: PerCpuArray<TaskSnap> = PerCpuArray::with_max_entries(1, 0);

/// `sched_switch(preempt, prev, next, prev_state)`.
///
/// Shaped for the verifier: every path reaches one shared tail with a pointer to a baseline
/// snapshot (`TASKS`, or the per-CPU fallback) and no path-specific constants, so the verifier
/// walks the tail a handful of times instead of once per combination of branches (17,153
/// verified instructions before, ~21 ms of start-up). The first-switch cases only differ in the
/// baseline they write (see `first_switch`).
#[inline(always)]
pub fn on_switch<R: Reader>(preempt: bool, prev: *const u8, next: *const u8, prev_state: u64) {
    let o = ro(&SCHED_OFFS);
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
    let wait = now.run_delay.wrapping_sub(s.run_delay);
    let flags = s.preempted;
    s.nvcsw = now.nvcsw;
    s.nivcsw = now.nivcsw;
    s.run_delay = now.run_delay;
    s.nr_migrations = now.nr_migrations;
    // invol != 0, without a branch: the top bit of invol | -invol.
    s.preempted = ((invol | invol.wrapping_neg()) >> 63) as u32;

    let gen = generation();
    let key = SchedKey {
        id: if ro(&SCHED_PER_THREAD) != 0 {
            tid
        } else {
            tgid
        },
        gen,
    };
    let val = match SCHED_AGG.get_ptr_mut(key) {
        Some(p) => Some(p),
        None => match SCHED_SCRATCH.get_ptr_mut(0) {
            Some(init) => {
                // SAFETY: per-CPU scratch slot owned by this run; only comm and tgid are ever
                // written, so its counters stay zero. `current` is still `prev` here.
                unsafe {
                    (*init).comm = bpf_get_current_comm().unwrap_or_default();
                    (*init).tgid = tgid;
                }
                // SAFETY: the scratch slot is valid for this run (see above).
                get_or_insert(&SCHED_AGG, &key, unsafe { &*init })
            }
            None => None,
        },
    };
    let val = match val {
        Some(v) => v,
        None => {
            stat(stats::KEY_MAP_FULL);
            match SCHED_OTHER.get_ptr_mut(gen) {
                Some(v) => v,
                None => return,
            }
        }
    };
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
        if flags & SNAP_NO_WAIT == 0 {
            // `preempt` follows `wake` in SchedVal: pick it by offset, not by branch, so the
            // histogram update is verified once. opaque() keeps LLVM from turning the
            // multiplication back into a select (a jump on BPF).
            let which = probes_common::hist::opaque((flags & SNAP_PREEMPTED) as u64);
            let h = (&raw mut (*val).wake as *mut u8)
                .add(which as usize * core::mem::size_of::<LatHist>())
                as *mut LatHist;
            hist_record(h, wait);
        }
    }

    if invol != 0 && ro(&SCHED_PREEMPTORS) != 0 {
        let by = if next.is_null() {
            0
        } else {
            R::i32(next, o.tgid) as u32
        };
        let pk = PreemptKey {
            victim: key.id,
            by,
            gen,
            _pad: 0,
        };
        match PREEMPTORS.get_ptr_mut(pk) {
            // SAFETY: `c` is a map value pointer from the lookup just above.
            Some(c) => unsafe { atomic_add(c, invol) },
            None => {
                if PREEMPTORS.insert(pk, invol, BPF_NOEXIST_U64).is_err() {
                    // Lost a race with another CPU creating the key, or the map is full.
                    match PREEMPTORS.get_ptr_mut(pk) {
                        // SAFETY: as above.
                        Some(c) => unsafe { atomic_add(c, invol) },
                        None => stat(STAT_PREEMPT_MAP_FULL),
                    }
                }
            }
        }
    }
}

const BPF_NOEXIST_U64: u64 = aya_ebpf::bindings::BPF_NOEXIST as u64;

/// `sched_process_exec`: the current task runs a new program, and `current->comm` already holds
/// its name. Only the current interval's aggregate is renamed: later intervals create theirs
/// with the new name anyway.
#[inline(always)]
pub fn on_exec() {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    // No filter check: a key exists only for a task that passed the filters, and a --comm
    // filter would test the new name.
    let key = SchedKey {
        id: if ro(&SCHED_PER_THREAD) != 0 {
            tid
        } else {
            tgid
        },
        gen: generation(),
    };
    let Some(v) = SCHED_AGG.get_ptr_mut(key) else {
        return;
    };
    let new = bpf_get_current_comm().unwrap_or_default();
    // SAFETY: live map value; an exec happens once at a time per task, and the aggregate's
    // counters are not touched here.
    unsafe {
        // The name right before this exec: after `fork; exec sh; exec python3` the row reads
        // python3, exec'd from sh.
        (*v).exec_from = (*v).comm;
        (*v).comm = new;
    }
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

/// `sched_process_free(p)`: the tid may be reused from now on.
#[inline(always)]
pub fn on_free<R: Reader>(task: *const u8) {
    let tid = R::i32(task, ro(&SCHED_OFFS).pid) as u32;
    let _ = TASKS.remove(tid);
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
