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
    /// With `--by-file`: the file's device (`inode->i_sb->s_dev`, kernel encoding) at the call,
    /// else 0 (also 0 for `msync` and `sync`, and when the fd was not open).
    pub dev: u32,
    /// Interval generation (see [`crate::stats::Control`]).
    pub gen: u32,
    /// With `--by-file`: the file's inode number at the call, else 0. The file is identified
    /// per call, so a descriptor reused for another file (closed and reopened, a WAL segment
    /// after a rename) is another key.
    pub ino: u64,
    /// With `--by-file`: the inode's generation (`i_generation`): file systems reuse a freed
    /// inode number at once (a file renamed over another frees one) and bump this instead.
    pub igen: u32,
    pub _pad: u32,
}

/// Byte offsets, from the kernel's BTF, of the pointers followed from the current task to the
/// file behind a descriptor: `task_struct.files`, `files_struct.fdt`, `fdtable.max_fds`,
/// `fdtable.fd`, `file.f_inode`, `inode.i_ino`, `inode.i_sb`, `super_block.s_dev`, `inode.i_generation`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileOffsets {
    pub task_files: u32,
    pub files_fdt: u32,
    pub fdt_max_fds: u32,
    pub fdt_fd: u32,
    pub file_inode: u32,
    pub inode_ino: u32,
    pub inode_sb: u32,
    pub sb_dev: u32,
    pub inode_generation: u32,
    /// `file.f_path.dentry` and `dentry.d_name.name`: the file's own name, read when a key is
    /// announced, for files closed before userspace could look at the fd.
    pub file_dentry: u32,
    pub dentry_name: u32,
    pub _pad: u32,
}

/// What the enter program remembers per thread until the matching exit.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FsyncStart {
    pub ts_ns: u64,
    pub nr: u32,
    pub fd: i32,
    /// The file identified at enter (`--by-file`), see [`FsyncKey`].
    pub dev: u32,
    pub igen: u32,
    pub ino: u64,
}

/// Bytes of a file's own name carried by a [`FileEvent`] (NUL-terminated when shorter).
pub const NAME_LEN: usize = 48;

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
    /// The calls' time inside this generation: a call that began before the generation did
    /// counts from its start (`Control::since_ns`), so one thread's share of a window never
    /// exceeds it. The histogram keeps each call's whole latency.
    pub in_window_ns: u64,
    pub hist: LatHist,
}

/// Streamed once per new (process, file) key with `--by-file`, from the enter program while the
/// fd is open, so userspace can resolve `/proc/<tgid>/fd/<fd>` (and check it is the same file
/// by device and inode) before it is closed.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileEvent {
    pub tgid: u32,
    pub tid: u32,
    pub fd: i32,
    pub id: u32,
    pub dev: u32,
    pub igen: u32,
    pub ino: u64,
    /// The file's last path component as the kernel knew it at the call.
    pub name: [u8; NAME_LEN],
}

crate::gen_keys!(FsyncKey);
crate::impl_pod!(FsyncKey, FsyncStart, FsyncVal, FileEvent, FileOffsets);

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(size_of::<FsyncKey>(), 32);
        assert_eq!(size_of::<FileOffsets>(), 48);
        assert_eq!(size_of::<FsyncStart>(), 32);
        assert_eq!(size_of::<FsyncVal>(), 40 + size_of::<LatHist>());
        assert_eq!(size_of::<FileEvent>(), 32 + NAME_LEN);
    }
}
