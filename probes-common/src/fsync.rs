//! `fsync-lat`: shared types for the sync-family syscall tracepoints
//! (`syscalls:sys_enter_*` / `syscalls:sys_exit_*` for fsync, fdatasync, sync_file_range, msync,
//! syncfs, sync).

use crate::{hist::LatHist, COMM_LEN};

/// Aggregation key.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FsyncKey {
    /// tgid, or tid with `--threads`.
    pub id: u32,
    /// Syscall number (`__syscall_nr` of the event).
    pub nr: u32,
    /// File descriptor with `--by-file`, else -1 (also -1 for `msync` and `sync`).
    pub fd: i32,
    /// Interval generation (see [`crate::stats::Control`]).
    pub gen: u32,
}

/// What the enter program remembers per thread until the matching exit.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FsyncStart {
    pub ts_ns: u64,
    pub nr: u32,
    pub fd: i32,
}

/// Aggregated value per key.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FsyncVal {
    /// `comm` of the thread that created the key.
    pub comm: [u8; COMM_LEN],
    /// Process of the thread that created the key (needed to resolve fds with `--threads`).
    pub tgid: u32,
    pub _pad: u32,
    /// Calls that returned an error (`ret < 0`, e.g. EIO after a failed writeback).
    pub errors: u64,
    pub hist: LatHist,
}

/// Streamed once per new (process, fd) with `--by-file`, from the enter program while the fd is
/// open, so userspace can resolve `/proc/<tgid>/fd/<fd>` before it is closed.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileEvent {
    pub tgid: u32,
    pub tid: u32,
    pub fd: i32,
    pub id: u32,
}

crate::impl_pod!(FsyncKey, FsyncStart, FsyncVal, FileEvent);

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(size_of::<FsyncKey>(), 16);
        assert_eq!(size_of::<FsyncStart>(), 16);
        assert_eq!(size_of::<FsyncVal>(), 32 + size_of::<LatHist>());
        assert_eq!(size_of::<FileEvent>(), 16);
    }
}
