//! Where a request's in-flight entry lives: `IO_RQ`, an open-addressed array by the request's
//! address (tp_btf, raw_tp), or `IO_START_TP`, the classic fallback's hash by (dev, sector).
//! The request lifecycle in the parent module runs over either through [`Store`].

use aya_ebpf::bindings::BPF_F_MMAPABLE;

use super::*;

/// In-flight requests (tp_btf, raw_tp), open-addressed: a request's entry is in one of
/// [`RQ_PROBES`] slots from its home ([`rq_home`]: its disk, hardware queue and tag), matched by
/// its address (`IoStart::rq`). Sized by userspace from the disks' queues to twice the requests
/// they can hold, a power of two ([`IO_RQ_MASK`]). An array slot is an inlined lookup where a
/// hash lookup by address was a call, a hash of the key and a bucket walk, three or four times
/// per request (a quarter of io-lat's kernel time). Entries are kept: one that ends stays,
/// marked free (`first_ns` 0), and the next request at the same address (its tag reused at
/// once) takes it over in place; a free slot is taken by any request homed near it. An entry
/// whose completion was missed is replaced when its request is reused. No free slot among the
/// probes is counted (`start_map_full`). `BPF_F_MMAPABLE` only for its page-aligned values
/// (see [`IoStart`]); userspace never maps it.
#[map]
static IO_RQ: Array<IoStart> = Array::with_max_entries(16384, BPF_F_MMAPABLE);

/// `IO_RQ`'s size minus one.
#[no_mangle]
static IO_RQ_MASK: u32 = 16383;

/// Slots tried per request.
const RQ_PROBES: u32 = 8;

/// In-flight requests by (dev, sector), for the classic-tracepoint fallback (no request
/// pointer in the records). An entry whose completion was missed stays until its sector is
/// reused; a full map is counted (`start_map_full`).
#[map]
static IO_START_TP: HashMap<SectorKey, IoStart> = HashMap::with_max_entries(16384, 0);

/// Where one request's in-flight entry lives: `IO_RQ` by address ([`ByRq`]), or the classic
/// fallback's hash by (dev, sector) ([`BySector`]).
pub(super) trait Store {
    /// Whether an entry that ends stays in place, free (`IO_RQ`), instead of being deleted.
    const KEEP: bool;
    /// The request's entry if it holds one (not free), and the place a new entry for it goes:
    /// its own entry, held or free, else (KEEP) a free slot; `None` when it is to be inserted
    /// (the hash) or there is no place (`IO_RQ` full around its home).
    fn find(&self) -> (Option<*mut IoStart>, Option<*mut IoStart>);
    /// Ends held entry `p`: freed in place when KEEP, else deleted. False when the delete
    /// failed (the bucket lock was busy: this CPU interrupted an update of the same map).
    fn end(&self, p: *mut IoStart) -> bool;
    /// Inserts `n` (no place from `find`); false when the store is full.
    fn insert(&self, n: &IoStart) -> bool;
}

/// A request in `IO_RQ`: its address and home slot.
pub(super) struct ByRq {
    rq: u64,
    home: u32,
}

impl Store for ByRq {
    const KEEP: bool = true;

    #[inline(always)]
    fn find(&self) -> (Option<*mut IoStart>, Option<*mut IoStart>) {
        let mask = ro(&IO_RQ_MASK);
        let mut free = None;
        for i in 0..RQ_PROBES {
            let Some(e) = IO_RQ.get_ptr_mut(self.home.wrapping_add(i) & mask) else {
                break;
            };
            // SAFETY: a live array slot; one CPU handles a request at a time, and a slot is
            // only ever written for the request whose address it holds (or, free, claimed).
            unsafe {
                if (*e).rq == self.rq {
                    let held = if (*e).first_ns != 0 { Some(e) } else { None };
                    return (held, Some(e));
                }
                if free.is_none() && (*e).first_ns == 0 {
                    free = Some(e);
                }
            }
        }
        (None, free)
    }

    #[inline(always)]
    fn end(&self, p: *mut IoStart) -> bool {
        // SAFETY: live map value; one CPU handles a request at a time.
        unsafe { (*p).first_ns = 0 };
        true
    }

    #[inline(always)]
    fn insert(&self, _: &IoStart) -> bool {
        false
    }
}

/// A request of the classic fallback in `IO_START_TP`, by (dev, sector).
pub(super) struct BySector {
    pub(super) key: SectorKey,
}

impl Store for BySector {
    const KEEP: bool = false;

    #[inline(always)]
    fn find(&self) -> (Option<*mut IoStart>, Option<*mut IoStart>) {
        let slot = IO_START_TP.get_ptr_mut(self.key);
        match slot {
            // SAFETY: live map value.
            Some(p) if unsafe { (*p).first_ns } != 0 => (Some(p), slot),
            _ => (None, slot),
        }
    }

    #[inline(always)]
    fn end(&self, _: *mut IoStart) -> bool {
        IO_START_TP.remove(self.key).is_ok()
    }

    #[inline(always)]
    fn insert(&self, n: &IoStart) -> bool {
        IO_START_TP.insert(self.key, n, 0).is_ok()
    }
}

/// Where `rq`'s entry is looked for in `IO_RQ`: a hash of its disk, hardware queue and tag
/// (`internal_tag`, the scheduler's, when it has one: set at allocation and kept until the
/// request is freed; else `tag`, the driver's, set at allocation without a scheduler). Two
/// requests in flight at once share these only when the flush machinery lends its request
/// the tag of the one it flushes for; the probes tell them apart by address.
#[inline(always)]
fn rq_home<R: Kread>(rq: u64) -> u32 {
    let o = ro(&IO_OFFS);
    let itag = R::u32(rq, o.rq_internal_tag);
    let tag = if (itag as i32) < 0 {
        R::u32(rq, o.rq_tag)
    } else {
        itag
    };
    let hctx = R::u32(R::u64(rq, o.rq_mq_hctx), o.hctx_queue_num);
    let h = (u64::from(rq_dev::<R>(rq)) << 32) ^ (u64::from(hctx) << 16) ^ u64::from(tag);
    (h.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as u32
}

/// `rq`'s place in `IO_RQ`.
#[inline(always)]
pub(super) fn by_rq<R: Kread>(rq: u64) -> ByRq {
    ByRq {
        rq,
        home: rq_home::<R>(rq),
    }
}
