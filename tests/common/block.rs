//! Loop devices of a test's own over a file (detached by the kernel even when the test dies)
//! and `/proc/diskstats` counts: the block-I/O fixtures of io-lat's tests and the bench floor's.

use std::{path::PathBuf, process::Command};

use crate::{output_ok, scratch};

/// A loop device over a 64 MiB file of real (allocated) blocks, detached on drop (by the
/// kernel, when `_hold` closes: see [`losetup`]).
pub struct LoopDev {
    pub dev: String,
    pub name: String,
    pub dir: PathBuf,
    _hold: std::fs::File,
}

impl LoopDev {
    pub fn new(tag: &str) -> LoopDev {
        let dir = scratch(tag);
        let file = dir.join("disk.img");
        // Written, not sparse: reads of holes would never reach the backing disk.
        std::fs::write(&file, vec![0x5au8; 64 << 20]).unwrap();
        let (dev, hold) = losetup(&["--direct-io=on"], &file);
        // The device holds the file: nothing is left behind if this process dies.
        let _ = std::fs::remove_file(&file);
        let name = dev.trim_start_matches("/dev/").to_string();
        let lo = LoopDev {
            dev,
            name,
            dir,
            _hold: hold,
        };
        lo.set("scheduler", "none");
        lo
    }

    /// Writes a queue attribute (`scheduler`, `nr_requests`, `rotational`).
    pub fn set(&self, attr: &str, v: &str) {
        std::fs::write(format!("/sys/block/{}/queue/{attr}", self.name), v)
            .unwrap_or_else(|e| panic!("setting {attr}={v} on {}: {e}", self.name));
    }

    /// (reads completed, writes completed) from /proc/diskstats.
    pub fn diskstats(&self) -> (u64, u64) {
        diskstats_of(&self.name).unwrap_or_else(|| panic!("{} not in /proc/diskstats", self.name))
    }
}

/// Attaches `file` to a free loop device (`losetup -f --show EXTRA FILE`): its /dev path, and
/// the device held open with `LO_FLAGS_AUTOCLEAR` set, so that the kernel detaches it when the
/// last opener closes it: when the handle drops, and also when the test process is killed or
/// aborts and no `Drop` runs (a loop device left attached to a test's file outlives the test).
pub fn losetup(extra: &[&str], file: &std::path::Path) -> (String, std::fs::File) {
    losetup_on(None, extra, file)
}

/// [`losetup`] on loop device `dev` (a [`NewLoop`]'s), or the first free one.
pub fn losetup_on(
    dev: Option<&str>,
    extra: &[&str],
    file: &std::path::Path,
) -> (String, std::fs::File) {
    let mut cmd = Command::new("losetup");
    cmd.args(match dev {
        Some(d) => vec!["--show", d],
        None => vec!["-f", "--show"],
    })
    .args(extra)
    .arg(file);
    let dev = String::from_utf8(output_ok(&mut cmd, "losetup"))
        .unwrap()
        .trim()
        .to_string();
    let hold = std::fs::File::open(&dev).unwrap_or_else(|e| panic!("{dev}: {e}"));
    if let Err(e) = autoclear(&hold) {
        let _ = Command::new("losetup").args(["-d", &dev]).status();
        panic!("autoclear on {dev}: {e}");
    }
    (dev, hold)
}

/// Sets `LO_FLAGS_AUTOCLEAR` on the open loop device `f` (`LOOP_GET_STATUS64`, then
/// `LOOP_SET_STATUS64` with the flag added; the other flags are kept).
fn autoclear(f: &std::fs::File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    const LOOP_SET_STATUS64: libc::c_ulong = 0x4C04;
    const LOOP_GET_STATUS64: libc::c_ulong = 0x4C05;
    const LO_FLAGS_AUTOCLEAR: u32 = 4;
    /// `struct loop_info64` is 232 bytes, `lo_flags` (u32) at 52.
    const FLAGS_AT: usize = 52;
    let mut info = [0u8; 232];
    for (req, what) in [(LOOP_GET_STATUS64, "get"), (LOOP_SET_STATUS64, "set")] {
        if req == LOOP_SET_STATUS64 {
            let mut flags = [0u8; 4];
            flags.copy_from_slice(&info[FLAGS_AT..FLAGS_AT + 4]);
            let flags = u32::from_ne_bytes(flags) | LO_FLAGS_AUTOCLEAR;
            info[FLAGS_AT..FLAGS_AT + 4].copy_from_slice(&flags.to_ne_bytes());
        }
        // SAFETY: the ioctl reads or writes a `struct loop_info64` in `info`, which is large
        // enough and outlives the call.
        if unsafe { libc::ioctl(f.as_raw_fd(), req, info.as_mut_ptr()) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(std::io::Error::new(e.kind(), format!("{what} status: {e}")));
        }
    }
    Ok(())
}

impl Drop for LoopDev {
    fn drop(&mut self) {
        // A loop device keeps its queue settings across detach: leave the defaults for the
        // next user.
        for (attr, v) in [
            ("scheduler", "none"),
            ("nr_requests", "128"),
            ("rotational", "1"),
        ] {
            let _ = std::fs::write(format!("/sys/block/{}/queue/{attr}", self.name), v);
        }
        // Detached now, or at the last close if fio or a mount still holds it.
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// (reads, writes) completed on disk `name` according to /proc/diskstats.
pub fn diskstats_of(name: &str) -> Option<(u64, u64)> {
    let s = std::fs::read_to_string("/proc/diskstats").ok()?;
    s.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() > 8 && f[2] == name {
            Some((f[3].parse().ok()?, f[7].parse().ok()?))
        } else {
            None
        }
    })
}

/// A loop device that did not exist before (`LOOP_CTL_ADD` on /dev/loop-control): a disk that
/// appears while a tool runs, unlike the idle loop0–7 every /proc/diskstats lists. Removed on
/// drop (`LOOP_CTL_REMOVE`, once nothing is attached to it).
pub struct NewLoop {
    pub dev: String,
    number: i32,
}

const LOOP_CTL_ADD: libc::c_ulong = 0x4C80;
const LOOP_CTL_REMOVE: libc::c_ulong = 0x4C81;

impl NewLoop {
    pub fn create() -> NewLoop {
        let ctl = std::fs::File::open("/dev/loop-control").expect("/dev/loop-control");
        use std::os::fd::AsRawFd;
        let first = 300 + (std::process::id() % 200) as i32;
        for n in first..first + 100 {
            // SAFETY: LOOP_CTL_ADD takes the device number as its argument, no memory.
            let r = unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_ADD, n) };
            if r >= 0 {
                return NewLoop {
                    dev: format!("/dev/loop{r}"),
                    number: r,
                };
            }
        }
        panic!("LOOP_CTL_ADD: no free number from {first}");
    }
}

impl Drop for NewLoop {
    fn drop(&mut self) {
        if let Ok(ctl) = std::fs::File::open("/dev/loop-control") {
            use std::os::fd::AsRawFd;
            // SAFETY: as in create; fails harmlessly (EBUSY) while still attached.
            unsafe { libc::ioctl(ctl.as_raw_fd(), LOOP_CTL_REMOVE, self.number) };
        }
    }
}

/// `count` O_DIRECT 4 KiB reads of `dev` (dd).
pub fn read_direct(dev: &str, count: u32) {
    output_ok(
        Command::new("dd")
            .args([&format!("if={dev}"), "of=/dev/null", "bs=4k"])
            .arg(format!("count={count}"))
            .arg("iflag=direct"),
        "dd",
    );
}
