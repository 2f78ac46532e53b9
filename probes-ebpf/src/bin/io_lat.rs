//! `io-lat` kernel programs: block I/O queue time (insert → issue) and device time
//! (issue → complete) per (cgroup, device, issuing process, op), request sizes, errors, and
//! per-device queue depth.
//!
//! Hooks, tracked by `struct request *` (BTF prototypes on 6.18, `btf_trace_<event>`):
//! - `block:block_bio_queue(struct bio *bio)` (`(q, bio)` up to 5.10, [`IO_BIO_Q_ARG`]): a bio
//!   submitted, in the issuer (`submit_bio_noacct`, once per bio). Its time is kept in a table
//!   by bio address ([`bio`]) until a request whose first bio (`request.bio`) it is is first seen:
//!   what the issuer waited for starts there, before plugging, merge attempts and the wait for a
//!   tag.
//! - `block:block_rq_insert(struct request *rq)`: the request enters the I/O scheduler (or the
//!   hctx dispatch list). Fires in the submitter's context (`blk_mq_insert_request`, or a plug
//!   flush at `blk_finish_plug`/`schedule`), so the issuer is `current`.
//! - `block:block_rq_issue(struct request *rq)`: handed to the driver (`blk_mq_start_request`).
//!   Requests never inserted (scheduler `none`: `blk_mq_try_issue_directly`,
//!   `blk_mq_plug_issue_direct`) are first seen here, also in the submitter's context.
//!   Requests dispatched from an elevator may be issued by kblockd: the issuer recorded at
//!   insert is kept.
//! - `block:block_rq_requeue(struct request *rq)`: back from the driver (`BLK_STS_RESOURCE` when
//!   its ring is full, a timeout): the request waits in a queue again, and its next issue starts
//!   its device time anew.
//! - `block:block_rq_merge(struct request *rq)`: a queued request merged into another and freed
//!   (`attempt_merge`): its entry goes.
//! - `block:block_rq_complete(struct request *rq, blk_status_t error, unsigned int nr_bytes)`
//!   (since 4.13; `error` was an `int` errno up to 5.x, see `IO_ERR_ERRNO`; the classic
//!   event's `error` field is always the errno): runs in interrupt or a driver's worker context,
//!   so nothing about the issuer is read here. `blk_update_request` fires it once per partial
//!   completion: only `nr_bytes >= rq->__data_len` (the last one) ends the request.
//!   Before 5.11 insert/issue/requeue/merge also passed the request_queue first (`IO_Q_ARG`).
//!
//! Attach modes: tp_btf (plain loads from the BTF-typed `rq`), else raw_tp (the same code with
//! `bpf_probe_read_kernel`). Both are instantiated from one generic body ([`Kread`]). Fallback
//! for kernels without BTF: the classic tracepoints, keyed by (dev, sector) (the `*_tp`
//! programs in [`classic`]). The request lifecycle (queued → issued → completed, requeued,
//! merged) is one generic state machine over either in-flight store ([`store`]).
//!
//! Struct members read (offsets from /sys/kernel/btf/vmlinux, [`RqOffsets`]):
//! `request.{q,cmd_flags,__data_len,bio}`, `request_queue.disk` (`request.rq_disk` before 5.15),
//! `gendisk.{major,first_minor}` (the whole disk, as `/proc/diskstats` and the classic event's
//! `dev` count it), `bio.bi_blkg →
//! blkcg_gq.blkcg → blkcg.css.cgroup → cgroup.kn →
//! kernfs_node.id` (the cgroup the I/O is charged to: for writeback the cgroup that dirtied the
//! pages, set by `wbc_init_bio`, while `current` is the flusher kworker).
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{btf_tracepoint, map, raw_tracepoint},
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::{BtfTracePointContext, RawTracePointContext, TracePointContext},
    EbpfContext,
};
use probes_common::{
    io_lat::{
        bio_slot, op_group, rwbs_op, size_bucket, BioStamp, DevKey, DevLive, DevVal, IoKey, IoNew,
        IoStart, IoVal, RqOffsets, SectorKey, TpOffsets, ANOM_BIO_EVICTED, ANOM_INSERT_OVER_ISSUED,
        ANOM_MERGED, ANOM_NO_ENTRY, ANOM_NO_SLOT, ANOM_REISSUE, ANOM_REMOVE_FAILED, ANOM_REQUEUE,
        ANOM_UNISSUED, BIO_PROBES, BIO_SLOTS, NANOM, NO_SLOT, NSTATUS, OFF_NONE, OP_REQUEUED,
        OP_SYNC, REQ_OP_MASK, STAT_ANOMALY, STAT_DIRECT, STAT_PARTIAL,
    },
    stats,
};
use probes_ebpf::{
    allowed, allowed_current, announce, atomic_add, comm_into, generation, get_or_insert, hist_record,
    hist_record_uncounted,
    kread::{Direct, Kread, Probe},
    ro, second_arg, slot, stat,
};

#[no_mangle]
static IO_OFFS: RqOffsets = RqOffsets::INIT;
/// Only this device (kernel `dev_t` encoding), 0 = all.
#[no_mangle]
static IO_DEV: u32 = 0;
/// The request is argument 1 of insert/issue/requeue/merge (`(struct request_queue *q, struct
/// request *rq)`, kernels up to 5.10) instead of argument 0 (5.11+).
#[no_mangle]
static IO_Q_ARG: u8 = 0;
/// `block_rq_complete`'s `error` is a negative errno (`int`, 4.13 to 5.x) instead of a
/// `blk_status_t` (6.x): errors are then slotted by errno.
#[no_mangle]
static IO_ERR_ERRNO: u8 = 0;
/// `block_bio_queue`'s bio is argument 1 (`(struct request_queue *q, struct bio *bio)`,
/// kernels up to 5.10) instead of argument 0 (5.11+).
#[no_mangle]
static IO_BIO_Q_ARG: u8 = 0;
/// Classic `block:block_rq_*` field offsets from the format files (fallback mode).
#[no_mangle]
static IO_TP: TpOffsets = TpOffsets::INIT;

/// Where a new `IO_START_TP` entry is built before it is inserted (see [`on_begin`]).
#[map]
static IO_STAGE: PerCpuArray<IoStart> = PerCpuArray::with_max_entries(1, 0);

/// Aggregates, sized by userspace (`--max-keys`).
#[map]
static IO_AGG: HashMap<IoKey, IoVal> = HashMap::with_max_entries(8192, BPF_F_NO_PREALLOC);

/// What did not fit `IO_AGG`, one row per generation: the `[other]` row.
#[map]
static IO_OTHER: Array<IoVal> = Array::with_max_entries(2, 0);

/// Initial value for new keys (comm filled in, counters zero).
#[map]
static IO_SCRATCH: PerCpuArray<IoVal> = PerCpuArray::with_max_entries(1, 0);

/// New aggregation keys, so userspace learns the issuer while it lives (low rate: once per key
/// and window).
#[map]
static IO_NEW: RingBuf = RingBuf::with_byte_size(64 * 1024, 0);

/// Untracked completions per device and generation (a rare path: the queue-depth histograms
/// of these values stay empty, they are in `IO_DEPTH`).
#[map]
static IO_DEV_VALS: HashMap<DevKey, DevVal> = HashMap::with_max_entries(1024, BPF_F_NO_PREALLOC);

/// A slot per block device (`dev_t` → index into `IO_LIVE` and `IO_DEPTH`), written by
/// userspace for the disks it knows (refreshed each window) and sized by it. Looked up once
/// per request, when it is first seen, and kept in its entry: the per-device counters are then
/// array slots, not hash lookups (three to five per request before, each a hash of the key and
/// a bucket walk).
#[map]
static IO_SLOTS: HashMap<u32, u32> = HashMap::with_max_entries(64, 0);

/// Queue-depth samples per device slot and generation (index `slot * 2 + gen`): the depth each
/// request met at insert and at issue (event-weighted). Drained by userspace slot by slot.
#[map]
static IO_DEPTH: Array<DevVal> = Array::with_max_entries(128, 0);

/// Zeroed initial value for `IO_DEV_VALS` (never written).
#[map]
static IO_DEV_SCRATCH: PerCpuArray<DevVal> = PerCpuArray::with_max_entries(1, 0);

/// Request-lifecycle events by kind (`probes_common::io_lat::ANOM_*`), per CPU, cumulative.
#[map]
static IO_ANOM: PerCpuArray<u64> = PerCpuArray::with_max_entries(NANOM, 0);

/// Live queued/in-flight counters per device slot (never reset), sampled by userspace on a
/// timer.
#[map]
static IO_LIVE: Array<DevLive> = Array::with_max_entries(64, 0);

#[inline(always)]
fn now() -> u64 {
    // SAFETY: plain helper call.
    unsafe { bpf_ktime_get_ns() }
}

#[inline(always)]
fn anom(kind: u32) {
    if let Some(p) = IO_ANOM.get_ptr_mut(kind) {
        // SAFETY: per-CPU slot; the programs of one kind do not nest on one CPU.
        unsafe { *p += 1 };
    }
}

/// A lifecycle anomaly: counted in the stats line (`anomalies`) and by kind.
#[inline(always)]
fn anomaly(kind: u32) {
    stat(STAT_ANOMALY);
    anom(kind);
}

#[inline(always)]
fn dev_wanted(dev: u32) -> bool {
    let want = ro(&IO_DEV);
    want == 0 || dev == want
}

/// The slot of `dev` ([`NO_SLOT`] when userspace has not given it one, counted).
#[inline(always)]
fn dev_slot(dev: u32) -> u32 {
    // SAFETY: the value is copied out at once.
    match unsafe { IO_SLOTS.get(dev) } {
        Some(s) => *s,
        None => {
            anom(ANOM_NO_SLOT);
            NO_SLOT
        }
    }
}

/// Bumps a live counter of device slot `slot` by `delta` (wrapping: `u64::MAX` decrements) and
/// returns the new value.
#[inline(always)]
fn live_add(slot: u32, queued: bool, delta: u64) -> u64 {
    let Some(l) = IO_LIVE.get_ptr_mut(slot) else {
        return 0;
    };
    // SAFETY: `l` is a live map value; the add is atomic, the read after it may see another
    // CPU's update too (a depth sample, not a count).
    unsafe {
        (*l).touched = 1;
        let p = if queued {
            &raw mut (*l).queued
        } else {
            &raw mut (*l).inflight
        };
        atomic_add(p, delta);
        core::ptr::read_volatile(p)
    }
}

/// A queued request of device slot `slot` goes to the driver: queued − 1, in flight + 1.
/// Returns the new in-flight count.
#[inline(always)]
fn live_move(slot: u32) -> u64 {
    let Some(l) = IO_LIVE.get_ptr_mut(slot) else {
        return 0;
    };
    // SAFETY: as in live_add.
    unsafe {
        atomic_add(&raw mut (*l).queued, u64::MAX);
        atomic_add(&raw mut (*l).inflight, 1);
        core::ptr::read_volatile(&raw const (*l).inflight)
    }
}

/// The old entry's request leaves the state it was counted in (queued or issued).
#[inline(always)]
fn leave(old: &IoStart) {
    live_add(old.slot, old.issue_ns == 0, u64::MAX);
}

/// This window's per-device value of `dev`.
#[inline(always)]
fn dev_val(dev: u32) -> Option<*mut DevVal> {
    let key = DevKey {
        dev,
        gen: generation(),
    };
    if let Some(v) = IO_DEV_VALS.get_ptr_mut(key) {
        return Some(v);
    }
    let init = IO_DEV_SCRATCH.get_ptr(0)?;
    // SAFETY: per-CPU scratch slot, never written, so all zero.
    let v = get_or_insert(&IO_DEV_VALS, &key, unsafe { &*init });
    if v.is_none() {
        stat(stats::KEY_MAP_FULL);
    }
    v
}

/// Records a queue-depth sample for device slot `slot`.
#[inline(always)]
fn depth_sample(slot: u32, queued: bool, depth: u64) {
    if slot == NO_SLOT {
        return;
    }
    let Some(v) = IO_DEPTH.get_ptr_mut(slot.wrapping_mul(2) | generation()) else {
        return;
    };
    // SAFETY: `v` is a live map value pointer. A wrapped (negative) counter, possible only
    // around attach, is clamped to 0.
    unsafe {
        let h = if queued {
            &raw mut (*v).queued
        } else {
            &raw mut (*v).inflight
        };
        hist_record(h, if depth > (1 << 32) { 0 } else { depth });
    }
}

/// A completion of `dev` (op `op`) without an entry to end: counted per device, so the
/// diskstats comparison can tell it from a completion the programs never saw.
#[inline(always)]
fn untracked(dev: u32, op: u32) {
    if !dev_wanted(dev) {
        return;
    }
    let Some(v) = dev_val(dev) else { return };
    // SAFETY: live map value; the index is bounded here, on the value used (see hist_record).
    unsafe {
        let g = core::ptr::read_volatile(&op_group(op));
        if g < (*v).untracked.len() {
            atomic_add(&raw mut (*v).untracked[g], 1);
        }
    }
}

/// The issuer, the current task: its tgid, `None` when `--pid`/`--comm` leave it out.
#[inline(always)]
fn issuer() -> Option<u32> {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    allowed(tgid).then_some(tgid)
}

// The request lifecycle, for either in-flight store ([`Store`]): a new entry's identity
// (issuer, device, size, op, submission) comes from `mk`; timestamps are set here.

/// Insert (`issued` false: the request waits in a queue, the scheduler or a dispatch list) or
/// issue (`issued`: the driver has it) of the request `st` finds. `mk` writes a new entry's
/// identity (issuer, device, size, op, submission, `rq`) into the entry it is given and returns
/// false, writing nothing, when the request is filtered out. The entry is built in place: in
/// the store's slot (KEEP), else in this CPU's `IO_STAGE` slot, then inserted (a copy of the
/// entry built on the stack cost a memset and copy per request).
#[inline(always)]
fn on_begin<S: Store>(st: &S, issued: bool, mk: impl FnOnce(&mut IoStart) -> bool) {
    let t = now();
    let (cur, slot) = st.find();
    if let Some(p) = cur {
        // SAFETY: live map value; one CPU handles a request at a time.
        let s = unsafe { &mut *p };
        if issued {
            if s.issue_ns == 0 {
                s.issue_ns = t;
                let n = live_move(s.slot);
                depth_sample(s.slot, false, n);
                return;
            }
            // Issued before, and neither completed nor requeued as far as the programs saw:
            // a stale entry at a recycled request address.
            anomaly(ANOM_REISSUE);
        } else {
            if s.issue_ns == 0 && s.op & OP_REQUEUED != 0 {
                // Requeued, now inserted again: the same request and issuer, still queued.
                s.op &= !OP_REQUEUED;
                return;
            }
            if s.issue_ns != 0 {
                anomaly(ANOM_INSERT_OVER_ISSUED);
            }
        }
        leave(s);
    }
    let (dst, in_place) = match slot {
        Some(p) if S::KEEP => (p, true),
        _ => match IO_STAGE.get_ptr_mut(0) {
            Some(p) => (p, false),
            None => return,
        },
    };
    // SAFETY: `dst` is a live map value (the store's slot, or this CPU's staging slot); one
    // CPU handles a request at a time.
    let n = unsafe { &mut *dst };
    // Slots are never taken back, so an entry of the same disk already holds its slot.
    let (old_dev, old_slot) = (n.dev, n.slot);
    if !mk(n) {
        // Filtered out: a stale entry of the request ends.
        if let Some(p) = cur {
            st.end(p);
        }
        return;
    }
    n.first_ns = t;
    if n.submit_ns > t || t - n.submit_ns > BIO_STALE_NS {
        n.submit_ns = 0;
    }
    n.slot = if in_place && old_dev == n.dev && old_slot != NO_SLOT {
        old_slot
    } else {
        dev_slot(n.dev)
    };
    if issued {
        n.issue_ns = t;
        n.insert_ns = 0;
    } else {
        n.insert_ns = t;
        n.issue_ns = 0;
    }
    if !in_place && !st.insert(n) {
        stat(stats::START_MAP_FULL);
        return;
    }
    if issued {
        stat(STAT_DIRECT);
    }
    let depth = live_add(n.slot, !issued, 1);
    depth_sample(n.slot, !issued, depth);
}

/// Requeue: back from the driver into a queue; queue time restarts, the first timestamp stays.
#[inline(always)]
fn on_requeue<S: Store>(st: &S) {
    let Some(p) = st.find().0 else {
        return;
    };
    anom(ANOM_REQUEUE);
    // SAFETY: live map value; one CPU handles a request at a time.
    let s = unsafe { &mut *p };
    if s.issue_ns != 0 {
        live_add(s.slot, false, u64::MAX);
        live_add(s.slot, true, 1);
    }
    s.issue_ns = 0;
    s.insert_ns = now();
    s.op |= OP_REQUEUED;
}

/// Merge: a queued request was merged into another and is freed without a completion.
#[inline(always)]
fn on_merge<S: Store>(st: &S) {
    if let Some(p) = st.find().0 {
        // SAFETY: live map value, copied before it ends.
        let old = unsafe { *p };
        st.end(p);
        anom(ANOM_MERGED);
        leave(&old);
    }
}

/// Completion with error `code`. `whole` says whether it ends the request (not a partial
/// completion); `who` gives the (dev, op) of a completion without an entry, `None` for the
/// second completion of a request the flush machinery already ended (no bytes left).
#[inline(always)]
fn on_complete<S: Store>(
    st: &S,
    code: u32,
    whole: impl FnOnce() -> bool,
    who: impl FnOnce() -> Option<(u32, u32)>,
) {
    let t = now();
    let Some(p) = st.find().0 else {
        // In flight at attach, filtered out, or never seen.
        if let Some((dev, op)) = who() {
            anom(ANOM_NO_ENTRY);
            untracked(dev, op);
        }
        return;
    };
    // SAFETY: live map value, copied before it ends.
    let s = unsafe { *p };
    if s.issue_ns == 0 {
        // Ended in a queue (failed or aborted before dispatch): no device time.
        st.end(p);
        leave(&s);
        anomaly(ANOM_UNISSUED);
        untracked(s.dev, s.op);
        return;
    }
    if !whole() {
        stat(STAT_PARTIAL);
        return;
    }
    if !st.end(p) {
        // The stale entry is replaced when the request is reused.
        anom(ANOM_REMOVE_FAILED);
    }
    leave(&s);
    record(&s, t, code);
}

/// Aggregates one finished request: `s` as captured at insert/issue, completed at `now` with
/// error `code` (a `blk_status_t`, or a positive errno where `IO_ERR_ERRNO` says so and on the
/// classic tracepoints; 0 = success).
#[inline(always)]
fn record(s: &IoStart, now: u64, code: u32) {
    stat(stats::EVENTS);
    let gen = generation();
    let key = IoKey {
        cgroup_id: s.cgroup_id,
        dev: s.dev,
        tgid: s.tgid,
        op: s.op & (REQ_OP_MASK | OP_SYNC),
        gen,
    };
    let comm = s.comm;
    let Some(at) = slot(&IO_AGG, &IO_OTHER, &IO_SCRATCH, &key, gen, |init| {
        // SAFETY: this CPU's scratch slot; only comm is written, so its counters stay zero.
        unsafe { (*init).comm = comm }
    }) else {
        return;
    };
    if at.created {
        announce(
            &IO_NEW,
            &IoNew {
                tgid: s.tgid,
                dev: s.dev,
            },
        );
    }
    let val = at.ptr;
    // SAFETY: `val` is a live map value pointer; indices are bounded below.
    unsafe {
        atomic_add(&raw mut (*val).count, 1);
        atomic_add(&raw mut (*val).bytes, s.bytes as u64);
        let sb = core::ptr::read_volatile(&size_bucket(s.bytes));
        if sb < (*val).sizes.len() {
            atomic_add(&raw mut (*val).sizes[sb], 1);
        }
        if code != 0 {
            let e = core::ptr::read_volatile(&(code as usize));
            let e = if e >= NSTATUS { NSTATUS - 1 } else { e };
            if e < NSTATUS {
                atomic_add(&raw mut (*val).errors[e], 1);
            }
        }
        // The histograms' counts are the row's (IoVal::fill_hist_counts): queue holds
        // count − direct values, device and total count, before submitted.
        if s.insert_ns != 0 {
            hist_record_uncounted(
                &raw mut (*val).queue,
                s.issue_ns.saturating_sub(s.insert_ns),
            );
        } else {
            atomic_add(&raw mut (*val).direct, 1);
        }
        hist_record_uncounted(&raw mut (*val).device, now.saturating_sub(s.issue_ns));
        let mut from = s.first_ns;
        if s.submit_ns != 0 {
            from = s.submit_ns;
            atomic_add(&raw mut (*val).submitted, 1);
            hist_record_uncounted(&raw mut (*val).before, s.first_ns - s.submit_ns);
        }
        hist_record_uncounted(&raw mut (*val).total, now.saturating_sub(from));
    }
}

// Keyed by `struct request *` (tp_btf, raw_tp).

/// The whole disk of `rq` (`rq->q->disk`, or `rq->rq_disk` before 5.15), in the kernel's
/// `dev_t` encoding.
#[inline(always)]
fn rq_dev<R: Kread>(rq: u64) -> u32 {
    let mut disk = R::u64(rq, ro(&IO_OFFS.rq_q));
    let q_disk = ro(&IO_OFFS.q_disk);
    if q_disk != OFF_NONE {
        disk = R::u64(disk, q_disk);
    }
    if disk == 0 {
        return 0;
    }
    let major = R::u32(disk, ro(&IO_OFFS.disk_major));
    let minor = R::u32(disk, ro(&IO_OFFS.disk_first_minor));
    (major << 20) | (minor & 0xf_ffff)
}

/// Cgroup id the request is charged to, 0 when unknown (no bio, no blkg, no blk-cgroup).
#[inline(always)]
fn rq_cgroup<R: Kread>(rq: u64) -> u64 {
    let blkg_off = ro(&IO_OFFS.bio_blkg);
    if blkg_off == 0 {
        return 0;
    }
    let blkg = R::u64(R::u64(rq, ro(&IO_OFFS.rq_bio)), blkg_off);
    let cgrp = R::u64(
        R::u64(blkg, ro(&IO_OFFS.blkg_blkcg)),
        ro(&IO_OFFS.blkcg_cgroup),
    );
    R::u64(R::u64(cgrp, ro(&IO_OFFS.cgroup_kn)), ro(&IO_OFFS.kn_id))
}

/// Writes a new entry's identity for `rq` into `n`, with the current task as issuer; false
/// (nothing written) when filtered out.
#[inline(always)]
fn rq_start<R: Kread>(rq: u64, n: &mut IoStart) -> bool {
    let dev = rq_dev::<R>(rq);
    if !dev_wanted(dev) {
        return false;
    }
    let Some(tgid) = issuer() else {
        return false;
    };
    let flags = R::u32(rq, ro(&IO_OFFS.rq_cmd_flags));
    let sync = OP_SYNC * u32::from(flags & ro(&IO_OFFS.req_sync) != 0);
    n.cgroup_id = rq_cgroup::<R>(rq);
    comm_into(&mut n.comm);
    n.tgid = tgid;
    n.dev = dev;
    n.bytes = R::u32(rq, ro(&IO_OFFS.rq_data_len));
    n.op = (flags & REQ_OP_MASK) | sync;
    n.submit_ns = bio_submitted(R::u64(rq, ro(&IO_OFFS.rq_bio)));
    n.rq = rq;
    true
}

#[inline(always)]
fn rq_complete<R: Kread>(rq: u64, error: u64, nr_bytes: u64) {
    let (error, nr_bytes) = (error as u32, nr_bytes as u32);
    let code = if ro(&IO_ERR_ERRNO) != 0 {
        (error as i32).unsigned_abs()
    } else {
        error & 0xff
    };
    on_complete(
        &by_rq::<R>(rq),
        code,
        || nr_bytes >= R::u32(rq, ro(&IO_OFFS.rq_data_len)),
        || {
            if nr_bytes == 0 && R::u32(rq, ro(&IO_OFFS.rq_data_len)) == 0 {
                return None;
            }
            Some((rq_dev::<R>(rq), R::u32(rq, ro(&IO_OFFS.rq_cmd_flags))))
        },
    );
}

/// The request argument of insert/issue/requeue/merge (see [`IO_Q_ARG`]). Both loads are
/// constant context offsets; the verifier prunes the branch not taken.
macro_rules! rq_arg {
    ($ctx:expr) => {
        if ro(&IO_Q_ARG) != 0 {
            $ctx.arg::<u64>(1)
        } else {
            $ctx.arg::<u64>(0)
        }
    };
}

/// The tp_btf and raw_tp programs of one request event: `$f` on the request argument, with
/// plain loads (`Direct`) or probe reads (`Probe`).
macro_rules! rq_programs {
    ($tp:tt, $btf:ident, $raw:ident, $f:ident) => {
        #[btf_tracepoint(function = $tp)]
        pub fn $btf(ctx: BtfTracePointContext) -> i32 {
            $f::<Direct>(rq_arg!(ctx));
            0
        }

        #[raw_tracepoint(tracepoint = $tp)]
        pub fn $raw(ctx: RawTracePointContext) -> i32 {
            $f::<Probe>(rq_arg!(ctx));
            0
        }
    };
}

#[inline(always)]
fn rq_insert<R: Kread>(rq: u64) {
    on_begin(&by_rq::<R>(rq), false, |n| rq_start::<R>(rq, n));
}

#[inline(always)]
fn rq_issue<R: Kread>(rq: u64) {
    on_begin(&by_rq::<R>(rq), true, |n| rq_start::<R>(rq, n));
}

#[inline(always)]
fn rq_requeue<R: Kread>(rq: u64) {
    on_requeue(&by_rq::<R>(rq));
}

#[inline(always)]
fn rq_merge<R: Kread>(rq: u64) {
    on_merge(&by_rq::<R>(rq));
}

rq_programs!("block_rq_insert", tk_io_insert, tk_io_insert_raw, rq_insert);
rq_programs!("block_rq_issue", tk_io_issue, tk_io_issue_raw, rq_issue);
rq_programs!(
    "block_rq_requeue",
    tk_io_requeue,
    tk_io_requeue_raw,
    rq_requeue
);
rq_programs!("block_rq_merge", tk_io_merge, tk_io_merge_raw, rq_merge);

#[btf_tracepoint(function = "block_rq_complete")]
pub fn tk_io_complete(ctx: BtfTracePointContext) -> i32 {
    rq_complete::<Direct>(ctx.arg(0), ctx.arg(1), ctx.arg(2));
    0
}

#[raw_tracepoint(tracepoint = "block_rq_complete")]
pub fn tk_io_complete_raw(ctx: RawTracePointContext) -> i32 {
    rq_complete::<Probe>(ctx.arg(0), ctx.arg(1), ctx.arg(2));
    0
}

#[path = "io_lat/bio.rs"]
mod bio;
#[path = "io_lat/classic.rs"]
mod classic;

#[path = "io_lat/dirty.rs"]
mod dirty;
#[path = "io_lat/store.rs"]
mod store;
use bio::{bio_submitted, BIO_STALE_NS};
use store::{by_rq, BySector, Store};
