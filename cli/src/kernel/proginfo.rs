//! What the kernel counts about a session's own programs (`bpf_prog_info`): runs skipped by the
//! per-program recursion guard, and run counts and time when `kernel.bpf_stats_enabled` is on.
//!
//! aya 0.14's `ProgramInfo` does not expose these fields, so the info is read with one
//! `BPF_OBJ_GET_INFO_BY_FD` per program.

use std::os::fd::{AsFd, AsRawFd};

use super::loader::Session;

/// Counters of one program, or summed over a session's programs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProgCounters {
    /// Runs the kernel skipped: the program fired while it was already running on that CPU (an
    /// interrupt arriving during it, e.g. a packet drop in softirq while the same program runs
    /// in task context), counted in `recursion_misses` (5.12+). Events lost that way are
    /// invisible otherwise, so tools report this beside their counts.
    pub recursion_misses: u64,
    /// Runs and total run time; zero unless `kernel.bpf_stats_enabled` is 1.
    pub run_cnt: u64,
    pub run_time_ns: u64,
}

fn prog_counters(fd: std::os::fd::BorrowedFd) -> Option<ProgCounters> {
    // SAFETY: bpf_prog_info is plain integers and pointers-as-u64; all-zero is a valid value
    // (no buffers requested).
    let mut info: aya_obj::generated::bpf_prog_info = unsafe { std::mem::zeroed() };
    // union bpf_attr's `info` member: bpf_fd (u32), info_len (u32), info (u64).
    #[repr(C)]
    struct InfoAttr {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }
    let attr = InfoAttr {
        bpf_fd: fd.as_raw_fd() as u32,
        info_len: std::mem::size_of_val(&info) as u32,
        info: &raw mut info as u64,
    };
    // SAFETY: BPF_OBJ_GET_INFO_BY_FD writes at most info_len bytes into `info`, which lives for
    // the call; attr is a valid bpf_attr prefix of its size.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            aya_obj::generated::bpf_cmd::BPF_OBJ_GET_INFO_BY_FD as libc::c_long,
            &attr as *const InfoAttr,
            std::mem::size_of::<InfoAttr>() as libc::c_uint,
        )
    };
    (rc == 0).then_some(ProgCounters {
        recursion_misses: info.recursion_misses,
        run_cnt: info.run_cnt,
        run_time_ns: info.run_time_ns,
    })
}

/// The counters of every program `session` attached, summed (cumulative since load).
pub fn session_counters(session: &Session) -> ProgCounters {
    let mut sum = ProgCounters::default();
    for a in &session.attached {
        let Some(fd) = session.ebpf.program(&a.program).and_then(|p| p.fd().ok()) else {
            continue;
        };
        if let Some(c) = prog_counters(fd.as_fd()) {
            sum.recursion_misses += c.recursion_misses;
            sum.run_cnt += c.run_cnt;
            sum.run_time_ns += c.run_time_ns;
        }
    }
    sum
}

/// The counters of the loaded programs among `ids` (by program id, as in a meta line's
/// `programs`), for whoever holds ids rather than the session (the exporter's emitter);
/// programs that are gone are left out.
pub fn counters_by_id(ids: &[u32]) -> Vec<(u32, ProgCounters)> {
    aya::programs::loaded_programs()
        .filter_map(|p| p.ok())
        .filter(|p| ids.contains(&p.id()))
        .filter_map(|p| {
            let fd = p.fd().ok()?;
            prog_counters(fd.as_fd()).map(|c| (p.id(), c))
        })
        .collect()
}
