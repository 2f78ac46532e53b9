//! Bio submission stamps: when each bio was submitted (`block:block_bio_queue`, in the
//! issuer's context), kept until the request whose first bio it is is first seen, where what
//! the issuer waited for starts.

use aya_ebpf::bindings::BPF_F_MMAPABLE;

use super::*;

/// Bio submissions not yet seen as a request: a table of [`BIO_SLOTS`] stamps in buckets of
/// [`BIO_PROBES`] (one cache line), the bucket from [`bio_slot`] of the bio's address, matched
/// by the address (see [`BIO_SLOTS`]). `BPF_F_MMAPABLE` only for its page-aligned values (an
/// ordinary array's start 312 bytes into its allocation on 6.18, so a bucket spans two lines);
/// userspace never maps it. Shared by all CPUs: a submitter that sleeps for a tag
/// wakes up on another CPU. A stamp is taken (its `bio` zeroed) when a request whose first bio
/// it is is first seen; a bio that never becomes a request's first bio (merged into one
/// already built, or completed by a bio-based driver such as dm or md) leaves its stamp until
/// a newer one needs the place.
#[map]
static IO_BIO: Array<BioStamp> = Array::with_max_entries(BIO_SLOTS, BPF_F_MMAPABLE);

/// A word of scratch per CPU: a kernel pointer stored here reads back as a number the program
/// may hash (see [`addr_of`]).
#[map]
static IO_ADDR: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// A submission older than this is a stale entry at a reused bio address (a bio built without
/// a submission of its own, such as a split's front), not a wait.
pub(super) const BIO_STALE_NS: u64 = 30_000_000_000;

/// The address `p` holds, as a number: the verifier refuses arithmetic on a BTF-typed kernel
/// pointer, not a store of it (root may write pointers into maps) and a load back, which is a
/// plain number. 0 when the scratch word is missing.
#[inline(always)]
fn addr_of(p: u64) -> u64 {
    let Some(w) = IO_ADDR.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: this CPU's scratch word; nothing else uses it between the two accesses (the
    // block programs that call this do not nest on one CPU).
    unsafe {
        core::ptr::write_volatile(w, p);
        core::ptr::read_volatile(w)
    }
}

/// Requests are timed from their first bio's submission (io-lat's default): the bio hook is
/// attached and each new request looks its stamp up. 0 (`--from request`): no bio hook, no
/// lookup; a request's time starts where it is first seen, as biolatency -Q times it.
#[no_mangle]
static IO_SUBMIT: u8 = 1;

/// When `bio` was submitted, taken out of `IO_BIO`; 0 when not there.
#[inline(always)]
pub(super) fn bio_submitted(bio: u64) -> u64 {
    if bio == 0 || ro(&IO_SUBMIT) == 0 {
        return 0;
    }
    let home = bio_slot(addr_of(bio));
    for i in 0..BIO_PROBES {
        let Some(st) = IO_BIO.get_ptr_mut((home + i) & (BIO_SLOTS - 1)) else {
            return 0;
        };
        // SAFETY: live map value. Two CPUs may race on one slot only for two bios filed at
        // once in one place: a stamp lost then leaves a request untimed from submission.
        unsafe {
            if (*st).bio == bio {
                (*st).bio = 0;
                return (*st).ts;
            }
        }
    }
    0
}

/// `block_bio_queue(bio)`: a bio submitted (`submit_bio_noacct`, once per bio, in the
/// issuer's context). Only the time is kept, in the slot of its bucket already holding this
/// bio's address (a stamp left by an earlier bio at the same address, merged into a request and
/// never taken: found first, it would time this one from then), else the first free one, else
/// in place of the oldest stamp there; the request it becomes says the rest.
/// `addr` is `bio` as a number: [`addr_of`] where the verifier types it as a pointer (tp_btf).
#[inline(always)]
fn bio_queue(bio: u64, addr: impl FnOnce(u64) -> u64) {
    if bio == 0 || !allowed_current() {
        return;
    }
    let home = bio_slot(addr(bio));
    let mut same: Option<*mut BioStamp> = None;
    let mut free: Option<*mut BioStamp> = None;
    let mut old: Option<*mut BioStamp> = None;
    let mut oldest = u64::MAX;
    for i in 0..BIO_PROBES {
        let Some(st) = IO_BIO.get_ptr_mut((home + i) & (BIO_SLOTS - 1)) else {
            return;
        };
        // SAFETY: live map value (see bio_submitted).
        let (b, ts) = unsafe { ((*st).bio, (*st).ts) };
        if b == bio {
            same = Some(st);
            break;
        }
        if b == 0 {
            if free.is_none() {
                free = Some(st);
            }
        } else if ts < oldest {
            oldest = ts;
            old = Some(st);
        }
    }
    let Some(st) = same.or(free).or(old) else {
        return;
    };
    // SAFETY: as above.
    unsafe {
        if same.is_none() && free.is_none() {
            anom(ANOM_BIO_EVICTED);
        }
        (*st).bio = bio;
        (*st).ts = now();
    }
}

/// The bio argument of `block_bio_queue` (see [`IO_BIO_Q_ARG`]; the second by
/// [`second_arg`], as 5.10's verifier needs).
macro_rules! bio_arg {
    ($ctx:expr) => {{
        let args = $ctx.as_ptr() as *const u64;
        if ro(&IO_BIO_Q_ARG) != 0 {
            second_arg(args)
        } else {
            // SAFETY: the tracepoint's first argument.
            unsafe { core::ptr::read_volatile(args) }
        }
    }};
}

#[btf_tracepoint(function = "block_bio_queue")]
pub fn tk_io_bio(ctx: BtfTracePointContext) -> i32 {
    bio_queue(bio_arg!(ctx), addr_of);
    0
}

/// The hook's preferred program (io-lat's hook table): it reads nothing through the bio, and a
/// raw tracepoint's argument is a plain number, so no [`addr_of`] round trip through a per-CPU
/// map, a page of its own on a path where every page is cold.
#[raw_tracepoint(tracepoint = "block_bio_queue")]
pub fn tk_io_bio_raw(ctx: RawTracePointContext) -> i32 {
    bio_queue(bio_arg!(ctx), |a| a);
    0
}
