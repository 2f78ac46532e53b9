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
    fn u64(base: u64, off: u32) -> u64;
    fn u32(base: u64, off: u32) -> u32;
    fn u16(base: u64, off: u32) -> u16;
    fn u8(base: u64, off: u32) -> u8;
}

pub struct Direct;
pub struct Probe;

impl Kread for Direct {
    #[inline(always)]
    fn u64(base: u64, off: u32) -> u64 {
        if base == 0 {
            return 0;
        }
        // SAFETY: `base` is a BTF-typed kernel pointer (tp_btf argument or loaded from one) and
        // `off` a member offset from the kernel's own BTF; the verifier checks the access
        // against the type and makes a faulting load read 0.
        unsafe { core::ptr::read_volatile((base as *const u8).add(off as usize) as *const u64) }
    }
    #[inline(always)]
    fn u32(base: u64, off: u32) -> u32 {
        if base == 0 {
            return 0;
        }
        // SAFETY: as above.
        unsafe { core::ptr::read_volatile((base as *const u8).add(off as usize) as *const u32) }
    }
    #[inline(always)]
    fn u16(base: u64, off: u32) -> u16 {
        if base == 0 {
            return 0;
        }
        // SAFETY: as above.
        unsafe { core::ptr::read_volatile((base as *const u8).add(off as usize) as *const u16) }
    }
    #[inline(always)]
    fn u8(base: u64, off: u32) -> u8 {
        if base == 0 {
            return 0;
        }
        // SAFETY: as above.
        unsafe { core::ptr::read_volatile((base as *const u8).add(off as usize)) }
    }
}

impl Kread for Probe {
    #[inline(always)]
    fn u64(base: u64, off: u32) -> u64 {
        if base == 0 {
            return 0;
        }
        // SAFETY: the helper checks the address; a failed read yields 0.
        unsafe { bpf_probe_read_kernel((base as *const u8).add(off as usize) as *const u64) }
            .unwrap_or(0)
    }
    #[inline(always)]
    fn u32(base: u64, off: u32) -> u32 {
        if base == 0 {
            return 0;
        }
        // SAFETY: as above.
        unsafe { bpf_probe_read_kernel((base as *const u8).add(off as usize) as *const u32) }
            .unwrap_or(0)
    }
    #[inline(always)]
    fn u16(base: u64, off: u32) -> u16 {
        if base == 0 {
            return 0;
        }
        // SAFETY: as above.
        unsafe { bpf_probe_read_kernel((base as *const u8).add(off as usize) as *const u16) }
            .unwrap_or(0)
    }
    #[inline(always)]
    fn u8(base: u64, off: u32) -> u8 {
        if base == 0 {
            return 0;
        }
        // SAFETY: as above.
        unsafe { bpf_probe_read_kernel((base as *const u8).add(off as usize)) }.unwrap_or(0)
    }
}
