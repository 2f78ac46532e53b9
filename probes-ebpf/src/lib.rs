//! Machinery shared by every tool's kernel programs: filters, per-CPU stats, the interval
//! generation, and atomic histogram updates. Each tool is a `[[bin]]` (see `Cargo.toml`) that
//! includes this library, so its object holds only the maps it uses.
#![no_std]
// The BPF target has no `Atomic*::fetch_add` in core (no compare-and-swap in the v1 ISA), but
// the intrinsic lowers to BPF_XADD, which every BPF-capable kernel has.
#![allow(internal_features)]
#![feature(core_intrinsics)]

use core::intrinsics::{atomic_xadd, AtomicOrdering};

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::bpf_get_current_comm,
    macros::map,
    maps::{Array, HashMap, PerCpuArray},
};
use probes_common::{
    hist::{bucket_index_flat, LatHist, NBUCKETS},
    stats::{Control, NSTATS},
    COMM_LEN,
};

/// Set by userspace before load (read-only data, so the verifier prunes disabled filters).
#[no_mangle]
static FILTER_PIDS_ON: u8 = 0;
#[no_mangle]
static FILTER_COMM_ON: u8 = 0;
#[no_mangle]
static FILTER_COMM: [u8; COMM_LEN] = [0; COMM_LEN];

/// tgids to trace when `FILTER_PIDS_ON` (`--pid`).
#[map]
static FILTER_PIDS: HashMap<u32, u8> = HashMap::with_max_entries(1024, 0);

/// What could not be recorded, per CPU; indices in `probes_common::stats`.
#[map]
static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(NSTATS, 0);

/// Interval generation, flipped by userspace.
#[map]
static CONTROL: Array<Control> = Array::with_max_entries(1, 0);

#[inline(always)]
fn ro<T: Copy>(v: &T) -> T {
    // SAFETY: `v` points at a static; the volatile read keeps rustc from folding the initial
    // value, which userspace replaces before load.
    unsafe { core::ptr::read_volatile(v) }
}

/// Whether `--pid` is in force (then `allowed` needs the real tgid).
#[inline(always)]
pub fn filtering_pids() -> bool {
    ro(&FILTER_PIDS_ON) != 0
}

/// Whether the current task passes `--pid` / `--comm`.
#[inline(always)]
pub fn allowed(tgid: u32) -> bool {
    if ro(&FILTER_PIDS_ON) != 0 {
        // SAFETY: the value is only tested for presence.
        if unsafe { FILTER_PIDS.get(tgid) }.is_none() {
            return false;
        }
    }
    if ro(&FILTER_COMM_ON) != 0 {
        let Ok(comm) = bpf_get_current_comm() else {
            return false;
        };
        let want = ro(&FILTER_COMM);
        let mut i = 0;
        while i < COMM_LEN {
            if comm[i] != want[i] {
                return false;
            }
            if comm[i] == 0 {
                break;
            }
            i += 1;
        }
    }
    true
}

/// Loads the u64 at byte `off` of the kernel object `p` points to.
///
/// # Safety
/// `p` must be a BTF-typed pointer argument of a tp_btf program (the verifier checks each such
/// load against the struct's BTF layout and turns a faulting load into zero), and `off` a member
/// offset from the kernel's BTF, held in a read-only global so the verifier sees a constant.
#[inline(always)]
pub unsafe fn btf_load_u64(p: *const u8, off: u32) -> u64 {
    // SAFETY: per the contract above.
    unsafe { core::ptr::read_volatile(p.add(off as usize) as *const u64) }
}

/// Bumps per-CPU counter `idx` (a `probes_common::stats` constant).
#[inline(always)]
pub fn stat(idx: u32) {
    if let Some(p) = STATS.get_ptr_mut(idx) {
        // SAFETY: per-CPU slot; programs on this CPU do not preempt each other mid-update for
        // tracepoint programs (they run with migration disabled and do not nest on one CPU).
        unsafe { *p += 1 };
    }
}

/// Current interval generation (0 or 1).
#[inline(always)]
pub fn generation() -> u32 {
    match CONTROL.get(0) {
        Some(c) => c.gen & 1,
        None => 0,
    }
}

/// Adds `v` to `*p` atomically.
///
/// # Safety
/// `p` must point into a live map value (8-byte aligned), e.g. from a lookup in this run.
#[inline(always)]
pub unsafe fn atomic_add(p: *mut u64, v: u64) {
    // SAFETY: per the contract above. The result is unused, so this compiles to BPF_XADD on any
    // BPF ISA version.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(p, v) };
}

/// Records `v` in a histogram that other CPUs may update at the same time.
///
/// # Safety
/// `h` must be a map value pointer handed out by a lookup in this program run.
#[inline(always)]
pub unsafe fn hist_record(h: *mut LatHist, v: u64) {
    // SAFETY: per the contract above.
    unsafe {
        atomic_add(&raw mut (*h).count, 1);
        atomic_add(&raw mut (*h).sum, v);
        // No atomic max in the BPF ISA: two CPUs updating the same key at once may lose the
        // smaller of two new maxima (likewise minima), never a count or a bucket.
        if v > (*h).max {
            (*h).max = v;
        }
        let m = v.saturating_add(1);
        if (*h).min_plus1 == 0 || m < (*h).min_plus1 {
            (*h).min_plus1 = m;
        }
        // The bound check must be on the index itself. Left alone, LLVM proves it from the
        // exponent check inside bucket_index and builds the index with `|`, whose result the
        // 6.1 verifier leaves unbounded ("math between map_value pointer and register with
        // unbounded min value"); 6.18 accepts it. A volatile round trip hides the proof, so
        // the comparison below is emitted on the value the pointer arithmetic uses.
        // bucket_index_flat has no branches (see there): one verifier path through here
        // instead of dozens.
        let idx = core::ptr::read_volatile(&bucket_index_flat(v));
        if idx < NBUCKETS as u64 {
            atomic_add(&raw mut (*h).buckets[idx as usize], 1);
        }
    }
}

/// Looks `key` up in `map`, inserting `init` first when absent. `None` when the map is full: the
/// caller then records into its overflow row and counts `KEY_MAP_FULL`.
#[inline(always)]
pub fn get_or_insert<K, V>(map: &HashMap<K, V>, key: &K, init: &V) -> Option<*mut V> {
    if let Some(p) = map.get_ptr_mut(key) {
        return Some(p);
    }
    // NOEXIST: when two CPUs create the same key, the loser's insert fails and it uses the
    // winner's value below.
    let _ = map.insert(key, init, BPF_NOEXIST as u64);
    map.get_ptr_mut(key)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // SAFETY: BPF programs cannot panic at run time; the verifier rejects any path reaching here.
    unsafe { core::hint::unreachable_unchecked() }
}
