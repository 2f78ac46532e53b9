//! `memstall` kernel programs: time tasks spend stalled in direct compaction (per allocation),
//! direct reclaim, memcg reclaim, `MADV_COLLAPSE` and (where fentry or kprobes exist) whole THP
//! faults, per process and kind, plus THP collapse counts, OOM kills and process lifetimes.
//!
//! Hooks (userspace picks the mode per group, see `cli/src/tools/memstall/mod.rs`):
//! - Rare events exist twice: as a BTF tracepoint (`*_b` programs, preferred: arguments straight
//!   from the tracepoint call, positions checked against the kernel's BTF in userspace, and a
//!   link that detaches at once) and as a classic tracepoint (fields at offsets from the
//!   `format` files, on kernels without BTF).
//! - `madvise` is timed from the classic `syscalls:sys_enter_madvise` / `sys_exit_madvise`
//!   events, which fire for madvise only; the BTF tracepoints on the raw `sys_enter` /
//!   `sys_exit` (every syscall of the node compares its number and returns) are the fallback
//!   where tracefs cannot be read.
//! - Whole THP faults: fentry/fexit on `do_huge_pmd_anonymous_page`, else kprobe/kretprobe.
//!
//! Events and fields:
//! - `compaction:*`: see `memstall/compaction.rs` (direct compaction per allocation).
//! - `vmscan:mm_vmscan_direct_reclaim_begin` / `_end` (`nr_reclaimed`, unsigned long), and the
//!   same for `mm_vmscan_memcg_reclaim_*`.
//! - `syscalls:sys_enter_madvise` (`behavior`) / `sys_exit_madvise` (`ret`): the duration of
//!   `madvise(MADV_COLLAPSE)` calls; a call that fails with EINVAL did no collapse work and is
//!   dropped.
//! - `huge_memory:mm_khugepaged_scan_pmd`, `mm_collapse_huge_page_isolate` (counted) and
//!   `mm_collapse_huge_page` (`status`, int: counted, successes apart), in the collapsing task.
//! - `oom:mark_victim`: the victim (BTF: its task; classic: `pid`), streamed.
//! - `sched:sched_process_exit`: when a tracked process (or thread) ended.
//!
//! The memory cgroup of a key is read in the kernel when the key is created: on a v1 (hybrid)
//! host from `task->cgroups->subsys[memory_cgrp_id]->cgroup->kn->id`, on v2 the unified cgroup
//! (`bpf_get_current_cgroup_id`), so processes that exit at once are still placed right.
#![no_std]
#![no_main]

use aya_ebpf::{
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid,
        bpf_get_current_task, bpf_ktime_get_ns, bpf_probe_read_kernel,
        bpf_probe_read_kernel_str_bytes,
    },
    macros::{btf_tracepoint, fentry, fexit, map},
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::{BtfTracePointContext, FEntryContext, FExitContext, TracePointContext},
};
use probes_common::{
    memstall::{
        start_key, MsAttempt, MsCgroup, MsKey, MsLife, MsNew, MsVal, CG_LEVELS, KIND_MEMCG_RECLAIM,
        KIND_RECLAIM, KIND_THP_COLLAPSE, KIND_THP_FAULT, MADV_COLLAPSE, STAT_LIFE_MAP_FULL,
    },
    stats,
};
use probes_ebpf::{
    allowed, atomic_add, begin as remember, btf_load_u64, generation, hist_record, ro, slot, stat,
};

/// A classic-tracepoint program and a BTF-tracepoint program for an event whose arguments are
/// not read, both running `$body`.
macro_rules! both {
    ($tp:ident, $btf:ident, $event:literal, $body:expr) => {
        probes_ebpf::passing! {
            pub fn $tp(_ctx: TracePointContext) -> u32 {
                $body;
                0
            }
        }

        #[btf_tracepoint(function = $event)]
        pub fn $btf(_ctx: BtfTracePointContext) -> i32 {
            $body;
            0
        }
    };
}

#[path = "memstall/compaction.rs"]
mod compaction;
#[path = "memstall/oom.rs"]
mod oom;

/// `mm_compaction_end.status` offset.
#[no_mangle]
static MS_COMPACT_STATUS_OFF: u32 = 44;
/// `mm_vmscan_*_reclaim_end.nr_reclaimed` offset (same for direct and memcg).
#[no_mangle]
static MS_RECLAIMED_OFF: u32 = 8;
/// `sys_enter_madvise.behavior` offset.
#[no_mangle]
static MS_MADV_BEHAVIOR_OFF: u32 = 32;
/// `mm_collapse_huge_page.status` offset and the value named "succeeded" in its format.
#[no_mangle]
static MS_COLLAPSE_STATUS_OFF: u32 = 20;
#[no_mangle]
static MS_SCAN_SUCCEED: u32 = 1;
#[no_mangle]
static MS_PER_THREAD: u8 = 0;
/// `sys_exit_madvise.ret` offset (classic mode).
#[no_mangle]
static MS_MADV_RET_OFF: u32 = 16;
/// BTF mode: position of `status` among the arguments of `mm_compaction_end` and
/// `mm_collapse_huge_page` (its last argument on every kernel seen, checked in userspace).
#[no_mangle]
static MS_COMPACT_STATUS_ARG: u32 = 4;
#[no_mangle]
static MS_COLLAPSE_STATUS_ARG: u32 = 2;
/// Fallback mode: `madvise`'s syscall number, and the offsets in `struct pt_regs` of its third
/// argument (`behavior`) and of the syscall number kept for the exit path.
#[no_mangle]
static MS_NR_MADVISE: u64 = 28;
#[no_mangle]
static MS_REGS_ARG2_OFF: u32 = 96;
#[no_mangle]
static MS_REGS_NR_OFF: u32 = 120;
/// `oom:mark_victim.pid` offset (classic mode).
#[no_mangle]
static MS_OOM_PID_OFF: u32 = 8;
/// BTF mode: `mark_victim`'s first argument is the victim's `struct task_struct *` (5.19+; an
/// `int pid` before).
#[no_mangle]
static MS_OOM_TASK_ARG: u8 = 0;
/// `VM_FAULT_FALLBACK`: a THP fault that fell back to small pages.
#[no_mangle]
static MS_FAULT_FALLBACK: u64 = 0x800;
/// A direct-compaction attempt whose last activity is older than this is stale (the thread
/// later compacts for another reason, e.g. a write to compact_memory).
#[no_mangle]
static MS_ATTEMPT_GAP_NS: u64 = 5_000_000_000;

/// Cgroup and task offsets from the kernel's BTF (`MS_CG_CHASE` 0: unknown, only the v2 helper
/// is used and no names are copied). The pointer picked in `struct css_set` is
/// `subsys[memory_cgrp_id]` (a css, then `->cgroup`) on v1 hosts, `dfl_cgrp` (a cgroup) on v2.
#[no_mangle]
static MS_CG_CHASE: u8 = 0;
#[no_mangle]
static MS_OFF_TASK_CGROUPS: u32 = 0;
#[no_mangle]
static MS_OFF_SET_PICK: u32 = 0;
#[no_mangle]
static MS_CG_PICK_CSS: u8 = 0;
#[no_mangle]
static MS_OFF_CSS_CGROUP: u32 = 0;
#[no_mangle]
static MS_OFF_CGROUP_KN: u32 = 0;
#[no_mangle]
static MS_OFF_KN_ID: u32 = 0;
/// `kernfs_node.parent` (`__parent` since 6.15) and `.name`.
#[no_mangle]
static MS_OFF_KN_PARENT: u32 = 0;
#[no_mangle]
static MS_OFF_KN_NAME: u32 = 0;
/// `task_struct.group_leader`, `.start_time`, `.tgid`, `.comm` (`u32::MAX`: unknown).
#[no_mangle]
static MS_OFF_TASK_LEADER: u32 = u32::MAX;
#[no_mangle]
static MS_OFF_TASK_START: u32 = u32::MAX;
#[no_mangle]
static MS_OFF_TASK_TGID: u32 = u32::MAX;
#[no_mangle]
static MS_OFF_TASK_COMM: u32 = u32::MAX;

/// `BPF_RB_NO_WAKEUP`.
const BPF_RB_NO_WAKEUP: u64 = 1;

/// `-EINVAL`: a `MADV_COLLAPSE` that returns it was refused before any collapse work.
const EINVAL: i64 = -22;

/// Begin timestamps by `start_key(tid, kind)`. Sized by userspace from pid_max.
#[map]
static MS_START: HashMap<u64, u64> = HashMap::with_max_entries(16384, 0);

/// Direct-compaction attempts in flight, by thread. Sized by userspace from pid_max.
#[map]
static MS_ATTEMPT: HashMap<u32, MsAttempt> = HashMap::with_max_entries(16384, 0);

/// Aggregates, sized by userspace (`--max-keys`; both generations share it). Preallocated: a
/// key created on demand allocates inside the traced stall (and the allocator's refill raises an
/// IPI there), which lands in the durations of every other tracer on the same events (20-350 us
/// measured on the first zone of a compaction).
#[map]
static MS_HIST: HashMap<MsKey, MsVal> = HashMap::with_max_entries(2048, 0);

/// What did not fit `MS_HIST`, one row per generation: the `[other]` row.
#[map]
static MS_OTHER: Array<MsVal> = Array::with_max_entries(2, 0);

/// Initial value for new keys (identity filled in, counters zero).
#[map]
static MS_SCRATCH: PerCpuArray<MsVal> = PerCpuArray::with_max_entries(1, 0);

/// Lifetimes of the processes (or threads) with keys, by id. Sized by userspace; preallocated
/// like `MS_HIST`.
#[map]
static MS_LIFE: HashMap<u32, MsLife> = HashMap::with_max_entries(2048, 0);

/// New keys, so userspace learns the process and names its cgroup. Written without a wakeup:
/// a wakeup (an IPI, then the tracer's event loop) from inside a traced operation would land in
/// the durations every tracer on the same events measures; userspace polls instead.
#[map]
static MS_NEW: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// OOM kills (rare).
#[map]
static MS_OOM: RingBuf = RingBuf::with_byte_size(16 * 1024, 0);

#[inline(always)]
fn ids() -> (u32, u32) {
    let pid_tgid = bpf_get_current_pid_tgid();
    ((pid_tgid >> 32) as u32, pid_tgid as u32)
}

#[inline(always)]
fn now_ns() -> u64 {
    // SAFETY: plain helper call.
    unsafe { bpf_ktime_get_ns() }
}

#[inline(always)]
fn per_thread() -> bool {
    ro(&MS_PER_THREAD) != 0
}

/// The u64 at kernel address `addr` (0 when unreadable).
#[inline(always)]
fn read_u64(addr: u64) -> u64 {
    // SAFETY: bpf_probe_read_kernel copies through the helper, which tolerates any address.
    unsafe { bpf_probe_read_kernel(addr as *const u64) }.unwrap_or(0)
}

/// The kernfs node of `task`'s memory cgroup (`task` a `struct task_struct *`): the v1 memory
/// hierarchy's cgroup or the unified one, as set up by userspace; 0 when unknown.
#[inline(always)]
fn memcg_kn(task: u64) -> u64 {
    if ro(&MS_CG_CHASE) == 0 || task == 0 {
        return 0;
    }
    let set = read_u64(task + ro(&MS_OFF_TASK_CGROUPS) as u64);
    if set == 0 {
        return 0;
    }
    let mut cg = read_u64(set + ro(&MS_OFF_SET_PICK) as u64);
    if cg != 0 && ro(&MS_CG_PICK_CSS) != 0 {
        cg = read_u64(cg + ro(&MS_OFF_CSS_CGROUP) as u64);
    }
    if cg == 0 {
        return 0;
    }
    read_u64(cg + ro(&MS_OFF_CGROUP_KN) as u64)
}

/// The current task's memory cgroup: its kernfs node (0 without BTF offsets) and id.
#[inline(always)]
fn current_memcg() -> (u64, u64) {
    if ro(&MS_CG_CHASE) == 0 {
        // SAFETY: plain helper call.
        return (0, unsafe { bpf_get_current_cgroup_id() });
    }
    // SAFETY: plain helper call.
    let kn = memcg_kn(unsafe { bpf_get_current_task() });
    (
        kn,
        if kn == 0 {
            0
        } else {
            read_u64(kn + ro(&MS_OFF_KN_ID) as u64)
        },
    )
}

/// Fills `c` (in a ring-buffer record) with the cgroup of kernfs node `kn`: its id and its
/// directories' names from the cgroup up to (not including) the hierarchy's root.
///
/// # Safety
/// `c` must point into a reserved ring-buffer record.
#[inline(always)]
unsafe fn fill_cgroup(c: *mut MsCgroup, kn: u64, id: u64) {
    // SAFETY: per the contract above; every name is copied through the helper.
    unsafe {
        (*c).id = id;
        (*c).depth = 0;
        (*c).truncated = 0;
        let mut node = kn;
        let mut i = 0;
        while i < CG_LEVELS {
            let parent = if node == 0 {
                0
            } else {
                read_u64(node + ro(&MS_OFF_KN_PARENT) as u64)
            };
            if parent == 0 {
                break;
            }
            let name = read_u64(node + ro(&MS_OFF_KN_NAME) as u64);
            let _ = bpf_probe_read_kernel_str_bytes(name as *const u8, &mut (*c).names[i]);
            (*c).depth = i as u32 + 1;
            node = parent;
            i += 1;
        }
        if i == CG_LEVELS && node != 0 && read_u64(node + ro(&MS_OFF_KN_PARENT) as u64) != 0 {
            (*c).truncated = 1;
        }
    }
}

/// When the current process (or thread, per thread) started, monotonic ns; 0 when unknown.
#[inline(always)]
fn start_time() -> u64 {
    if ro(&MS_OFF_TASK_START) == u32::MAX {
        return 0;
    }
    // SAFETY: plain helper call.
    let mut task = unsafe { bpf_get_current_task() };
    if !per_thread() && ro(&MS_OFF_TASK_LEADER) != u32::MAX {
        task = read_u64(task + ro(&MS_OFF_TASK_LEADER) as u64);
    }
    if task == 0 {
        return 0;
    }
    read_u64(task + ro(&MS_OFF_TASK_START) as u64)
}

#[inline(always)]
fn begin(kind: u32) {
    let (tgid, tid) = ids();
    if !allowed(tgid) {
        return;
    }
    remember(&MS_START, &start_key(tid, kind), &now_ns());
}

/// The begin of `kind` in this thread, removed; `None` when the begin was filtered out or
/// happened before we attached.
#[inline(always)]
fn take_begin(kind: u32, tid: u32) -> Option<u64> {
    let key = start_key(tid, kind);
    // SAFETY: the value is copied out before the delete below.
    let start = unsafe { MS_START.get(key) }.copied()?;
    let _ = MS_START.remove(key);
    Some(start)
}

/// Time since the matching begin of `kind` in this thread.
#[inline(always)]
fn end(kind: u32, tid: u32) -> Option<u64> {
    let now = now_ns();
    take_begin(kind, tid).map(|s| now.saturating_sub(s))
}

/// The aggregate of (current process or thread, `kind`) in this generation, created on first
/// use (with its memory cgroup read now, announced on `MS_NEW`, its lifetime tracked), or the
/// `[other]` row when the map is full.
#[inline(always)]
fn value(kind: u32, tgid: u32, tid: u32) -> Option<*mut MsVal> {
    let id = if per_thread() { tid } else { tgid };
    let key = MsKey {
        id,
        kind,
        gen: generation(),
        _pad: 0,
    };
    let (mut kn, mut cg) = (0u64, 0u64);
    let s = slot(&MS_HIST, &MS_OTHER, &MS_SCRATCH, &key, key.gen, |init| {
        (kn, cg) = current_memcg();
        // SAFETY: this CPU's scratch slot; only identity fields are written, so its counters
        // stay zero.
        unsafe {
            (*init).comm = bpf_get_current_comm().unwrap_or_default();
            (*init).tgid = tgid;
            (*init).cgroup_id = cg;
        }
    })?;
    if s.created {
        match MS_NEW.reserve::<MsNew>(0) {
            Some(mut e) => {
                let p = e.as_mut_ptr();
                // SAFETY: `p` is the reserved record; every field is written before submit.
                unsafe {
                    (*p).tgid = tgid;
                    (*p).tid = tid;
                    (*p).kind = kind;
                    (*p)._pad = 0;
                    fill_cgroup(&raw mut (*p).cgroup, kn, cg);
                }
                e.submit(BPF_RB_NO_WAKEUP);
            }
            None => stat(stats::RINGBUF_FULL),
        }
        let life = MsLife {
            start_ns: start_time(),
            exit_ns: 0,
        };
        if MS_LIFE.insert(id, life, 0).is_err() {
            stat(STAT_LIFE_MAP_FULL);
        }
    }
    Some(s.ptr)
}

/// Argument `idx` of a BTF tracepoint as an int. The index is a read-only global, so the
/// verifier follows one arm with a constant context offset.
#[inline(always)]
fn arg_i32(ctx: &BtfTracePointContext, idx: u32) -> i32 {
    (match idx {
        0 => ctx.arg::<u64>(0),
        1 => ctx.arg::<u64>(1),
        2 => ctx.arg::<u64>(2),
        3 => ctx.arg::<u64>(3),
        4 => ctx.arg::<u64>(4),
        5 => ctx.arg::<u64>(5),
        6 => ctx.arg::<u64>(6),
        _ => u64::MAX,
    }) as i32
}

// ---------------------------------------------------------------------------------------------
// Reclaim.

#[inline(always)]
fn reclaim_end(kind: u32, pages: u64) -> u32 {
    let (tgid, tid) = ids();
    let Some(delta) = end(kind, tid) else {
        return 0;
    };
    stat(stats::EVENTS);
    if let Some(v) = value(kind, tgid, tid) {
        // SAFETY: `v` is a live map value pointer.
        unsafe {
            atomic_add(&raw mut (*v).reclaimed, pages);
            hist_record(&raw mut (*v).hist, delta);
        }
    }
    0
}

#[inline(always)]
fn reclaim_end_tp(ctx: &TracePointContext, kind: u32) -> u32 {
    // SAFETY: offset from the end event's format file.
    let pages = unsafe { ctx.read_at::<u64>(ro(&MS_RECLAIMED_OFF) as usize) }.unwrap_or(0);
    reclaim_end(kind, pages)
}

both!(
    tk_ms_reclaim_begin_tp,
    tk_ms_reclaim_begin,
    "mm_vmscan_direct_reclaim_begin",
    begin(KIND_RECLAIM)
);
both!(
    tk_ms_memcg_begin_tp,
    tk_ms_memcg_begin,
    "mm_vmscan_memcg_reclaim_begin",
    begin(KIND_MEMCG_RECLAIM)
);

probes_ebpf::passing! {
    pub fn tk_ms_reclaim_end_tp(ctx: TracePointContext) -> u32 {
        reclaim_end_tp(&ctx, KIND_RECLAIM)
    }
}

probes_ebpf::passing! {
    pub fn tk_ms_memcg_end_tp(ctx: TracePointContext) -> u32 {
        reclaim_end_tp(&ctx, KIND_MEMCG_RECLAIM)
    }
}

/// `mm_vmscan_*_reclaim_end(unsigned long nr_reclaimed)`.
#[btf_tracepoint(function = "mm_vmscan_direct_reclaim_end")]
pub fn tk_ms_reclaim_end(ctx: BtfTracePointContext) -> i32 {
    reclaim_end(KIND_RECLAIM, ctx.arg(0)) as i32
}

#[btf_tracepoint(function = "mm_vmscan_memcg_reclaim_end")]
pub fn tk_ms_memcg_end(ctx: BtfTracePointContext) -> i32 {
    reclaim_end(KIND_MEMCG_RECLAIM, ctx.arg(0)) as i32
}

// ---------------------------------------------------------------------------------------------
// MADV_COLLAPSE and THP collapse counts.

#[inline(always)]
fn madv_enter(behavior: u64) {
    if behavior == MADV_COLLAPSE {
        begin(KIND_THP_COLLAPSE);
    }
}

#[inline(always)]
fn madv_exit(ret: i64) {
    let (tgid, tid) = ids();
    let Some(delta) = end(KIND_THP_COLLAPSE, tid) else {
        return;
    };
    if ret == EINVAL {
        return;
    }
    stat(stats::EVENTS);
    if let Some(v) = value(KIND_THP_COLLAPSE, tgid, tid) {
        // SAFETY: `v` is a live map value pointer.
        unsafe { hist_record(&raw mut (*v).hist, delta) };
    }
}

probes_ebpf::passing! {
    pub fn tk_ms_madv_enter_tp(ctx: TracePointContext) -> u32 {
        // SAFETY: offset from sys_enter_madvise's format file (an 8-byte argument slot).
        let behavior = unsafe { ctx.read_at::<u64>(ro(&MS_MADV_BEHAVIOR_OFF) as usize) }.unwrap_or(0);
        madv_enter(behavior);
        0
    }
}

probes_ebpf::passing! {
    pub fn tk_ms_madv_exit_tp(ctx: TracePointContext) -> u32 {
        // SAFETY: offset from sys_exit_madvise's format file.
        let ret = unsafe { ctx.read_at::<i64>(ro(&MS_MADV_RET_OFF) as usize) }.unwrap_or(0);
        madv_exit(ret);
        0
    }
}

/// Fallback without tracefs: `sys_enter(struct pt_regs *regs, long id)`; every syscall but
/// madvise returns after the comparison.
#[btf_tracepoint(function = "sys_enter")]
pub fn tk_ms_madv_enter(ctx: BtfTracePointContext) -> i32 {
    let id: u64 = ctx.arg(1);
    if id != ro(&MS_NR_MADVISE) {
        return 0;
    }
    let regs: *const u8 = ctx.arg(0);
    // SAFETY: `regs` is the tracepoint's BTF-typed `struct pt_regs *`; the offset is a member
    // offset from the kernel's BTF.
    madv_enter(unsafe { btf_load_u64(regs, ro(&MS_REGS_ARG2_OFF)) });
    0
}

/// Fallback without tracefs: `sys_exit(struct pt_regs *regs, long ret)`.
#[btf_tracepoint(function = "sys_exit")]
pub fn tk_ms_madv_exit(ctx: BtfTracePointContext) -> i32 {
    let regs: *const u8 = ctx.arg(0);
    // SAFETY: as above.
    if unsafe { btf_load_u64(regs, ro(&MS_REGS_NR_OFF)) } != ro(&MS_NR_MADVISE) {
        return 0;
    }
    madv_exit(ctx.arg(1));
    0
}

/// Which THP counter an event bumps.
#[derive(Clone, Copy)]
enum Thp {
    Scan,
    Isolate,
    Collapse,
}

#[inline(always)]
fn thp_count(what: Thp, status: i32) -> u32 {
    let (tgid, tid) = ids();
    if !allowed(tgid) {
        return 0;
    }
    stat(stats::EVENTS);
    let Some(v) = value(KIND_THP_COLLAPSE, tgid, tid) else {
        return 0;
    };
    // SAFETY: `v` is a live map value pointer.
    unsafe {
        match what {
            Thp::Scan => atomic_add(&raw mut (*v).scans, 1),
            Thp::Isolate => atomic_add(&raw mut (*v).isolates, 1),
            Thp::Collapse => {
                atomic_add(&raw mut (*v).collapses, 1);
                if status as u32 == ro(&MS_SCAN_SUCCEED) {
                    atomic_add(&raw mut (*v).collapsed, 1);
                }
            }
        }
    }
    0
}

both!(
    tk_ms_thp_scan_tp,
    tk_ms_thp_scan,
    "mm_khugepaged_scan_pmd",
    thp_count(Thp::Scan, -1)
);
both!(
    tk_ms_thp_isolate_tp,
    tk_ms_thp_isolate,
    "mm_collapse_huge_page_isolate",
    thp_count(Thp::Isolate, -1)
);

probes_ebpf::passing! {
    pub fn tk_ms_thp_collapse_tp(ctx: TracePointContext) -> u32 {
        // SAFETY: the status offset comes from the format file; read_at goes through the helper.
        let status = unsafe { ctx.read_at::<i32>(ro(&MS_COLLAPSE_STATUS_OFF) as usize) }.unwrap_or(-1);
        thp_count(Thp::Collapse, status)
    }
}

#[btf_tracepoint(function = "mm_collapse_huge_page")]
pub fn tk_ms_thp_collapse(ctx: BtfTracePointContext) -> i32 {
    thp_count(Thp::Collapse, arg_i32(&ctx, ro(&MS_COLLAPSE_STATUS_ARG))) as i32
}

// ---------------------------------------------------------------------------------------------
// Whole THP faults (fentry/fexit, else kprobe/kretprobe on do_huge_pmd_anonymous_page).

#[inline(always)]
fn fault_exit(ret: u64) {
    let (tgid, tid) = ids();
    let Some(delta) = end(KIND_THP_FAULT, tid) else {
        return;
    };
    stat(stats::EVENTS);
    if let Some(v) = value(KIND_THP_FAULT, tgid, tid) {
        // SAFETY: `v` is a live map value pointer.
        unsafe {
            if ret & ro(&MS_FAULT_FALLBACK) != 0 {
                atomic_add(&raw mut (*v).fallbacks, 1);
            }
            hist_record(&raw mut (*v).hist, delta);
        }
    }
}

#[fentry(function = "do_huge_pmd_anonymous_page")]
pub fn tk_ms_fault_entry(_ctx: FEntryContext) -> u32 {
    begin(KIND_THP_FAULT);
    0
}

/// `vm_fault_t do_huge_pmd_anonymous_page(struct vm_fault *vmf)`: the return value follows the
/// one argument.
#[fexit(function = "do_huge_pmd_anonymous_page")]
pub fn tk_ms_fault_exit(ctx: FExitContext) -> u32 {
    let ret: u64 = ctx.arg(1);
    fault_exit(ret & 0xffff_ffff);
    0
}

probes_ebpf::passing! {
    pub fn tk_ms_fault_entry_kp(_ctx: ProbeContext) -> u32 {
        begin(KIND_THP_FAULT);
        0
    }
}

probes_ebpf::passing! {
    pub fn tk_ms_fault_exit_krp(ctx: RetProbeContext) -> u32 {
        let ret: u64 = ctx.ret();
        fault_exit(ret & 0xffff_ffff);
        0
    }
}
