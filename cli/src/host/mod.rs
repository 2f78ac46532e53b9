//! Readers of what the node says about itself in `/proc` and `/sys`: pure parsers (tested on
//! fixture files, no root, no BPF) plus thin functions that read the live files.
//!
//! Every file read whole goes through [`read_capped`], so a hostile or endless file
//! (`/dev/zero` behind an override variable, a runaway `/proc` file) cannot exhaust memory, and
//! every file opened on behalf of another user or from an override variable is opened by
//! [`open_regular`] (or [`open_foreign`]), so a FIFO, a device or a socket put there cannot hang
//! tracekit: the open never blocks and what is opened must be a regular file.
//! `TRACEKIT_PROC` and `TRACEKIT_SYS` point these readers at the host's `/proc` and `/sys` when
//! tracekit runs in a container with them mounted elsewhere (e.g. `/host/proc`).

use std::{
    fs::File,
    io::Read,
    os::unix::fs::{MetadataExt, OpenOptionsExt},
    path::{Path, PathBuf},
};

pub mod cgroup;
pub mod container;
pub mod disks;
pub mod facts;
pub mod kallsyms;
pub mod listeners;
pub mod maps;
pub mod memcg;
pub mod mountinfo;
pub mod net;
pub mod numa;
pub mod pmu;
pub mod proc;
pub mod psi;
pub mod sysstat;
pub mod thp;
pub mod tuning;
pub mod vmstat;

/// What went wrong reading or parsing a host file; every message names the file.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is larger than {limit} bytes")]
    TooLarge { path: PathBuf, limit: u64 },
    /// A FIFO, device, socket, directory or (where no link is expected) symbolic link where a
    /// regular file was expected: refused without a read (a FIFO would never end, nor would a
    /// blocking open of one).
    #[error("{path} is {what}, not a regular file")]
    NotRegular { path: PathBuf, what: &'static str },
    /// A file another user could have planted (a perf map in a process's /tmp) that is not
    /// owned by whom it should be.
    #[error("{path} is owned by uid {uid}, not by {expected}: ignored")]
    NotOwned {
        path: PathBuf,
        uid: u32,
        expected: String,
    },
    #[error("{path}: {msg}")]
    Parse { path: PathBuf, msg: String },
    #[error("no process with pid {0} (it may have exited)")]
    NoSuchProcess(u32),
    /// A `--pid` that is a thread: the message names the process id to use.
    #[error("{0}")]
    NotAProcess(String),
    /// tracekit lacks a capability; the message names it.
    #[error("{0}")]
    Privilege(String),
}

impl HostError {
    /// The I/O error kind, for callers that map "permission denied" or "not found".
    pub fn kind(&self) -> Option<std::io::ErrorKind> {
        match self {
            HostError::Read { source, .. } => Some(source.kind()),
            _ => None,
        }
    }

    pub fn parse(path: impl Into<PathBuf>, msg: impl Into<String>) -> HostError {
        HostError::Parse {
            path: path.into(),
            msg: msg.into(),
        }
    }
}

/// Limits for files read whole: small ones (comm, a sysfs value, a format file, most of /proc),
/// large ones (mountinfo on a node with thousands of mounts, kallsyms, /proc/interrupts on a
/// machine with hundreds of CPUs).
pub const SMALL_FILE: u64 = 1 << 20;
pub const LARGE_FILE: u64 = 64 << 20;

/// What a file of mode `mode` is, for messages ("a FIFO").
fn file_kind(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFREG => "a regular file",
        libc::S_IFIFO => "a FIFO",
        libc::S_IFCHR => "a character device",
        libc::S_IFBLK => "a block device",
        libc::S_IFSOCK => "a socket",
        libc::S_IFDIR => "a directory",
        libc::S_IFLNK => "a symbolic link",
        _ => "of an unknown file type",
    }
}

fn open_checked(path: &Path, limit: u64, nofollow: bool) -> Result<File, HostError> {
    let io = |source| HostError::Read {
        path: path.to_path_buf(),
        source,
    };
    // O_NONBLOCK: opening a FIFO for reading blocks until a writer comes (forever, if the user
    // who put it there wants); non-blocking, it opens at once and fstat below refuses it.
    // O_NOCTTY: a terminal device must not become tracekit's controlling terminal. (std adds
    // O_CLOEXEC.)
    let mut flags = libc::O_NONBLOCK | libc::O_NOCTTY;
    if nofollow {
        flags |= libc::O_NOFOLLOW;
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) if nofollow => HostError::NotRegular {
                path: path.to_path_buf(),
                what: "a symbolic link",
            },
            _ => io(e),
        })?;
    // fstat of the descriptor, not stat of the path: the path may be swapped between the two.
    let md = f.metadata().map_err(io)?;
    if !md.is_file() {
        return Err(HostError::NotRegular {
            path: path.to_path_buf(),
            what: file_kind(md.mode()),
        });
    }
    if md.len() > limit {
        return Err(HostError::TooLarge {
            path: path.to_path_buf(),
            limit,
        });
    }
    Ok(f)
}

/// Opens `path` for reading without ever blocking, and only if it is a regular file of at most
/// `limit` bytes (by its size; procfs and sysfs files say 0 or a page, so [`read_limited`] still
/// counts what it reads). Links are followed (`/proc/<pid>/map_files/…`, `/proc/<pid>/root` and
/// an override variable naming a link are links on purpose). Every file tracekit opens on behalf
/// of another user, or that an override variable names, is opened here.
pub fn open_regular(path: &Path, limit: u64) -> Result<File, HostError> {
    open_checked(path, limit, false)
}

/// [`open_regular`] for a file another user may have planted where no link is expected (a perf
/// map in a process's /tmp): a link as the last component is refused, and the file must be owned
/// by one of `owners` (as perf itself requires of a perf map: the process's user or root).
pub fn open_foreign(path: &Path, limit: u64, owners: &[u32]) -> Result<File, HostError> {
    let f = open_checked(path, limit, true)?;
    let uid = f
        .metadata()
        .map_err(|source| HostError::Read {
            path: path.to_path_buf(),
            source,
        })?
        .uid();
    if !owners.contains(&uid) {
        let expected = owners
            .iter()
            .map(|u| format!("uid {u}"))
            .collect::<Vec<_>>()
            .join(" or ");
        return Err(HostError::NotOwned {
            path: path.to_path_buf(),
            uid,
            expected,
        });
    }
    Ok(f)
}

/// Reads the rest of open file `f` (named `path` in messages), refusing more than `limit` bytes:
/// the size is checked while reading, since procfs files report size 0 and a file may grow.
pub fn read_limited(f: &File, path: &Path, limit: u64) -> Result<Vec<u8>, HostError> {
    let mut buf = Vec::new();
    f.take(limit.saturating_add(1))
        .read_to_end(&mut buf)
        .map_err(|source| HostError::Read {
            path: path.to_path_buf(),
            source,
        })?;
    if buf.len() as u64 > limit {
        return Err(HostError::TooLarge {
            path: path.to_path_buf(),
            limit,
        });
    }
    Ok(buf)
}

/// Reads a whole regular file, refusing more than `limit` bytes. Every file tracekit reads whole
/// goes through here: some paths come from the environment (`TRACEKIT_BTF`, `TRACEKIT_TRACEFS`,
/// `TRACEKIT_PROC`) and may name `/dev/zero` or a FIFO, which must neither grow tracekit's memory
/// without bound nor block it ([`open_regular`]: procfs and sysfs files are regular files).
pub fn read_capped(path: &Path, limit: u64) -> Result<Vec<u8>, HostError> {
    read_limited(&open_regular(path, limit)?, path, limit)
}

/// [`read_capped`] as text (invalid UTF-8 replaced: kernel text files are ASCII, and a stray
/// byte must not make a whole file unreadable).
pub fn read_text_capped(path: &Path, limit: u64) -> Result<String, HostError> {
    read_capped(path, limit).map(|b| match String::from_utf8(b) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    })
}

/// [`read_text_capped`] at [`LARGE_FILE`]: /proc and /sys text whose size grows with the machine.
pub fn read_text(path: &Path) -> Result<String, HostError> {
    read_text_capped(path, LARGE_FILE)
}

/// A sysfs/procfs value on one line, trimmed; `None` when absent or unreadable.
pub fn read_trim(path: &Path) -> Option<String> {
    read_capped(path, SMALL_FILE)
        .ok()
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
}

/// A sysfs/procfs integer; `None` when absent, unreadable or not a number.
pub fn read_u64(path: &Path) -> Option<u64> {
    read_trim(path)?.parse().ok()
}

fn root(var: &str, default: &str) -> PathBuf {
    std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(default))
}

/// `/proc/<rel>`, or under `TRACEKIT_PROC` when set.
pub fn proc_path(rel: &str) -> PathBuf {
    root("TRACEKIT_PROC", "/proc").join(rel.trim_start_matches('/'))
}

/// `/sys/<rel>`, or under `TRACEKIT_SYS` when set.
pub fn sys_path(rel: &str) -> PathBuf {
    root("TRACEKIT_SYS", "/sys").join(rel.trim_start_matches('/'))
}

/// `/proc/sys/<a/b/c>` for the sysctl `a.b.c`, trimmed.
pub fn sysctl(name: &str) -> Option<String> {
    read_trim(&proc_path(&format!("sys/{}", name.replace('.', "/"))))
}

/// The selected value of a sysfs choice file such as `always [madvise] never` (THP settings,
/// `queue/scheduler`), or its whole trimmed text when it has no brackets (`1`, `none`).
pub fn selected(text: &str) -> Option<String> {
    let t = text.trim();
    if t.is_empty() {
        return None;
    }
    match (t.find('['), t.find(']')) {
        (Some(a), Some(b)) if a < b => Some(t[a + 1..b].to_string()),
        _ => Some(t.to_string()),
    }
}

/// A CPU list such as `0-3,8,10-11` (sysfs `cpulist`, `Cpus_allowed_list`) as CPU numbers.
pub fn parse_cpu_list(s: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                if b < a || b - a > 1 << 16 {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.trim().parse().ok()?),
        }
    }
    Some(out)
}

#[cfg(test)]
pub(crate) fn fixture(rel: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capped_read_refuses_endless_files() {
        // /dev/zero never ends: refused as what it is, without a read.
        let e = read_capped(Path::new("/dev/zero"), 1 << 16).unwrap_err();
        assert_eq!(
            e.to_string(),
            "/dev/zero is a character device, not a regular file"
        );
        assert!(read_capped(Path::new("/proc/self/status"), SMALL_FILE).is_ok());
        let e = read_capped(Path::new("/nonexistent/x"), 10).unwrap_err();
        assert!(e.to_string().starts_with("reading /nonexistent/x"), "{e}");
        // A procfs file says size 0: its cap is counted while reading.
        let e = read_capped(Path::new("/proc/self/maps"), 16).unwrap_err();
        assert!(matches!(e, HostError::TooLarge { limit: 16, .. }), "{e}");
    }

    /// A scratch directory for one test, removed when the guard drops.
    struct Scratch(PathBuf);
    impl Scratch {
        fn new(tag: &str) -> Scratch {
            let d = std::env::temp_dir().join(format!("tk-host-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&d);
            std::fs::create_dir_all(&d).unwrap();
            Scratch(d)
        }
        fn fifo(&self, name: &str) -> PathBuf {
            use std::os::unix::ffi::OsStrExt;
            let p = self.0.join(name);
            let c = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
            // SAFETY: a NUL-terminated path; plain syscall.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
            p
        }
    }
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Runs `f` on another thread and fails if it has not returned within 5 s (the bug was an
    /// open that never returns: the test must fail, not hang).
    fn promptly<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(std::time::Duration::from_secs(5))
            .expect("returned within 5 s (a blocking open of a FIFO never does)")
    }

    #[test]
    fn a_fifo_with_no_writer_is_refused_at_once() {
        let d = Scratch::new("fifo");
        let fifo = d.fifo("perf-1.map");
        let p = fifo.clone();
        let e = promptly(move || read_capped(&p, SMALL_FILE).unwrap_err());
        assert_eq!(
            e.to_string(),
            format!("{} is a FIFO, not a regular file", fifo.display())
        );
        let p = fifo.clone();
        let e = promptly(move || open_regular(&p, SMALL_FILE).unwrap_err());
        assert!(
            matches!(e, HostError::NotRegular { what: "a FIFO", .. }),
            "{e}"
        );
        let p = fifo.clone();
        let e = promptly(move || open_foreign(&p, SMALL_FILE, &[0]).unwrap_err());
        assert!(
            matches!(e, HostError::NotRegular { what: "a FIFO", .. }),
            "{e}"
        );
    }

    #[test]
    fn links_to_fifos_directories_and_sizes() {
        let d = Scratch::new("kinds");
        let fifo = d.fifo("fifo");
        let link = d.0.join("link");
        std::os::unix::fs::symlink(&fifo, &link).unwrap();
        // Followed, the link leads to a FIFO: refused as one, at once.
        let p = link.clone();
        let e = promptly(move || open_regular(&p, SMALL_FILE).unwrap_err());
        assert_eq!(
            e.to_string(),
            format!("{} is a FIFO, not a regular file", link.display())
        );
        // Where no link is expected, the link itself is refused.
        let p = link.clone();
        let e = promptly(move || open_foreign(&p, SMALL_FILE, &[0]).unwrap_err());
        assert_eq!(
            e.to_string(),
            format!("{} is a symbolic link, not a regular file", link.display())
        );
        let e = read_capped(&d.0, SMALL_FILE).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("{} is a directory, not a regular file", d.0.display())
        );
        // The size cap is exact, by size at open and by count while reading.
        let f = d.0.join("f");
        std::fs::write(&f, [b'x'; 100]).unwrap();
        assert_eq!(read_capped(&f, 100).unwrap().len(), 100);
        let e = open_regular(&f, 99).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("{} is larger than 99 bytes", f.display())
        );
        let e = read_capped(&f, 99).unwrap_err();
        assert!(matches!(e, HostError::TooLarge { limit: 99, .. }), "{e}");
        let open = open_regular(&f, 100).unwrap();
        std::fs::write(&f, [b'x'; 200]).unwrap();
        let e = read_limited(&open, &f, 100).unwrap_err();
        assert!(matches!(e, HostError::TooLarge { limit: 100, .. }), "{e}");
        // Ownership: this file is ours (uid of this test), not another user's.
        // SAFETY: plain syscall.
        let me = unsafe { libc::geteuid() };
        assert!(open_foreign(&f, 1000, &[me]).is_ok());
        let other = me.wrapping_add(4242);
        let e = open_foreign(&f, 1000, &[other]).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{} is owned by uid {me}, not by uid {other}: ignored",
                f.display()
            )
        );
    }

    #[test]
    fn selectors_and_cpu_lists() {
        assert_eq!(
            selected("always [madvise] never").as_deref(),
            Some("madvise")
        );
        assert_eq!(selected("[none] mq-deadline").as_deref(), Some("none"));
        assert_eq!(selected("1\n").as_deref(), Some("1"));
        assert_eq!(selected(" "), None);
        assert_eq!(
            parse_cpu_list("0-3,8,10-11").unwrap(),
            [0, 1, 2, 3, 8, 10, 11]
        );
        assert_eq!(parse_cpu_list("5\n").unwrap(), [5]);
        assert_eq!(parse_cpu_list("").unwrap(), Vec::<u32>::new());
        assert!(parse_cpu_list("3-1").is_none());
        assert!(parse_cpu_list("a").is_none());
        assert!(parse_cpu_list("0-4294967295").is_none());
    }

    #[test]
    fn roots_follow_the_override() {
        assert_eq!(proc_path("vmstat"), PathBuf::from("/proc/vmstat"));
        assert_eq!(sys_path("/block"), PathBuf::from("/sys/block"));
    }
}
