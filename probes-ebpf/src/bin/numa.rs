//! `numa` kernel programs: where each process's threads run, node by node, and what NUMA
//! balancing does to it.
//!
//! - `sched:sched_switch` (tp_btf, else raw_tp): the run that just ended, on this CPU's node
//!   (`probes_ebpf::node_time`: one per-CPU slot, one array lookup and one hash lookup per
//!   switch; the per-node times of a task add up to its `/proc/<pid>/schedstat` run time).
//!   Beside ctxsw or runq-lat this program is not attached: the shared `sched` object records
//!   the same into its own maps (`SCHED_NODE_TIME`).
//! - `sched:sched_move_numa`, `sched_swap_numa`, `sched_stick_numa`: the scheduler's NUMA
//!   placement moves (tp_btf, else raw_tp; rare), per task and, system-wide, per (source node,
//!   destination node) pair of the event's CPUs in `NUMA_PAIRS` (the tracepoints' own
//!   `src_nid`/`dst_nid` are `cpu_to_node` of the same CPUs).
//! - `migrate:mm_migrate_pages` with reason `MR_NUMA_MISPLACED` (value from the kernel's BTF):
//!   pages NUMA balancing moved, in the context of the task whose fault moved them.
//! - `task_numa_fault` (fentry, else kprobe; optional): every NUMA hinting fault, local or not,
//!   and the pages it migrated, by destination node (`mem_node` when `TNF_MIGRATED`: the node
//!   the page is on after the fault). The source node of a migrated page is no argument (it is
//!   `folio_nid()` before the move, a `page->flags` bit field whose shift no BTF describes), and
//!   `last_cpupid` is the last *accessor*, not where the page was: so no source node here.
//!   The kernel counts `numa_hint_faults` once per call of it.
//!
//! Fields of `struct task_struct` (`pid`, `tgid`, `comm`, `prio`, `se.sum_exec_runtime`,
//! `se.prev_sum_exec_runtime`) are read at
//! offsets from /sys/kernel/btf/vmlinux (`NUMA_OFFS`).

#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid},
    macros::{btf_tracepoint, fentry, map, raw_tracepoint},
    maps::HashMap,
    programs::{BtfTracePointContext, FEntryContext, RawTracePointContext},
};
use probes_common::{
    numa::{
        NumaOffsets, NumaVal, PairKey, RunOffsets, MAX_NODES, PAIR_MOVE,
        PAIR_SWAP, STAT_PAIR_FULL,
    },
    stats,
};
use probes_ebpf::{
    allowed, atomic_add, generation, get_or_insert_copy,
    kread::{Direct, Kread, Probe},
    node_time::RunCfg,
    ro, stat, task_comm,
};

#[no_mangle]
static NUMA_OFFS: NumaOffsets = NumaOffsets {
    pid: 0,
    tgid: 0,
    comm: 0,
    run: RunOffsets::ZERO,
};
#[no_mangle]
static NUMA_PER_THREAD: u8 = 0;
/// `bpf_ktime_get_ns` when userspace loaded the programs: a run measured from the task's pick
/// time is clipped to it, so time from before the attach is never counted.
#[no_mangle]
static NUMA_START_NS: u64 = 0;
/// `MR_NUMA_MISPLACED` of `enum migrate_reason`.
#[no_mangle]
static NUMA_MR_MISPLACED: i32 = 5;
/// `mm_migrate_pages` passes `large_folio_split` (kernels ≥ 6.9: 8 arguments, reason last).
#[no_mangle]
static NUMA_MIG_WIDE: u8 = 0;
/// `task_numa_fault` flag bits (include/linux/sched/numa_balancing.h).
#[no_mangle]
static NUMA_TNF_MIGRATED: u32 = 0x01;
#[no_mangle]
static NUMA_TNF_FAULT_LOCAL: u32 = 0x08;

probes_ebpf::node_time_maps!(8192);

/// System-wide task moves and swaps per (kind, source node, destination node) and generation,
/// sized by userspace.
#[map]
static NUMA_PAIRS: HashMap<PairKey, u64> = HashMap::with_max_entries(1024, BPF_F_NO_PREALLOC);

#[inline(always)]
fn run_cfg() -> RunCfg {
    RunCfg {
        offs: ro(&NUMA_OFFS.run),
        per_thread: ro(&NUMA_PER_THREAD) != 0,
        start_ns: ro(&NUMA_START_NS),
    }
}

/// The aggregate of `tid` (or its process) in the current generation.
#[inline(always)]
fn value(tid: u32, tgid: u32, init: impl FnOnce(*mut NumaVal)) -> Option<*mut NumaVal> {
    NODES.value(ro(&NUMA_PER_THREAD) != 0, tid, tgid, init)
}

/// The current task's aggregate (events in the context of the task they are about).
#[inline(always)]
fn current() -> Option<*mut NumaVal> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    if tid == 0 || !allowed(tgid) {
        return None;
    }
    stat(stats::EVENTS);
    value(tid, tgid, |v| {
        // SAFETY: this CPU's scratch slot, owned by this run.
        unsafe { (*v).comm = bpf_get_current_comm().unwrap_or_default() };
    })
}

/// One scheduler move or swap from `src_cpu`'s node to `dst_cpu`'s, system-wide (any task).
#[inline(always)]
fn on_pair(kind: u32, src_cpu: u64, dst_cpu: u64) {
    let key = PairKey {
        gen: generation(),
        kind,
        src: NODES.node_of(src_cpu as u32),
        dst: NODES.node_of(dst_cpu as u32),
    };
    match get_or_insert_copy(&NUMA_PAIRS, &key, 0u64) {
        // SAFETY: a live map value.
        Some(p) => unsafe { atomic_add(p, 1) },
        None => stat(STAT_PAIR_FULL),
    }
}

/// `sched_switch(preempt, prev, next, ...)`.
#[inline(always)]
fn on_switch<R: Kread>(prev: *const u8, next: *const u8) {
    let o = ro(&NUMA_OFFS);
    let cfg = run_cfg();
    let Some(base) = NODES.switch_in::<R>(next as u64, o.pid, &cfg) else {
        return;
    };
    let tid = R::u32(prev as u64, o.pid);
    if tid == 0 {
        // The idle task: not a process.
        return;
    }
    let tgid = R::u32(prev as u64, o.tgid);
    if !allowed(tgid) {
        return;
    }
    stat(stats::EVENTS);
    NODES.switch_out::<R>(prev as u64, tid, tgid, base, &cfg);
}

/// Counts one NUMA placement event about `task` (not necessarily the current one) in the
/// counter at byte offset `field` of its aggregate.
#[inline(always)]
fn on_task<R: Kread>(task: *const u8, field: usize) {
    // The other side of a swap may be absent (the verifier insists on the check).
    if task.is_null() {
        return;
    }
    let o = ro(&NUMA_OFFS);
    let tid = R::u32(task as u64, o.pid);
    let tgid = R::u32(task as u64, o.tgid);
    if tid == 0 || !allowed(tgid) {
        return;
    }
    stat(stats::EVENTS);
    let Some(v) = value(tid, tgid, |v| {
        // SAFETY: this CPU's scratch slot, owned by this run.
        unsafe { (*v).comm = task_comm(task, o.comm) };
    }) else {
        return;
    };
    // SAFETY: `field` is the offset of a u64 counter of NumaVal (a constant per program).
    unsafe { atomic_add((v as *mut u8).add(field) as *mut u64, 1) };
}

const MOVES: usize = core::mem::offset_of!(NumaVal, moves);
const SWAPS: usize = core::mem::offset_of!(NumaVal, swaps);
const STICKS: usize = core::mem::offset_of!(NumaVal, sticks);

/// `mm_migrate_pages(succeeded, failed, thp_succeeded, thp_failed, thp_split,
/// [large_folio_split,] mode, reason)`: only NUMA balancing's migrations.
#[inline(always)]
fn on_migrate(succeeded: u64, failed: u64, reason: i32) {
    if reason != ro(&NUMA_MR_MISPLACED) {
        return;
    }
    if let Some(v) = current() {
        // SAFETY: live map value.
        unsafe {
            atomic_add(&raw mut (*v).pages_migrated, succeeded);
            atomic_add(&raw mut (*v).pages_failed, failed);
        }
    }
}

/// `task_numa_fault(last_cpupid, mem_node, pages, flags)`, in the faulting task.
#[inline(always)]
fn on_fault(mem_node: i32, pages: i32, flags: i32) {
    let Some(v) = current() else {
        return;
    };
    let flags = flags as u32;
    let pages = pages.max(0) as u64;
    // Without branches: each flag test is 0 or 1.
    let local = ((flags & ro(&NUMA_TNF_FAULT_LOCAL)) != 0) as u64;
    let migrated = ((flags & ro(&NUMA_TNF_MIGRATED)) != 0) as u64;
    // SAFETY: live map value.
    unsafe {
        atomic_add(&raw mut (*v).hint_faults, 1);
        atomic_add(&raw mut (*v).hint_faults_local, local);
        atomic_add(&raw mut (*v).hint_pages, pages);
        atomic_add(&raw mut (*v).hint_pages_migrated, pages * migrated);
    }
    // By destination: only migrations (a non-migrating fault adds nothing, so skip the store).
    // The bound check must be on the index the pointer arithmetic uses (see on_switch).
    let node = mem_node as u32 as u64;
    // SAFETY: reads a local.
    let idx = unsafe { core::ptr::read_volatile(&node) };
    if migrated != 0 && idx < MAX_NODES as u64 {
        // SAFETY: `v` is a live map value; the index is checked against the array length.
        unsafe { atomic_add(&raw mut (*v).migrated_to[idx as usize], pages) };
    }
}

// Entry points.

#[btf_tracepoint(function = "sched_switch")]
pub fn tk_numa_switch(ctx: BtfTracePointContext) -> i32 {
    on_switch::<Direct>(ctx.arg(1), ctx.arg(2));
    0
}

#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn tk_numa_switch_raw(ctx: RawTracePointContext) -> i32 {
    on_switch::<Probe>(ctx.arg(1), ctx.arg(2));
    0
}

#[btf_tracepoint(function = "sched_move_numa")]
pub fn tk_numa_move(ctx: BtfTracePointContext) -> i32 {
    on_task::<Direct>(ctx.arg(0), MOVES);
    on_pair(PAIR_MOVE, ctx.arg(1), ctx.arg(2));
    0
}

#[raw_tracepoint(tracepoint = "sched_move_numa")]
pub fn tk_numa_move_raw(ctx: RawTracePointContext) -> i32 {
    on_task::<Probe>(ctx.arg(0), MOVES);
    on_pair(PAIR_MOVE, ctx.arg(1), ctx.arg(2));
    0
}

/// `sched_swap_numa(src_tsk, src_cpu, dst_tsk, dst_cpu)`: both tasks change node.
#[btf_tracepoint(function = "sched_swap_numa")]
pub fn tk_numa_swap(ctx: BtfTracePointContext) -> i32 {
    on_task::<Direct>(ctx.arg(0), SWAPS);
    on_task::<Direct>(ctx.arg(2), SWAPS);
    on_pair(PAIR_SWAP, ctx.arg(1), ctx.arg(3));
    0
}

#[raw_tracepoint(tracepoint = "sched_swap_numa")]
pub fn tk_numa_swap_raw(ctx: RawTracePointContext) -> i32 {
    on_task::<Probe>(ctx.arg(0), SWAPS);
    on_task::<Probe>(ctx.arg(2), SWAPS);
    on_pair(PAIR_SWAP, ctx.arg(1), ctx.arg(3));
    0
}

#[btf_tracepoint(function = "sched_stick_numa")]
pub fn tk_numa_stick(ctx: BtfTracePointContext) -> i32 {
    on_task::<Direct>(ctx.arg(0), STICKS);
    0
}

#[raw_tracepoint(tracepoint = "sched_stick_numa")]
pub fn tk_numa_stick_raw(ctx: RawTracePointContext) -> i32 {
    on_task::<Probe>(ctx.arg(0), STICKS);
    0
}

/// `mm_migrate_pages` through either context's argument reader. The reason is the 7th
/// argument, or the 8th on kernels with `large_folio_split`; the read of the 8th sits behind a
/// frozen global, in a branch of its own, so older kernels' verifiers never see it (two loads at
/// a selected offset would be one load from a computed context pointer, which the verifier
/// refuses; see `prev_state` in sched.rs).
#[inline(always)]
fn on_migrate_args(arg: impl Fn(usize) -> u64) {
    let seventh = arg(6);
    let reason = if ro(&NUMA_MIG_WIDE) != 0 {
        arg(7)
    } else {
        seventh
    };
    on_migrate(arg(0), arg(1), reason as i32);
}

#[btf_tracepoint(function = "mm_migrate_pages")]
pub fn tk_numa_migrate(ctx: BtfTracePointContext) -> i32 {
    on_migrate_args(|i| ctx.arg::<u64>(i));
    0
}

#[raw_tracepoint(tracepoint = "mm_migrate_pages")]
pub fn tk_numa_migrate_raw(ctx: RawTracePointContext) -> i32 {
    on_migrate_args(|i| ctx.arg::<u64>(i));
    0
}

#[fentry(function = "task_numa_fault")]
pub fn tk_numa_fault(ctx: FEntryContext) -> i32 {
    on_fault(
        ctx.arg::<u64>(1) as i32,
        ctx.arg::<u64>(2) as i32,
        ctx.arg::<u64>(3) as i32,
    );
    0
}

probes_ebpf::passing! {
    pub fn tk_numa_fault_kp(ctx: ProbeContext) -> u32 {
        on_fault(
            ctx.arg::<u64>(1).unwrap_or(u64::MAX) as i32,
            ctx.arg::<u64>(2).unwrap_or(0) as i32,
            ctx.arg::<u64>(3).unwrap_or(0) as i32,
        );
        0
    }
}
