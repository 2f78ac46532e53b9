//! Kernel feature probes, each tried once per process and cached.

use std::{path::Path, sync::OnceLock};

/// `/sys/kernel/btf/vmlinux` exists: tp_btf and fentry are possible, struct offsets can be
/// computed.
pub fn btf_present() -> bool {
    static C: OnceLock<bool> = OnceLock::new();
    *C.get_or_init(|| Path::new("/sys/kernel/btf/vmlinux").exists())
}

/// The kprobe PMU exists (CONFIG_KPROBES).
pub fn kprobes() -> bool {
    static C: OnceLock<bool> = OnceLock::new();
    *C.get_or_init(|| Path::new("/sys/bus/event_source/devices/kprobe/type").exists())
}

/// Raw tracepoint programs load.
pub fn raw_tp() -> bool {
    static C: OnceLock<bool> = OnceLock::new();
    *C.get_or_init(|| {
        aya::sys::is_program_supported(aya::programs::ProgramType::RawTracePoint).unwrap_or(false)
    })
}

/// Tracing programs (fentry/fexit) load; on some kernels BPF_PROG_LOAD answers EPERM for them
/// even as root (lockdown, or the JIT lacking trampolines).
pub fn fentry() -> bool {
    static C: OnceLock<bool> = OnceLock::new();
    *C.get_or_init(|| {
        btf_present()
            && aya::sys::is_program_supported(aya::programs::ProgramType::Tracing).unwrap_or(false)
    })
}
