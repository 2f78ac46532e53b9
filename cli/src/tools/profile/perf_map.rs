//! JIT code named by its perf map, `/tmp/perf-<pid>.map` as the process sees it (lines `START
//! SIZE name`, hex without `0x`: `tools/perf/Documentation/jit-interface.txt`).
//!
//! Read here, not by blazesym: the file is in a directory any user can write, and tracekit runs
//! as root. blazesym opens it with a blocking open (a FIFO there hung `profile` forever, past
//! SIGTERM) and maps it (a file truncated under the mapping is SIGBUS). Here it is opened with
//! [`crate::host::open_foreign`] (non-blocking, no link, a regular file, owned by the process's
//! user or root as perf requires) and read whole, capped at [`MAX_PERF_MAP_BYTES`].

use std::{path::PathBuf, rc::Rc};

use crate::host::{self, HostError};

/// Largest perf map read: a busy JVM's or Node's maps reach tens of MB.
pub const MAX_PERF_MAP_BYTES: u64 = 64 << 20;

/// One process's perf map: functions sorted by start, with what the file was when read.
pub struct PerfMap {
    /// (start, end, name), sorted by start.
    syms: Vec<(u64, u64, Rc<str>)>,
    /// The module name frames in it get (`perf-1234.map`).
    pub module: Rc<str>,
    /// (size, mtime in ns) of the file read: it is read again only when they change.
    stamp: (u64, i64),
}

/// The pid the process sees itself as (the last `NStgid` entry: its id in its own PID namespace,
/// which names its perf map) and its real and effective uids, from `/proc/<pid>/status`.
fn identity(pid: u32) -> Option<(u32, Vec<u32>)> {
    let status =
        host::read_text_capped(&host::proc_path(&format!("{pid}/status")), host::SMALL_FILE)
            .ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.split_whitespace().filter_map(|x| x.parse::<u32>().ok()))
    };
    let ns = field("NStgid:")
        .and_then(|mut v| v.next_back())
        .unwrap_or(pid);
    let uids: Vec<u32> = field("Uid:")?.take(2).collect();
    Some((ns, uids))
}

impl PerfMap {
    /// Parses perf map text; lines that do not parse are skipped (a JIT may be mid-write).
    pub fn parse(text: &[u8], module: Rc<str>) -> PerfMap {
        let mut syms: Vec<(u64, u64, Rc<str>)> = text
            .split(|&b| b == b'\n')
            .filter_map(|l| {
                let l = std::str::from_utf8(l).ok()?.trim_end_matches('\r');
                let mut it = l.splitn(3, |c: char| c.is_ascii_whitespace());
                let start = u64::from_str_radix(it.next()?, 16).ok()?;
                let size = u64::from_str_radix(it.next()?, 16).ok()?;
                let name = it.next()?.trim();
                (!name.is_empty()).then(|| (start, start.saturating_add(size), Rc::from(name)))
            })
            .collect();
        syms.sort_by_key(|s| (s.0, s.1));
        PerfMap {
            syms,
            module,
            stamp: (0, 0),
        }
    }

    /// The function containing `addr`.
    pub fn lookup(&self, addr: u64) -> Option<&Rc<str>> {
        let i = self.syms.partition_point(|s| s.0 <= addr);
        self.syms[..i]
            .iter()
            .rev()
            .take(8)
            .find(|s| addr < s.1)
            .map(|s| &s.2)
    }

    /// Reads `pid`'s perf map, or keeps `old` when the file has not changed since it was read.
    /// `Ok(None)` when the process has none (the usual case) or is gone; an error when the file
    /// there is refused (not a regular file, not the process's, too large), for the report.
    pub fn read(pid: u32, old: Option<Rc<PerfMap>>) -> Result<Option<Rc<PerfMap>>, HostError> {
        use std::os::unix::fs::MetadataExt;
        let Some((ns, mut owners)) = identity(pid) else {
            return Ok(None);
        };
        owners.push(0);
        let path: PathBuf = host::proc_path(&format!("{pid}/root/tmp/perf-{ns}.map"));
        let f = match host::open_foreign(&path, MAX_PERF_MAP_BYTES, &owners) {
            Ok(f) => f,
            Err(e) if e.kind() == Some(std::io::ErrorKind::NotFound) => return Ok(None),
            Err(e) => return Err(e),
        };
        let md = f.metadata().map_err(|source| HostError::Read {
            path: path.clone(),
            source,
        })?;
        let stamp = (md.len(), md.mtime() * 1_000_000_000 + md.mtime_nsec());
        if let Some(old) = old.filter(|o| o.stamp == stamp) {
            return Ok(Some(old));
        }
        let text = host::read_limited(&f, &path, MAX_PERF_MAP_BYTES)?;
        let mut m = PerfMap::parse(&text, Rc::from(format!("perf-{ns}.map")));
        m.stamp = stamp;
        Ok(Some(Rc::new(m)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn perf_map_lines_and_lookups() {
        let m = PerfMap::parse(
            b"1000 10 hot loop\n2000 8 [jit] b\r\nnot a line\n1800 100 outer\n3000 0\n",
            Rc::from("perf-1.map"),
        );
        assert_eq!(m.lookup(0x1000).map(|s| &**s), Some("hot loop"));
        assert_eq!(m.lookup(0x100f).map(|s| &**s), Some("hot loop"));
        assert_eq!(m.lookup(0x1010), None);
        // Nested: the innermost (latest-starting) function that contains the address.
        assert_eq!(m.lookup(0x2004).map(|s| &**s), Some("[jit] b"));
        assert_eq!(m.lookup(0x1850).map(|s| &**s), Some("outer"));
        assert_eq!(m.lookup(0x3000), None);
        assert_eq!(m.lookup(0), None);
    }

    /// This process's own perf map, as a JIT writes it, is read; none is the usual case.
    #[test]
    fn own_perf_map_is_read() {
        let pid = std::process::id();
        assert!(PerfMap::read(pid, None).unwrap().is_none());
        let path = format!("/tmp/perf-{pid}.map");
        std::fs::write(&path, "abc0 10 tk_unit_jit\n").unwrap();
        let m = PerfMap::read(pid, None);
        let _ = std::fs::remove_file(&path);
        let m = m.unwrap().unwrap();
        assert_eq!(m.lookup(0xabc4).map(|s| &**s), Some("tk_unit_jit"));
        assert_eq!(&*m.module, &*format!("perf-{pid}.map"));
    }
}
