//! The workloads the benchmark times, each run once per call with its metric (lower is better).

use std::{path::Path, process::Command};

use anyhow::{Context as _, Result};
use serde_json::Value;

use super::parse::{parse_perf_pipe, parse_stress_ng};

#[derive(Clone, Debug)]
pub(super) enum Workload {
    /// `perf bench sched pipe -l N`, optionally pinned to CPU 1. Metric: µs per op.
    Pipe { loops: u32, pinned: bool },
    /// `stress-ng --switch 2 -t S`. Metric: ns per bogo op (1e9 / ops per second).
    SwitchStorm { secs: u32 },
    /// `tk-workload fsync PATH N 0`. Metric: mean ns per fsync.
    Fsync { n: u32 },
    /// `tk-workload compact`, N times (each compacts every zone). Metric: ns per compaction run.
    Compaction { n: u32 },
    /// `taskset -c 1 perf bench syscall basic -l N` (getppid): what every syscall pays while a
    /// syscall tracer runs. Metric: ns per syscall.
    Syscalls { loops: u32 },
}

impl Workload {
    pub(super) fn name(&self) -> String {
        match self {
            Workload::Pipe {
                loops,
                pinned: true,
            } => format!("taskset -c 1 perf bench sched pipe -l {loops}"),
            Workload::Pipe {
                loops,
                pinned: false,
            } => format!("perf bench sched pipe -l {loops} (unpinned)"),
            Workload::SwitchStorm { secs } => format!("stress-ng --switch 2 -t {secs}"),
            Workload::Fsync { n } => {
                format!("fsync loop: {n} × (write 4 KiB + fsync) on the work tree")
            }
            Workload::Compaction { n } => {
                format!("compaction loop: {n} × echo 1 > /proc/sys/vm/compact_memory")
            }
            Workload::Syscalls { loops } => {
                format!("taskset -c 1 perf bench syscall basic -l {loops} (getppid, not traced)")
            }
        }
    }

    pub(super) fn unit(&self) -> &'static str {
        match self {
            Workload::Pipe { .. } => "us/op",
            Workload::SwitchStorm { .. } => "ns/switch-op",
            Workload::Fsync { .. } => "ns/fsync",
            Workload::Compaction { .. } => "ns/compaction",
            Workload::Syscalls { .. } => "ns/syscall",
        }
    }

    /// Runs once; returns the metric (lower is better).
    pub(super) fn run(&self, workload_bin: &Path, scratch: &Path) -> Result<f64> {
        match self {
            Workload::Pipe { loops, pinned } => {
                let mut c = if *pinned {
                    let mut c = Command::new("taskset");
                    c.args(["-c", "1", "perf"]);
                    c
                } else {
                    Command::new("perf")
                };
                c.args(["bench", "sched", "pipe", "-l", &loops.to_string()]);
                let out = c.output().context("perf bench sched pipe")?;
                parse_perf_pipe(&String::from_utf8_lossy(&out.stdout))
                    .context("parsing perf bench output")
            }
            Workload::SwitchStorm { secs } => {
                let out = Command::new("stress-ng")
                    .args(["--switch", "2", "-t", &secs.to_string(), "--metrics-brief"])
                    .output()
                    .context("stress-ng")?;
                let text = format!(
                    "{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
                let ops = parse_stress_ng(&text).context("parsing stress-ng output")?;
                Ok(1e9 / ops)
            }
            Workload::Fsync { n } => {
                let out = Command::new(workload_bin)
                    .args([
                        "fsync",
                        scratch.join("bench-fsync").to_str().unwrap(),
                        &n.to_string(),
                        "0",
                    ])
                    .output()?;
                let v: Value = serde_json::from_slice(&out.stdout).context("tk-workload output")?;
                let ns: Vec<f64> = v["fsync_ns"]
                    .as_array()
                    .context("fsync_ns")?
                    .iter()
                    .filter_map(Value::as_f64)
                    .collect();
                Ok(ns.iter().sum::<f64>() / ns.len().max(1) as f64)
            }
            Workload::Syscalls { loops } => {
                let out = Command::new("taskset")
                    .args(["-c", "1", "perf", "bench", "syscall", "basic", "-l"])
                    .arg(loops.to_string())
                    .output()
                    .context("perf bench syscall basic")?;
                let us = parse_perf_pipe(&String::from_utf8_lossy(&out.stdout))
                    .context("parsing perf bench syscall output")?;
                Ok(us * 1000.0)
            }
            Workload::Compaction { n } => {
                let mut total = 0.0;
                for _ in 0..*n {
                    let out = Command::new(workload_bin).arg("compact").output()?;
                    let v: Value = serde_json::from_slice(&out.stdout)
                        .context("tk-workload compact output")?;
                    total += v["wall_ns"].as_f64().context("wall_ns")?;
                }
                Ok(total / f64::from((*n).max(1)))
            }
        }
    }
}
