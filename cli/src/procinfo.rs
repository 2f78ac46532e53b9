//! What tracekit reads about processes from /proc: existence, names, open files, privileges.
//! Uses the `procfs` crate where it keeps bytes faithful; `comm` is read raw because procfs
//! returns it lossily as a String and names are compared and escaped byte for byte.

use std::{fs, path::Path};

use crate::error::UserError;

pub fn exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Every `--pid` must name a running process.
pub fn check_pids(pids: &[u32]) -> Result<(), UserError> {
    match pids.iter().find(|p| !exists(**p)) {
        Some(p) => Err(UserError::NoSuchProcess(*p)),
        None => Ok(()),
    }
}

/// `/proc/<pid>/comm` as bytes, without the trailing newline.
pub fn comm(pid: u32) -> Option<Vec<u8>> {
    let mut b = fs::read(format!("/proc/{pid}/comm")).ok()?;
    if b.last() == Some(&b'\n') {
        b.pop();
    }
    Some(b)
}

/// What fd `fd` of thread `tid` in process `tgid` refers to, while the process lives:
/// a path (with the kernel's " (deleted)" suffix when unlinked), `socket:[…]`, …; `[closed]`
/// when the process lives but the fd is gone, `[exited]` when the process is gone.
pub fn fd_path(tgid: u32, tid: u32, fd: i32) -> String {
    let link = format!("/proc/{tgid}/task/{tid}/fd/{fd}");
    match fs::read_link(&link).or_else(|_| fs::read_link(format!("/proc/{tgid}/fd/{fd}"))) {
        Ok(p) => crate::sanitize::text(p.as_os_str().as_encoded_bytes()),
        Err(_) if exists(tgid) => "[closed]".to_string(),
        Err(_) => "[exited]".to_string(),
    }
}

const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Root, or CAP_BPF + CAP_PERFMON (5.8+), or CAP_SYS_ADMIN; checked before touching the kernel
/// so the user gets one line instead of an EPERM from deep inside a load.
pub fn check_privileges() -> Result<(), UserError> {
    let capeff = procfs::process::Process::myself()
        .and_then(|p| p.status())
        .map(|s| s.capeff)
        .unwrap_or(0);
    if has_bpf_privileges(capeff) {
        return Ok(());
    }
    Err(UserError::Permission(
        "tracekit needs root, or the capabilities CAP_BPF and CAP_PERFMON (CAP_SYS_ADMIN on kernels before 5.8): run it with sudo".to_string(),
    ))
}

pub fn has_bpf_privileges(capeff: u64) -> bool {
    let has = |c: u32| capeff & (1u64 << c) != 0;
    has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON))
}

/// tracekit's own resident set and its peak (VmRSS, VmHWM), in KiB; zeros if unreadable.
pub fn self_rss_kib() -> (u64, u64) {
    procfs::process::Process::myself()
        .and_then(|p| p.status())
        .map(|s| (s.vmrss.unwrap_or(0), s.vmhwm.unwrap_or(0)))
        .unwrap_or((0, 0))
}

/// Number of possible CPUs (per-CPU maps have one slot each).
pub fn possible_cpus() -> usize {
    aya::util::nr_cpus().unwrap_or(1).max(1)
}

/// `/proc/sys/kernel/pid_max`, bounding how many tasks can exist at once.
pub fn pid_max() -> u32 {
    fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(32768)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn privilege_bits() {
        assert!(has_bpf_privileges(1 << CAP_SYS_ADMIN));
        assert!(has_bpf_privileges((1 << CAP_BPF) | (1 << CAP_PERFMON)));
        assert!(!has_bpf_privileges(1 << CAP_BPF));
        assert!(!has_bpf_privileges(0));
    }

    #[test]
    fn own_process() {
        let me = std::process::id();
        assert!(exists(me));
        assert!(comm(me).is_some());
        assert!(check_pids(&[me]).is_ok());
        assert!(matches!(
            check_pids(&[me, 4_000_000]),
            Err(UserError::NoSuchProcess(4_000_000))
        ));
    }

    #[test]
    fn resolves_own_fd() {
        let f = fs::File::open("/proc/self/status").unwrap();
        use std::os::fd::AsRawFd;
        let me = std::process::id();
        let tid = unsafe { libc::gettid() } as u32;
        assert!(fd_path(me, tid, f.as_raw_fd()).ends_with("/status"));
        assert_eq!(fd_path(me, tid, 987_654), "[closed]");
    }
}
