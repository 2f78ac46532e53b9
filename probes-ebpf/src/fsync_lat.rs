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
    bindings::{BPF_F_NO_PREALLOC, BPF_LOCAL_STORAGE_GET_F_CREATE},
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns,
        generated::{bpf_get_current_task_btf, bpf_task_storage_get},
    },
    macros::{btf_map, map, tracepoint},
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::TracePointContext,
    EbpfContext,
};
use probes_common::{
    fsync::{FileEvent, FsyncKey, FsyncStart, FsyncVal},
    stats,
};
use probes_ebpf::{
    allowed, atomic_add, filtering_pids, generation, get_or_insert, hist_record, stat,
};

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
/// Research switches (bits, see MODE_*): which implementation of each step runs. Read-only
/// data, so the verifier drops the other one.
#[no_mangle]
static FS_MODE: u32 = 0;
/// In-flight call in task-local storage (`INFLIGHT`) instead of the `FSYNC_START` hash.
const MODE_TASK_STORAGE: u32 = 1;
/// Tracepoint fields by direct context loads instead of `bpf_probe_read`.
const MODE_DIRECT_CTX: u32 = 2;
/// Measurement only: skip the per-call `EVENTS` counter.
const MODE_NO_EVENTS: u32 = 4;
/// Measurement only: skip the histogram update (the aggregate lookup still runs).
const MODE_NO_RECORD: u32 = 8;
/// Measurement only: skip the aggregate lookup and record altogether.
const MODE_NO_AGG: u32 = 16;
/// Measurement only: the enter program returns right after the filter.
const MODE_ENTER_EMPTY: u32 = 32;
/// Measurement only: no timestamp at enter.
const MODE_ENTER_NOTIME: u32 = 64;
/// Enter calls bpf_get_current_pid_tgid only when something needs it (`--pid`, `--by-file`,
/// or the hash in-flight map keyed by tid).
const MODE_LAZY_PID: u32 = 128;
/// Measurement only: the lower bound of any latency tool on these hooks: enter takes a
/// timestamp and stores it per thread, exit takes a timestamp and reads it back (no fields,
/// no aggregation, no counters).
const MODE_TIMESTAMPS_ONLY: u32 = 256;

/// A task-local storage map (aya-ebpf 0.2.1 has none): BTF-defined, as the kernel requires
/// for local storage (key and value BTF ids). Laid out like aya-ebpf's `btf_map_def!` maps.
#[repr(C)]
pub struct TaskStorage<T> {
    r#type: *const [i32; aya_ebpf::bindings::bpf_map_type::BPF_MAP_TYPE_TASK_STORAGE as usize],
    key: *const i32,
    value: *const T,
    max_entries: *const [i32; 0],
    map_flags: *const [i32; BPF_F_NO_PREALLOC as usize],
}

// SAFETY: placeholder pointers the loader reads from BTF; never dereferenced.
unsafe impl<T> Sync for TaskStorage<T> {}

impl<T> TaskStorage<T> {
    pub const fn new() -> Self {
        TaskStorage {
            r#type: core::ptr::null(),
            key: core::ptr::null(),
            value: core::ptr::null(),
            max_entries: core::ptr::null(),
            map_flags: core::ptr::null(),
        }
    }

    /// The current task's value, zero-initialised on first use when `create`; null when absent
    /// (or when the kernel could not allocate it).
    #[inline(always)]
    pub fn current(&self, create: bool) -> *mut T {
        // SAFETY: helper calls; the task pointer is the kernel's BTF-typed `current`.
        unsafe {
            let task = bpf_get_current_task_btf();
            bpf_task_storage_get(
                self as *const Self as *mut core::ffi::c_void,
                task,
                core::ptr::null_mut(),
                if create {
                    BPF_LOCAL_STORAGE_GET_F_CREATE as u64
                } else {
                    0
                },
            ) as *mut T
        }
    }
}

/// In-flight calls by thread, freed by the kernel with the thread (MODE_TASK_STORAGE).
/// `ts_ns == 0` means no call in flight.
#[btf_map]
static INFLIGHT: TaskStorage<FsyncStart> = TaskStorage::new();

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

/// A tracepoint field: with MODE_DIRECT_CTX a plain load at the offset the verifier sees as a
/// constant (the context pointer may not be offset by a register, so each supported offset is
/// its own load; the verifier keeps only the arm the read-only offset selects), else
/// `bpf_probe_read`.
#[inline(always)]
fn field<T: Copy, const WIDE: bool>(ctx: &TracePointContext, off: u32, default: T) -> T {
    if ro(&FS_MODE) & MODE_DIRECT_CTX != 0 && !WIDE {
        // Records without arguments (sys_enter_sync): the kernel refuses to attach a program
        // whose loads reach past the smallest record it is attached to, so only offset 8.
        if off == 8 {
            // SAFETY: as below.
            return unsafe {
                core::ptr::read_volatile((ctx.as_ptr() as *const u8).add(8) as *const T)
            };
        }
    } else if ro(&FS_MODE) & MODE_DIRECT_CTX != 0 {
        let p = ctx.as_ptr() as *const u8;
        // Both candidate slots are loaded unconditionally, at immediate offsets: inside an
        // `if off == 16` LLVM rewrote `ctx + 16` as `ctx + off`, and the verifier refuses any
        // context pointer offset by a register ("dereference of modified ctx ptr").
        // SAFETY: tracepoint programs may load any aligned offset in [8, 2048) of their
        // record buffer; the offset that is used comes from the event's format file.
        let (at8, at16) = unsafe {
            (
                core::ptr::read_volatile(p.add(8) as *const T),
                core::ptr::read_volatile(p.add(16) as *const T),
            )
        };
        if off == 8 {
            return at8;
        }
        if off == 16 {
            return at16;
        }
    }
    // A plain value on every path: with an Option here LLVM compared the undefined value of
    // the failed read before selecting (`R1 !read_ok` from the verifier).
    // SAFETY: the helper checks the address.
    match unsafe { ctx.read_at::<T>(off as usize) } {
        Ok(v) => v,
        Err(_) => default,
    }
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
    enter::<true>(ctx)
}

/// `sys_enter_sync`: no arguments, so a record too short for `enter::<true>`'s loads.
#[tracepoint]
pub fn tk_fsync_enter_noarg(ctx: TracePointContext) -> u32 {
    enter::<false>(ctx)
}

#[inline(always)]
fn enter<const ARGS: bool>(ctx: TracePointContext) -> u32 {
    let mode = ro(&FS_MODE);
    let need_pid = mode & MODE_LAZY_PID == 0
        || filtering_pids()
        || ro(&FS_BY_FILE) != 0
        || mode & MODE_TASK_STORAGE == 0;
    let pid_tgid = if need_pid {
        bpf_get_current_pid_tgid()
    } else {
        0
    };
    let (tgid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    if !allowed(tgid) {
        return 0;
    }
    if mode & MODE_ENTER_EMPTY != 0 {
        return 0;
    }
    if mode & MODE_TIMESTAMPS_ONLY != 0 && mode & MODE_TASK_STORAGE != 0 {
        let p = INFLIGHT.current(true);
        if !p.is_null() {
            // SAFETY: as below.
            unsafe { (*p).ts_ns = bpf_ktime_get_ns() };
        }
        return 0;
    }
    let nr = field::<i32, ARGS>(&ctx, ro(&FS_NR_OFF), -1);
    if nr < 0 {
        return 0;
    }
    let nr = nr as u32;
    let fd = if !ARGS || nr == ro(&FS_NR_MSYNC) || nr == ro(&FS_NR_SYNC) {
        -1
    } else {
        field::<u64, true>(&ctx, ro(&FS_ARG0_OFF), u64::MAX) as i32
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
    let ts_ns = if mode & MODE_ENTER_NOTIME != 0 {
        1
    } else {
        // SAFETY: plain helper call.
        unsafe { bpf_ktime_get_ns() }
    };
    if mode & MODE_TASK_STORAGE != 0 {
        let p = INFLIGHT.current(true);
        if p.is_null() {
            stat(stats::START_MAP_FULL);
            return 0;
        }
        // SAFETY: the current task's storage, written only by this thread's own syscalls.
        unsafe { *p = FsyncStart { ts_ns, nr, fd } };
        return 0;
    }
    let start = FsyncStart { ts_ns, nr, fd };
    if FSYNC_START.insert(tid, start, 0).is_err() {
        stat(stats::START_MAP_FULL);
    }
    0
}

#[tracepoint]
pub fn tk_fsync_exit(ctx: TracePointContext) -> u32 {
    let mode = ro(&FS_MODE);
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    if mode & MODE_TIMESTAMPS_ONLY != 0 && mode & MODE_TASK_STORAGE != 0 {
        let p = INFLIGHT.current(false);
        if !p.is_null() {
            // SAFETY: as in the enter program.
            unsafe { (*p).ts_ns = now.wrapping_sub((*p).ts_ns) };
        }
        return 0;
    }
    let start = if mode & MODE_TASK_STORAGE != 0 {
        let p = INFLIGHT.current(false);
        if p.is_null() {
            // Never entered a traced call (filtered out, or began before we attached).
            return 0;
        }
        // SAFETY: as in the enter program.
        let s = unsafe { *p };
        if s.ts_ns == 0 {
            return 0;
        }
        // SAFETY: as above.
        unsafe { (*p).ts_ns = 0 };
        s
    } else {
        // SAFETY: the value is copied out before the delete below.
        let Some(start) = (unsafe { FSYNC_START.get(tid) }).copied() else {
            // Filtered out at enter, or the call began before we attached.
            return 0;
        };
        let _ = FSYNC_START.remove(tid);
        start
    };
    let delta = now.saturating_sub(start.ts_ns);
    let ret = field::<i64, true>(&ctx, ro(&FS_RET_OFF), 0);
    if mode & MODE_NO_EVENTS == 0 {
        stat(stats::EVENTS);
    }
    if mode & MODE_NO_AGG != 0 {
        return 0;
    }

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
    if mode & MODE_NO_RECORD != 0 {
        return 0;
    }
    // SAFETY: `val` is a live map value pointer.
    unsafe {
        if ret < 0 {
            atomic_add(&raw mut (*val).errors, 1);
        }
        hist_record(&raw mut (*val).hist, delta);
    }
    0
}
