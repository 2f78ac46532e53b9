//! `GET /debug/pprof/profile?seconds=N`: a CPU profile of the node for N seconds, gzip-compressed
//! `profile.proto`, where Go services serve theirs: Pyroscope's and Parca's pull mode and `go
//! tool pprof http://node:9100/debug/pprof/profile?seconds=10` read it.
//!
//! Nothing is loaded until it is asked for, so an exporter nobody profiles pays nothing. A
//! request runs this very binary's `profile --pprof` (`/proc/self/exe`: its own programs, its
//! own process, detached when it ends) into a directory of its own under the temporary
//! directory, reads the file back and removes what it created. One at a time: a request while
//! another runs gets 429. The connection's slot is held for the N seconds; a client that goes
//! away, or the exchange's deadline, kills the run and removes its files.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

pub const PATH: &str = "/debug/pprof/profile";
/// Go's default.
pub const DEFAULT_SECS: u64 = 30;
pub const MAX_SECS: u64 = 120;
/// What the profile run may take beyond its N seconds (loading, symbolising, writing).
pub const SLACK: Duration = Duration::from_secs(20);
/// The largest profile read back.
const MAX_BYTES: u64 = 64 << 20;
pub const CONTENT_TYPE: &str = "application/octet-stream";

static BUSY: AtomicBool = AtomicBool::new(false);

/// The `seconds` of a query string (`seconds=10&x=y`): [`DEFAULT_SECS`] without one, an error
/// for anything but 1 to [`MAX_SECS`].
pub fn seconds(query: &str) -> Result<u64, String> {
    let Some(v) = query.split('&').find_map(|kv| kv.strip_prefix("seconds=")) else {
        return Ok(DEFAULT_SECS);
    };
    match v.parse::<u64>() {
        Ok(n) if (1..=MAX_SECS).contains(&n) => Ok(n),
        _ => Err(format!("seconds must be 1 to {MAX_SECS}, not {v:?}\n")),
    }
}

/// The running profile: killed and its files removed when dropped (the client went away, the
/// deadline passed, or it ended).
struct Run {
    child: Option<Child>,
    /// Set once this run created it.
    dir: Option<PathBuf>,
}

impl Drop for Run {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
        // Only what this run created: its two files, then its directory.
        if let Some(dir) = &self.dir {
            for f in ["profile.pb.gz", "stderr"] {
                let _ = std::fs::remove_file(dir.join(f));
            }
            let _ = std::fs::remove_dir(dir);
        }
        BUSY.store(false, Ordering::Release);
    }
}

/// The profile's bytes, or the status and the one-line reason to answer instead.
pub async fn profile(query: &str) -> Result<Vec<u8>, (u16, String)> {
    let secs = seconds(query).map_err(|e| (400, e))?;
    if BUSY.swap(true, Ordering::AcqRel) {
        return Err((
            429,
            "a profile is already running: try again when it ends\n".into(),
        ));
    }
    let dir = std::env::temp_dir().join(format!(
        "tracekit-serve-pprof-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    let mut run = Run {
        child: None,
        dir: None,
    };
    start(&mut run, &dir, secs).map_err(|e| (500, format!("{e}\n")))?;
    let deadline = Instant::now() + Duration::from_secs(secs) + SLACK;
    let status = loop {
        let c = run.child.as_mut().expect("started");
        match c.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Ok(None) => return Err((500, "the profile run did not end in time\n".into())),
            Err(e) => return Err((500, format!("waiting for the profile run: {e}\n"))),
        }
    };
    if !status.success() {
        let why = crate::host::read_text_capped(&dir.join("stderr"), 4096).unwrap_or_default();
        let why = why.lines().last().unwrap_or("").trim().to_string();
        return Err((500, format!("the profile run failed ({status}): {why}\n")));
    }
    crate::host::read_capped(&dir.join("profile.pb.gz"), MAX_BYTES)
        .map_err(|e| (500, format!("reading the profile: {e}\n")))
}

fn start(run: &mut Run, dir: &Path, secs: u64) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    // Fails if anything is there: nobody else's file is written into or removed.
    std::fs::DirBuilder::new().mode(0o700).create(dir)?;
    run.dir = Some(dir.to_path_buf());
    let stderr = std::fs::File::create_new(dir.join("stderr"))?;
    let child = Command::new("/proc/self/exe")
        .args(["profile", "--duration", &format!("{secs}s"), "--pprof"])
        .arg(dir.join("profile.pb.gz"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()?;
    run.child = Some(child);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_default_to_go_s_and_are_bounded() {
        assert_eq!(seconds(""), Ok(DEFAULT_SECS));
        assert_eq!(seconds("debug=1"), Ok(DEFAULT_SECS));
        assert_eq!(seconds("seconds=5"), Ok(5));
        assert_eq!(seconds("x=1&seconds=120"), Ok(120));
        for bad in [
            "seconds=0",
            "seconds=121",
            "seconds=-1",
            "seconds=1.5",
            "seconds=",
        ] {
            assert!(seconds(bad).is_err(), "{bad}");
        }
    }
}
