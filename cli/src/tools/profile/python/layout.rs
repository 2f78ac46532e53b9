//! Where CPython keeps what the kernel walks, per minor version: the offsets of the runtime,
//! interpreter, thread state and frame fields (`probes_common::python::PyProc`), and 3.13's own
//! published layout (`_Py_DebugOffsets`), which wins over the table where found.

use probes_common::python::{
    PyProc, PY_NONE, PY_NO_SHIM, PY_OWNED_BY_CSTACK, PY_TID_FSBASE, PY_TID_NATIVE,
};

use super::code::Mem;

/// The offsets of one minor version that the kernel and the setup need.
pub struct Layout {
    pub runtime_interpreters_head: u64,
    pub interp_threads_head: u64,
    pub proc: PyProc,
}

/// Offsets measured with `offsetof()` against each version's headers (x86_64, release builds;
/// CPython keeps them within a minor version). Field by field, see `PyProc`.
pub fn layout(minor: u8) -> Option<Layout> {
    let base = PyProc {
        tstate_next: 8,
        cframe_frame: PY_NONE,
        owner_shim: PY_NO_SHIM,
        tid_kind: PY_TID_NATIVE,
        ..PyProc::default()
    };
    let (rih, ith, proc) = match minor {
        10 => (
            32,
            8,
            PyProc {
                tstate_tid: 176,
                tid_kind: PY_TID_FSBASE,
                tstate_frame: 24,
                frame_previous: 24,
                frame_code: 32,
                frame_instr: 96,
                ..base
            },
        ),
        11 => (
            40,
            16,
            PyProc {
                tstate_tid: 160,
                tstate_frame: 56,
                cframe_frame: 8,
                frame_previous: 48,
                frame_code: 32,
                frame_instr: 56,
                frame_is_entry: 68,
                entry_mask: 0xff,
                ..base
            },
        ),
        12 => (
            40,
            72,
            PyProc {
                tstate_tid: 144,
                tstate_frame: 56,
                cframe_frame: 0,
                frame_previous: 8,
                frame_code: 0,
                frame_instr: 56,
                frame_owner: 70,
                owner_shim: PY_OWNED_BY_CSTACK as u32,
                ..base
            },
        ),
        13 => (
            632,
            7344,
            PyProc {
                tstate_tid: 160,
                tstate_frame: 72,
                frame_previous: 8,
                frame_code: 0,
                frame_instr: 56,
                frame_owner: 70,
                owner_shim: PY_OWNED_BY_CSTACK as u32,
                ..base
            },
        ),
        _ => return None,
    };
    Some(Layout {
        runtime_interpreters_head: rih,
        interp_threads_head: ith,
        proc,
    })
}

/// 3.13+: `_Py_DebugOffsets` at the start of `_PyRuntime` (cookie `xdebugpy`): the offsets
/// that the 3.13 headers place at these positions in it override the table's.
pub fn apply_debug_offsets(mem: &dyn Mem, runtime: u64, l: &mut Layout) {
    let mut b = [0u8; 272];
    if mem.read(runtime, &mut b).is_err() || &b[..8] != b"xdebugpy" {
        return;
    }
    let at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or_default());
    let small = |v: u64| u32::try_from(v).ok().filter(|&v| v < 65536);
    l.runtime_interpreters_head = at(40);
    l.interp_threads_head = at(72);
    let p = &mut l.proc;
    for (field, o) in [
        (&mut p.tstate_next, 168),
        (&mut p.tstate_frame, 184),
        (&mut p.tstate_tid, 200),
        (&mut p.frame_previous, 232),
        (&mut p.frame_code, 240),
        (&mut p.frame_instr, 248),
        (&mut p.frame_owner, 264),
    ] {
        if let Some(v) = small(at(o)) {
            *field = v;
        }
    }
}
