//! `fsync-lat` kernel programs: latency of the sync-family syscalls per process and syscall.
//!
//! Two ways to hook the same calls, the first preferred:
//! - BTF tracepoints on the raw `sys_enter` / `sys_exit` tracepoints (`tk_fsync_enter`,
//!   `tk_fsync_exit`). They see every syscall and return after comparing its number with the
//!   six of the family (the classic per-syscall events below cost every syscall a comparable
//!   bitmap test in `perf_syscall_enter`, see docs/benchmarks.md). Why not the classic events:
//!   closing each classic-tracepoint perf event waits for an RCU grace period under the global
//!   `event_mutex` (`perf_trace_destroy` -> `tracepoint_synchronize_unregister`), about 35–90 ms
//!   per event here, so detaching twelve of them took ~0.9 s; a BTF tracepoint link detaches
//!   without waiting. Fields: `id` (argument 1 of `sys_enter`), the first syscall argument and,
//!   at exit, the syscall number (`orig_ax`) from `struct pt_regs` at offsets taken from the
//!   kernel's BTF; `ret` (argument 1 of `sys_exit`).
//! - Classic tracepoints `syscalls:sys_enter_{fsync,fdatasync,sync_file_range,msync,syncfs,
//!   sync}` and the matching `sys_exit_*` (`tk_fsync_enter_tp`, `tk_fsync_exit_tp`), on kernels without
//!   BTF. One enter and one exit program serve all six events and tell them apart by
//!   `__syscall_nr`; fields at offsets from each event's `format` file: `__syscall_nr` (int),
//!   the first argument (8-byte slot: `fd` for all but msync and sync), `ret` (long).
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns,
        bpf_probe_read_kernel, bpf_probe_read_kernel_str_bytes,
    },
    macros::{btf_tracepoint, map},
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::BtfTracePointContext,
};
use probes_common::{
    fsync::{FileEvent, FileOffsets, FsyncKey, FsyncStart, FsyncVal},
    stats,
};
use probes_ebpf::{
    allowed, atomic_add, begin_kept, btf_load_u64, generation, generation_since, hist_record, ro,
    slot, stat, take_kept,
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
/// The family's syscall numbers for the raw-tracepoint programs (`u32::MAX`: unused slot).
#[no_mangle]
static FS_NRS: [u32; 6] = [u32::MAX; 6];
/// Offsets in `struct pt_regs` of the first syscall argument and of the syscall number kept for
/// the exit path (`di` and `orig_ax` on x86_64), from the kernel's BTF.
#[no_mangle]
static FS_REGS_ARG0_OFF: u32 = 112;
#[no_mangle]
static FS_REGS_NR_OFF: u32 = 120;
#[no_mangle]
static FS_BY_FILE: u8 = 0;
/// Offsets followed from the task to the file behind an fd (`--by-file`), from the kernel's BTF.
#[no_mangle]
static FS_FILE_OFFS: FileOffsets = FileOffsets {
    task_files: 0,
    files_fdt: 0,
    fdt_max_fds: 0,
    fdt_fd: 0,
    file_inode: 0,
    inode_ino: 0,
    inode_sb: 0,
    sb_dev: 0,
    inode_generation: 0,
    file_dentry: 0,
    dentry_name: 0,
    _pad: 0,
};

/// In-flight calls by tid. Sized by userspace from pid_max. An entry stays after its call
/// (`ts_ns` 0) for the thread's next call, which writes it in place (`begin_kept`); userspace
/// removes exited threads' entries every window.
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
fn key_for(tgid: u32, tid: u32, nr: u32, f: FileId) -> FsyncKey {
    FsyncKey {
        id: if ro(&FS_PER_THREAD) != 0 { tid } else { tgid },
        nr,
        dev: f.dev,
        gen: generation(),
        ino: f.ino,
        igen: f.igen,
        _pad: 0,
    }
}

/// A file as the kernel knows it: device, inode number, inode generation, and where its
/// `struct file` is (to read its name when the key is announced).
#[derive(Clone, Copy, Default)]
struct FileId {
    dev: u32,
    igen: u32,
    ino: u64,
    file: u64,
}

/// Reads a kernel pointer-sized or smaller value at `base + off`; 0 when unreadable.
#[inline(always)]
fn read<T: Copy + Default>(base: u64, off: u32) -> T {
    if base == 0 {
        return T::default();
    }
    // SAFETY: the helper validates the address; a failed read yields the default.
    unsafe { bpf_probe_read_kernel((base + off as u64) as *const T) }.unwrap_or_default()
}

/// The file open as `fd` in the current task (all zero when none): `current->files->fdt->
/// fd[fd]->f_inode->{i_sb->s_dev, i_ino, i_generation}`, every pointer read with the helper (the
/// file table is RCU-protected; a stale read names a file that was open an instant ago, never a
/// fault).
#[inline(always)]
fn file_id(fd: i32) -> FileId {
    if fd < 0 {
        return FileId::default();
    }
    let o = ro(&FS_FILE_OFFS);
    // SAFETY: plain helper call returning the current task's address.
    let task = unsafe { bpf_get_current_task() };
    let files: u64 = read(task, o.task_files);
    let fdt: u64 = read(files, o.files_fdt);
    let max: u32 = read(fdt, o.fdt_max_fds);
    if fd as u32 >= max {
        return FileId::default();
    }
    let fds: u64 = read(fdt, o.fdt_fd);
    let file: u64 = read(fds, fd as u32 * 8);
    let inode: u64 = read(file, o.file_inode);
    let ino: u64 = read(inode, o.inode_ino);
    let sb: u64 = read(inode, o.inode_sb);
    FileId {
        dev: read(sb, o.sb_dev),
        igen: read(inode, o.inode_generation),
        ino,
        file,
    }
}

#[inline(always)]
fn in_family(nr: i64) -> bool {
    if !(0..=u32::MAX as i64).contains(&nr) {
        return false;
    }
    let nr = nr as u32;
    let nrs = ro(&FS_NRS);
    nr == nrs[0] || nr == nrs[1] || nr == nrs[2] || nr == nrs[3] || nr == nrs[4] || nr == nrs[5]
}

/// A sync-family call begins in the current thread: remember when. `arg0` yields the first
/// syscall argument (read only for the calls whose first argument is an fd).
#[inline(always)]
fn on_enter(nr: u32, arg0: impl FnOnce() -> u64) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    if !allowed(tgid) {
        return;
    }
    // The fd only names the file (`--by-file`): without it the argument is not read.
    let fd = if ro(&FS_BY_FILE) == 0 || nr == ro(&FS_NR_MSYNC) || nr == ro(&FS_NR_SYNC) {
        -1
    } else {
        arg0() as i32
    };
    let file = if ro(&FS_BY_FILE) != 0 {
        file_id(fd)
    } else {
        FileId::default()
    };
    if ro(&FS_BY_FILE) != 0 && file.ino != 0 {
        let key = key_for(tgid, tid, nr, file);
        if FSYNC_HIST.get_ptr(key).is_none() {
            // Built in place: the event is larger than is wise for the 512-byte BPF stack.
            match FSYNC_FILES.reserve::<FileEvent>(0) {
                Some(mut slot) => {
                    let o = ro(&FS_FILE_OFFS);
                    let dentry: u64 = read(file.file, o.file_dentry);
                    let name: u64 = read(dentry, o.dentry_name);
                    // SAFETY: writing the fields of a reserved ring-buffer slot we own.
                    unsafe {
                        let ev = slot.as_mut_ptr();
                        (*ev).tgid = tgid;
                        (*ev).tid = tid;
                        (*ev).fd = fd;
                        (*ev).id = key.id;
                        (*ev).dev = file.dev;
                        (*ev).igen = file.igen;
                        (*ev).ino = file.ino;
                        (*ev).name = [0; probes_common::fsync::NAME_LEN];
                        if name != 0 {
                            let _ =
                                bpf_probe_read_kernel_str_bytes(name as *const u8, &mut (*ev).name);
                        }
                    }
                    slot.submit(0);
                }
                None => stat(stats::RINGBUF_FULL),
            }
        }
    }
    let start = FsyncStart {
        // SAFETY: plain helper call.
        ts_ns: unsafe { bpf_ktime_get_ns() },
        nr,
        fd,
        dev: file.dev,
        igen: file.igen,
        ino: file.ino,
    };
    begin_kept(&FSYNC_START, &tid, &start);
}

probes_ebpf::passing! {
    pub fn tk_fsync_enter_tp(ctx: TracePointContext) -> u32 {
        // SAFETY: offsets come from the event's format file; read_at bounds-checks via the helper.
        let nr = match unsafe { ctx.read_at::<i32>(ro(&FS_NR_OFF) as usize) } {
            Ok(nr) => nr as u32,
            Err(_) => return 0,
        };
        on_enter(nr, || {
            // SAFETY: as above.
            unsafe { ctx.read_at::<u64>(ro(&FS_ARG0_OFF) as usize) }.unwrap_or(u64::MAX)
        });
        0
    }
}

/// `sys_enter(struct pt_regs *regs, long id)`: every syscall passes here; all but the family
/// return after the comparison.
#[btf_tracepoint(function = "sys_enter")]
pub fn tk_fsync_enter(ctx: BtfTracePointContext) -> i32 {
    let id: i64 = ctx.arg(1);
    if !in_family(id) {
        return 0;
    }
    let regs: *const u8 = ctx.arg(0);
    // SAFETY: `regs` is the tracepoint's BTF-typed `struct pt_regs *`, the offset is a member
    // offset from the kernel's BTF.
    on_enter(id as u32, || unsafe {
        btf_load_u64(regs, ro(&FS_REGS_ARG0_OFF))
    });
    0
}

/// A call of the family returns `ret` in the current thread: record its latency.
#[inline(always)]
fn on_exit(ret: i64) {
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    // None: filtered out at enter, or the call began before we attached.
    let Some(start) = take_kept(&FSYNC_START, &tid, |s| s.ts_ns != 0, |s| s.ts_ns = 0) else {
        return;
    };
    let delta = now.saturating_sub(start.ts_ns);
    stat(stats::EVENTS);

    let key = key_for(
        tgid,
        tid,
        start.nr,
        FileId {
            dev: start.dev,
            igen: start.igen,
            ino: start.ino,
            file: 0,
        },
    );
    let Some(val) = slot(&FSYNC_HIST, &FSYNC_OTHER, &FSYNC_SCRATCH, &key, key.gen, |init| {
        // SAFETY: this CPU's scratch slot; only comm and tgid are ever written, so its histogram
        // stays zero.
        unsafe {
            (*init).comm = bpf_get_current_comm().unwrap_or_default();
            (*init).tgid = tgid;
        }
    }) else {
        return;
    };
    let val = val.ptr;
    // SAFETY: `val` is a live map value pointer.
    unsafe {
        if ret < 0 {
            atomic_add(&raw mut (*val).errors, 1);
        }
        let inside = now.saturating_sub(start.ts_ns.max(generation_since()));
        atomic_add(&raw mut (*val).in_window_ns, inside);
        hist_record(&raw mut (*val).hist, delta);
    }
}

probes_ebpf::passing! {
    pub fn tk_fsync_exit_tp(ctx: TracePointContext) -> u32 {
        // SAFETY: offset from the exit event's format file.
        let ret = unsafe { ctx.read_at::<i64>(ro(&FS_RET_OFF) as usize) }.unwrap_or(0);
        on_exit(ret);
        0
    }
}

/// `sys_exit(struct pt_regs *regs, long ret)`: the syscall number is the one kept in `regs` for
/// the exit path; all but the family return after the comparison, before any map lookup.
#[btf_tracepoint(function = "sys_exit")]
pub fn tk_fsync_exit(ctx: BtfTracePointContext) -> i32 {
    let regs: *const u8 = ctx.arg(0);
    // SAFETY: as in tk_fsync_enter.
    let nr = unsafe { btf_load_u64(regs, ro(&FS_REGS_NR_OFF)) } as i64;
    if !in_family(nr) {
        return 0;
    }
    on_exit(ctx.arg(1));
    0
}
