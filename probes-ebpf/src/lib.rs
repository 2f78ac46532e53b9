//! Machinery shared by every tool's kernel programs (the kernel half of the collector kit):
//! filters, per-CPU stats, the interval generation, atomic histogram updates, the get-or-insert
//! aggregation [`slot`] with its `[other]` fallback, in-flight begin/end maps, and announcing
//! new keys on a ring buffer.
//!
//! Each tool is one object, `src/bin/<tool>.rs`, that links this library. Every map declared
//! here lands in every object (bpf-linker keeps exported statics), so only the three maps every
//! tool uses live here; helpers take the tool's own maps as arguments.
#![no_std]
// The BPF target has no `Atomic*::fetch_add` in core (no compare-and-swap in the v1 ISA), but
// the intrinsic lowers to BPF_XADD, which every BPF-capable kernel has.
#![allow(internal_features)]
#![feature(core_intrinsics)]
// `second_arg`: one load the compiler cannot merge (kernel-side builds only, see cli/build.rs).
#![feature(asm_experimental_arch)]

use core::intrinsics::{atomic_xadd, AtomicOrdering};

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_probe_read_kernel},
    macros::map,
    maps::{Array, HashMap, PerCpuArray, RingBuf},
};
use probes_common::{
    hist::{bucket_index_flat, LatHist, NBUCKETS},
    stats::{self, Control, NSTATS},
    COMM_LEN,
};

/// Readers of kernel struct members at BTF offsets (plain loads for tp_btf, probe reads else).
/// Declares no maps: every map of this library lands in every object.
pub mod kread;
/// On-CPU time per NUMA node at `sched_switch` (numa's object and the shared `sched` one).
pub mod node_time;
pub mod python;

/// The second argument of a tp_btf or raw_tp context (an array of u64), loaded at a constant
/// offset from the context register. Where a program takes argument 0 or 1 by a frozen global
/// (prototypes that lost their first argument), the two loads written in Rust are merged into
/// one from a computed `ctx + 8`, even when volatile, and 5.10's verifier refuses that
/// ("dereference of modified ctx ptr"). Behind a branch on the global, this load is dead to the
/// verifier of a kernel whose prototype has one argument.
#[inline(always)]
pub fn second_arg(args: *const u64) -> u64 {
    let v: u64;
    // SAFETY: one load at `args + 8`, which the verifier checks against the prototype.
    unsafe {
        core::arch::asm!(
            "{0} = *(u64 *)({1} + 8)",
            out(reg) v,
            in(reg) args,
            options(nostack, readonly, preserves_flags)
        )
    };
    v
}

/// Set by userspace before load (read-only data, so the verifier prunes disabled filters).
#[no_mangle]
static FILTER_PIDS_ON: u8 = 0;
#[no_mangle]
static FILTER_COMM_ON: u8 = 0;
/// `--pid N` alone (one process, no `--children`, so the set never changes): its tgid, and the
/// pid filter is one compare instead of a hash lookup on every event; 0 otherwise.
#[no_mangle]
static FILTER_ONE_PID: u32 = 0;
#[no_mangle]
static FILTER_COMM: [u8; COMM_LEN] = [0; COMM_LEN];

/// tgids to trace when `FILTER_PIDS_ON` (`--pid`).
#[map]
static FILTER_PIDS: HashMap<u32, u8> = HashMap::with_max_entries(1024, 0);

/// Offsets of `pid` and `clone_flags` in `task:task_newtask` (from its format file), for
/// [`tk_follow_fork`].
#[no_mangle]
static FOLLOW_PID_OFF: u32 = 8;
#[no_mangle]
static FOLLOW_FLAGS_OFF: u32 = 32;

/// `CLONE_THREAD` (include/uapi/linux/sched.h): a new thread of a traced process is covered by
/// its tgid already.
const CLONE_THREAD: u64 = 0x0001_0000;

/// What a program attached through perf_event returns so the event goes on to perf.
///
/// For a classic tracepoint (`perf_trace_run_bpf_submit`) or a kprobe/uprobe attached through
/// perf (`kprobe_perf_func`), the kernel skips `perf_tp_event` for the hit when the program
/// returns 0: every `perf record`/`perf trace`/`perf stat` user of the same event on that CPU
/// loses it (KERNEL-NOTES, 2026-12-01: 0 of 20 `fdatasync` recorded beside `fsync-lat`).
pub const PASS: u32 = 1;

/// Defines a classic-tracepoint, kprobe or kretprobe program (by the context its body takes:
/// `TracePointContext`, `ProbeContext`, `RetProbeContext`) that returns [`PASS`], whatever its
/// body returns:
///
/// ```ignore
/// passing! {
///     pub fn tk_x_enter(ctx: TracePointContext) -> u32 { ...; 0 }
/// }
/// ```
///
/// Why not aya's `#[tracepoint]`/`#[kprobe]`: their wrappers discard the body's value and
/// return 0, which blinds every other tracer of the event (see [`PASS`]). tp_btf and raw_tp
/// programs do not gate perf, so they keep aya's attributes.
#[macro_export]
macro_rules! passing {
    ($(#[$attr:meta])* $vis:vis fn $name:ident($ctx:ident: $ctx_ty:ident) -> u32 $body:block) => {
        $(#[$attr])*
        #[unsafe(no_mangle)]
        #[unsafe(link_section = $crate::passing!(@section $ctx_ty))]
        $vis fn $name(ctx: *mut ::core::ffi::c_void) -> u32 {
            #[inline(always)]
            fn body($ctx: ::aya_ebpf::programs::$ctx_ty) -> u32 $body
            let _ = body(::aya_ebpf::programs::$ctx_ty::new(ctx));
            $crate::PASS
        }
    };
    // The section aya's loader reads the program type from, by the context the body takes.
    (@section TracePointContext) => { "tracepoint" };
    (@section ProbeContext) => { "kprobe" };
    (@section RetProbeContext) => { "kretprobe" };
}

passing! {
    /// `--pid N --children`: on `task:task_newtask` (runs in the parent, inside fork, before the
    /// child can run), a process forked by a traced process joins `FILTER_PIDS`, so a child that
    /// lives a millisecond is traced from its first instruction. Every object carries this program;
    /// userspace loads it only with `--children`.
    pub fn tk_follow_fork(ctx: TracePointContext) -> u32 {
        let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
        // SAFETY: the value is only tested for presence.
        if unsafe { FILTER_PIDS.get(tgid) }.is_none() {
            return 0;
        }
        // SAFETY: offsets from the event's format file; read_at goes through bpf_probe_read.
        let flags = unsafe { ctx.read_at::<u64>(ro(&FOLLOW_FLAGS_OFF) as usize) }.unwrap_or(0);
        if flags & CLONE_THREAD != 0 {
            return 0;
        }
        // SAFETY: as above.
        let Ok(child) = (unsafe { ctx.read_at::<i32>(ro(&FOLLOW_PID_OFF) as usize) }) else {
            return 0;
        };
        // A full map (1024 processes) fails the insert; userspace sees the size and says so.
        let _ = FILTER_PIDS.insert(child as u32, 1, 0);
        0
    }
}

/// What could not be recorded, per CPU; indices in `probes_common::stats`.
#[map]
static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(NSTATS, 0);

/// Interval generation, flipped by userspace.
#[map]
static CONTROL: Array<Control> = Array::with_max_entries(1, 0);

/// Reads a read-only global that userspace patches before load (field offsets, flags), or one
/// field of it (`ro(&OFFS.rq_bio)`): one volatile load each, so every offset is a constant the
/// verifier sees where it is used (tp_btf's direct loads need that).
#[inline(always)]
pub fn ro<T: Copy>(v: &T) -> T {
    // SAFETY: `v` points at a static; the volatile read keeps rustc from folding the initial
    // value, which userspace replaces before load.
    unsafe { core::ptr::read_volatile(v) }
}

/// Whether `--pid` is in force (then `allowed` needs the real tgid).
#[inline(always)]
pub fn filtering_pids() -> bool {
    ro(&FILTER_PIDS_ON) != 0
}

/// False when a task (any task, not only the current one) of the process whose tgid `tgid`
/// reads certainly fails `--pid`: with one process to trace that costs a compare, and lets a
/// hook on other tasks' events (the incoming task of a switch, the woken one) skip its own map
/// lookup. `tgid` is read only then.
#[inline(always)]
pub fn may_pass_pid(tgid: impl FnOnce() -> u32) -> bool {
    let one = ro(&FILTER_ONE_PID);
    one == 0 || tgid() == one
}

/// Whether the current task passes `--pid` / `--comm`.
#[inline(always)]
pub fn allowed(tgid: u32) -> bool {
    if ro(&FILTER_PIDS_ON) != 0 {
        let one = ro(&FILTER_ONE_PID);
        if one != 0 {
            if tgid != one {
                return false;
            }
        // SAFETY: the value is only tested for presence.
        } else if unsafe { FILTER_PIDS.get(tgid) }.is_none() {
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

/// [`allowed`] for the current task, whose tgid is read only under `--pid`.
#[inline(always)]
pub fn allowed_current() -> bool {
    let tgid = if filtering_pids() {
        (bpf_get_current_pid_tgid() >> 32) as u32
    } else {
        0
    };
    allowed(tgid)
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

/// The `comm` of a task that may not be the current one (`off`: `task_struct.comm` from BTF);
/// zeros if unreadable. Rare paths only (a helper call in either attach mode).
#[inline(always)]
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn task_comm(task: *const u8, off: u32) -> [u8; COMM_LEN] {
    // SAFETY: the helper checks the address; a failed read yields zeros.
    unsafe { bpf_probe_read_kernel(task.add(off as usize) as *const [u8; COMM_LEN]) }
        .unwrap_or([0; COMM_LEN])
}

/// The run queue `task` is on and that queue's steal clock, `rq->prev_steal_time_rq`: the
/// steal of its CPU up to the queue's last clock update (every enqueue and every `__schedule`
/// update it first). (0, 0) when a read fails. Through `se.cfs_rq`, which every task has
/// (`set_task_rq` sets it for all classes), and `cfs_rq.rq`, offsets from the kernel's BTF
/// (`o.se_cfs_rq`, `o.cfs_rq_rq`, `o.rq_steal`).
#[inline(always)]
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn rq_steal(task: *const u8, o: &probes_common::sched::TaskOffsets) -> (u64, u64) {
    // SAFETY: the helper checks each address; a failed read yields 0 and ends the chase.
    unsafe {
        let cfs = bpf_probe_read_kernel(task.add(o.se_cfs_rq as usize) as *const u64).unwrap_or(0);
        if cfs == 0 {
            return (0, 0);
        }
        let rq = bpf_probe_read_kernel((cfs as *const u8).add(o.cfs_rq_rq as usize) as *const u64)
            .unwrap_or(0);
        if rq == 0 {
            return (0, 0);
        }
        let steal = bpf_probe_read_kernel((rq as *const u8).add(o.rq_steal as usize) as *const u64)
            .unwrap_or(0);
        (rq, steal)
    }
}

/// The current task's `comm`, written where `dst` points (a map value or this program's
/// stack): the helper fills all 16 bytes, so nothing is zeroed first. aya's
/// `bpf_get_current_comm()` returns the array by value, which costs a byte-wise memset loop
/// and a byte-wise copy (LLVM's BPF lowering of a 16-byte, byte-aligned array) on a hot path.
#[inline(always)]
pub fn comm_into(dst: &mut [u8; COMM_LEN]) {
    // SAFETY: `dst` is 16 writable bytes; on failure the helper zeroes them.
    unsafe {
        aya_ebpf::helpers::generated::bpf_get_current_comm(
            dst.as_mut_ptr().cast(),
            COMM_LEN as u32,
        )
    };
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

/// When the current generation began (`Control::since_ns`; 0 for the first).
#[inline(always)]
pub fn generation_since() -> u64 {
    match CONTROL.get(0) {
        Some(c) => c.since_ns,
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
        hist_record_uncounted(h, v);
    }
}

/// [`hist_record`] without `count`, for a histogram whose count the caller's row already keeps
/// (io-lat's `count`, `direct` and `submitted` say how many values each of its histograms
/// got): one atomic add less per value. Userspace fills `count` in from the row.
///
/// # Safety
/// As [`hist_record`].
#[inline(always)]
pub unsafe fn hist_record_uncounted(h: *mut LatHist, v: u64) {
    // SAFETY: per the contract above.
    unsafe {
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
///
/// `init` points at a map value or at this program's stack, never at a constant (`&0`): rustc
/// promotes that to an unnamed constant, which LLVM merges with any read-only global of the
/// same value, a tunable userspace patches before load included. `&0` in numa's pair count
/// became `&NUMA_START_NS`, so a window's first task move counted the attach time (56,593,020,161
/// moves on 5.10). Small values go through [`get_or_insert_copy`].
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

/// [`get_or_insert`] with `init` written to this program's stack first (a volatile store, so
/// the compiler cannot fold it back into a read-only constant). For values of a few words: the
/// BPF stack is 512 bytes.
#[inline(always)]
pub fn get_or_insert_copy<K, V: Copy>(map: &HashMap<K, V>, key: &K, init: V) -> Option<*mut V> {
    let mut local = core::mem::MaybeUninit::<V>::uninit();
    // SAFETY: a write of a whole `V` into this frame's own slot.
    unsafe { core::ptr::write_volatile(local.as_mut_ptr(), init) };
    // SAFETY: written just above.
    get_or_insert(map, key, unsafe { &*local.as_ptr() })
}

/// Where a key's aggregate lives for this event.
pub struct Slot<V> {
    pub ptr: *mut V,
    /// The key was created by this call (announce it, if the tool learns about new keys).
    pub created: bool,
}

/// The aggregate of `key` in `map`: found; or created from this CPU's `scratch` value after
/// `init` filled its identity fields (counters in the scratch value are never written, so they
/// stay zero); or, when `map` is full, the `[other]` row `other[gen]`, counted as
/// `KEY_MAP_FULL`, so totals still add up. `None` only if `other` has no slot `gen`.
///
/// Every path ends in one pointer, so the caller's update is verified once (the verifier walks
/// the code after a branch once per path: keep path-specific constants out of it).
#[inline(always)]
pub fn slot<K, V>(
    map: &HashMap<K, V>,
    other: &Array<V>,
    scratch: &PerCpuArray<V>,
    key: &K,
    gen: u32,
    init: impl FnOnce(*mut V),
) -> Option<Slot<V>> {
    if let Some(p) = map.get_ptr_mut(key) {
        return Some(Slot {
            ptr: p,
            created: false,
        });
    }
    if let Some(s) = scratch.get_ptr_mut(0) {
        init(s);
        // SAFETY: this CPU's scratch slot, valid for this program run.
        if let Some(p) = get_or_insert(map, key, unsafe { &*s }) {
            return Some(Slot {
                ptr: p,
                created: true,
            });
        }
    }
    stat(stats::KEY_MAP_FULL);
    other.get_ptr_mut(gen).map(|p| Slot {
        ptr: p,
        created: false,
    })
}

/// Remembers the begin of something under `key` until its end (`take`); a full map is counted
/// as `START_MAP_FULL` (that call's end then finds nothing and is not recorded).
#[inline(always)]
pub fn begin<K, V>(map: &HashMap<K, V>, key: &K, v: &V) {
    if map.insert(key, v, 0).is_err() {
        stat(stats::START_MAP_FULL);
    }
}

/// The begin stored under `key`, removed; `None` when it was filtered out or happened before
/// tracing started.
#[inline(always)]
pub fn take<K, V: Copy>(map: &HashMap<K, V>, key: &K) -> Option<V> {
    // SAFETY: the value is copied out before the delete below.
    let v = unsafe { map.get(key) }.copied()?;
    let _ = map.remove(key);
    Some(v)
}

/// [`begin`] for a map whose entries stay after their end ([`take_kept`]): written in place
/// when `key` has an entry, so after a key's first begin a begin is one lookup and no map
/// update (an update or a delete takes the bucket lock and a free-list round trip each, the
/// bulk of a begin/end pair's cost). Userspace removes the entries of keys that cannot come
/// back (an exited thread's tid).
#[inline(always)]
pub fn begin_kept<K, V: Copy>(map: &HashMap<K, V>, key: &K, v: &V) {
    match map.get_ptr_mut(key) {
        // SAFETY: a live map value; only the key's own thread writes it in the kernel.
        Some(p) => unsafe { *p = *v },
        None => begin(map, key, v),
    }
}

/// The begin [`begin_kept`] stored under `key`, if `held` says the entry holds one (else
/// `None`: filtered out, begun before tracing, or already ended); `end` marks it ended in
/// place and the entry stays for the key's next begin.
#[inline(always)]
pub fn take_kept<K, V: Copy>(
    map: &HashMap<K, V>,
    key: &K,
    held: impl FnOnce(&V) -> bool,
    end: impl FnOnce(&mut V),
) -> Option<V> {
    let p = map.get_ptr_mut(key)?;
    // SAFETY: a live map value, copied before it is marked; only the key's own thread writes
    // it in the kernel.
    let v = unsafe { *p };
    if !held(&v) {
        return None;
    }
    // SAFETY: as above.
    end(unsafe { &mut *p });
    Some(v)
}

/// Streams `ev` to userspace (low-rate records only: new keys, rare events); a full ring buffer
/// is counted as `RINGBUF_FULL`.
#[inline(always)]
pub fn announce<T: 'static>(rb: &RingBuf, ev: &T) {
    if rb.output::<T>(ev, 0).is_err() {
        stat(stats::RINGBUF_FULL);
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // SAFETY: BPF programs cannot panic at run time; the verifier rejects any path reaching here.
    unsafe { core::hint::unreachable_unchecked() }
}
