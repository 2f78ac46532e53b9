//! Running a tracer around a workload: start it, wait until it says it is attached, measure,
//! stop it with SIGINT; its CPU time and memory, its programs' kernel time, its start-up.

use std::{
    collections::BTreeSet,
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use serde_json::{json, Value};

use super::{
    parse::{
        parse_fdinfo_prog_id, parse_perf_record_samples, parse_proc_stat_cpu_ticks,
        parse_py_spy_samples, parse_strace_attach_ms, parse_strace_exit_ms,
        parse_sum_exec_runtime_ms,
    },
    workload::Workload,
};

/// How to tell a tracer has attached.
#[derive(Clone, Debug)]
pub(super) enum Ready {
    /// tracekit --json prints a `"type":"meta"` line after attaching.
    JsonMeta,
    /// A line on stdout or stderr containing this text (runqlat: "Tracing", bpftrace:
    /// "Attaching", triage: "Triage: watching" on stderr).
    Line(&'static str),
    /// Not measurable on this host, and why (the row reads N/A with the reason).
    NotHere(String),
    /// `perf record` prints nothing until it ends: attached once the process holds a perf
    /// event fd per online CPU (or more) and the count has not changed for 300 ms.
    PerfEvents,
    /// A BPF tool that prints nothing when it attaches (libbpf-tools offcputime): attached once
    /// the process holds programs and the set has not changed for 300 ms.
    Programs,
}

#[derive(Clone, Debug)]
pub(super) struct Tracer {
    pub(super) name: String,
    pub(super) argv: Vec<String>,
    pub(super) ready: Ready,
}

/// One measurement of one configuration.
#[derive(Clone, Debug, Default)]
pub(super) struct Sample {
    pub(super) metric: f64,
    pub(super) cpu_ms: Option<f64>,
    pub(super) rss_kib: Option<u64>,
    pub(super) hwm_kib: Option<u64>,
    pub(super) lost: Option<u64>,
    /// CPU time of the tracer up to the moment it was attached (all its threads).
    pub(super) cpu_start_ms: Option<f64>,
    /// CPU time of the tracer's whole life (start-up and exit included: perf record's build-id
    /// pass, tracekit's last report), from the rusage wait4 returns.
    pub(super) cpu_life_ms: Option<f64>,
    /// Samples the profiler took over the run (tracekit's stats, perf's closing line).
    pub(super) samples: Option<u64>,
}

struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
    /// The line that said the tracer is attached (tracekit's meta line lists program ids).
    ready_line: String,
    /// The tracer's working directory, made for it and removed with it (perf.data goes there).
    dir: std::path::PathBuf,
}

/// A tracer dropped without `stop` (a pass that failed half-way) is killed and reaped: left
/// running, its programs would weigh on every later measurement.
impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A fresh empty directory for one tracer run.
fn run_dir() -> Result<std::path::PathBuf> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let d = std::env::temp_dir().join(format!(
        "tk-bench-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d)?;
    Ok(d)
}

fn start(t: &Tracer) -> Result<Running> {
    if let Ready::NotHere(why) = &t.ready {
        bail!("{why}");
    }
    let dir = run_dir()?;
    let mut child = Command::new(&t.argv[0])
        .args(&t.argv[1..])
        .current_dir(&dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", t.name))?;
    let (tx, rx) = mpsc::channel();
    forward_lines(child.stdout.take().unwrap(), tx.clone());
    forward_lines(child.stderr.take().unwrap(), tx);
    // Owned by a Running from here on, so an early return kills it.
    let mut r = Running {
        child,
        lines: rx,
        ready_line: String::new(),
        dir,
    };
    if let Ready::PerfEvents = t.ready {
        settle_perf_events(r.child.id(), deadline(20))?;
        return Ok(r);
    }
    if let Ready::Programs = t.ready {
        settle_programs(r.child.id(), deadline(20));
        anyhow::ensure!(
            !prog_ids(r.child.id()).is_empty(),
            "{} loaded no BPF program",
            t.name
        );
        return Ok(r);
    }
    let deadline = deadline(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = r
            .lines
            .recv_timeout(left)
            .map_err(|_| anyhow::anyhow!("{} did not report attaching", t.name))?;
        let ok = match &t.ready {
            Ready::JsonMeta => line.contains("\"type\":\"meta\""),
            Ready::Line(s) => line.contains(s),
            Ready::NotHere(_) | Ready::PerfEvents | Ready::Programs => false,
        };
        if ok {
            if !matches!(t.ready, Ready::JsonMeta) {
                // bpftrace says "Attaching" before it loads and attaches: wait until the
                // process holds its programs and the set has stopped growing.
                settle_programs(r.child.id(), deadline);
            }
            r.ready_line = line;
            return Ok(r);
        }
    }
}

/// Sends every line `from` prints to `tx`, on a thread of its own.
fn forward_lines(from: impl std::io::Read + Send + 'static, tx: mpsc::Sender<String>) {
    std::thread::spawn(move || {
        for l in BufReader::new(from).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
}

/// utime + stime of `pid` in ms, and (VmRSS, VmHWM) in KiB.
fn usage(pid: u32) -> (Option<f64>, Option<u64>, Option<u64>) {
    // se.sum_exec_runtime in /proc/<pid>/task/<tid>/sched is time on CPU in ms with ns
    // precision, and is kept even where schedstats are off (then schedstat reads 0); summed
    // over the threads (/proc/<pid>/sched is the main thread's alone). utime+stime in
    // /proc/<pid>/stat (10 ms ticks) is the fallback.
    let threads: Vec<f64> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("sched")).ok())
        .filter_map(|s| parse_sum_exec_runtime_ms(&s))
        .collect();
    let cpu = (!threads.is_empty())
        .then(|| threads.iter().sum())
        .or_else(|| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            parse_proc_stat_cpu_ticks(&stat).map(|t| t as f64 * 1000.0 / clk_tck())
        });
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
    };
    (cpu, kib("VmRSS:"), kib("VmHWM:"))
}

fn clk_tck() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

fn deadline(secs: u64) -> Instant {
    Instant::now() + Duration::from_secs(secs)
}

/// Stops the tracer with SIGINT; its last lines and the CPU time of its whole life (ms).
fn stop(mut r: Running) -> Result<(Vec<String>, f64)> {
    let pid = r.child.id() as i32;
    // SAFETY: signals our own child.
    unsafe { libc::kill(pid, libc::SIGINT) };
    let deadline = deadline(15);
    let mut again = Instant::now() + Duration::from_secs(1);
    // Reaped here with wait4 for its rusage (Child::wait gives none); `Running::drop` then
    // finds no child to kill.
    // SAFETY: rusage is plain data.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        let mut status = 0;
        // SAFETY: our own child, valid pointers.
        let got = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut ru) };
        if got == pid {
            break;
        }
        if got < 0 {
            bail!("wait4: {}", std::io::Error::last_os_error());
        }
        if Instant::now() > deadline {
            let _ = r.child.kill();
            bail!("tracer did not exit on SIGINT");
        }
        if Instant::now() > again {
            // bpftrace under load now and then misses the first one.
            // SAFETY: signals our own child, not yet reaped.
            unsafe { libc::kill(r.child.id() as i32, libc::SIGINT) };
            again += Duration::from_secs(1);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut lines = Vec::new();
    while let Ok(l) = r.lines.recv_timeout(Duration::from_millis(300)) {
        lines.push(l);
    }
    Ok((lines, super::parse::rusage_ms(&ru)))
}

pub(super) fn measure(
    w: &Workload,
    t: Option<&Tracer>,
    wl: &Path,
    scratch: &Path,
) -> Result<Sample> {
    let Some(t) = t else {
        return Ok(Sample {
            metric: w.run(wl, scratch)?,
            ..Default::default()
        });
    };
    let r = start(t)?;
    let pid = r.child.id();
    let (cpu0, _, _) = usage(pid);
    let metric = w.run(wl, scratch)?;
    let (cpu1, rss, hwm) = usage(pid);
    let (lines, life) = stop(r)?;
    // tracekit reports what it could not record in its stats lines.
    let lost = lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["type"] == "stats")
        // Only where the tracer reports its losses: a tool without the counters (the floor)
        // gets "–", not a 0 nobody measured.
        .filter_map(|v| {
            let ks: Vec<u64> = ["start_map_full", "ringbuf_full"]
                .iter()
                .filter_map(|k| v[*k].as_u64())
                .collect();
            (!ks.is_empty()).then(|| ks.iter().sum::<u64>())
        })
        .reduce(|a, b| a + b);
    Ok(Sample {
        metric,
        cpu_ms: cpu1.zip(cpu0).map(|(a, b)| a - b),
        rss_kib: rss,
        hwm_kib: hwm,
        lost,
        cpu_start_ms: cpu0,
        cpu_life_ms: Some(life),
        samples: samples_taken(&lines),
    })
}

/// Where tracers' kernel time goes: with `kernel.bpf_stats_enabled=1`, each program's run count
/// and run time over one workload run (a separate pass: the statistics themselves cost), and
/// the events the kernel itself counted over the run (`Workload::events`). Every tracer of
/// `ts` is attached at once, for the whole run; one list of programs per tracer, in order.
pub(super) fn bpf_stats_pass(
    w: &Workload,
    ts: &[&Tracer],
    wl: &Path,
    scratch: &Path,
) -> Result<(Vec<Vec<Value>>, Option<f64>)> {
    let set = |v: &str| std::fs::write("/proc/sys/kernel/bpf_stats_enabled", v);
    set("1").context("enabling kernel.bpf_stats_enabled")?;
    let res = (|| -> Result<(Vec<Vec<Value>>, Option<f64>)> {
        let mut running = Vec::new();
        for t in ts {
            let r = start(t)?;
            let progs = programs(&r)?;
            running.push((t, r, progs));
        }
        let before = w.events();
        w.run(wl, scratch)?;
        let events = before.zip(w.events()).map(|(a, b)| b - a);
        let mut all = Vec::new();
        for (t, _, progs) in &running {
            let mut out = Vec::new();
            for (id, name, attach) in progs {
                let o = Command::new("bpftool")
                    .args(["prog", "show", "id", &id.to_string(), "--json"])
                    .output()?;
                let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
                let (ns, cnt) = (
                    v["run_time_ns"].as_u64().unwrap_or(0),
                    v["run_cnt"].as_u64().unwrap_or(0),
                );
                out.push(json!({
                    "tracer": t.name,
                    "program": name.clone().unwrap_or_else(|| v["name"].clone()),
                    "attach": attach.clone().unwrap_or_else(|| v["type"].clone()),
                    "run_cnt": cnt, "run_time_ns": ns,
                    "ns_per_run": if cnt > 0 { ns as f64 / cnt as f64 } else { 0.0 },
                }));
            }
            all.push(out);
        }
        for (_, r, _) in running {
            stop(r)?;
        }
        Ok((all, events))
    })();
    let _ = set("0");
    res
}

/// A program's id, and its name and attach mode where the tracer said them.
type Program = (u64, Option<Value>, Option<Value>);

/// A running tracer's programs: (id, name, attach mode) from tracekit's meta line, or, for
/// tracers that print none (the references, triage), every program the process holds an fd of
/// (`prog_id:` in /proc/<pid>/fdinfo/*: program and link fds), names and types from bpftool.
fn programs(r: &Running) -> Result<Vec<Program>> {
    let meta: Value = serde_json::from_str(&r.ready_line).unwrap_or_default();
    if let Some(ps) = meta["programs"].as_array() {
        return Ok(ps
            .iter()
            .map(|p| {
                (
                    p["id"].as_u64().unwrap_or(0),
                    Some(p["name"].clone()),
                    Some(p["attach"].clone()),
                )
            })
            .collect());
    }
    let ids = prog_ids(r.child.id());
    if ids.is_empty() {
        bail!("no BPF program fd in /proc/{}/fdinfo", r.child.id());
    }
    Ok(ids.into_iter().map(|id| (id, None, None)).collect())
}

/// The ids of the BPF programs `pid` holds a program or link fd of.
fn prog_ids(pid: u32) -> BTreeSet<u64> {
    let dir = format!("/proc/{pid}/fdinfo");
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
        .filter_map(|text| parse_fdinfo_prog_id(&text))
        .collect()
}

/// Samples a profiler took: tracekit's stats lines (`samples` + `idle_samples`: perf -a
/// records the idle CPUs' samples too), or perf record's closing line.
fn samples_taken(lines: &[String]) -> Option<u64> {
    let tk = lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["type"] == "stats" && v["samples"].is_u64())
        .map(|v| v["samples"].as_u64().unwrap_or(0) + v["idle_samples"].as_u64().unwrap_or(0))
        .reduce(|a, b| a + b);
    tk.or_else(|| lines.iter().find_map(|l| parse_perf_record_samples(l)))
        .or_else(|| lines.iter().find_map(|l| parse_py_spy_samples(l)))
}

/// Waits (until `deadline`) for `pid` to hold a perf event fd per online CPU, the same number
/// for 300 ms.
fn settle_perf_events(pid: u32, deadline: Instant) -> Result<()> {
    let ncpu = std::thread::available_parallelism().map_or(1, |n| n.get());
    let count = || {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .into_iter()
            .flatten()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|l| l.to_string_lossy() == "anon_inode:[perf_event]")
            .count()
    };
    let (mut last, mut since) = (0, Instant::now());
    while Instant::now() < deadline {
        let now = count();
        if now != last {
            (last, since) = (now, Instant::now());
        } else if last >= ncpu && since.elapsed() >= Duration::from_millis(300) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    bail!("perf opened {last} perf event fds, fewer than one per CPU ({ncpu})")
}

/// Waits (until `deadline`) for `pid` to hold programs, the same set for 300 ms.
fn settle_programs(pid: u32, deadline: Instant) {
    let mut last = BTreeSet::new();
    let mut since = Instant::now();
    while Instant::now() < deadline {
        let now = prog_ids(pid);
        if now != last {
            (last, since) = (now, Instant::now());
        } else if !last.is_empty() && since.elapsed() >= Duration::from_millis(300) {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Per run: (exec to the last attach, the report's last write to the process's end), in ms.
pub(super) fn startup_ms(argv: &[String], runs: usize) -> Result<Vec<(f64, Option<f64>)>> {
    let mut out = Vec::new();
    for i in 0..runs {
        let f = std::env::temp_dir().join(format!("tk-bench-strace-{i}"));
        let dir = run_dir()?;
        let st = Command::new("strace")
            .current_dir(&dir)
            .args([
                "-f",
                "-ttt",
                "--seccomp-bpf",
                "-e",
                "trace=execve,bpf,ioctl,write,exit_group",
                "-o",
            ])
            .arg(&f)
            .args(argv)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()?;
        let _ = st;
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        if let Some(ms) = parse_strace_attach_ms(&text) {
            out.push((ms, parse_strace_exit_ms(&text)));
        }
        let _ = std::fs::remove_file(f);
        let _ = std::fs::remove_dir_all(dir);
    }
    Ok(out)
}

pub(super) fn tracekit_has(bin: &Path, tool: &str) -> bool {
    Command::new(bin)
        .args([tool, "--help"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
