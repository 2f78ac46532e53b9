//! `profile`'s CPython frames: what userspace tells the kernel about each Python process
//! ([`PyProc`], by tgid) and the Python stacks the kernel walks from it ([`PyStack`]).
//!
//! The kernel finds the sampled thread's `PyThreadState` in the interpreter's list of threads
//! (matching its thread id, so neither the GIL holder nor the interpreter's cooperation is
//! needed), follows its current frame through the `previous`/`f_back` links and records each
//! frame's code object address and instruction. Userspace decodes code objects and line tables
//! (`cli/src/tools/profile/python/`). Offsets differ per minor version and come from userspace.

/// An offset that does not exist in this version (`cframe_frame`).
pub const PY_NONE: u32 = u32::MAX;
/// `PyProc::owner_shim` where no frame is a shim: no byte equals it.
pub const PY_NO_SHIM: u32 = 0x100;

/// Python frames recorded per stack at most, innermost first (deeper ones are counted as
/// truncated).
pub const PY_MAX_FRAMES: usize = 64;
/// Threads of one interpreter searched for the sampled thread at most.
pub const PY_MAX_THREADS: u32 = 64;

/// `PyProc::tid_kind`: the thread state's id field holds the kernel thread id
/// (`native_thread_id`, 3.11+).
pub const PY_TID_NATIVE: u32 = 0;
/// `PyProc::tid_kind`: the field holds `pthread_self()` (3.10's `thread_id`), which on x86_64
/// glibc is the thread's TLS base, the task's `thread.fsbase`.
pub const PY_TID_FSBASE: u32 = 1;

/// Bit 63 of [`PyFrame::instr`]: the frame was entered from C, the first frame of its
/// `_PyEval_EvalFrameDefault` call (3.11's `is_entry`; 3.12+: the next outer frame is a shim
/// owned by the C stack). User addresses never set it.
pub const PY_ENTRY: u64 = 1 << 63;
/// 3.12+ `_PyInterpreterFrame.owner` of the shim frame an entry into the evaluator pushes
/// (`FRAME_OWNED_BY_CSTACK`).
pub const PY_OWNED_BY_CSTACK: u8 = 3;

/// Slots of the per-CPU `PY_STATS` array of the profile objects: Python stacks recorded.
pub const PY_STAT_STACKS: u32 = 0;
/// A Python stack deeper than [`PY_MAX_FRAMES`] (its outer frames are lost).
pub const PY_STAT_TRUNCATED: u32 = 1;
/// A Python stack that did not fit `PY_STACKS` (the sample keeps its native stacks).
pub const PY_STAT_MAP_FULL: u32 = 2;
/// A thread of a Python process whose thread state was not found (a thread the interpreter
/// does not know, or one past [`PY_MAX_THREADS`]).
pub const PY_STAT_NO_THREAD: u32 = 3;
/// A thread state found with no Python frame running (a thread in C, or between calls).
pub const PY_STAT_NO_FRAME: u32 = 4;
pub const PY_NSTATS: u32 = 5;

/// One Python process, by tgid, in `PY_PROCS`. Offsets in bytes; [`PY_NONE`] where the version
/// has no such field.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyProc {
    /// The address of the main interpreter's `threads.head` (3.10: `tstate_head`).
    pub threads_head: u64,
    /// `PyThreadState.next`.
    pub tstate_next: u32,
    /// The thread state's id field ([`PY_TID_NATIVE`] or [`PY_TID_FSBASE`]).
    pub tstate_tid: u32,
    pub tid_kind: u32,
    /// `PyThreadState` → frame: 3.10 `frame`, 3.11/3.12 `cframe`, 3.13 `current_frame`.
    pub tstate_frame: u32,
    /// 3.11/3.12: `_PyCFrame.current_frame` (else [`PY_NONE`]).
    pub cframe_frame: u32,
    /// 3.10 `PyFrameObject.f_back`, 3.11+ `_PyInterpreterFrame.previous`.
    pub frame_previous: u32,
    /// 3.10/3.11/3.12 `f_code`, 3.13 `f_executable`.
    pub frame_code: u32,
    /// 3.10 `f_lasti` (an int: the kernel reads 8 bytes, userspace keeps the low 4),
    /// 3.11/3.12 `prev_instr`, 3.13 `instr_ptr`.
    pub frame_instr: u32,
    /// 3.12+ `owner`; the kernel reads a byte there on every version (0 where there is none)
    /// and compares it with `owner_shim`.
    pub frame_owner: u32,
    /// [`PY_OWNED_BY_CSTACK`] (3.12+), or 0x100, which no byte equals.
    pub owner_shim: u32,
    /// 3.11 `is_entry`, read as a byte on every version (0 where there is none) and masked
    /// with `entry_mask` (0xff on 3.11, else 0).
    pub frame_is_entry: u32,
    pub entry_mask: u32,
    /// `task_struct.thread.fsbase` from the kernel's BTF, for [`PY_TID_FSBASE`].
    pub fsbase_off: u32,
    pub _pad: u32,
}

/// One Python frame: its code object and raw instruction (see [`PyProc::frame_instr`]), with
/// [`PY_ENTRY`] in `instr` for the first frame of an evaluator call (3.11). `code` 0: the shim
/// frame 3.12+ pushes where C enters the evaluator (the frame before it is that call's first).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PyFrame {
    pub code: u64,
    pub instr: u64,
}

/// A Python stack in `PY_STACKS`, by its id (a hash of its frames, never 0).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PyStack {
    pub len: u32,
    /// 1: deeper than [`PY_MAX_FRAMES`].
    pub truncated: u32,
    /// Innermost first; `len` of them are set.
    pub frames: [PyFrame; PY_MAX_FRAMES],
}

crate::impl_pod!(PyProc, PyFrame, PyStack);

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(size_of::<PyProc>(), 8 + 14 * 4);
        assert_eq!(size_of::<PyFrame>(), 16);
        assert_eq!(size_of::<PyStack>(), 8 + 16 * PY_MAX_FRAMES);
    }
}
