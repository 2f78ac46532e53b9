//! Readers of what the node says about itself in `/proc` and `/sys`: pure parsers (tested on
//! fixture files, no root, no BPF) plus thin functions that read the live files.
//!
//! Every file read whole goes through [`read_capped`], so a hostile or endless file
//! (`/dev/zero` behind an override variable, a runaway `/proc` file) cannot exhaust memory.
//! `TRACEKIT_PROC` and `TRACEKIT_SYS` point these readers at the host's `/proc` and `/sys` when
//! tracekit runs in a container with them mounted elsewhere (e.g. `/host/proc`).

use std::{
    io::Read,
    path::{Path, PathBuf},
};

pub mod cgroup;
pub mod container;
pub mod disks;
pub mod facts;
pub mod kallsyms;
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

/// Reads a whole file, refusing more than `limit` bytes (procfs files report size 0, so the size
/// is checked while reading). Every file tracekit reads whole goes through here: some paths come
/// from the environment (`TRACEKIT_BTF`, `TRACEKIT_TRACEFS`, `TRACEKIT_PROC`) and may name
/// `/dev/zero` or a FIFO, which must not grow tracekit's memory without bound.
pub fn read_capped(path: &Path, limit: u64) -> Result<Vec<u8>, HostError> {
    let io = |source| HostError::Read {
        path: path.to_path_buf(),
        source,
    };
    let f = std::fs::File::open(path).map_err(io)?;
    let mut buf = Vec::new();
    f.take(limit.saturating_add(1))
        .read_to_end(&mut buf)
        .map_err(io)?;
    if buf.len() as u64 > limit {
        return Err(HostError::TooLarge {
            path: path.to_path_buf(),
            limit,
        });
    }
    Ok(buf)
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
        let e = read_capped(Path::new("/dev/zero"), 1 << 16).unwrap_err();
        assert!(matches!(e, HostError::TooLarge { .. }), "{e}");
        assert!(e.to_string().contains("/dev/zero"), "{e}");
        assert!(read_capped(Path::new("/proc/self/status"), SMALL_FILE).is_ok());
        let e = read_capped(Path::new("/nonexistent/x"), 10).unwrap_err();
        assert!(e.to_string().starts_with("reading /nonexistent/x"), "{e}");
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
