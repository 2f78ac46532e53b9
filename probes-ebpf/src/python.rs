//! CPython frames for `profile` (on-CPU and `--off-cpu`): the walk both objects share. Each
//! object declares its own `PY_PROCS` (what userspace found per Python process), `PY_STACKS`
//! (the stacks, by id), a per-CPU scratch stack and `PY_STATS`, and calls [`python_stack`] for
//! the current task.
//!
//! Reads are `bpf_probe_read_user` of the interpreter's own structures at offsets userspace
//! chose for the process's version (`probes_common::python::PyProc`): the thread list of the
//! main interpreter, the thread state's current frame, then each frame's code object,
//! instruction and link. A thread state of another thread, or memory that changes while it is
//! read (the interpreter runs on other CPUs), gives a wrong or short stack, never a fault:
//! every read is checked by the helper and every loop is bounded.

use aya_ebpf::{
    helpers::{bpf_get_current_task, bpf_probe_read_kernel, generated as gen},
    maps::{HashMap, PerCpuArray},
};
use probes_common::python::{
    PyFrame, PyProc, PyStack, PY_ENTRY, PY_MAX_FRAMES, PY_MAX_THREADS, PY_NONE, PY_STAT_MAP_FULL, PY_STAT_NO_FRAME, PY_STAT_NO_THREAD, PY_STAT_STACKS,
    PY_STAT_TRUNCATED, PY_TID_FSBASE,
};

/// `BPF_NOEXIST`: a stack already stored under its id is not written again.
const BPF_NOEXIST: u64 = 1;
const EEXIST: i32 = 17;

/// The `T` at user address `addr`, zeros when unreadable (the helper zero-fills its
/// destination on a fault). No branch on the outcome: a branch per read in the frame loop
/// doubled the verifier's states each frame.
#[inline(always)]
fn user<T: Copy + Default>(addr: u64) -> T {
    let mut v = T::default();
    // SAFETY: `v` is a local of size_of::<T>(); the helper checks the user address.
    unsafe {
        gen::bpf_probe_read_user(
            (&raw mut v).cast(),
            core::mem::size_of::<T>() as u32,
            addr as *const _,
        )
    };
    v
}

/// 1 when `x` is not 0, else 0, without a branch (BPF has no set-on-condition instruction,
/// so `x != 0` as a value compiles to one).
#[inline(always)]
fn nonzero(x: u64) -> u64 {
    (x | x.wrapping_neg()) >> 63
}

#[inline(always)]
fn bump(stats: &PerCpuArray<u64>, idx: u32) {
    if let Some(p) = stats.get_ptr_mut(idx) {
        // SAFETY: this CPU's slot (see `probes_ebpf::stat`).
        unsafe { *p += 1 };
    }
}

/// The id under which the current thread's Python stack is stored in `stacks` (0: the
/// process is not known as Python, or no stack was found or stored).
#[inline(always)]
pub fn python_stack(
    tgid: u32,
    tid: u32,
    procs: &HashMap<u32, PyProc>,
    stacks: &HashMap<u32, PyStack>,
    scratch: &PerCpuArray<PyStack>,
    stats: &PerCpuArray<u64>,
) -> u32 {
    // SAFETY: copied out of the map at once.
    let Some(p) = (unsafe { procs.get(tgid) }).copied() else {
        return 0;
    };
    let Some(out) = scratch.get_ptr_mut(0) else {
        return 0;
    };
    let want = if p.tid_kind == PY_TID_FSBASE {
        // SAFETY: the current task; the helper checks the kernel address (`thread.fsbase`
        // from BTF).
        unsafe {
            let task = bpf_get_current_task() as *const u8;
            bpf_probe_read_kernel(task.add(p.fsbase_off as usize) as *const u64).unwrap_or(0)
        }
    } else {
        tid as u64
    };
    let mut t: u64 = user(p.threads_head);
    let mut found = 0u64;
    for _ in 0..PY_MAX_THREADS {
        if t == 0 {
            break;
        }
        if user::<u64>(t + p.tstate_tid as u64) == want {
            found = t;
            break;
        }
        t = user(t + p.tstate_next as u64);
    }
    if found == 0 {
        bump(stats, PY_STAT_NO_THREAD);
        return 0;
    }
    let mut f: u64 = user(found + p.tstate_frame as u64);
    if p.cframe_frame != PY_NONE {
        f = user(f + p.cframe_frame as u64);
    }
    // SAFETY: this CPU's scratch slot, used only here and not re-entered on this CPU.
    let out = unsafe { &mut *out };
    // One slot per frame visited, the loop's own index: a counter that moved apart from it
    // (skipping shims) made every iteration a new verifier state, past the 1M-instruction
    // budget on 6.18.
    let mut n = 0usize;
    let mut h: u32 = 0x811c_9dc5;
    for i in 0..PY_MAX_FRAMES {
        if f == 0 {
            break;
        }
        let prev: u64 = user(f + p.frame_previous as u64);
        // Branch-free per version (see `PyProc`): a 3.12+ entry shim becomes a code-0 frame
        // (the frame before it, inner, is that evaluator call's first); 3.11 marks its first
        // frame with `is_entry`.
        let shim = 1 - nonzero(user::<u8>(f + p.frame_owner as u64) as u64 ^ p.owner_shim as u64);
        let entry = nonzero((user::<u8>(f + p.frame_is_entry as u64) as u32 & p.entry_mask) as u64);
        let code: u64 = user(f + p.frame_code as u64);
        let instr: u64 = user(f + p.frame_instr as u64);
        let frame = PyFrame {
            code: code * (1 - shim),
            instr: (instr & !PY_ENTRY) | ((shim | entry) << 63),
        };
        if let Some(slot) = out.frames.get_mut(i) {
            *slot = frame;
        }
        h = (h ^ frame.code as u32 ^ (frame.code >> 32) as u32).wrapping_mul(0x0100_0193);
        h = (h ^ frame.instr as u32 ^ (frame.instr >> 32) as u32).wrapping_mul(0x0100_0193);
        n = i + 1;
        f = prev;
    }
    let truncated = u32::from(f != 0);
    if n == 0 {
        bump(stats, PY_STAT_NO_FRAME);
        return 0;
    }
    if truncated != 0 {
        bump(stats, PY_STAT_TRUNCATED);
    }
    out.len = n as u32;
    out.truncated = truncated;
    let id = if h == 0 { 1 } else { h };
    match stacks.insert(id, out, BPF_NOEXIST) {
        Ok(()) => {}
        Err(e) if e == -EEXIST => {}
        Err(_) => {
            bump(stats, PY_STAT_MAP_FULL);
            return 0;
        }
    }
    bump(stats, PY_STAT_STACKS);
    id
}
