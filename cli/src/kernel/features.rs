//! Kernel feature probes, each tried once per process and cached.

use std::{path::Path, sync::OnceLock};

/// A probe's answer with the reason, as `doctor` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    pub available: bool,
    pub why: String,
}

impl Probe {
    fn new(available: bool, why: impl Into<String>) -> Probe {
        Probe {
            available,
            why: why.into(),
        }
    }
}

/// `/sys/kernel/btf/vmlinux` exists: tp_btf and fentry are possible, struct offsets can be
/// computed.
pub fn btf_present() -> bool {
    static C: OnceLock<bool> = OnceLock::new();
    *C.get_or_init(|| crate::kernel::btf::vmlinux_path().exists())
}

/// The kprobe PMU exists (CONFIG_KPROBES).
pub fn kprobes() -> bool {
    kprobes_probe().available
}

const KPROBE_PMU: &str = "/sys/bus/event_source/devices/kprobe/type";

pub fn kprobes_probe() -> &'static Probe {
    static C: OnceLock<Probe> = OnceLock::new();
    C.get_or_init(|| {
        if Path::new(KPROBE_PMU).exists() {
            Probe::new(true, format!("the kprobe PMU exists ({KPROBE_PMU})"))
        } else {
            Probe::new(
                false,
                format!("no kprobe PMU ({KPROBE_PMU} missing): the kernel is built without CONFIG_KPROBES"),
            )
        }
    })
}

/// Raw tracepoint programs load.
pub fn raw_tp() -> bool {
    raw_tp_probe().available
}

pub fn raw_tp_probe() -> &'static Probe {
    static C: OnceLock<Probe> = OnceLock::new();
    C.get_or_init(|| {
        match aya::sys::is_program_supported(aya::programs::ProgramType::RawTracePoint) {
            Ok(true) => Probe::new(true, "a raw tracepoint program loaded"),
            Ok(false) => Probe::new(
                false,
                "the kernel rejects raw tracepoint programs (before 4.17)",
            ),
            Err(e) => Probe::new(
                false,
                format!("probing raw tracepoint programs failed: {}", chain(&e)),
            ),
        }
    })
}

/// Tracing programs (fentry/fexit) load; on some kernels BPF_PROG_LOAD answers EPERM for them
/// even as root (lockdown, or the JIT lacking trampolines).
pub fn fentry() -> bool {
    fentry_probe().available
}

pub fn fentry_probe() -> &'static Probe {
    static C: OnceLock<Probe> = OnceLock::new();
    C.get_or_init(|| {
        if !btf_present() {
            return Probe::new(
                false,
                "no kernel BTF (/sys/kernel/btf/vmlinux): fentry needs it",
            );
        }
        // aya loads a trivial fentry program on bpf_fentry_test1 and attaches it.
        match aya::sys::is_program_supported(aya::programs::ProgramType::Tracing) {
            Ok(true) => Probe::new(
                true,
                "a fentry program on bpf_fentry_test1 loaded and attached",
            ),
            Ok(false) => Probe::new(
                false,
                "the kernel rejects tracing programs, or cannot attach BPF trampolines (ENOTSUPP)",
            ),
            Err(e) => Probe::new(
                false,
                format!("loading a fentry program failed: {}", chain(&e)),
            ),
        }
    })
}

/// An error and its sources on one line (aya puts the errno in the source).
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        src = c.source();
    }
    s
}
