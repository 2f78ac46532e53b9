//! The block workloads' disk: a loop device over a file in RAM (tmpfs), with direct I/O, so a
//! read costs the block layer and a page copy, not a slow shared backing disk (the requests'
//! rate and latency stay steady from run to run, as on a fast device).
//!
//! Cleanup cannot be missed: the backing file is unlinked as soon as it is open, and the loop
//! device is configured with `LO_FLAGS_AUTOCLEAR` while this process holds it open, so the
//! kernel detaches it (and frees the file) when the last opener closes it: when the bench ends,
//! fails, panics or is killed. Nothing here waits for a `Drop` that a `SIGKILL` would skip.

use std::{
    fs::{File, OpenOptions},
    os::fd::AsRawFd,
    sync::OnceLock,
};

use anyhow::{bail, Context as _, Result};

const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LO_FLAGS_AUTOCLEAR: u32 = 4;
const LO_FLAGS_DIRECT_IO: u32 = 16;
/// Size of the disk: larger than any read-ahead or cache effect matters for, small in RAM.
pub(super) const SIZE: usize = 64 << 20;

/// `struct loop_info64` (include/uapi/linux/loop.h).
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// `struct loop_config` (`LOOP_CONFIGURE`, 5.8+).
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// The loop device, held open for the life of the process (see the module note).
pub(super) struct RamDisk {
    /// `loopN`.
    pub(super) name: String,
    _dev: File,
}

impl RamDisk {
    /// The process's RAM disk, set up on first use.
    pub(super) fn get() -> Result<&'static RamDisk> {
        static DISK: OnceLock<std::result::Result<RamDisk, String>> = OnceLock::new();
        DISK.get_or_init(|| {
            let d = RamDisk::new().map_err(|e| format!("{e:#}"))?;
            eprintln!(
                "bench: block workload on /dev/{} ({} MiB in RAM, direct I/O {})",
                d.name,
                SIZE >> 20,
                if d.direct_io() { "on" } else { "off" }
            );
            Ok(d)
        })
        .as_ref()
        .map_err(|e| anyhow::anyhow!("RAM-backed loop device: {e}"))
    }

    fn new() -> Result<RamDisk> {
        let path = format!("/dev/shm/tk-bench-disk-{}.img", std::process::id());
        // Written, not sparse: every block is a real page.
        std::fs::write(&path, vec![0x5au8; SIZE]).with_context(|| path.clone())?;
        let backing = OpenOptions::new().read(true).write(true).open(&path);
        let _ = std::fs::remove_file(&path);
        let backing = backing.with_context(|| path.clone())?;
        let ctl = File::open("/dev/loop-control").context("/dev/loop-control")?;
        // Another process may take the free device between the two calls: try again.
        for _ in 0..8 {
            // SAFETY: plain ioctl on our fd.
            let n = unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_GET_FREE) };
            if n < 0 {
                bail!("LOOP_CTL_GET_FREE: {}", std::io::Error::last_os_error());
            }
            let name = format!("loop{n}");
            let dev = OpenOptions::new()
                .read(true)
                .write(true)
                .open(format!("/dev/{name}"))
                .with_context(|| format!("/dev/{name}"))?;
            // SAFETY: all-zero is a valid value of these plain C structs.
            let mut cfg: LoopConfig = unsafe { std::mem::zeroed() };
            cfg.fd = backing.as_raw_fd() as u32;
            cfg.info.lo_flags = LO_FLAGS_AUTOCLEAR | LO_FLAGS_DIRECT_IO;
            // SAFETY: the ioctl reads a `struct loop_config` that outlives the call.
            if unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE, &raw const cfg) } == 0 {
                return Ok(RamDisk { name, _dev: dev });
            }
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EBUSY) {
                bail!("LOOP_CONFIGURE on /dev/{name}: {e}");
            }
        }
        bail!("no free loop device after 8 tries")
    }

    pub(super) fn path(&self) -> String {
        format!("/dev/{}", self.name)
    }

    /// Selects the I/O scheduler (`none`, `mq-deadline`) for the next run.
    pub(super) fn set_scheduler(&self, sched: &str) -> Result<()> {
        let p = format!("/sys/block/{}/queue/scheduler", self.name);
        std::fs::write(&p, sched).with_context(|| format!("{sched} > {p}"))
    }

    /// Whether the loop driver kept direct I/O on the backing file (tmpfs has it since 6.6).
    fn direct_io(&self) -> bool {
        std::fs::read_to_string(format!("/sys/block/{}/loop/dio", self.name))
            .is_ok_and(|s| s.trim() == "1")
    }
}
