//! `memstall` kernel programs: time tasks spend stalled in direct compaction, direct reclaim,
//! memcg reclaim and `MADV_COLLAPSE`, per process and kind, plus THP collapse counts.
//!
//! Hooks (classic tracepoints: these events are rare, so the perf-event layer costs nothing that
//! matters, and their fields are read at offsets from the `format` files, passed in as globals):
//! - `compaction:mm_compaction_begin` (no field) / `mm_compaction_end` (`status`, int).
//! - `vmscan:mm_vmscan_direct_reclaim_begin` / `_end` (`nr_reclaimed`, unsigned long), and the
//!   same for `mm_vmscan_memcg_reclaim_*`.
//! - `syscalls:sys_enter_madvise` (`behavior`, an 8-byte argument slot) / `sys_exit_madvise`:
//!   the duration of `madvise(MADV_COLLAPSE)` calls, the only begin/end pair around a collapse.
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
    macros::{map, tracepoint},
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::TracePointContext,
};
use probes_common::{
    memstall::{
        start_key, MsKey, MsNew, MsVal, KIND_COMPACTION, KIND_MEMCG_RECLAIM, KIND_RECLAIM,
        KIND_THP_COLLAPSE, MADV_COLLAPSE, NOUTCOMES,
    },
    stats,
};
use probes_ebpf::{allowed, atomic_add, generation, get_or_insert, hist_record, stat};

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
fn ro<T: Copy>(v: &T) -> T {
    // SAFETY: see probes_ebpf::ro; globals are patched by userspace before load.
    unsafe { core::ptr::read_volatile(v) }
}

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

#[tracepoint]
pub fn tk_ms_compact_end(ctx: TracePointContext) -> u32 {
    let (tgid, tid) = ids();
    let Some(delta) = end(KIND_COMPACTION, tid) else {
        return 0;
    };
    stat(stats::EVENTS);
    // SAFETY: offset from mm_compaction_end's format file; read_at goes through the helper.
    let status = unsafe { ctx.read_at::<i32>(ro(&MS_COMPACT_STATUS_OFF) as usize) }.unwrap_or(-1);
    let slot = if status < 0 || status as usize >= NOUTCOMES {
        NOUTCOMES - 1
    } else {
        status as usize
    };
    if let Some(v) = value(KIND_COMPACTION, tgid, tid) {
        // SAFETY: `v` is a live map value pointer; `slot` < NOUTCOMES.
        unsafe {
            atomic_add(&raw mut (*v).outcomes[slot], 1);
            hist_record(&raw mut (*v).hist, delta);
        }
    }
    0
}

#[inline(always)]
fn reclaim_end(ctx: &TracePointContext, kind: u32) -> u32 {
    let (tgid, tid) = ids();
    let Some(delta) = end(kind, tid) else {
        return 0;
    };
    stat(stats::EVENTS);
    // SAFETY: offset from the end event's format file.
    let pages = unsafe { ctx.read_at::<u64>(ro(&MS_RECLAIMED_OFF) as usize) }.unwrap_or(0);
    if let Some(v) = value(kind, tgid, tid) {
        // SAFETY: `v` is a live map value pointer.
        unsafe {
            atomic_add(&raw mut (*v).reclaimed, pages);
            hist_record(&raw mut (*v).hist, delta);
        }
    }
    0
}

#[tracepoint]
pub fn tk_ms_reclaim_begin(_ctx: TracePointContext) -> u32 {
    begin(KIND_RECLAIM)
}

#[tracepoint]
pub fn tk_ms_reclaim_end(ctx: TracePointContext) -> u32 {
    reclaim_end(&ctx, KIND_RECLAIM)
}

#[tracepoint]
pub fn tk_ms_memcg_begin(_ctx: TracePointContext) -> u32 {
    begin(KIND_MEMCG_RECLAIM)
}

#[tracepoint]
pub fn tk_ms_memcg_end(ctx: TracePointContext) -> u32 {
    reclaim_end(&ctx, KIND_MEMCG_RECLAIM)
}

#[tracepoint]
pub fn tk_ms_madv_enter(ctx: TracePointContext) -> u32 {
    // SAFETY: offset from sys_enter_madvise's format file (an 8-byte argument slot).
    let behavior = unsafe { ctx.read_at::<u64>(ro(&MS_MADV_BEHAVIOR_OFF) as usize) }.unwrap_or(0);
    if behavior != MADV_COLLAPSE {
        return 0;
    }
    begin(KIND_THP_COLLAPSE)
}

#[tracepoint]
pub fn tk_ms_madv_exit(_ctx: TracePointContext) -> u32 {
    let (tgid, tid) = ids();
    let Some(delta) = end(KIND_THP_COLLAPSE, tid) else {
        return 0;
    };
    stat(stats::EVENTS);
    if let Some(v) = value(KIND_THP_COLLAPSE, tgid, tid) {
        // SAFETY: `v` is a live map value pointer.
        unsafe { hist_record(&raw mut (*v).hist, delta) };
    }
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
fn thp_count(ctx: &TracePointContext, what: Thp) -> u32 {
    let (tgid, tid) = ids();
    if !allowed(tgid) {
        return 0;
    }
    stat(stats::EVENTS);
    let Some(v) = value(KIND_THP_COLLAPSE, tgid, tid) else {
        return 0;
    };
    // SAFETY: `v` is a live map value pointer; the status offset comes from the format file.
    unsafe {
        match what {
            Thp::Scan => atomic_add(&raw mut (*v).scans, 1),
            Thp::Isolate => atomic_add(&raw mut (*v).isolates, 1),
            Thp::Collapse => {
                atomic_add(&raw mut (*v).collapses, 1);
                let status = ctx
                    .read_at::<i32>(ro(&MS_COLLAPSE_STATUS_OFF) as usize)
                    .unwrap_or(-1);
                if status as u32 == ro(&MS_SCAN_SUCCEED) {
                    atomic_add(&raw mut (*v).collapsed, 1);
                }
            }
        }
    }
    0
}

#[tracepoint]
pub fn tk_ms_thp_scan(ctx: TracePointContext) -> u32 {
    thp_count(&ctx, Thp::Scan)
}

#[tracepoint]
pub fn tk_ms_thp_isolate(ctx: TracePointContext) -> u32 {
    thp_count(&ctx, Thp::Isolate)
}

#[tracepoint]
pub fn tk_ms_thp_collapse(ctx: TracePointContext) -> u32 {
    thp_count(&ctx, Thp::Collapse)
}
