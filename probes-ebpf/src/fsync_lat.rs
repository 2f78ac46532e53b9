//! `fsync-lat` kernel programs: latency of the sync-family syscalls per process and syscall.
//!
//! Hooks: `syscalls:sys_enter_{fsync,fdatasync,sync_file_range,msync,syncfs,sync}` and the
//! matching `sys_exit_*`, classic tracepoints (the per-syscall events exist only as classic
//! tracepoints; they fire for these syscalls alone, so nothing else pays). One enter and one exit
//! program serve all six events and tell them apart by `__syscall_nr`.
//!
//! Fields read (offsets from each event's `format` file, passed in as globals):
//! - `sys_enter_*`: `__syscall_nr` (int), first argument (8-byte slot: `fd` for all but msync
//!   and sync).
//! - `sys_exit_*`: `ret` (long).
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{map, tracepoint},
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::TracePointContext,
};
use probes_common::{
    fsync::{FileEvent, FsyncKey, FsyncStart, FsyncVal},
    stats,
};
use probes_ebpf::{allowed, atomic_add, generation, get_or_insert, hist_record, stat};

#[no_mangle]
static FS_NR_OFF: u32 = 8;
#[no_mangle]
static FS_ARG0_OFF: u32 = 16;
#[no_mangle]
static FS_RET_OFF: u32 = 16;
#[no_mangle]
static FS_NR_MSYNC: u32 = u32::MAX;
#[no_mangle]
static FS_NR_SYNC: u32 = u32::MAX;
#[no_mangle]
static FS_PER_THREAD: u8 = 0;
#[no_mangle]
static FS_BY_FILE: u8 = 0;

/// In-flight calls by tid. Sized by userspace from pid_max.
#[map]
static FSYNC_START: HashMap<u32, FsyncStart> = HashMap::with_max_entries(16384, 0);

/// Aggregates. Sized by userspace (`--max-keys`, doubled for the two generations); allocated on
/// demand, so an idle cap costs nothing.
#[map]
static FSYNC_HIST: HashMap<FsyncKey, FsyncVal> = HashMap::with_max_entries(8192, BPF_F_NO_PREALLOC);

/// What did not fit `FSYNC_HIST`, one row per generation: the `[other]` row of the report.
#[map]
static FSYNC_OTHER: Array<FsyncVal> = Array::with_max_entries(2, 0);

/// Initial value for new keys (comm and tgid filled in, histogram zero).
#[map]
static FSYNC_SCRATCH: PerCpuArray<FsyncVal> = PerCpuArray::with_max_entries(1, 0);

/// New (process, fd) pairs with `--by-file`; low rate (once per pair and interval).
#[map]
static FSYNC_FILES: RingBuf = RingBuf::with_byte_size(64 * 1024, 0);

#[inline(always)]
fn ro<T: Copy>(v: &T) -> T {
    // SAFETY: see probes_ebpf::ro; globals are patched by userspace before load.
    unsafe { core::ptr::read_volatile(v) }
}

#[inline(always)]
fn key_for(tgid: u32, tid: u32, nr: u32, fd: i32) -> FsyncKey {
    FsyncKey {
        id: if ro(&FS_PER_THREAD) != 0 { tid } else { tgid },
        nr,
        fd: if ro(&FS_BY_FILE) != 0 { fd } else { -1 },
        gen: generation(),
    }
}

#[tracepoint]
pub fn tk_fsync_enter(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    if !allowed(tgid) {
        return 0;
    }
    // SAFETY: offsets come from the event's format file; read_at bounds-checks via the helper.
    let nr = match unsafe { ctx.read_at::<i32>(ro(&FS_NR_OFF) as usize) } {
        Ok(nr) => nr as u32,
        Err(_) => return 0,
    };
    let fd = if nr == ro(&FS_NR_MSYNC) || nr == ro(&FS_NR_SYNC) {
        -1
    } else {
        // SAFETY: as above.
        unsafe { ctx.read_at::<u64>(ro(&FS_ARG0_OFF) as usize) }.unwrap_or(u64::MAX) as i32
    };
    if ro(&FS_BY_FILE) != 0 && fd >= 0 {
        let key = key_for(tgid, tid, nr, fd);
        if FSYNC_HIST.get_ptr(key).is_none() {
            let ev = FileEvent {
                tgid,
                tid,
                fd,
                id: key.id,
            };
            if FSYNC_FILES.output::<FileEvent>(&ev, 0).is_err() {
                stat(stats::RINGBUF_FULL);
            }
        }
    }
    let start = FsyncStart {
        // SAFETY: plain helper call.
        ts_ns: unsafe { bpf_ktime_get_ns() },
        nr,
        fd,
    };
    if FSYNC_START.insert(tid, start, 0).is_err() {
        stat(stats::START_MAP_FULL);
    }
    0
}

#[tracepoint]
pub fn tk_fsync_exit(ctx: TracePointContext) -> u32 {
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    // SAFETY: the value is copied out before the delete below.
    let Some(start) = (unsafe { FSYNC_START.get(tid) }).copied() else {
        // Filtered out at enter, or the call began before we attached.
        return 0;
    };
    let _ = FSYNC_START.remove(tid);
    let delta = now.saturating_sub(start.ts_ns);
    // SAFETY: offset from the exit event's format file.
    let ret = unsafe { ctx.read_at::<i64>(ro(&FS_RET_OFF) as usize) }.unwrap_or(0);
    stat(stats::EVENTS);

    let key = key_for(tgid, tid, start.nr, start.fd);
    let val = match FSYNC_HIST.get_ptr_mut(key) {
        Some(p) => Some(p),
        None => match FSYNC_SCRATCH.get_ptr_mut(0) {
            Some(init) => {
                // SAFETY: per-CPU scratch slot owned by this run; only comm and tgid are ever
                // written, so its histogram stays zero.
                unsafe {
                    (*init).comm = bpf_get_current_comm().unwrap_or_default();
                    (*init).tgid = tgid;
                }
                // SAFETY: the scratch slot is valid for this run (see above).
                get_or_insert(&FSYNC_HIST, &key, unsafe { &*init })
            }
            None => None,
        },
    };
    let val = match val {
        Some(v) => v,
        None => {
            stat(stats::KEY_MAP_FULL);
            match FSYNC_OTHER.get_ptr_mut(key.gen) {
                Some(v) => v,
                None => return 0,
            }
        }
    };
    // SAFETY: `val` is a live map value pointer.
    unsafe {
        if ret < 0 {
            atomic_add(&raw mut (*val).errors, 1);
        }
        hist_record(&raw mut (*val).hist, delta);
    }
    0
}
