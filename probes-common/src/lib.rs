//! Types shared by the kernel programs (`probes-ebpf`, `no_std`, BPF target) and the `tracekit`
//! userspace. Everything here is `#[repr(C)]` plain data: the kernel writes it into maps, userspace
//! reads the same bytes back.
#![no_std]
// `opaque` below: inline assembly on the BPF target is still an experimental arch in rustc (the
// kernel-side build enables unstable features through RUSTC_BOOTSTRAP, see cli/build.rs).
#![cfg_attr(target_arch = "bpf", feature(asm_experimental_arch))]

pub mod fsync;
pub mod hist;
pub mod io_lat;
pub mod irq_lat;
pub mod memstall;
pub mod net_rx;
pub mod numa;
pub mod profile;
pub mod python;
pub mod sched;
pub mod stats;
pub mod why;

/// Length of a task's `comm` as the kernel stores it (`TASK_COMM_LEN`), including the NUL.
pub const COMM_LEN: usize = 16;

/// `$a.f += $b.f` for each counter field named: the merge of two map values, one line per type.
#[macro_export]
macro_rules! add_counters {
    ($a:expr, $b:expr; $($f:ident),+ $(,)?) => {
        $( $a.$f += $b.$f; )+
    };
}

/// A key of a map that two generations share: the kernel writes keys of the current generation
/// while userspace drains the other (see `cli/src/kernel/maps.rs`).
pub trait GenKey {
    fn gen(&self) -> u32;
}

/// [`GenKey`] for key types whose generation is their `gen` field, one line per module.
#[macro_export]
macro_rules! gen_keys {
    ($($t:ty),+ $(,)?) => {
        $(
            impl $crate::GenKey for $t {
                fn gen(&self) -> u32 {
                    self.gen
                }
            }
        )+
    };
}

/// Marks `$t` as plain old data for aya's map accessors (userspace only).
#[macro_export]
macro_rules! impl_pod {
    ($($t:ty),+ $(,)?) => {
        $(
            #[cfg(feature = "user")]
            // SAFETY: every type listed is #[repr(C)], Copy, made only of integers and arrays of
            // integers, and has no padding the kernel could leave uninitialised that we rely on.
            unsafe impl aya::Pod for $t {}
        )+
    };
}
