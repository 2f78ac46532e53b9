//! `memstall` kernel programs: time tasks spend stalled in direct compaction, direct reclaim,
//! memcg reclaim and `MADV_COLLAPSE`, per process and kind, plus THP collapse counts.
//!
//! Each hook exists twice: as a BTF tracepoint (`*_b` programs, preferred: arguments straight
//! from the tracepoint call, positions checked against the kernel's BTF in userspace), and as a
//! classic tracepoint (fields at offsets from the `format` files, on kernels without BTF). The
//! events are rare, so the perf-event layer of the classic ones costs nothing at run time, but
//! closing each classic-tracepoint perf event waits for an RCU grace period under a global mutex
//! (~35–90 ms per event here, ~0.9 s for eleven), while a BTF tracepoint link detaches at once.
//! `madvise` is timed from the raw `sys_enter` / `sys_exit` tracepoints in BTF mode (every
//! syscall compares its number and returns; see `fsync_lat.rs`).
//!
//! Events and fields:
//! - `compaction:mm_compaction_begin` (no field) / `mm_compaction_end` (`status`, int).
//! - `vmscan:mm_vmscan_direct_reclaim_begin` / `_end` (`nr_reclaimed`, unsigned long), and the
//!   same for `mm_vmscan_memcg_reclaim_*`.
//! - `syscalls:sys_enter_madvise` (`behavior`, an 8-byte argument slot) / `sys_exit_madvise`:
//!   the duration of `madvise(MADV_COLLAPSE)` calls, the only begin/end pair around a collapse;
//!   a call that fails with EINVAL (bad range, THP not allowed for it) did no collapse work and
//!   is not a stall, so it is dropped (`ret`, long).
//! - `huge_memory:mm_khugepaged_scan_pmd`, `mm_collapse_huge_page_isolate` (counted) and
//!   `mm_collapse_huge_page` (`status`, int: counted, successes apart). They fire in the
//!   collapsing task: khugepaged, or the `MADV_COLLAPSE` caller.
//!
//! Begin events store a timestamp per (thread, kind); end events record the difference.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns,
    },
    macros::{btf_tracepoint, map, tracepoint},
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::{BtfTracePointContext, TracePointContext},
};
use probes_common::{
    memstall::{
        start_key, MsKey, MsNew, MsVal, KIND_COMPACTION, KIND_MEMCG_RECLAIM, KIND_RECLAIM,
        KIND_THP_COLLAPSE, MADV_COLLAPSE, NOUTCOMES,
    },
    stats,
};
use probes_ebpf::{
    allowed, atomic_add, btf_load_u64, generation, get_or_insert, hist_record, ro, stat,
};

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
/// BTF mode: `madvise`'s syscall number, and the offsets in `struct pt_regs` of its third
/// argument (`behavior`) and of the syscall number kept for the exit path.
#[no_mangle]
static MS_NR_MADVISE: u64 = 28;
#[no_mangle]
static MS_REGS_ARG2_OFF: u32 = 96;
#[no_mangle]
static MS_REGS_NR_OFF: u32 = 120;

/// `-EINVAL`: a `MADV_COLLAPSE` that returns it was refused before any collapse work.
const EINVAL: i64 = -22;

/// Begin timestamps by `start_key(tid, kind)`. Sized by userspace from pid_max.
#[map]
static MS_START: HashMap<u64, u64> = HashMap::with_max_entries(16384, 0);

/// Aggregates, sized by userspace (`--max-keys`, doubled for the two generations).
#[map]
static MS_HIST: HashMap<MsKey, MsVal> = HashMap::with_max_entries(8192, BPF_F_NO_PREALLOC);

/// What did not fit `MS_HIST`, one row per generation: the `[other]` row.
#[map]
static MS_OTHER: Array<MsVal> = Array::with_max_entries(2, 0);

/// Initial value for new keys (identity filled in, counters zero).
#[map]
static MS_SCRATCH: PerCpuArray<MsVal> = PerCpuArray::with_max_entries(1, 0);

/// New keys, so userspace resolves cgroup and name while the process lives; low rate.
#[map]
static MS_NEW: RingBuf = RingBuf::with_byte_size(64 * 1024, 0);

#[inline(always)]
fn ids() -> (u32, u32) {
    let pid_tgid = bpf_get_current_pid_tgid();
    ((pid_tgid >> 32) as u32, pid_tgid as u32)
}

#[inline(always)]
fn begin(kind: u32) -> u32 {
    let (tgid, tid) = ids();
    if !allowed(tgid) {
        return 0;
    }
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    if MS_START.insert(start_key(tid, kind), now, 0).is_err() {
        stat(stats::START_MAP_FULL);
    }
    0
}

/// Time since the matching begin of `kind` in this thread, removing it; `None` when the begin
/// was filtered out or happened before we attached.
#[inline(always)]
fn end(kind: u32, tid: u32) -> Option<u64> {
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    let key = start_key(tid, kind);
    // SAFETY: the value is copied out before the delete below.
    let start = unsafe { MS_START.get(key) }.copied()?;
    let _ = MS_START.remove(key);
    Some(now.saturating_sub(start))
}

/// The aggregate of (current process or thread, `kind`) in this generation, created on first
/// use (announced on `MS_NEW`), or the `[other]` row when the map is full.
#[inline(always)]
fn value(kind: u32, tgid: u32, tid: u32) -> Option<*mut MsVal> {
    let key = MsKey {
        id: if ro(&MS_PER_THREAD) != 0 { tid } else { tgid },
        kind,
        gen: generation(),
        _pad: 0,
    };
    if let Some(p) = MS_HIST.get_ptr_mut(key) {
        return Some(p);
    }
    let created = match MS_SCRATCH.get_ptr_mut(0) {
        Some(init) => {
            // SAFETY: per-CPU scratch slot owned by this run; only identity fields are ever
            // written, so its counters stay zero.
            unsafe {
                (*init).comm = bpf_get_current_comm().unwrap_or_default();
                (*init).tgid = tgid;
                (*init).cgroup_id = bpf_get_current_cgroup_id();
            }
            // SAFETY: the scratch slot is valid for this run (see above).
            get_or_insert(&MS_HIST, &key, unsafe { &*init })
        }
        None => None,
    };
    match created {
        Some(p) => {
            let ev = MsNew {
                tgid,
                tid,
                kind,
                _pad: 0,
            };
            if MS_NEW.output::<MsNew>(&ev, 0).is_err() {
                stat(stats::RINGBUF_FULL);
            }
            Some(p)
        }
        None => {
            stat(stats::KEY_MAP_FULL);
            MS_OTHER.get_ptr_mut(key.gen)
        }
    }
}

#[tracepoint]
pub fn tk_ms_compact_begin(_ctx: TracePointContext) -> u32 {
    begin(KIND_COMPACTION)
}

#[inline(always)]
fn compact_end(status: i32) -> u32 {
    let (tgid, tid) = ids();
    let Some(delta) = end(KIND_COMPACTION, tid) else {
        return 0;
    };
    stat(stats::EVENTS);
    let slot = if status < 0 || status as usize >= NOUTCOMES {
        NOUTCOMES - 1
    } else {
        status as usize
    };
    // As in probes_ebpf::hist_record: the bound check must be emitted on the very value the
    // pointer arithmetic uses, which a volatile round trip forces (else LLVM folds it away and
    // the verifier sees an unbounded index).
    // SAFETY: reads a local.
    let slot = unsafe { core::ptr::read_volatile(&slot) };
    if let Some(v) = value(KIND_COMPACTION, tgid, tid) {
        // SAFETY: `v` is a live map value pointer; `slot` < NOUTCOMES is checked right here.
        unsafe {
            if slot < NOUTCOMES {
                atomic_add(&raw mut (*v).outcomes[slot], 1);
            }
            hist_record(&raw mut (*v).hist, delta);
        }
    }
    0
}

#[tracepoint]
pub fn tk_ms_compact_end(ctx: TracePointContext) -> u32 {
    // SAFETY: offset from mm_compaction_end's format file; read_at goes through the helper.
    let status = unsafe { ctx.read_at::<i32>(ro(&MS_COMPACT_STATUS_OFF) as usize) }.unwrap_or(-1);
    compact_end(status)
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

#[btf_tracepoint(function = "mm_compaction_begin")]
pub fn tk_ms_compact_begin_b(_ctx: BtfTracePointContext) -> i32 {
    begin(KIND_COMPACTION) as i32
}

#[btf_tracepoint(function = "mm_compaction_end")]
pub fn tk_ms_compact_end_b(ctx: BtfTracePointContext) -> i32 {
    compact_end(arg_i32(&ctx, ro(&MS_COMPACT_STATUS_ARG))) as i32
}

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

#[tracepoint]
pub fn tk_ms_reclaim_begin(_ctx: TracePointContext) -> u32 {
    begin(KIND_RECLAIM)
}

#[tracepoint]
pub fn tk_ms_reclaim_end(ctx: TracePointContext) -> u32 {
    reclaim_end_tp(&ctx, KIND_RECLAIM)
}

#[tracepoint]
pub fn tk_ms_memcg_begin(_ctx: TracePointContext) -> u32 {
    begin(KIND_MEMCG_RECLAIM)
}

#[tracepoint]
pub fn tk_ms_memcg_end(ctx: TracePointContext) -> u32 {
    reclaim_end_tp(&ctx, KIND_MEMCG_RECLAIM)
}

/// `mm_vmscan_*_reclaim_end(unsigned long nr_reclaimed)`.
#[btf_tracepoint(function = "mm_vmscan_direct_reclaim_begin")]
pub fn tk_ms_reclaim_begin_b(_ctx: BtfTracePointContext) -> i32 {
    begin(KIND_RECLAIM) as i32
}

#[btf_tracepoint(function = "mm_vmscan_direct_reclaim_end")]
pub fn tk_ms_reclaim_end_b(ctx: BtfTracePointContext) -> i32 {
    reclaim_end(KIND_RECLAIM, ctx.arg(0)) as i32
}

#[btf_tracepoint(function = "mm_vmscan_memcg_reclaim_begin")]
pub fn tk_ms_memcg_begin_b(_ctx: BtfTracePointContext) -> i32 {
    begin(KIND_MEMCG_RECLAIM) as i32
}

#[btf_tracepoint(function = "mm_vmscan_memcg_reclaim_end")]
pub fn tk_ms_memcg_end_b(ctx: BtfTracePointContext) -> i32 {
    reclaim_end(KIND_MEMCG_RECLAIM, ctx.arg(0)) as i32
}

#[inline(always)]
fn madv_enter(behavior: u64) -> u32 {
    if behavior != MADV_COLLAPSE {
        return 0;
    }
    begin(KIND_THP_COLLAPSE)
}

#[inline(always)]
fn madv_exit(ret: i64) -> u32 {
    let (tgid, tid) = ids();
    let Some(delta) = end(KIND_THP_COLLAPSE, tid) else {
        return 0;
    };
    if ret == EINVAL {
        return 0;
    }
    stat(stats::EVENTS);
    if let Some(v) = value(KIND_THP_COLLAPSE, tgid, tid) {
        // SAFETY: `v` is a live map value pointer.
        unsafe { hist_record(&raw mut (*v).hist, delta) };
    }
    0
}

#[tracepoint]
pub fn tk_ms_madv_enter(ctx: TracePointContext) -> u32 {
    // SAFETY: offset from sys_enter_madvise's format file (an 8-byte argument slot).
    let behavior = unsafe { ctx.read_at::<u64>(ro(&MS_MADV_BEHAVIOR_OFF) as usize) }.unwrap_or(0);
    madv_enter(behavior)
}

#[tracepoint]
pub fn tk_ms_madv_exit(ctx: TracePointContext) -> u32 {
    // SAFETY: offset from sys_exit_madvise's format file.
    let ret = unsafe { ctx.read_at::<i64>(ro(&MS_MADV_RET_OFF) as usize) }.unwrap_or(0);
    madv_exit(ret)
}

/// `sys_enter(struct pt_regs *regs, long id)`: all syscalls but madvise return at once.
#[btf_tracepoint(function = "sys_enter")]
pub fn tk_ms_madv_enter_b(ctx: BtfTracePointContext) -> i32 {
    let id: u64 = ctx.arg(1);
    if id != ro(&MS_NR_MADVISE) {
        return 0;
    }
    let regs: *const u8 = ctx.arg(0);
    // SAFETY: `regs` is the tracepoint's BTF-typed `struct pt_regs *`; the offset is a member
    // offset from the kernel's BTF.
    madv_enter(unsafe { btf_load_u64(regs, ro(&MS_REGS_ARG2_OFF)) }) as i32
}

/// `sys_exit(struct pt_regs *regs, long ret)`.
#[btf_tracepoint(function = "sys_exit")]
pub fn tk_ms_madv_exit_b(ctx: BtfTracePointContext) -> i32 {
    let regs: *const u8 = ctx.arg(0);
    // SAFETY: as above.
    if unsafe { btf_load_u64(regs, ro(&MS_REGS_NR_OFF)) } != ro(&MS_NR_MADVISE) {
        return 0;
    }
    madv_exit(ctx.arg(1)) as i32
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

#[tracepoint]
pub fn tk_ms_thp_scan(_ctx: TracePointContext) -> u32 {
    thp_count(Thp::Scan, -1)
}

#[tracepoint]
pub fn tk_ms_thp_isolate(_ctx: TracePointContext) -> u32 {
    thp_count(Thp::Isolate, -1)
}

#[tracepoint]
pub fn tk_ms_thp_collapse(ctx: TracePointContext) -> u32 {
    // SAFETY: the status offset comes from the format file; read_at goes through the helper.
    let status = unsafe { ctx.read_at::<i32>(ro(&MS_COLLAPSE_STATUS_OFF) as usize) }.unwrap_or(-1);
    thp_count(Thp::Collapse, status)
}

#[btf_tracepoint(function = "mm_khugepaged_scan_pmd")]
pub fn tk_ms_thp_scan_b(_ctx: BtfTracePointContext) -> i32 {
    thp_count(Thp::Scan, -1) as i32
}

#[btf_tracepoint(function = "mm_collapse_huge_page_isolate")]
pub fn tk_ms_thp_isolate_b(_ctx: BtfTracePointContext) -> i32 {
    thp_count(Thp::Isolate, -1) as i32
}

#[btf_tracepoint(function = "mm_collapse_huge_page")]
pub fn tk_ms_thp_collapse_b(ctx: BtfTracePointContext) -> i32 {
    thp_count(Thp::Collapse, arg_i32(&ctx, ro(&MS_COLLAPSE_STATUS_ARG))) as i32
}
