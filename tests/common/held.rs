//! A workload held alive after its first report line, until released.

use std::{
    io::{BufRead, BufReader, Read},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::workload_bin;

/// A workload that stays alive after its report (so tracekit can still read its numa_maps)
/// until released.
pub struct Held {
    child: Child,
    pub pid: u32,
    pub report: Value,
}

impl Held {
    pub fn start(args: &[&str]) -> Result<Held, String> {
        let mut child = Command::new(workload_bin())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("spawn tk-workload: {e}"))?;
        let mut line = String::new();
        let mut out = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        out.read_line(&mut line).map_err(|e| e.to_string())?;
        let report: Value = match serde_json::from_str(&line) {
            Ok(v) => v,
            Err(_) => {
                let mut err = String::new();
                let _ = child.kill();
                let _ = child.stderr.take().map(|mut e| e.read_to_string(&mut err));
                return Err(format!("tk-workload {args:?} printed {line:?}: {err}"));
            }
        };
        let pid = report["pid"].as_u64().ok_or("workload printed no pid")? as u32;
        Ok(Held { child, pid, report })
    }

    /// Its run time once it sleeps for good (state S and two equal `schedstat` reads 20 ms
    /// apart): from then on it does not run until released.
    pub fn runtime_asleep(&self) -> Result<u64, String> {
        let read = |f: &str| std::fs::read_to_string(format!("/proc/{}/{f}", self.pid));
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut last = None;
        while Instant::now() < deadline {
            let state = read("stat")
                .ok()
                .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.starts_with('S')));
            let ns: Option<u64> = read("schedstat")
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse().ok());
            if state == Some(true) && ns.is_some() && ns == last {
                return Ok(ns.unwrap_or(0));
            }
            last = ns;
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(format!("workload {} never settled asleep", self.pid))
    }

    pub fn release(mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}
