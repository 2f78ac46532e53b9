//! `profile` kernel program: CPU-clock sampling with kernel and user stacks.
//!
//! `tk_profile` runs on a `perf_event` (`PERF_COUNT_SW_CPU_CLOCK`, one event per online CPU at
//! `--freq` Hz; the software clock exists in virtual machines that lack a hardware PMU). Each
//! sample takes the interrupted task's kernel and user stacks with `bpf_get_stackid` (frame
//! pointers; the stacks live in `PROFILE_STACKS`, deduplicated by hash) and counts one in
//! `PROFILE_COUNTS` under (tgid, tid, user stack id, kernel stack id), so userspace reads one
//! row per distinct stack pair instead of one record per sample.
//!
//! What could not be recorded is counted: a stack whose bucket held another stack (EEXIST,
//! `STAT_STACK_COLLIDED`; the sample still counts, without that stack), a user stack that failed
//! otherwise (`STAT_USTACK_FAILED`), a key that did not fit (`KEY_MAP_FULL`, the sample goes to
//! `[other]`). Idle samples (pid 0) are only counted (`STAT_IDLE`), for the share of all CPU.
//!
//! DWARF mode (`tk_profile_dwarf`, for code without frame pointers): instead of a user stack
//! id, each sample streams a [`DwarfSample`] through `PROFILE_SAMPLES` — the task's saved user
//! registers (`bpf_task_pt_regs`, so samples that hit the kernel unwind from the user side too)
//! and up to [`DWARF_STACK`] bytes of user stack above `sp` — and userspace unwinds it with the
//! binaries' CFI and counts it. A full ring buffer is counted (`RINGBUF_FULL`).
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::BPF_F_USER_STACK,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_probe_read_kernel,
        generated::{bpf_get_current_task_btf, bpf_probe_read_user, bpf_task_pt_regs},
    },
    macros::{map, perf_event},
    maps::{Array, HashMap, PerCpuArray, RingBuf, StackTrace},
    programs::{tracing::StackIdContext, PerfEventContext},
};
use probes_common::{
    profile::{
        DwarfSample, ProfileKey, ProfileVal, DWARF_STACK, NO_STACK, STAT_IDLE,
        STAT_STACK_COLLIDED, STAT_USTACK_FAILED,
    },
    stats,
};
use probes_common::python::{PyProc, PyStack, PY_NSTATS};
use probes_ebpf::{allowed, atomic_add, generation, python::python_stack, slot, stat};

/// Stacks by id (frame addresses, innermost first). Sized by userspace.
#[map]
static PROFILE_STACKS: StackTrace = StackTrace::with_max_entries(16384, 0);

/// Samples per (process, thread, user stack, kernel stack, generation). Sized by userspace.
/// Preallocated: a perf_event program runs in NMI context, where allocating is unsafe, and
/// before Linux 6.1 (commit 96da3f7d489d, "bpf: Remove tracing program restriction on map
/// types") the verifier refuses such a program a `BPF_F_NO_PREALLOC` hash ("perf_event programs
/// can only use preallocated hash map", EINVAL).
#[map]
static PROFILE_COUNTS: HashMap<ProfileKey, ProfileVal> = HashMap::with_max_entries(16384, 0);

/// Samples whose key did not fit, one row per generation.
#[map]
static PROFILE_OTHER: Array<ProfileVal> = Array::with_max_entries(2, 0);

/// Initial value for new keys (comm filled in, count zero).
#[map]
static PROFILE_SCRATCH: PerCpuArray<ProfileVal> = PerCpuArray::with_max_entries(1, 0);

/// Samples with user registers and stack for userspace unwinding (DWARF mode). Sized by
/// userspace.
#[map]
static PROFILE_SAMPLES: RingBuf = RingBuf::with_byte_size(4 << 20, 0);

/// Python processes in scope, by tgid (filled by userspace; see `probes_ebpf::python`).
#[map]
static PY_PROCS: HashMap<u32, PyProc> = HashMap::with_max_entries(1024, 0);

/// Python stacks by id. Preallocated, as `PROFILE_COUNTS`. Sized by userspace.
#[map]
static PY_STACKS: HashMap<u32, PyStack> = HashMap::with_max_entries(4096, 0);

#[map]
static PY_SCRATCH: PerCpuArray<PyStack> = PerCpuArray::with_max_entries(1, 0);

/// Python walk counters (`probes_common::python::PY_STAT_*`).
#[map]
static PY_STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(PY_NSTATS, 0);

const EEXIST: i32 = 17;
/// `BPF_RB_NO_WAKEUP`: userspace polls the ring buffer.
const BPF_RB_NO_WAKEUP: u64 = 1;

/// Offsets in x86_64 `struct pt_regs` (the ptrace ABI layout: stable).
const REGS_BP: usize = 32;
const REGS_IP: usize = 128;
const REGS_SP: usize = 152;

/// Copies the user stack above `sp` into `dst`: all of it when mapped, else what remains of
/// the page of `sp` and the next one, else of its page (the top of a thread's stack). Returns
/// the bytes copied.
#[inline(always)]
fn copy_stack(dst: *mut u8, sp: u64) -> u32 {
    let to_page_end = 4096 - (sp & 0xfff) as u32;
    let read = |n: u32| {
        // SAFETY: `dst` has DWARF_STACK bytes and n ≤ DWARF_STACK; the helper faults safely.
        unsafe { bpf_probe_read_user(dst.cast(), n.min(DWARF_STACK as u32), sp as *const _) == 0 }
    };
    if read(DWARF_STACK as u32) {
        return DWARF_STACK as u32;
    }
    if read(to_page_end + 4096) {
        return to_page_end + 4096;
    }
    if read(to_page_end) {
        return to_page_end;
    }
    0
}

/// Streams one DWARF-mode sample; a full ring buffer is counted.
#[inline(always)]
fn stream(tgid: u32, pid: u32, kernel_stack: i32, py_stack: u32) {
    let Some(mut e) = PROFILE_SAMPLES.reserve::<DwarfSample>(0) else {
        stat(stats::RINGBUF_FULL);
        return;
    };
    let s = e.as_mut_ptr();
    // SAFETY: the current task (trusted BTF pointer); its saved user registers are read with
    // probe_read at the fixed pt_regs offsets; `s` is the reserved record.
    unsafe {
        let regs = bpf_task_pt_regs(bpf_get_current_task_btf()) as *const u8;
        let reg = |off: usize| bpf_probe_read_kernel(regs.add(off) as *const u64).unwrap_or(0);
        (*s).tgid = tgid;
        (*s).pid = pid;
        (*s).kernel_stack = kernel_stack;
        (*s).py_stack = py_stack;
        (*s)._pad = 0;
        (*s).ip = reg(REGS_IP);
        (*s).sp = reg(REGS_SP);
        (*s).bp = reg(REGS_BP);
        (*s).comm = bpf_get_current_comm().unwrap_or([0; 16]);
        (*s).len = if (*s).sp == 0 {
            0
        } else {
            copy_stack((&raw mut (*s).stack).cast(), (*s).sp)
        };
    }
    e.submit(BPF_RB_NO_WAKEUP);
}

/// The id of the current stack of one kind, or [`NO_STACK`]; a collision is counted.
#[inline(always)]
fn stack_id(ctx: &PerfEventContext, flags: u64) -> (i32, i32) {
    match ctx.get_stackid(&PROFILE_STACKS, flags) {
        Ok(id) => (id as i32, 0),
        Err(e) => {
            if e == -EEXIST {
                stat(STAT_STACK_COLLIDED);
            }
            (NO_STACK, e)
        }
    }
}

/// Frame-pointer mode: stack ids, counted here. Uses no helper newer than 5.10.
#[perf_event]
pub fn tk_profile(ctx: PerfEventContext) -> u32 {
    sample(&ctx, false)
}

/// DWARF mode: each sample's user registers and stack streamed for unwinding in userspace.
/// A program of its own because `bpf_task_pt_regs` needs Linux 5.15: on older kernels only this
/// one fails to load, and frame-pointer mode still runs.
#[perf_event]
pub fn tk_profile_dwarf(ctx: PerfEventContext) -> u32 {
    sample(&ctx, true)
}

#[inline(always)]
fn sample(ctx: &PerfEventContext, dwarf: bool) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tgid, pid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    if pid == 0 {
        stat(STAT_IDLE);
        return 0;
    }
    if !allowed(tgid) {
        return 0;
    }
    stat(stats::EVENTS);
    let (kernel_stack, _) = stack_id(ctx, 0);
    let py_stack = python_stack(tgid, pid, &PY_PROCS, &PY_STACKS, &PY_SCRATCH, &PY_STATS);
    if dwarf {
        stream(tgid, pid, kernel_stack, py_stack);
        return 0;
    }
    let (user_stack, uerr) = stack_id(ctx, BPF_F_USER_STACK as u64);
    // EFAULT: no user stack (kernel threads); EEXIST is counted above.
    if uerr != 0 && uerr != -EEXIST && uerr != -14 {
        stat(STAT_USTACK_FAILED);
    }
    let gen = generation();
    let key = ProfileKey {
        tgid,
        pid,
        user_stack,
        kernel_stack,
        gen,
        py_stack,
    };
    let init = |v: *mut ProfileVal| {
        // SAFETY: this CPU's scratch slot (see `slot`).
        unsafe { (*v).comm = bpf_get_current_comm().unwrap_or([0; 16]) };
    };
    if let Some(s) = slot(
        &PROFILE_COUNTS,
        &PROFILE_OTHER,
        &PROFILE_SCRATCH,
        &key,
        gen,
        init,
    ) {
        // SAFETY: a live map value from this run.
        unsafe { atomic_add(&raw mut (*s.ptr).samples, 1) };
    }
    0
}
