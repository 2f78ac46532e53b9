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
        match super::retry_eagain(
            || aya::sys::is_program_supported(aya::programs::ProgramType::RawTracePoint),
            super::program_io_error,
        ) {
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
        // The function id comes from tracekit's own BTF reader: aya's probe
        // (`is_program_supported(Tracing)`) parses all of vmlinux BTF first, ~30 ms here.
        let btf = match crate::kernel::btf::vmlinux() {
            Ok(b) => b,
            Err(e) => {
                return Probe::new(false, format!("kernel BTF unusable ({e}): fentry needs it"))
            }
        };
        let Some(id) = btf.find_func(FENTRY_PROBE_FN) else {
            return Probe::new(
                false,
                format!("kernel BTF has no function {FENTRY_PROBE_FN} to probe fentry on"),
            );
        };
        match super::retry_eagain(|| load_and_attach_fentry(id), |(_, e)| Some(e)) {
            Ok(()) => Probe::new(
                true,
                format!("a fentry program on {FENTRY_PROBE_FN} loaded and attached"),
            ),
            Err(("BPF_RAW_TRACEPOINT_OPEN", e)) if e.raw_os_error() == Some(ENOTSUPP) => Probe::new(
                false,
                "the kernel loads tracing programs but cannot attach BPF trampolines (ENOTSUPP)",
            ),
            Err(("BPF_PROG_LOAD", e)) if e.raw_os_error() == Some(libc::EINVAL) => Probe::new(
                false,
                format!("the kernel rejects fentry programs (BPF_PROG_LOAD: {e})"),
            ),
            Err((step, e)) => Probe::new(
                false,
                format!("loading a fentry program on {FENTRY_PROBE_FN} failed: {step}: {e}"),
            ),
        }
    })
}

/// The function the fentry probe attaches to (net/bpf/test_run.c, there for such tests).
const FENTRY_PROBE_FN: &str = "bpf_fentry_test1";

/// The kernel's internal ENOTSUPP (trampolines unsupported by the JIT).
const ENOTSUPP: i32 = 524;

/// `union bpf_attr` for BPF_PROG_LOAD, up to `attach_btf_id` (include/uapi/linux/bpf.h).
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
    prog_btf_fd: u32,
    func_info_rec_size: u32,
    func_info: u64,
    func_info_cnt: u32,
    line_info_rec_size: u32,
    line_info: u64,
    line_info_cnt: u32,
    attach_btf_id: u32,
}

/// Loads `r0 = 0; exit` as an fentry program on BTF function `btf_id` and attaches it
/// (BPF_RAW_TRACEPOINT_OPEN attaches a tracing program to its `attach_btf_id`), then closes
/// both: the checks aya's probe makes, without its BTF parse. Err: the failing step, its error.
fn load_and_attach_fentry(btf_id: u32) -> Result<(), (&'static str, std::io::Error)> {
    use std::os::fd::{FromRawFd, OwnedFd};
    const BPF_PROG_LOAD: libc::c_long = 5;
    const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;
    const BPF_PROG_TYPE_TRACING: u32 = 26;
    const BPF_TRACE_FENTRY: u32 = 24;
    // `mov r0, 0` and `exit`: opcodes first, registers, offsets and immediates all zero.
    let insns: [u8; 16] = [0xb7, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0];
    let license = c"GPL";
    let attr = ProgLoadAttr {
        prog_type: BPF_PROG_TYPE_TRACING,
        insn_cnt: 2,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        expected_attach_type: BPF_TRACE_FENTRY,
        attach_btf_id: btf_id,
        ..Default::default()
    };
    let size = std::mem::size_of::<ProgLoadAttr>() as libc::c_uint;
    // SAFETY: bpf(2) reads `attr` and the buffers it points to, all alive for the call.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, BPF_PROG_LOAD, &attr as *const _, size) };
    if fd < 0 {
        return Err(("BPF_PROG_LOAD", std::io::Error::last_os_error()));
    }
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    let prog = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // `raw_tracepoint`: name (0: the program's attach_btf_id), prog_fd.
    let mut open = [0u8; 16];
    use std::os::fd::AsRawFd;
    open[8..12].copy_from_slice(&(prog.as_raw_fd() as u32).to_ne_bytes());
    // SAFETY: bpf(2) reads the 16 bytes of `open`.
    let link = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_RAW_TRACEPOINT_OPEN,
            open.as_ptr(),
            open.len() as libc::c_uint,
        )
    };
    if link < 0 {
        return Err(("BPF_RAW_TRACEPOINT_OPEN", std::io::Error::last_os_error()));
    }
    // SAFETY: as above; dropping it detaches the probe.
    drop(unsafe { OwnedFd::from_raw_fd(link as i32) });
    Ok(())
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
