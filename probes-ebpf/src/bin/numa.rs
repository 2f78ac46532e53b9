//! `numa` kernel programs: where each process's threads run, node by node, and what NUMA
//! balancing does to it.
//!
//! - `sched:sched_switch` (tp_btf, else raw_tp): the outgoing task's `se.sum_exec_runtime` minus
//!   its value when this CPU switched it in (kept per CPU in `LAST_IN`) is exactly the run that
//!   just ended, and it ran on this CPU's node (`CPU_NODE`, filled by userspace from sysfs). No
//!   timestamp, no per-task map: one per-CPU slot, one array lookup and one hash lookup per
//!   switch; the per-node times of a task add up to its `/proc/<pid>/schedstat` run time.
//!   A run whose switch-in was not seen (begun before the attach, or an event this host's
//!   kernel skips) is `sum_exec_runtime - se.prev_sum_exec_runtime` for fair-class tasks
//!   (`set_next_entity` sets it at each pick, every kernel since 2.6.23), clipped to the attach.
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
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_ns,
    },
    macros::{btf_tracepoint, fentry, map, raw_tracepoint},
    maps::{Array, HashMap, PerCpuArray},
    programs::{BtfTracePointContext, FEntryContext, RawTracePointContext},
};
use probes_common::{
    numa::{
        NumaKey, NumaOffsets, NumaVal, PairKey, Stint, MAX_NODES, PAIR_MOVE, PAIR_SWAP,
        STAT_NO_BASELINE, STAT_NO_NODE, STAT_PAIR_FULL,
    },
    stats,
};
use probes_ebpf::{
    allowed, atomic_add, generation, get_or_insert_copy,
    kread::{Direct, Kread, Probe},
    ro, slot, stat, task_comm,
};

#[no_mangle]
static NUMA_OFFS: NumaOffsets = NumaOffsets {
    pid: 0,
    tgid: 0,
    comm: 0,
    sum_exec_runtime: 0,
    prev_sum_exec_runtime: 0,
    prio: 0,
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

/// Node of each CPU, sized and filled by userspace.
#[map]
static CPU_NODE: Array<u32> = Array::with_max_entries(1, 0);

/// What each CPU switched in last.
#[map]
static LAST_IN: PerCpuArray<Stint> = PerCpuArray::with_max_entries(1, 0);

/// Per process (or thread) and generation, sized by userspace.
#[map]
static NUMA_AGG: HashMap<NumaKey, NumaVal> = HashMap::with_max_entries(8192, BPF_F_NO_PREALLOC);

/// What did not fit `NUMA_AGG`, one row per generation.
#[map]
static NUMA_OTHER: Array<NumaVal> = Array::with_max_entries(2, 0);

/// System-wide task moves and swaps per (kind, source node, destination node) and generation,
/// sized by userspace.
#[map]
static NUMA_PAIRS: HashMap<PairKey, u64> = HashMap::with_max_entries(1024, BPF_F_NO_PREALLOC);

#[map]
static NUMA_SCRATCH: PerCpuArray<NumaVal> = PerCpuArray::with_max_entries(1, 0);

/// The aggregate of `id` (tgid or tid) in the current generation, created with `init` filling
/// the name; every path ends in one pointer (see `probes_ebpf::slot`).
#[inline(always)]
fn value(tid: u32, tgid: u32, init: impl FnOnce(*mut NumaVal)) -> Option<*mut NumaVal> {
    let gen = generation();
    let key = NumaKey {
        id: if ro(&NUMA_PER_THREAD) != 0 { tid } else { tgid },
        gen,
    };
    slot(&NUMA_AGG, &NUMA_OTHER, &NUMA_SCRATCH, &key, gen, |v| {
        init(v);
        // SAFETY: this CPU's scratch slot, owned by this run.
        unsafe { (*v).tgid = tgid };
    })
    .map(|s| s.ptr)
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

/// The node of `cpu` (node 0 for a CPU beyond the map, counted as `STAT_NO_NODE`).
#[inline(always)]
fn node_of(cpu: u32) -> u32 {
    match CPU_NODE.get(cpu) {
        Some(n) => *n,
        None => {
            stat(STAT_NO_NODE);
            0
        }
    }
}

/// One scheduler move or swap from `src_cpu`'s node to `dst_cpu`'s, system-wide (any task).
#[inline(always)]
fn on_pair(kind: u32, src_cpu: u64, dst_cpu: u64) {
    let key = PairKey {
        gen: generation(),
        kind,
        src: node_of(src_cpu as u32),
        dst: node_of(dst_cpu as u32),
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
    let Some(last) = LAST_IN.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's slot; sched_switch programs do not nest on one CPU.
    let base = unsafe { *last };
    // SAFETY: as above.
    unsafe {
        *last = Stint {
            tid: R::u32(next as u64, o.pid),
            valid: 1,
            sum_exec_runtime: R::u64(next as u64, o.sum_exec_runtime),
        };
    }
    let tid = R::u32(prev as u64, o.pid);
    if tid == 0 {
        // The idle task: not a process.
        return;
    }
    let tgid = R::u32(prev as u64, o.tgid);
    if !allowed(tgid) {
        return;
    }
    let sum = R::u64(prev as u64, o.sum_exec_runtime);
    let ran = if base.valid != 0 && base.tid == tid {
        sum.wrapping_sub(base.sum_exec_runtime)
    } else {
        // Its switch-in was not seen (the run began before the attach, or this host's kernel
        // skipped the event). The fair class records `sum_exec_runtime` when it picks a task,
        // which bounds this run from the kernel's own accounting, clipped to the attach time.
        match unseen_run::<R>(prev as u64, sum) {
            Some(ran) => ran,
            None => {
                stat(STAT_NO_BASELINE);
                return;
            }
        }
    };
    stat(stats::EVENTS);
    // The CPU id indexes the array; a CPU beyond it (hot-added after start) counts as node 0.
    // SAFETY: a helper without arguments.
    let cpu = unsafe { bpf_get_smp_processor_id() };
    let node = node_of(cpu) as u64;
    // `current` is still `prev` here.
    let Some(v) = value(tid, tgid, |v| {
        // SAFETY: this CPU's scratch slot, owned by this run.
        unsafe { (*v).comm = bpf_get_current_comm().unwrap_or_default() };
    }) else {
        return;
    };
    // The bound check must be on the index the pointer arithmetic uses (see hist_record): a
    // volatile round trip keeps LLVM from proving it away.
    // SAFETY: reads a local.
    let idx = unsafe { core::ptr::read_volatile(&node) };
    // SAFETY: `v` is a live map value; the index is checked against the array length.
    unsafe {
        atomic_add(&raw mut (*v).runs, 1);
        if idx < MAX_NODES as u64 {
            atomic_add(&raw mut (*v).cpu_ns[idx as usize], ran);
        }
    }
}

/// The run of fair-class `task` that ends now, from `se.prev_sum_exec_runtime`, never longer
/// than the time since the attach; `None` for other classes (which leave that field stale).
#[inline(always)]
fn unseen_run<R: Kread>(task: u64, sum: u64) -> Option<u64> {
    let o = ro(&NUMA_OFFS);
    // `prio` is an int: deadline tasks have -1.
    if (R::u32(task, o.prio) as i32) < 100 {
        return None;
    }
    let since_pick = sum.checked_sub(R::u64(task, o.prev_sum_exec_runtime))?;
    // SAFETY: a helper without arguments.
    let since_attach = unsafe { bpf_ktime_get_ns() }.saturating_sub(ro(&NUMA_START_NS));
    Some(since_pick.min(since_attach))
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
