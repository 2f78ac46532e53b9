//! Reading kernel struct members at offsets computed in userspace from the kernel's BTF (Rust
//! BPF code has no CO-RE, so offsets arrive as read-only globals, never hard-coded).
//!
//! Two readers with one interface, so a tool's logic is written once and instantiated per
//! attach mode:
//! - [`Direct`]: plain loads, for BTF-typed pointers (tp_btf arguments and pointers loaded from
//!   them). The offsets come from frozen read-only data, so the verifier sees constants, checks
//!   each load against the struct layout, and turns a faulting load (a NULL pointer on the way)
//!   into a zero. No helper call.
//! - [`Probe`]: `bpf_probe_read_kernel`, for untyped pointers (raw_tp arguments, pointers read
//!   from a classic tracepoint record). A failed read yields 0.
//!
//! Pointers travel as `u64`: a 0 means "absent", and every reader returns 0 for it, so a chain
//! of loads (`rq->q->disk->major`) needs no check in the middle.

use aya_ebpf::helpers::bpf_probe_read_kernel;

pub trait Kread {
    /// The `T` at `base + off`: 0 for a 0 `base` (or, for [`Probe`], a failed read).
    fn read<T: Copy + Default>(base: u64, off: u32) -> T;

    #[inline(always)]
    fn u64(base: u64, off: u32) -> u64 {
        Self::read(base, off)
    }
    #[inline(always)]
    fn u32(base: u64, off: u32) -> u32 {
        Self::read(base, off)
    }
    #[inline(always)]
    fn u16(base: u64, off: u32) -> u16 {
        Self::read(base, off)
    }
    #[inline(always)]
    fn u8(base: u64, off: u32) -> u8 {
        Self::read(base, off)
    }
}

pub struct Direct;
pub struct Probe;

impl Kread for Direct {
    #[inline(always)]
    fn read<T: Copy + Default>(base: u64, off: u32) -> T {
        if base == 0 {
            return T::default();
        }
        // SAFETY: `base` is a BTF-typed kernel pointer (tp_btf argument or loaded from one) and
        // `off` a member offset from the kernel's own BTF; the verifier checks the access
        // against the type and makes a faulting load read 0.
        unsafe { core::ptr::read_volatile((base as *const u8).add(off as usize) as *const T) }
    }
}

impl Kread for Probe {
    #[inline(always)]
    fn read<T: Copy + Default>(base: u64, off: u32) -> T {
        if base == 0 {
            return T::default();
        }
        // SAFETY: the helper checks the address; a failed read yields 0.
        unsafe { bpf_probe_read_kernel((base as *const u8).add(off as usize) as *const T) }
            .unwrap_or_default()
    }
}

/// Reads `T` from any kernel address (packet bytes, addresses computed from offsets), 0-filled
/// on failure.
#[inline(always)]
pub fn probe<T: Copy + Default>(addr: u64) -> T {
    if addr == 0 {
        return T::default();
    }
    // SAFETY: the helper checks the address.
    unsafe { bpf_probe_read_kernel(addr as *const T) }.unwrap_or_default()
}
