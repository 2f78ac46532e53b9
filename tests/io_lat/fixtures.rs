//! What io-lat's root tests share: serialisation, fio, loop devices of our own, a traced run,
//! and readers of tracekit's lines.

use std::{path::PathBuf, process::Command, time::Duration};

use serde_json::Value;
use tracekit_tests::*;

pub(crate) use tracekit_tests::block::LoopDev;

/// fio from Debian, installed on first use.
pub(crate) fn ensure_fio() {
    if Command::new("fio").arg("--version").output().is_ok() {
        return;
    }
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends", "fio"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success())
    };
    if !install() {
        let _ = Command::new("apt-get").args(["update", "-q"]).status();
        assert!(install(), "installing fio failed");
    }
}

/// Runs fio on `dev` (bounded by --io_size and --runtime) at SCHED_FIFO priority, so its own
/// wakeups are not delayed behind other work on this 2-CPU machine (that delay is in fio's
/// clat but is no block-layer time). Returns fio's JSON job report.
pub(crate) fn fio(dev: &str, extra: &[&str]) -> Value {
    let out = output_ok(
        Command::new("chrt")
            .args(["-f", "20", "fio", "--name=tk", "--direct=1", "--size=64M"])
            .arg(format!("--filename={dev}"))
            .args(["--runtime=60", "--output-format=json"])
            .args(extra),
        "fio",
    );
    let v: Value = serde_json::from_slice(&out).expect("fio JSON");
    v["jobs"][0].clone()
}

pub(crate) fn rows<'a>(lines: &'a [Value], dev: &str) -> Vec<&'a Value> {
    lines
        .iter()
        .filter(|v| v["tool"] == "io-lat" && v["type"] == "summary" && v["dev"] == dev)
        .collect()
}

pub(crate) fn sum(rows: &[&Value], op: &str, key: &str) -> u64 {
    rows.iter()
        .filter(|r| r["op"] == op)
        .map(|r| r[key].as_u64().unwrap())
        .sum()
}

pub(crate) fn device<'a>(lines: &'a [Value], dev: &str) -> &'a Value {
    lines
        .iter()
        .find(|l| l["type"] == "device" && l["dev"] == dev)
        .unwrap_or_else(|| panic!("no device line for {dev}"))
}

pub(crate) fn findings(lines: &[Value]) -> Vec<&Value> {
    lines.iter().filter(|l| l["type"] == "finding").collect()
}

/// What one traced run gave.
pub(crate) struct Run {
    pub(crate) lines: Vec<Value>,
    /// /proc/diskstats (reads, writes) delta around the work.
    pub(crate) disk: (u64, u64),
    pub(crate) job: Value,
    /// Completions accepted as lost by [`traced_exact`] ([`evidenced_loss`]); 0 when exact.
    pub(crate) lost: u64,
}

/// Traces the loop device (`--dev`, plus `extra`) while `work` runs.
pub(crate) fn traced(lo: &LoopDev, extra: &[&str], work: impl FnOnce() -> Value) -> Run {
    let mut args = vec!["io-lat", "--json", "--dev", &lo.name];
    args.extend_from_slice(extra);
    let mut tk = Tracer::spawn(&args);
    tk.wait_attached();
    let before = lo.diskstats();
    let job = work();
    // fio's psync/libaio jobs end when their last request completed: nothing is in flight.
    let after = lo.diskstats();
    tk.signal(libc::SIGINT);
    let (status, lines, stderr) = tk.finish(Duration::from_secs(20));
    assert!(status.success(), "exit {status}: {stderr}");
    Run {
        lines,
        disk: (after.0 - before.0, after.1 - before.1),
        job,
        lost: 0,
    }
}

/// Whether a run's shortfall is completions the kernel never ran the programs for, each one
/// evidenced by its request coming back: `unseen` (diskstats − counted − untracked) equals the
/// requests whose address was issued (or inserted) again over an entry still marked issued
/// (`reissue` + `insert_over_issued`), and is at most 0.5 % of the requests.
///
/// Why this is accepted, measured: in two CI runs on two machines (this kernel, 6.18), 0.1–0.4 %
/// of loop0's completions never reached the `block_rq_complete` programs in any attach mode
/// (tp_btf, raw_tp; classic in one of them), with no other BPF program loaded and no recursion
/// miss counted, in every attempt of those runs, and in none of the runs between. Every such
/// loss showed as a reissue of its address, so io-lat reports it (`unseen_*`, the note). The
/// cause is not found (see the session note of 2026-12-02); the test still fails when a loss is
/// not accounted for this way, or when it is larger.
pub(crate) fn evidenced_loss(unseen: i64, anomalies: &Value, requests: u64) -> bool {
    let k = |n: &str| anomalies[n].as_i64().unwrap_or(0);
    unseen > 0
        && unseen == k("reissue") + k("insert_over_issued")
        && unseen as u64 * 1000 <= requests * 5
}

/// Runs of [`traced_exact`] before it gives up.
pub(crate) const ATTEMPTS: usize = 3;

/// [`traced`] until a run counts exactly the reads and writes diskstats counted (all rows of
/// the device, whoever issued them), at most [`ATTEMPTS`] times: on this shared 2-vCPU machine
/// the kernel has been seen to skip the programs for a burst of completions while other tracers
/// attach and detach (the device line's `unseen_*`; see the io-lat design note). Each disturbed
/// run is printed with the device line's accounting; panics when no run is exact.
pub(crate) fn traced_exact(lo: &LoopDev, extra: &[&str], work: impl Fn() -> Value) -> Run {
    let mut seen = Vec::new();
    for attempt in 1..=ATTEMPTS {
        let run = traced(lo, extra, &work);
        let r = rows(&run.lines, &lo.name);
        let counted = (sum(&r, "read", "count"), sum(&r, "write", "count"));
        if counted == run.disk {
            return run;
        }
        let dev = device(&run.lines, &lo.name);
        let stats = run.lines.iter().rev().find(|l| l["type"] == "stats");
        let unseen =
            dev["unseen_reads"].as_i64().unwrap_or(0) + dev["unseen_writes"].as_i64().unwrap_or(0);
        if let Some(st) =
            stats.filter(|st| evidenced_loss(unseen, &st["anomaly_kinds"], run.disk.0 + run.disk.1))
        {
            eprintln!(
                "attempt {attempt}: counted {counted:?}, diskstats {:?}: {unseen} completion(s) the kernel never ran the programs for, each evidenced by its request's reissue ({}); accepted (see evidenced_loss)",
                run.disk, st["anomaly_kinds"]
            );
            return Run {
                lost: unseen as u64,
                ..run
            };
        }
        let msg = format!(
            "attempt {attempt}: counted {counted:?}, diskstats {:?}; untracked {}/{} unseen {}/{}; stats {}",
            run.disk,
            dev["untracked_reads"],
            dev["untracked_writes"],
            dev["unseen_reads"],
            dev["unseen_writes"],
            stats.cloned().unwrap_or_default()
        );
        eprintln!("{msg}; {}", tracers_now());
        seen.push(msg);
    }
    panic!("no exact run in {ATTEMPTS}: {seen:#?}");
}

/// A loop device with an ext4 file system, mounted; unmounted on drop.
pub(crate) struct Mounted {
    pub(crate) mnt: PathBuf,
}

impl Mounted {
    pub(crate) fn new(lo: &LoopDev) -> Option<Mounted> {
        if Command::new("mkfs.ext4").arg("-V").output().is_err() {
            return None;
        }
        let mnt = lo.dir.join("mnt");
        std::fs::create_dir_all(&mnt).unwrap();
        let mk = Command::new("mkfs.ext4")
            .args(["-q", "-F", &lo.dev])
            .status()
            .unwrap();
        assert!(mk.success());
        let m = Command::new("mount").arg(&lo.dev).arg(&mnt).status();
        assert!(m.unwrap().success());
        Some(Mounted { mnt })
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mnt).status();
    }
}
