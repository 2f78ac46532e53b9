//! `io-lat`: shared types for the block-layer request tracepoints
//! (`block:block_rq_insert`, `block_rq_issue`, `block_rq_complete`, and `block_rq_requeue`,
//! `block_rq_merge` to keep the in-flight state exact).
//!
//! Requests are tracked from insert (or issue, when the request never saw an insert: scheduler
//! `none`, direct issue) to completion, by `struct request *` (tp_btf, raw_tp) or, on the classic
//! tracepoints, by (dev, sector). Everything about the issuer is captured at insert/issue, never
//! at completion, which runs in interrupt (or another task's) context. Aggregation happens in the
//! kernel per (cgroup, device, process, op, generation).

use crate::{hist::LatHist, COMM_LEN};

/// Error slots: a `blk_status_t` (6.x), or the errno where the kernel passes one; values at or
/// above the last slot share it. The kernel's own values are small (`BLK_STS_IOERR` is 10,
/// `BLK_STS_INVAL` 19 on 6.x); userspace names them (`blk_status_to_errno`).
pub const NSTATUS: usize = 32;
/// Request-size buckets: bucket 0 holds 0-byte requests (flushes), bucket `i` ≥ 1 holds sizes in
/// `[2^(i-1), 2^i)` bytes; the last bucket takes everything larger.
pub const NSIZES: usize = 32;

/// Bit set in [`IoKey::op`] when the request had `REQ_SYNC` (rwbs `S`): reads and O_DIRECT
/// writes are sync, writeback is async.
pub const OP_SYNC: u32 = 1 << 8;
/// Bit set in [`IoStart::op`] (never in a key) once the request was requeued: the insert that
/// follows continues it (its first timestamp is kept) instead of replacing a stale entry.
pub const OP_REQUEUED: u32 = 1 << 9;
/// Mask of the `enum req_op` part of `cmd_flags` (`REQ_OP_BITS` = 8 since 4.10).
pub const REQ_OP_MASK: u32 = 0xff;

/// An offset in [`RqOffsets`] that does not apply on this kernel.
pub const OFF_NONE: u32 = u32::MAX;

/// `/proc/diskstats` groups (`op_stat_group`), as [`DevVal::untracked`] and userspace count them.
pub const GROUP_READ: usize = 0;
pub const GROUP_WRITE: usize = 1;
pub const GROUP_DISCARD: usize = 2;
/// Flushes and passthrough commands: not in the read/write/discard counters of diskstats.
pub const GROUP_OTHER: usize = 3;
pub const NGROUPS: usize = 4;

/// The diskstats group of `enum req_op` value `op` (`op_stat_group` in the kernel: discards
/// (3, secure erase 5) apart, odd ops are writes, even ones reads; flush (2) and passthrough
/// (`REQ_OP_DRV_*`, 34 and up) are not counted as either).
#[inline(always)]
pub const fn op_group(op: u32) -> usize {
    let op = op & REQ_OP_MASK;
    if op == 2 || op >= 34 {
        GROUP_OTHER
    } else if op == 3 || op == 5 {
        GROUP_DISCARD
    } else if op & 1 == 1 {
        GROUP_WRITE
    } else {
        GROUP_READ
    }
}

/// Slots of the per-CPU `IO_ANOM` array: request-lifecycle anomalies, cumulative, named in the
/// stats line so every count that does not add up can be explained.
/// An issue found an entry already issued: a stale entry (its completion never reached the
/// programs) at a recycled request address, replaced.
pub const ANOM_REISSUE: u32 = 0;
/// A completion found the request never issued.
pub const ANOM_UNISSUED: u32 = 1;
/// A completion found no entry (in flight at attach, filtered out, or lost).
pub const ANOM_NO_ENTRY: u32 = 2;
/// Deleting the in-flight entry at completion failed.
pub const ANOM_REMOVE_FAILED: u32 = 3;
/// An insert replaced an entry that had been issued (stale, as for [`ANOM_REISSUE`]).
pub const ANOM_INSERT_OVER_ISSUED: u32 = 4;
/// A request went back to the queue (`block_rq_requeue`: driver busy, timeout).
pub const ANOM_REQUEUE: u32 = 5;
/// A queued request was merged into another (`block_rq_merge`) and its entry dropped.
pub const ANOM_MERGED: u32 = 6;
/// A request's device had no slot yet (it appeared after the last window's refresh, or every
/// slot is taken): the request is timed, but not counted in the device's queue depth.
pub const ANOM_NO_SLOT: u32 = 7;
/// A bio's submission stamp went in place of another bio's not yet taken (every slot of its
/// place held one, the oldest gave way): usually a bio merged into a request already built,
/// whose stamp nothing takes; else a request left untimed from its submission.
pub const ANOM_BIO_EVICTED: u32 = 8;
pub const NANOM: u32 = 9;
pub const ANOM_NAMES: [&str; NANOM as usize] = [
    "reissue",
    "unissued",
    "no_entry",
    "remove_failed",
    "insert_over_issued",
    "requeue",
    "merged",
    "no_dev_slot",
    "bio_stamp_evicted",
];

/// [`IoStart::slot`] of a request whose device has no slot.
pub const NO_SLOT: u32 = u32::MAX;

/// Per-CPU stats slot: a completion covered only part of the request (`nr_bytes` < the bytes
/// left); the request is recorded once, at its final completion.
pub const STAT_PARTIAL: u32 = 5;
/// A request was issued without a preceding insert (scheduler `none`, direct issue, or a
/// flush): it has device time and no queue time.
pub const STAT_DIRECT: u32 = 6;
/// A request-lifecycle anomaly (stale entry replaced, completed without issue); the kinds are in
/// `IO_ANOM`.
pub const STAT_ANOMALY: u32 = 7;

/// Byte offsets into kernel structs, computed in userspace from the kernel's BTF and passed in
/// as one read-only global. A zero `blkg_*` chain (no `CONFIG_BLK_CGROUP`) disables the cgroup
/// read.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RqOffsets {
    /// `request.q` (struct request_queue *), or `request.rq_disk` (struct gendisk *) on kernels
    /// before 5.15, where `q_disk` is then [`OFF_NONE`].
    pub rq_q: u32,
    /// `request.cmd_flags` (u32): op in the low 8 bits, REQ_* flags above.
    pub rq_cmd_flags: u32,
    /// `request.__data_len` (unsigned int): bytes left to complete.
    pub rq_data_len: u32,
    /// `request.bio` (struct bio *): the first bio, for its blkcg.
    pub rq_bio: u32,
    /// `request_queue.disk` (struct gendisk *), 5.15+; [`OFF_NONE`] when `rq_q` is `rq_disk`.
    pub q_disk: u32,
    /// `gendisk.major` (int).
    pub disk_major: u32,
    /// `gendisk.first_minor` (int).
    pub disk_first_minor: u32,
    /// `bio.bi_blkg` (struct blkcg_gq *), 0 without CONFIG_BLK_CGROUP.
    pub bio_blkg: u32,
    /// `blkcg_gq.blkcg` (struct blkcg *).
    pub blkg_blkcg: u32,
    /// `blkcg.css.cgroup` (struct cgroup *).
    pub blkcg_cgroup: u32,
    /// `cgroup.kn` (struct kernfs_node *).
    pub cgroup_kn: u32,
    /// `kernfs_node.id` (u64): the cgroup id userspace resolves to a path.
    pub kn_id: u32,
    /// `REQ_SYNC` as a mask of `cmd_flags` (1 << `__REQ_SYNC` from BTF `enum req_flag_bits`).
    pub req_sync: u32,
    pub _pad: u32,
    /// `request.tag` and `request.internal_tag` (int): the driver's and the scheduler's tags,
    /// `request.mq_hctx` (struct blk_mq_hw_ctx *) and `blk_mq_hw_ctx.queue_num` (unsigned
    /// int): where a request's entry is looked for in `IO_RQ`.
    pub rq_tag: u32,
    pub rq_internal_tag: u32,
    pub rq_mq_hctx: u32,
    pub hctx_queue_num: u32,
}

impl RqOffsets {
    /// Before userspace patches it in (`__REQ_SYNC` as on 6.x).
    pub const INIT: RqOffsets = RqOffsets {
        rq_q: 0,
        rq_cmd_flags: 0,
        rq_data_len: 0,
        rq_bio: 0,
        q_disk: 0,
        disk_major: 0,
        disk_first_minor: 0,
        bio_blkg: 0,
        blkg_blkcg: 0,
        blkcg_cgroup: 0,
        cgroup_kn: 0,
        kn_id: 0,
        req_sync: 1 << 11,
        _pad: 0,
        rq_tag: 0,
        rq_internal_tag: 0,
        rq_mq_hctx: 0,
        hctx_queue_num: 0,
    };
}

/// Field offsets of the classic `block:block_rq_*` records, from their format files (the
/// fallback mode): `dev` (dev_t, 4) and `sector` (8) sit at one offset in every event; `bytes`
/// (4) and `rwbs` (char[8+]) of insert/issue; `error` (int), `nr_sector` (4) and `rwbs` of
/// complete.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TpOffsets {
    pub dev: u32,
    pub sector: u32,
    pub bytes: u32,
    pub rwbs: u32,
    pub error: u32,
    pub cpl_nr_sector: u32,
    pub cpl_rwbs: u32,
    pub _pad: u32,
}

impl TpOffsets {
    /// The 6.18 layout, until userspace patches in this kernel's.
    pub const INIT: TpOffsets = TpOffsets {
        dev: 8,
        sector: 16,
        bytes: 28,
        rwbs: 34,
        error: 28,
        cpl_nr_sector: 24,
        cpl_rwbs: 34,
        _pad: 0,
    };
}

/// What is remembered per in-flight request (`IO_RQ` by the request's address, or
/// `IO_START_TP` keyed by [`SectorKey`]). An entry is queued (`issue_ns` 0) or issued.
///
/// Two cache lines, in a page-aligned table (`BPF_F_MMAPABLE`): what finding the entry and
/// issuing the request read (`rq`, the timestamps, `slot`) is the first line, so an issue from
/// the scheduler and a probe past a taken slot read one cold line, not two or three.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoStart {
    /// The request's address (`struct request *`), whose entry this is in `IO_RQ`, or 0 (the
    /// classic fallback, keyed by (dev, sector)).
    pub rq: u64,
    /// `bpf_ktime_get_ns()` when the request was first seen (insert, else issue); kept across
    /// requeues: what the issuer waited for ends at the final completion. 0: a free entry.
    pub first_ns: u64,
    /// Last insert (or requeue), 0 if the request was issued directly.
    pub insert_ns: u64,
    /// Last issue, 0 while queued.
    pub issue_ns: u64,
    /// When the request's first bio was submitted (`block_bio_queue`, in the issuer), 0 when
    /// not seen (no bio hook, or the bio was submitted before tracing began): what the issuer
    /// waited for starts here, before any plugging, merging attempt or tag allocation.
    pub submit_ns: u64,
    /// `enum req_op` | [`OP_SYNC`] | [`OP_REQUEUED`].
    pub op: u32,
    /// The device's slot in `IO_LIVE` and `IO_DEPTH` (from `IO_SLOTS`, looked up once per
    /// request), or [`NO_SLOT`].
    pub slot: u32,
    /// Process that inserted (or issued) the request.
    pub tgid: u32,
    /// `dev_t` in the kernel's encoding (`major << 20 | minor`).
    pub dev: u32,
    /// Request size in bytes at insert/issue.
    pub bytes: u32,
    pub _pad: u32,
    /// Cgroup id the request is charged to (`bio->bi_blkg->blkcg`), 0 if unknown.
    pub cgroup_id: u64,
    /// `comm` of the task that inserted (or issued) the request.
    pub comm: [u8; COMM_LEN],
    /// To 128 bytes: an entry is two whole cache lines of the page-aligned table.
    pub _tail: [u64; 5],
}

/// In-flight key of the classic-tracepoint fallback, which has no request pointer: the
/// request's device and start sector (`dev`, `sector` of the records).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SectorKey {
    pub sector: u64,
    pub dev: u32,
    pub _pad: u32,
}

/// Aggregation key.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IoKey {
    /// Cgroup the I/O is charged to (writeback: the dirtying cgroup, not the flusher's).
    pub cgroup_id: u64,
    /// `dev_t` in the kernel's encoding (`major << 20 | minor`).
    pub dev: u32,
    /// Issuer's tgid (kernel threads included: the flusher is `kworker/u…`).
    pub tgid: u32,
    /// `enum req_op` | [`OP_SYNC`].
    pub op: u32,
    /// Interval generation (see [`crate::stats::Control`]).
    pub gen: u32,
}

/// Aggregated value per key.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoVal {
    /// `comm` of the issuer that created the key (captured at insert/issue).
    pub comm: [u8; COMM_LEN],
    /// Completed requests.
    pub count: u64,
    /// Bytes of the completed requests (sizes at insert/issue).
    pub bytes: u64,
    /// Requests that never waited in a queue (no insert, no requeue): no queue time.
    pub direct: u64,
    /// Requests whose first bio's submission was seen: their `total` starts there, and
    /// `before` holds submission → insert (or issue).
    pub submitted: u64,
    /// Completions with an error, by `blk_status_t` or errno (slot 0 unused).
    pub errors: [u64; NSTATUS],
    /// Request sizes, see [`NSIZES`].
    pub sizes: [u64; NSIZES],
    /// insert → issue (requests that waited in a queue).
    pub queue: LatHist,
    /// issue → complete.
    pub device: LatHist,
    /// bio submitted (else first seen: insert, else issue) → complete: what the issuer waited
    /// for.
    pub total: LatHist,
    /// bio submitted → insert (or issue, when never inserted): plugging, merge attempts, the
    /// wait for a tag; only requests whose submission was seen (`submitted`).
    pub before: LatHist,
}

impl IoVal {
    pub const ZERO: IoVal = IoVal {
        comm: [0; COMM_LEN],
        count: 0,
        bytes: 0,
        direct: 0,
        submitted: 0,
        errors: [0; NSTATUS],
        sizes: [0; NSIZES],
        queue: LatHist::ZERO,
        device: LatHist::ZERO,
        total: LatHist::ZERO,
        before: LatHist::ZERO,
    };

    /// Adds another value's counters (not its identity) into this one.
    pub fn merge(&mut self, o: &IoVal) {
        self.count += o.count;
        self.bytes += o.bytes;
        self.direct += o.direct;
        self.submitted += o.submitted;
        for (a, b) in self.errors.iter_mut().zip(o.errors.iter()) {
            *a += *b;
        }
        for (a, b) in self.sizes.iter_mut().zip(o.sizes.iter()) {
            *a += *b;
        }
        self.queue.merge(&o.queue);
        self.device.merge(&o.device);
        self.total.merge(&o.total);
        self.before.merge(&o.before);
    }

    /// Sets the histograms' `count` from the row's counters: the kernel does not count their
    /// values (one atomic add less for each, per request), since every completion adds one to
    /// `device` and `total`, one to `queue` unless `direct`, one to `before` when `submitted`.
    /// Call once on each value read from the kernel, before merging.
    pub fn fill_hist_counts(&mut self) {
        self.queue.count = self.count.saturating_sub(self.direct);
        self.device.count = self.count;
        self.total.count = self.count;
        self.before.count = self.submitted;
    }
}

/// Key of the per-device values.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DevKey {
    pub dev: u32,
    pub gen: u32,
}

/// Per device and generation: queue depth sampled at every issue and insert (event-weighted: a
/// mean over requests, the depth each request met), and the completions the programs saw
/// without an entry, so that `/proc/diskstats` minus counted minus these is exactly what the
/// kernel did not run the programs for.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DevVal {
    /// Requests issued to the driver and not completed, seen by each issuing request (itself
    /// included).
    pub inflight: LatHist,
    /// Requests inserted into the scheduler and not yet issued, seen by each inserted request
    /// (itself included).
    pub queued: LatHist,
    /// Completions without an entry (in flight at attach, filtered out by `--pid`/`--comm`,
    /// completed before issue), by [`op_group`].
    pub untracked: [u64; NGROUPS],
}

impl DevVal {
    pub const ZERO: DevVal = DevVal {
        inflight: LatHist::ZERO,
        queued: LatHist::ZERO,
        untracked: [0; NGROUPS],
    };
}

/// Live counters per device (`IO_LIVE`, an array indexed by the device's slot; never reset):
/// what is in the scheduler and in the driver right now, as far as requests seen since attach
/// go. Userspace samples them on a timer for the time-weighted depth.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DevLive {
    pub queued: u64,
    pub inflight: u64,
    /// Set by the first request of the device: its depth is sampled from then on.
    pub touched: u64,
}

/// Slots of the table of bio submissions not yet seen as a request (`IO_BIO`, 16 bytes each:
/// 64 KiB). A bio's stamp goes in the first free slot of its bucket of [`BIO_PROBES`] (its
/// home, [`bio_slot`]), found again by the bio's address: an array slot instead of an LRU hash
/// insert and delete per bio, which were 40 % of io-lat's kernel time per request. A stamp lost
/// (every slot of its bucket holding a younger one) leaves the request untimed from submission
/// (`submitted` < `count`), never wrongly timed.
pub const BIO_SLOTS: u32 = 4096;

/// Slots per bucket: four stamps, one cache line. The table is a page-aligned
/// (`BPF_F_MMAPABLE`) array, so a bucket never straddles two lines: on a request path where
/// every line a program touches is cold (a loop device's read is ~40 µs of other work), eight
/// probes from any slot read two or three lines at ~100 ns each.
pub const BIO_PROBES: u32 = 4;

/// One slot of the bio submission table: the bio's address and `bpf_ktime_get_ns()` at
/// `block_bio_queue`; `bio` 0 once taken.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BioStamp {
    pub bio: u64,
    pub ts: u64,
}

/// The first slot of the bucket of the bio at address `addr` (a multiple of [`BIO_PROBES`]):
/// Fibonacci hashing, since the low bits of the addresses of one slab's objects are alike. By
/// address, not by sector: a split bio's remainder keeps its address and moves its sector
/// (filed by sector, the remainder's request looked elsewhere and could match a stamp an
/// earlier bio at that address left there).
#[inline(always)]
pub const fn bio_slot(addr: u64) -> u32 {
    let buckets = BIO_SLOTS / BIO_PROBES;
    ((addr.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - buckets.trailing_zeros())) as u32)
        * BIO_PROBES
}

/// Streamed when a new aggregation key is created, so userspace learns the issuer's facts
/// (name, kernel thread or not) while it lives.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoNew {
    pub tgid: u32,
    pub dev: u32,
}

/// Length of a backing device's name in `writeback:writeback_dirty_folio` (`char name[32]`):
/// `"MAJ:MIN"` for a block device's bdi, as `bdi_register` names it.
pub const BDI_NAME_LEN: usize = 32;

/// Pages dirtied per (backing device, process) in one generation, from
/// `writeback:writeback_dirty_folio` (`writeback_dirty_page` before 6.0): whose pages the
/// flusher writes back to a disk.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DirtyKey {
    /// The event's `name`: the bdi, NUL-padded.
    pub bdi: [u8; BDI_NAME_LEN],
    pub tgid: u32,
    pub gen: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DirtyVal {
    /// `comm` of the thread that created the key.
    pub comm: [u8; COMM_LEN],
    /// Dirtying events: one per folio (a large folio of 1 MiB is one event, as is one page).
    pub folios: u64,
    /// Bytes dirtied, from the growth of the dirtying thread's `task_struct.ioac.write_bytes`
    /// between its events (`folio_account_dirtied` adds each folio's size right after the
    /// event): each event measures the folio before it, so a thread's last folio of the window
    /// is not counted. 0 where the kernel has no task I/O accounting.
    pub bytes: u64,
}

impl DirtyVal {
    pub const ZERO: DirtyVal = DirtyVal {
        comm: [0; COMM_LEN],
        folios: 0,
        bytes: 0,
    };

    pub fn merge(&mut self, o: &DirtyVal) {
        self.folios += o.folios;
        self.bytes += o.bytes;
    }
}

/// The disk of a bdi name (`"7:0"` → (7, 0)); `None` for other backing devices (`(unknown)`,
/// a network file system's `0:53` is a number pair too but names no block device, which the
/// caller finds out from the disks it knows).
pub fn bdi_disk(name: &[u8; BDI_NAME_LEN]) -> Option<(u32, u32)> {
    let end = name.iter().position(|b| *b == 0).unwrap_or(BDI_NAME_LEN);
    let s = core::str::from_utf8(&name[..end]).ok()?;
    let (a, b) = s.split_once(':')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// (op, sync) from a `rwbs` string as `blk_fill_rwbs` writes it: an optional `F`
/// (REQ_PREFLUSH), the op (`W` write, `R` read, `D` discard (`DE` secure erase), `F` flush,
/// `N` other), then flags, `S` being REQ_SYNC.
#[inline(always)]
pub fn rwbs_op(r: &[u8; 8]) -> u32 {
    let op_at = if r[0] == b'F' && matches!(r[1], b'W' | b'R' | b'D' | b'F' | b'N') {
        1
    } else {
        0
    };
    let op = match r[op_at] {
        b'R' => 0,
        b'W' => 1,
        b'F' => 2,
        b'D' => 3,
        _ => REQ_OP_MASK,
    };
    let mut sync = 0;
    let mut i = op_at + 1;
    while i < 8 {
        if r[i] == 0 {
            break;
        }
        if r[i] == b'S' {
            sync = OP_SYNC;
        }
        i += 1;
    }
    op | sync
}

/// Size bucket of a request of `bytes` bytes (see [`NSIZES`]).
#[inline(always)]
pub const fn size_bucket(bytes: u32) -> usize {
    let b = (32 - bytes.leading_zeros()) as usize;
    if b >= NSIZES {
        NSIZES - 1
    } else {
        b
    }
}

crate::gen_keys!(IoKey, DevKey, DirtyKey);
crate::impl_pod!(
    RqOffsets, TpOffsets, IoStart, SectorKey, IoKey, IoVal, DevKey, DevVal, DevLive, IoNew,
    DirtyKey, DirtyVal, BioStamp
);

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    /// The kernel leaves the histograms' counts at 0; filled from the row, each equals the
    /// values its buckets hold.
    #[test]
    fn hist_counts_come_from_the_row() {
        let mut v = IoVal::ZERO;
        let uncounted = |h: &mut LatHist, x: u64| {
            h.record(x);
            h.count -= 1;
        };
        // Three requests: one direct (no queue time), two submitted (a time before the queue).
        for (direct, submitted) in [(true, false), (false, true), (false, true)] {
            v.count += 1;
            if direct {
                v.direct += 1;
            } else {
                uncounted(&mut v.queue, 1_000);
            }
            if submitted {
                v.submitted += 1;
                uncounted(&mut v.before, 500);
            }
            uncounted(&mut v.device, 20_000);
            uncounted(&mut v.total, 21_500);
        }
        v.fill_hist_counts();
        for (h, n) in [(&v.queue, 2), (&v.device, 3), (&v.total, 3), (&v.before, 2)] {
            assert_eq!(h.count, n);
            assert_eq!(h.buckets.iter().sum::<u64>(), n);
        }
    }

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(size_of::<RqOffsets>(), 72);
        assert_eq!(size_of::<TpOffsets>(), 32);
        assert_eq!(size_of::<IoStart>(), 128);
        // What the issue and the probes read is one cache line.
        assert!(core::mem::offset_of!(IoStart, slot) < 64);
        assert!(core::mem::offset_of!(IoStart, issue_ns) < 64);
        assert_eq!(size_of::<IoKey>(), 24);
        assert_eq!(size_of::<SectorKey>(), 16);
        assert_eq!(
            size_of::<IoVal>(),
            16 + 32 + 8 * (NSTATUS + NSIZES) + 4 * size_of::<LatHist>()
        );
        assert_eq!(size_of::<DevKey>(), 8);
        assert_eq!(size_of::<DevVal>(), 2 * size_of::<LatHist>() + 8 * NGROUPS);
        assert_eq!(size_of::<DevLive>(), 24);
        assert_eq!(size_of::<IoNew>(), 8);
        assert_eq!(size_of::<BioStamp>(), 16);
        assert_eq!(size_of::<DirtyKey>(), 40);
        assert_eq!(size_of::<DirtyVal>(), 32);
    }

    #[test]
    fn bio_slots_spread_a_slab() {
        // 256 bios of one slab run (256-byte objects, as the bio slabs lay them out) in flight
        // at once: no bucket overflows, and every bucket starts on a cache line of the table.
        let base = 0xffff_8880_1234_5600u64;
        let mut used = [0u32; BIO_SLOTS as usize];
        for i in 0..256 {
            let s = bio_slot(base + i * 256);
            assert!(s + BIO_PROBES <= BIO_SLOTS);
            assert_eq!(s % BIO_PROBES, 0);
            assert_eq!(s as usize * size_of::<BioStamp>() % 64, 0);
            used[s as usize] += 1;
        }
        let full = used.iter().filter(|&&n| n > BIO_PROBES).count();
        assert_eq!(full, 0, "{full} buckets overflow");
        let shared: u32 = used.iter().filter(|&&n| n > 1).map(|n| n - 1).sum();
        assert!(shared <= 40, "{shared} of 256 bios share a bucket");
    }

    #[test]
    fn size_buckets() {
        assert_eq!(size_bucket(0), 0);
        assert_eq!(size_bucket(1), 1);
        assert_eq!(size_bucket(4095), 12);
        assert_eq!(size_bucket(4096), 13);
        assert_eq!(size_bucket(u32::MAX), NSIZES - 1);
    }

    #[test]
    fn rwbs_strings() {
        let r = |s: &[u8]| {
            let mut b = [0u8; 8];
            b[..s.len()].copy_from_slice(s);
            rwbs_op(&b)
        };
        assert_eq!(r(b"R"), 0);
        assert_eq!(r(b"RS"), OP_SYNC);
        assert_eq!(r(b"WS"), 1 | OP_SYNC);
        assert_eq!(r(b"W"), 1);
        assert_eq!(r(b"FWFS"), 1 | OP_SYNC, "preflush + write + FUA + sync");
        assert_eq!(r(b"FF"), 2, "a flush with preflush");
        assert_eq!(r(b"F"), 2);
        assert_eq!(r(b"DS"), 3 | OP_SYNC);
        assert_eq!(r(b"N"), REQ_OP_MASK);
        assert_eq!(r(b"WSMFEDCB"), 1 | OP_SYNC);
    }

    #[test]
    fn diskstats_groups() {
        // REQ_OP_READ, WRITE, FLUSH, DISCARD, SECURE_ERASE, ZONE_APPEND, WRITE_ZEROES, DRV_IN/OUT.
        let want = [
            (0, GROUP_READ),
            (1, GROUP_WRITE),
            (2, GROUP_OTHER),
            (3, GROUP_DISCARD),
            (5, GROUP_DISCARD),
            (7, GROUP_WRITE),
            (9, GROUP_WRITE),
            (34, GROUP_OTHER),
            (35, GROUP_OTHER),
        ];
        for (op, g) in want {
            assert_eq!(op_group(op), g, "op {op}");
            assert_eq!(op_group(op | OP_SYNC), g, "op {op} sync");
        }
    }

    #[test]
    fn bdi_names_of_block_devices_are_their_disks() {
        let name = |s: &str| {
            let mut n = [0u8; BDI_NAME_LEN];
            n[..s.len()].copy_from_slice(s.as_bytes());
            n
        };
        assert_eq!(bdi_disk(&name("7:0")), Some((7, 0)));
        assert_eq!(bdi_disk(&name("259:12")), Some((259, 12)));
        assert_eq!(bdi_disk(&name("(unknown)")), None);
        assert_eq!(bdi_disk(&name("")), None);
        assert_eq!(bdi_disk(&[b'9'; BDI_NAME_LEN]), None);
    }
}
