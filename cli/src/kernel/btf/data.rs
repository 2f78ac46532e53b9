//! The BTF bytes: a read-only mapping of the file where the kernel allows it, else a heap copy.

/// The BTF bytes: a private read-only mapping of the file where the kernel allows it
/// (/sys/kernel/btf/vmlinux is mmap-able since Linux 6.16: no copy at all), else a heap copy.
pub(super) enum Data {
    Mmap { ptr: *const u8, len: usize },
    Heap(Vec<u8>),
}

// SAFETY: the mapping is private and read-only, never written or unmapped before drop.
unsafe impl Send for Data {}
// SAFETY: as above; shared access is read-only.
unsafe impl Sync for Data {}

impl std::ops::Deref for Data {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            // SAFETY: `ptr` maps `len` readable bytes for as long as `self` lives.
            Data::Mmap { ptr, len } => unsafe { std::slice::from_raw_parts(*ptr, *len) },
            Data::Heap(v) => v,
        }
    }
}

impl Drop for Data {
    fn drop(&mut self) {
        if let Data::Mmap { ptr, len } = self {
            // SAFETY: unmaps exactly the mapping made in `Data::map`.
            unsafe { libc::munmap(*ptr as *mut libc::c_void, *len) };
        }
    }
}

impl Data {
    /// Maps `file` privately and read-only; `None` where the file does not support mmap
    /// (kernels before 6.16 for /sys/kernel/btf/vmlinux, some file systems).
    pub(super) fn map(file: &std::fs::File) -> Option<Data> {
        use std::os::fd::AsRawFd;
        let len = file.metadata().ok()?.len() as usize;
        if len == 0 {
            return None;
        }
        // SAFETY: a fresh private read-only mapping of a file we hold open; checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return None;
        }
        Some(Data::Mmap {
            ptr: ptr as *const u8,
            len,
        })
    }
}
