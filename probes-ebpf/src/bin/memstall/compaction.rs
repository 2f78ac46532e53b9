//! Compaction: direct compaction timed per allocation that stalled, other compaction per zone.
//!
//! `mm_compaction_try_to_compact_pages` begins an attempt of the allocating thread. The kernel
//! counts it in `/proc/vmstat compact_stall` unless every zone was skipped, so the attempt is
//! recorded (one stall) at its first zone that was compacted (`mm_compaction_begin`), deferred
//! (`mm_compaction_deferred`) or found able to serve the allocation
//! (`mm_compaction_defer_reset`), and its recorded time is extended to the end of each of its
//! later zones. Zones compacted outside an attempt (kcompactd, `/proc/sys/vm/compact_memory`)
//! are each one timed value.

use aya_ebpf::{macros::btf_tracepoint, programs::BtfTracePointContext};
use probes_common::{
    hist::{bucket_index_flat, LatHist, NBUCKETS},
    memstall::{start_key, MsAttempt, KIND_COMPACTION, NOUTCOMES},
    stats,
};
use probes_ebpf::{allowed, atomic_add, begin as remember, generation, hist_record, ro, stat};

use super::{
    arg_i32, ids, now_ns, take_begin, value, MS_ATTEMPT, MS_ATTEMPT_GAP_NS, MS_COMPACT_STATUS_ARG,
    MS_COMPACT_STATUS_OFF, MS_START,
};

/// Top bit of a zone's begin timestamp in `MS_START`: the zone belongs to an attempt.
const IN_ATTEMPT: u64 = 1 << 63;

/// Moves one recorded value of `h` from `old` to `new` (an attempt that grew): the count stays,
/// the sum, the buckets and the max follow.
///
/// # Safety
/// `h` must be a map value pointer handed out by a lookup in this program run, holding a value
/// `old` recorded earlier.
#[inline(always)]
unsafe fn hist_amend(h: *mut LatHist, old: u64, new: u64) {
    // SAFETY: per the contract above.
    unsafe {
        atomic_add(&raw mut (*h).sum, new.wrapping_sub(old));
        if new > (*h).max {
            (*h).max = new;
        }
        // The bound checks on the very values the pointer arithmetic uses (see hist_record).
        let oi = core::ptr::read_volatile(&bucket_index_flat(old));
        let ni = core::ptr::read_volatile(&bucket_index_flat(new));
        if oi != ni {
            if oi < NBUCKETS as u64 {
                atomic_add(&raw mut (*h).buckets[oi as usize], u64::MAX);
            }
            if ni < NBUCKETS as u64 {
                atomic_add(&raw mut (*h).buckets[ni as usize], 1);
            }
        }
    }
}

#[inline(always)]
fn compact_try() {
    let (tgid, tid) = ids();
    if !allowed(tgid) {
        return;
    }
    let now = now_ns();
    let a = MsAttempt {
        start_ns: now,
        last_ns: now,
        recorded_plus1: 0,
        gen: 0,
        _pad: 0,
    };
    remember(&MS_ATTEMPT, &tid, &a);
}

/// This thread's attempt in flight, if fresh.
#[inline(always)]
fn attempt(tid: u32, now: u64) -> Option<*mut MsAttempt> {
    let a = MS_ATTEMPT.get_ptr_mut(tid)?;
    // SAFETY: a live map value; only this thread writes its own attempt.
    if now.saturating_sub(unsafe { (*a).last_ns }) > ro(&MS_ATTEMPT_GAP_NS) {
        let _ = MS_ATTEMPT.remove(tid);
        return None;
    }
    Some(a)
}

/// The attempt is a stall (first call: one more in `direct` and in the histogram) that lasted
/// until `now` (later calls: its recorded value grows).
#[inline(always)]
fn attempt_extend(a: *mut MsAttempt, tgid: u32, tid: u32, now: u64) {
    let gen = generation();
    // SAFETY: a live map value of this thread's attempt.
    let (start, old, old_gen) = unsafe {
        (*a).last_ns = now;
        ((*a).start_ns, (*a).recorded_plus1, (*a).gen)
    };
    if old != 0 && old_gen != gen {
        // Recorded in the previous window, which userspace is reading: it stays there.
        return;
    }
    let d = now.saturating_sub(start);
    let Some(v) = value(KIND_COMPACTION, tgid, tid) else {
        return;
    };
    // SAFETY: `v` and `a` are live map value pointers.
    unsafe {
        if old == 0 {
            stat(stats::EVENTS);
            atomic_add(&raw mut (*v).direct, 1);
            hist_record(&raw mut (*v).hist, d);
            (*a).gen = gen;
        } else {
            hist_amend(&raw mut (*v).hist, old - 1, d);
        }
        (*a).recorded_plus1 = d.saturating_add(1);
    }
}

/// A zone of this thread's attempt was deferred or found able to serve the allocation.
#[inline(always)]
fn compact_proof() {
    let (tgid, tid) = ids();
    let now = now_ns();
    if let Some(a) = attempt(tid, now) {
        attempt_extend(a, tgid, tid, now);
    }
}

#[inline(always)]
fn compact_begin() {
    let (tgid, tid) = ids();
    if !allowed(tgid) {
        return;
    }
    let now = now_ns();
    let mut ts = now;
    if let Some(a) = attempt(tid, now) {
        attempt_extend(a, tgid, tid, now);
        ts |= IN_ATTEMPT;
    }
    remember(&MS_START, &start_key(tid, KIND_COMPACTION), &ts);
}

#[inline(always)]
fn compact_end(status: i32) -> u32 {
    let (tgid, tid) = ids();
    let Some(start) = take_begin(KIND_COMPACTION, tid) else {
        return 0;
    };
    let now = now_ns();
    let slot = if status < 0 || status as usize >= NOUTCOMES {
        NOUTCOMES - 1
    } else {
        status as usize
    };
    // As in probes_ebpf::hist_record: the bound check must be emitted on the very value the
    // pointer arithmetic uses, which a volatile round trip forces.
    // SAFETY: reads a local.
    let slot = unsafe { core::ptr::read_volatile(&slot) };
    if start & IN_ATTEMPT != 0 {
        if let Some(a) = MS_ATTEMPT.get_ptr_mut(tid) {
            attempt_extend(a, tgid, tid, now);
        }
    }
    let Some(v) = value(KIND_COMPACTION, tgid, tid) else {
        return 0;
    };
    // SAFETY: `v` is a live map value pointer; `slot` < NOUTCOMES is checked right here.
    unsafe {
        if slot < NOUTCOMES {
            atomic_add(&raw mut (*v).outcomes[slot], 1);
        }
        if start & IN_ATTEMPT == 0 {
            // Compaction that serves no allocation: each zone is one timed value.
            stat(stats::EVENTS);
            hist_record(&raw mut (*v).hist, now.saturating_sub(start));
        }
    }
    0
}

both!(
    tk_ms_compact_try_tp,
    tk_ms_compact_try,
    "mm_compaction_try_to_compact_pages",
    compact_try()
);
both!(
    tk_ms_compact_deferred_tp,
    tk_ms_compact_deferred,
    "mm_compaction_deferred",
    compact_proof()
);
both!(
    tk_ms_compact_reset_tp,
    tk_ms_compact_reset,
    "mm_compaction_defer_reset",
    compact_proof()
);
both!(
    tk_ms_compact_begin_tp,
    tk_ms_compact_begin,
    "mm_compaction_begin",
    compact_begin()
);

probes_ebpf::passing! {
    pub fn tk_ms_compact_end_tp(ctx: TracePointContext) -> u32 {
        // SAFETY: offset from mm_compaction_end's format file; read_at goes through the helper.
        let status = unsafe { ctx.read_at::<i32>(ro(&MS_COMPACT_STATUS_OFF) as usize) }.unwrap_or(-1);
        compact_end(status)
    }
}

#[btf_tracepoint(function = "mm_compaction_end")]
pub fn tk_ms_compact_end(ctx: BtfTracePointContext) -> i32 {
    compact_end(arg_i32(&ctx, ro(&MS_COMPACT_STATUS_ARG))) as i32
}
