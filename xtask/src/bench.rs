//! `cargo xtask bench [--quick]`: tracekit's cost beside libbpf-tools and bpftrace, measured the
//! same way in the same run, written to docs/benchmarks.md and docs/benchmarks.json.
//!
//! Method: for each workload, every configuration (nothing traced, the floor program, each
//! tracekit tool, the references) runs once per round, in the same order each round (A B C A B C
//! …), for at least five rounds; the median and the min–max spread are reported. A tracer is
//! started, waited for until it reports being attached, then the workload runs, then the tracer
//! gets SIGINT. Tracer CPU is utime + stime from /proc/<pid>/stat read just before SIGINT; RSS is
//! VmRSS (steady) and VmHWM (peak) at the same moment. Start-up is exec to the last attach
//! syscall, and exit is the last write of the report to the process's end (detaching included),
//! both from `strace -f -ttt --seccomp-bpf`.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use serde_json::{json, Value};

use crate::{build, root, toolchain};

const PACKAGES: [&str; 7] = [
    "libbpf-tools",
    "bpftrace",
    "linux-perf",
    "stress-ng",
    "fio",
    "strace",
    "bpftool",
];

/// How to tell a tracer has attached.
#[derive(Clone, Debug)]
enum Ready {
    /// tracekit --json prints a `"type":"meta"` line after attaching.
    JsonMeta,
    /// A line on stdout containing this text (runqlat: "Tracing", bpftrace: "Attaching").
    Line(&'static str),
}

#[derive(Clone, Debug)]
struct Tracer {
    name: String,
    argv: Vec<String>,
    ready: Ready,
}

#[derive(Clone, Debug)]
enum Workload {
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
    fn name(&self) -> String {
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

    fn unit(&self) -> &'static str {
        match self {
            Workload::Pipe { .. } => "us/op",
            Workload::SwitchStorm { .. } => "ns/switch-op",
            Workload::Fsync { .. } => "ns/fsync",
            Workload::Compaction { .. } => "ns/compaction",
            Workload::Syscalls { .. } => "ns/syscall",
        }
    }

    /// Runs once; returns the metric (lower is better).
    fn run(&self, workload_bin: &Path, scratch: &Path) -> Result<f64> {
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

/// One measurement of one configuration.
#[derive(Clone, Debug, Default)]
struct Sample {
    metric: f64,
    cpu_ms: Option<f64>,
    rss_kib: Option<u64>,
    hwm_kib: Option<u64>,
    lost: Option<u64>,
}

struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
    /// The line that said the tracer is attached (tracekit's meta line lists program ids).
    ready_line: String,
}

fn start(t: &Tracer) -> Result<Running> {
    let mut child = Command::new(&t.argv[0])
        .args(&t.argv[1..])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", t.name))?;
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx
            .recv_timeout(left)
            .map_err(|_| anyhow::anyhow!("{} did not report attaching", t.name))?;
        let ok = match &t.ready {
            Ready::JsonMeta => line.contains("\"type\":\"meta\""),
            Ready::Line(s) => line.contains(s),
        };
        if ok {
            return Ok(Running {
                child,
                lines: rx,
                ready_line: line,
            });
        }
    }
}

/// utime + stime of `pid` in ms, and (VmRSS, VmHWM) in KiB.
fn usage(pid: u32) -> (Option<f64>, Option<u64>, Option<u64>) {
    // se.sum_exec_runtime in /proc/<pid>/sched is time on CPU in ms with ns precision, and is
    // kept even where schedstats are off (then /proc/<pid>/schedstat reads 0); utime+stime in
    // /proc/<pid>/stat (10 ms ticks) is the fallback.
    let cpu = std::fs::read_to_string(format!("/proc/{pid}/sched"))
        .ok()
        .and_then(|s| parse_sum_exec_runtime_ms(&s))
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

fn stop(mut r: Running) -> Result<Vec<String>> {
    // SAFETY: signals our own child.
    unsafe { libc::kill(r.child.id() as i32, libc::SIGINT) };
    let deadline = Instant::now() + Duration::from_secs(15);
    while r.child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            let _ = r.child.kill();
            bail!("tracer did not exit on SIGINT");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut lines = Vec::new();
    while let Ok(l) = r.lines.recv_timeout(Duration::from_millis(300)) {
        lines.push(l);
    }
    Ok(lines)
}

fn measure(w: &Workload, t: Option<&Tracer>, wl: &Path, scratch: &Path) -> Result<Sample> {
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
    let lines = stop(r)?;
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
    })
}

/// Median of `v` (mean of the middle two for even lengths).
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

pub fn spread(v: &[f64]) -> (f64, f64) {
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (min, max)
}

/// `      4.012345 usecs/op` from `perf bench sched pipe`.
pub fn parse_perf_pipe(out: &str) -> Option<f64> {
    out.lines()
        .find(|l| l.contains("usecs/op"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// `bogo ops/s (real time)` of the `switch` stressor from `stress-ng --metrics-brief`.
pub fn parse_stress_ng(out: &str) -> Option<f64> {
    // stress-ng: metrc: [6646] switch  164874  1.00  0.13  1.09  164734.12  134279.27
    out.lines()
        .filter(|l| l.contains("metrc:") || l.contains("info:"))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let i = f.iter().position(|x| *x == "switch")?;
            let nums: Vec<f64> = f[i + 1..].iter().filter_map(|x| x.parse().ok()).collect();
            (nums.len() >= 5).then(|| nums[4])
        })
        .next()
}

/// utime + stime (clock ticks) from a /proc/<pid>/stat line; the comm may contain spaces and
/// parentheses, so fields are counted after the last ')'.
pub fn parse_proc_stat_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the comm: state(3) … utime is field 14, stime 15 overall → index 11, 12 here.
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// `se.sum_exec_runtime : 12.345678` (ms) from /proc/<pid>/sched.
pub fn parse_sum_exec_runtime_ms(sched: &str) -> Option<f64> {
    sched
        .lines()
        .find(|l| l.trim_start().starts_with("se.sum_exec_runtime"))
        .and_then(|l| l.split(':').nth(1))
        .and_then(|v| v.trim().parse().ok())
}

/// Milliseconds from the first execve to the last attach syscall in `strace -ttt` output.
pub fn parse_strace_attach_ms(trace: &str) -> Option<f64> {
    let ts = |l: &str| -> Option<f64> {
        let mut it = l.split_whitespace();
        let first = it.next()?;
        // With -f, lines start with the pid.
        let t = if first.contains('.') {
            first
        } else {
            it.next()?
        };
        t.parse().ok()
    };
    let start = trace.lines().find(|l| l.contains("execve("))?;
    let attach = |l: &&str| {
        l.contains("BPF_LINK_CREATE")
            || l.contains("BPF_RAW_TRACEPOINT_OPEN")
            || l.contains("PERF_EVENT_IOC_SET_BPF")
            || l.contains("PERF_EVENT_IOC_ENABLE")
    };
    let last = trace
        .lines()
        .filter(attach)
        .rfind(|l| !l.contains("= -1"))?;
    Some((ts(last)? - ts(start)?) * 1000.0)
}

/// Milliseconds from the last write to stdout (the report) to the end of the process in
/// `strace -f -ttt` output: what detaching and exiting cost after the user has the answer.
pub fn parse_strace_exit_ms(trace: &str) -> Option<f64> {
    let ts = |l: &str| -> Option<f64> {
        let mut it = l.split_whitespace();
        let first = it.next()?;
        let t = if first.contains('.') {
            first
        } else {
            it.next()?
        };
        t.parse().ok()
    };
    let lines: Vec<&str> = trace.lines().collect();
    let end = lines.iter().rposition(|l| l.contains("+++ exited with"))?;
    let last_write = lines[..end]
        .iter()
        .rposition(|l| l.contains(" write(1, "))?;
    Some((ts(lines[end])? - ts(lines[last_write])?) * 1000.0)
}

/// Where a tracekit tool's kernel time goes: with `kernel.bpf_stats_enabled=1`, each program's
/// run count and run time over one workload run (a separate pass: the statistics themselves cost).
fn bpf_stats_pass(w: &Workload, t: &Tracer, wl: &Path, scratch: &Path) -> Result<Vec<Value>> {
    let set = |v: &str| std::fs::write("/proc/sys/kernel/bpf_stats_enabled", v);
    set("1").context("enabling kernel.bpf_stats_enabled")?;
    let res = (|| -> Result<Vec<Value>> {
        let r = start(t)?;
        let meta: Value = serde_json::from_str(&r.ready_line).unwrap_or_default();
        w.run(wl, scratch)?;
        let mut out = Vec::new();
        for p in meta["programs"].as_array().into_iter().flatten() {
            let id = p["id"].as_u64().unwrap_or(0);
            let o = Command::new("bpftool")
                .args(["prog", "show", "id", &id.to_string(), "--json"])
                .output()?;
            let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
            let (ns, cnt) = (
                v["run_time_ns"].as_u64().unwrap_or(0),
                v["run_cnt"].as_u64().unwrap_or(0),
            );
            out.push(json!({
                "tracer": t.name, "program": p["name"], "attach": p["attach"],
                "run_cnt": cnt, "run_time_ns": ns,
                "ns_per_run": if cnt > 0 { ns as f64 / cnt as f64 } else { 0.0 },
            }));
        }
        stop(r)?;
        Ok(out)
    })();
    let _ = set("0");
    res
}

/// One program's figures over the rounds of the bpf_stats pass: attach mode, ns per run (rounds
/// where it ran), run counts.
type ProgRounds = (Value, Vec<f64>, Vec<f64>);

/// Per run: (exec to the last attach, the report's last write to the process's end), in ms.
fn startup_ms(argv: &[String], runs: usize) -> Result<Vec<(f64, Option<f64>)>> {
    let mut out = Vec::new();
    for i in 0..runs {
        let f = std::env::temp_dir().join(format!("tk-bench-strace-{i}"));
        let st = Command::new("strace")
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
    }
    Ok(out)
}

fn tracekit_has(bin: &Path, tool: &str) -> bool {
    Command::new(bin)
        .args([tool, "--help"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn ensure_packages() -> Result<()> {
    toolchain::ensure_debian(
        &PACKAGES,
        "the reference tools and workloads the benchmark runs",
    )
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

pub fn run(args: &[String]) -> Result<()> {
    let quick = args.iter().any(|a| a == "--quick");
    if args.iter().any(|a| a == "--render") {
        // Rewrite docs/benchmarks.md from docs/benchmarks.json without measuring again.
        let docs = root().join("docs");
        let doc: Value =
            serde_json::from_str(&std::fs::read_to_string(docs.join("benchmarks.json"))?)?;
        std::fs::write(docs.join("benchmarks.md"), markdown(&doc))?;
        return Ok(());
    }
    toolchain::ensure()?;
    ensure_packages()?;
    let tk = build()?;
    let tk_s = tk.to_string_lossy().into_owned();
    let wl = root().join("target/x86_64-unknown-linux-gnu/release/tk-workload");
    let scratch = root().join("target/bench-scratch");
    std::fs::create_dir_all(&scratch)?;
    let rounds = if quick { 5 } else { 7 };
    let started = Instant::now();

    let tkj = |tool: &str, extra: &[&str]| {
        let mut a = vec![tk_s.clone(), tool.to_string(), "--json".to_string()];
        a.extend(extra.iter().map(|x| x.to_string()));
        a
    };
    let mut sched: Vec<Tracer> = vec![
        Tracer {
            name: "floor: Aya per-CPU counter, tp_btf sched_switch".into(),
            argv: tkj("bench-floor", &["--hook", "sched-switch"]),
            ready: Ready::JsonMeta,
        },
        Tracer {
            name: "floor: same, classic tracepoint".into(),
            argv: tkj("bench-floor", &["--hook", "sched-switch-tp"]),
            ready: Ready::JsonMeta,
        },
    ];
    for tool in ["ctxsw", "runq-lat"] {
        if tracekit_has(&tk, tool) {
            sched.push(Tracer {
                name: format!("tracekit {tool}"),
                argv: tkj(tool, &[]),
                ready: Ready::JsonMeta,
            });
        }
    }
    sched.push(Tracer {
        name: "libbpf-tools runqlat".into(),
        argv: s(&["stdbuf", "-oL", "runqlat"]),
        ready: Ready::Line("Tracing"),
    });
    sched.push(Tracer {
        name: "bpftrace count by comm".into(),
        argv: s(&[
            "stdbuf",
            "-oL",
            "bpftrace",
            "-e",
            "tracepoint:sched:sched_switch { @[comm] = count(); }",
        ]),
        ready: Ready::Line("Attaching"),
    });
    let fsync: Vec<Tracer> = vec![
        // The floor on the same hooks as fsync-lat (enter and exit), so per-call kernel time
        // compares like for like (it used to be on sys_enter_fsync only: one run per call
        // against fsync-lat's two).
        Tracer { name: "floor: Aya counter, tracepoints sys_enter_fsync + sys_exit_fsync".into(), argv: tkj("bench-floor", &["--hook", "fsync-pair"]), ready: Ready::JsonMeta },
        Tracer { name: "floor: Aya counter, tp_btf sys_enter".into(), argv: tkj("bench-floor", &["--hook", "sys-enter"]), ready: Ready::JsonMeta },
        Tracer { name: "tracekit fsync-lat".into(), argv: tkj("fsync-lat", &[]), ready: Ready::JsonMeta },
        Tracer {
            name: "bpftrace fsync latency hist".into(),
            argv: s(&[
                "stdbuf",
                "-oL",
                "bpftrace",
                "-e",
                "tracepoint:syscalls:sys_enter_fsync { @s[tid] = nsecs; } tracepoint:syscalls:sys_exit_fsync /@s[tid]/ { @ns = hist(nsecs - @s[tid]); delete(@s[tid]); }",
            ]),
            ready: Ready::Line("Attaching"),
        },
    ];

    let compaction: Vec<Tracer> = vec![
        Tracer { name: "tracekit memstall".into(), argv: tkj("memstall", &[]), ready: Ready::JsonMeta },
        Tracer {
            name: "bpftrace compaction latency hist".into(),
            argv: s(&[
                "stdbuf",
                "-oL",
                "bpftrace",
                "-e",
                "tracepoint:compaction:mm_compaction_begin { @s[tid] = nsecs; } tracepoint:compaction:mm_compaction_end /@s[tid]/ { @ns[comm] = hist(nsecs - @s[tid]); delete(@s[tid]); }",
            ]),
            ready: Ready::Line("Attaching"),
        },
    ];
    let loops = if quick { 50_000 } else { 200_000 };
    let cases: Vec<(Workload, Vec<Tracer>)> = vec![
        (
            Workload::Pipe {
                loops,
                pinned: true,
            },
            sched.clone(),
        ),
        (
            Workload::Pipe {
                loops,
                pinned: false,
            },
            sched
                .iter()
                .filter(|t| !t.name.contains("classic"))
                .cloned()
                .collect(),
        ),
        (
            Workload::SwitchStorm {
                secs: if quick { 1 } else { 3 },
            },
            sched
                .iter()
                .filter(|t| !t.name.contains("classic"))
                .cloned()
                .collect(),
        ),
        (
            Workload::Fsync {
                n: if quick { 300 } else { 2000 },
            },
            fsync.clone(),
        ),
        (
            Workload::Syscalls {
                loops: if quick { 2_000_000 } else { 10_000_000 },
            },
            fsync.clone(),
        ),
        (
            Workload::Compaction {
                n: if quick { 3 } else { 10 },
            },
            compaction,
        ),
    ];

    let mut report = Vec::new();
    for (w, tracers) in &cases {
        eprintln!(
            "bench: {} ({} configurations × {rounds} rounds)",
            w.name(),
            tracers.len() + 1
        );
        let mut samples: BTreeMap<usize, Vec<Sample>> = BTreeMap::new();
        let mut failures: BTreeMap<usize, String> = BTreeMap::new();
        for _ in 0..rounds {
            for i in 0..=tracers.len() {
                if failures.contains_key(&i) {
                    continue;
                }
                let t = if i == 0 { None } else { Some(&tracers[i - 1]) };
                match measure(w, t, &wl, &scratch) {
                    Ok(s) => samples.entry(i).or_default().push(s),
                    Err(e) => {
                        eprintln!(
                            "bench: {}: {e:#}",
                            t.map_or("untraced", |t| t.name.as_str())
                        );
                        failures.insert(i, format!("{e:#}"));
                    }
                }
            }
        }
        let base = samples
            .get(&0)
            .map(|v| median(&v.iter().map(|s| s.metric).collect::<Vec<_>>()))
            .unwrap_or(f64::NAN);
        let mut rows = Vec::new();
        for i in 0..=tracers.len() {
            let name = if i == 0 {
                "nothing traced".to_string()
            } else {
                tracers[i - 1].name.clone()
            };
            let Some(v) = samples.get(&i).filter(|_| !failures.contains_key(&i)) else {
                let why = failures
                    .get(&i)
                    .cloned()
                    .unwrap_or_else(|| "did not run".into());
                rows.push(json!({"config": name, "status": format!("N/A: {why}")}));
                continue;
            };
            let m: Vec<f64> = v.iter().map(|s| s.metric).collect();
            let med = median(&m);
            let (lo, hi) = spread(&m);
            let opt_med = |f: &dyn Fn(&Sample) -> Option<f64>| {
                let xs: Vec<f64> = v.iter().filter_map(f).collect();
                (!xs.is_empty()).then(|| median(&xs))
            };
            rows.push(json!({
                "config": name,
                "median": med, "min": lo, "max": hi, "unit": w.unit(), "runs": m.len(),
                "slowdown_pct": if i == 0 { 0.0 } else { (med / base - 1.0) * 100.0 },
                "tracer_cpu_ms": opt_med(&|s| s.cpu_ms),
                "rss_kib": opt_med(&|s| s.rss_kib.map(|x| x as f64)),
                "rss_peak_kib": opt_med(&|s| s.hwm_kib.map(|x| x as f64)),
                "events_lost": v.iter().filter_map(|s| s.lost).max(),
            }));
        }
        report.push(json!({"workload": w.name(), "rows": rows}));
    }

    // Where the kernel time goes, per program (separate pass): every tracer once per round,
    // interleaved like the main pass, medians over the rounds (one run each was mostly noise:
    // the same program measured 147 and 460 ns per run a minute apart here).
    let mut prog_stats = Vec::new();
    let mut per_call = Vec::new();
    let pipe = Workload::Pipe {
        loops,
        pinned: true,
    };
    let fsync_calls = match &cases[3].0 {
        Workload::Fsync { n } => *n as f64,
        _ => f64::NAN,
    };
    for (w, tracers, calls) in [
        (&pipe, &cases[0].1, None),
        (&cases[3].0, &cases[3].1, Some(fsync_calls)),
    ] {
        let tracers: Vec<&Tracer> = tracers
            .iter()
            .filter(|t| matches!(t.ready, Ready::JsonMeta))
            .collect();
        // (tracer, program) -> (attach, [ns per run], [run count]); tracer -> [ns per call]
        let mut runs: BTreeMap<(usize, String), ProgRounds> = BTreeMap::new();
        let mut calls_ns: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
        for _ in 0..rounds {
            for (i, t) in tracers.iter().enumerate() {
                match bpf_stats_pass(w, t, &wl, &scratch) {
                    Ok(v) => {
                        let mut total = 0.0;
                        for p in v {
                            let e = runs
                                .entry((i, p["program"].as_str().unwrap_or("").to_string()))
                                .or_insert_with(|| (p["attach"].clone(), vec![], vec![]));
                            let cnt = p["run_cnt"].as_f64().unwrap_or(0.0);
                            if cnt > 0.0 {
                                e.1.push(p["ns_per_run"].as_f64().unwrap_or(0.0));
                            }
                            e.2.push(cnt);
                            total += p["run_time_ns"].as_f64().unwrap_or(0.0);
                        }
                        if let Some(n) = calls {
                            calls_ns.entry(i).or_default().push(total / n);
                        }
                    }
                    Err(e) => eprintln!("bench: bpf stats for {}: {e:#}", t.name),
                }
            }
        }
        for ((i, prog), (attach, ns, cnt)) in runs {
            prog_stats.push(json!({
                "tracer": tracers[i].name, "program": prog, "attach": attach,
                "run_cnt": median(&cnt), "ns_per_run": if ns.is_empty() { 0.0 } else { median(&ns) },
                "rounds": ns.len(),
            }));
        }
        for (i, v) in calls_ns {
            let (lo, hi) = spread(&v);
            per_call.push(json!({
                "tracer": tracers[i].name, "ns_per_call": median(&v), "min": lo, "max": hi,
                "rounds": v.len(),
            }));
        }
    }

    // Start-up: exec to the last attach syscall; exit: the report's last write to the end.
    let mut startup = Vec::new();
    let mut st_cases: Vec<(String, Vec<String>)> = vec![(
        "tracekit fsync-lat".into(),
        s(&[&tk_s, "fsync-lat", "--duration", "300ms"]),
    )];
    for tool in ["memstall", "ctxsw", "runq-lat"] {
        if tracekit_has(&tk, tool) {
            st_cases.push((
                format!("tracekit {tool}"),
                s(&[&tk_s, tool, "--duration", "300ms"]),
            ));
        }
    }
    st_cases.push(("libbpf-tools runqlat".into(), s(&["runqlat", "1", "1"])));
    st_cases.push((
        "bpftrace one-probe script".into(),
        s(&[
            "bpftrace",
            "-e",
            "tracepoint:sched:sched_switch { @[comm] = count(); } interval:ms:300 { exit(); }",
        ]),
    ));
    // Interleaved like everything else (A B C … A B C …): run one after the other, a burst of
    // load from elsewhere landed on one tool's runs and skewed the ratio to runqlat.
    let mut st_runs: Vec<Vec<(f64, Option<f64>)>> = vec![Vec::new(); st_cases.len()];
    for _ in 0..rounds.max(7) {
        for (i, (_, argv)) in st_cases.iter().enumerate() {
            st_runs[i].extend(startup_ms(argv, 1)?);
        }
    }
    for ((name, _), runs) in st_cases.iter().zip(&st_runs) {
        let v: Vec<f64> = runs.iter().map(|r| r.0).collect();
        let x: Vec<f64> = runs.iter().filter_map(|r| r.1).collect();
        let (lo, hi) = spread(&v);
        let (xlo, xhi) = spread(&x);
        startup.push(json!({
            "tool": name, "median_ms": median(&v), "min_ms": lo, "max_ms": hi, "runs": v.len(),
            "exit_median_ms": if x.is_empty() { Value::Null } else { json!(median(&x)) },
            "exit_min_ms": xlo, "exit_max_ms": xhi,
        }));
    }

    let doc = json!({
        "date": humantime_now(),
        "machine": machine(),
        "quick": quick,
        "rounds": rounds,
        "wall_s": started.elapsed().as_secs(),
        "workloads": report,
        "startup": startup,
        "bpf_stats": prog_stats,
        "bpf_per_call": per_call,
    });
    let docs = root().join("docs");
    std::fs::create_dir_all(&docs)?;
    std::fs::write(
        docs.join("benchmarks.json"),
        serde_json::to_string_pretty(&doc)? + "\n",
    )?;
    std::fs::write(docs.join("benchmarks.md"), markdown(&doc))?;
    eprintln!(
        "bench: wrote docs/benchmarks.md and docs/benchmarks.json in {} s",
        started.elapsed().as_secs()
    );
    print!("{}", markdown(&doc));
    Ok(())
}

fn humantime_now() -> String {
    Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn machine() -> Value {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .unwrap_or("")
        .trim()
        .to_string();
    let ncpu = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    json!({"kernel": kernel, "cpu": cpu, "cpus": ncpu})
}

fn fmt_opt(v: &Value, digits: usize) -> String {
    v.as_f64()
        .map(|x| format!("{x:.digits$}"))
        .unwrap_or_else(|| "–".into())
}

/// The report as Markdown: one table per workload, then start-up.
pub fn markdown(doc: &Value) -> String {
    let mut m = String::new();
    m.push_str("# tracekit benchmarks\n\n");
    m.push_str(&format!(
        "Measured {} on {} ({} CPUs, kernel {}) by `cargo xtask bench{}`, {} rounds, {} s.\n\n",
        doc["date"].as_str().unwrap_or(""),
        doc["machine"]["cpu"].as_str().unwrap_or(""),
        doc["machine"]["cpus"],
        doc["machine"]["kernel"].as_str().unwrap_or(""),
        if doc["quick"] == true { " --quick" } else { "" },
        doc["rounds"],
        doc["wall_s"],
    ));
    m.push_str("Method: configurations interleaved in every round (A B C … A B C …); medians with the min–max spread; slowdown is the workload's median against the untraced median of the same run. Tracer CPU is the tracer process's own time on CPU over the workload (se.sum_exec_runtime in /proc/<pid>/sched; the kernel programs' cost shows up in the workload's slowdown, not here); RSS is VmRSS / VmHWM at the end. Events lost: what tracekit's kernel counters say it could not record (– where a tool does not report it). Start-up: exec to the last attach syscall; exit: the report's last write to stdout to the end of the process, detaching included (`strace -f -ttt --seccomp-bpf -e trace=execve,bpf,ioctl,write,exit_group`).\n\n");
    for w in doc["workloads"].as_array().into_iter().flatten() {
        m.push_str(&format!("## {}\n\n", w["workload"].as_str().unwrap_or("")));
        m.push_str("| configuration | median | spread | slowdown | tracer CPU | RSS / peak | events lost |\n|---|---|---|---|---|---|---|\n");
        for r in w["rows"].as_array().into_iter().flatten() {
            if r["median"].is_null() {
                m.push_str(&format!(
                    "| {} | {} | | | | | |\n",
                    r["config"].as_str().unwrap_or(""),
                    r["status"].as_str().unwrap_or("")
                ));
                continue;
            }
            let unit = r["unit"].as_str().unwrap_or("");
            let rss = match (r["rss_kib"].as_f64(), r["rss_peak_kib"].as_f64()) {
                (Some(a), Some(b)) => format!("{:.1} / {:.1} MiB", a / 1024.0, b / 1024.0),
                _ => "–".into(),
            };
            m.push_str(&format!(
                "| {} | {} {unit} | {}–{} | {}% | {} ms | {} | {} |\n",
                r["config"].as_str().unwrap_or(""),
                fmt_opt(&r["median"], 2),
                fmt_opt(&r["min"], 2),
                fmt_opt(&r["max"], 2),
                fmt_opt(&r["slowdown_pct"], 1),
                fmt_opt(&r["tracer_cpu_ms"], 2),
                rss,
                r["events_lost"]
                    .as_u64()
                    .map(|x| x.to_string())
                    .unwrap_or_else(|| "–".into()),
            ));
        }
        m.push('\n');
    }
    m.push_str(&format!("## Where the kernel time goes (kernel.bpf_stats_enabled=1, separate pass, median of {} interleaved rounds)\n\n| tracer | program | attach | runs | ns per run |\n|---|---|---|---|---|\n", doc["rounds"]));
    for p in doc["bpf_stats"].as_array().into_iter().flatten() {
        m.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            p["tracer"].as_str().unwrap_or(""),
            p["program"].as_str().unwrap_or(""),
            p["attach"].as_str().unwrap_or(""),
            fmt_opt(&p["run_cnt"], 0),
            fmt_opt(&p["ns_per_run"], 0)
        ));
    }
    m.push('\n');
    let calls: Vec<&Value> = doc["bpf_per_call"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    if !calls.is_empty() {
        m.push_str("Kernel time per fsync call, all of a tracer's programs (enter + exit), same hooks, median over the rounds:\n\n| tracer | ns per call | spread | × floor |\n|---|---|---|---|\n");
        let floor = calls
            .iter()
            .find(|c| c["tracer"].as_str().unwrap_or("").starts_with("floor"))
            .and_then(|c| c["ns_per_call"].as_f64());
        for c in &calls {
            let ratio = match (c["ns_per_call"].as_f64(), floor) {
                (Some(a), Some(f)) if f > 0.0 => format!("{:.1}", a / f),
                _ => "–".into(),
            };
            m.push_str(&format!(
                "| {} | {} | {}–{} | {} |\n",
                c["tracer"].as_str().unwrap_or(""),
                fmt_opt(&c["ns_per_call"], 0),
                fmt_opt(&c["min"], 0),
                fmt_opt(&c["max"], 0),
                ratio
            ));
        }
        m.push('\n');
    }
    m.push_str(
        "## Start-up and exit: exec to all programs attached, report to process end\n\n| tool | start-up median | spread | × runqlat | exit median | spread |\n|---|---|---|---|---|---|\n",
    );
    let runqlat = doc["startup"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["tool"] == "libbpf-tools runqlat")
        .and_then(|s| s["median_ms"].as_f64());
    for s in doc["startup"].as_array().into_iter().flatten() {
        let ratio = match (s["median_ms"].as_f64(), runqlat) {
            (Some(a), Some(r)) if r > 0.0 => format!("{:.2}", a / r),
            _ => "–".into(),
        };
        m.push_str(&format!(
            "| {} | {} ms | {}–{} ms | {} | {} ms | {}–{} ms |\n",
            s["tool"].as_str().unwrap_or(""),
            fmt_opt(&s["median_ms"], 1),
            fmt_opt(&s["min_ms"], 1),
            fmt_opt(&s["max_ms"], 1),
            ratio,
            fmt_opt(&s["exit_median_ms"], 1),
            fmt_opt(&s["exit_min_ms"], 1),
            fmt_opt(&s["exit_max_ms"], 1)
        ));
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_spread() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
        assert_eq!(spread(&[3.0, 1.0, 2.0]), (1.0, 3.0));
    }

    #[test]
    fn parses_perf_bench_pipe() {
        let out = "# Running 'sched/pipe' benchmark:\n# Executed 20000 pipe operations between two processes\n\n     Total time: 0.142 [sec]\n\n       7.140300 usecs/op\n         140049 ops/sec\n";
        assert_eq!(parse_perf_pipe(out), Some(7.1403));
        assert_eq!(parse_perf_pipe("garbage"), None);
    }

    #[test]
    fn parses_stress_ng_switch() {
        let out = "stress-ng: metrc: [6646] stressor       bogo ops real time  usr time  sys time   bogo ops/s     bogo ops/s\nstress-ng: metrc: [6646]                           (secs)    (secs)    (secs)   (real time) (usr+sys time)\nstress-ng: metrc: [6646] switch           164874      1.00      0.13      1.09    164734.12      134279.27\nstress-ng: metrc: [6646] switch             12143.20 nanosecs per context switch (pipe method)\n";
        assert_eq!(parse_stress_ng(out), Some(164734.12));
    }

    #[test]
    fn parses_proc_stat_with_hostile_comm() {
        let stat =
            "1234 (a) b (c)) S 1 1234 1234 0 -1 4194304 100 0 0 0 250 17 0 0 20 0 1 0 100 1000 10";
        assert_eq!(parse_proc_stat_cpu_ticks(stat), Some(267));
        assert_eq!(parse_proc_stat_cpu_ticks("no paren"), None);
    }

    #[test]
    fn parses_sched_runtime() {
        let s = "tracekit (123, #threads: 1)\n---------\nse.exec_start  :  5.0\nse.sum_exec_runtime                          :             1.014640\n";
        assert_eq!(parse_sum_exec_runtime_ms(s), Some(1.01464));
        assert_eq!(parse_sum_exec_runtime_ms("nothing"), None);
    }

    #[test]
    fn parses_strace_exit_time() {
        let t = "100 1000.000000 execve(\"/x\", [...]) = 0\n100 1001.000000 write(1, \"report\\n\", 7) = 7\n100 1001.002500 exit_group(0) = ?\n100 1001.003000 +++ exited with 0 +++\n";
        let ms = parse_strace_exit_ms(t).unwrap();
        assert!((ms - 3.0).abs() < 1e-6, "{ms}");
        assert_eq!(
            parse_strace_exit_ms("100 1.0 write(1, \"x\", 1) = 1\n"),
            None
        );
    }

    #[test]
    fn parses_strace_attach_time() {
        let t = "100 1000.000000 execve(\"/x\", [\"x\"], 0x7ff) = 0\n100 1000.010000 bpf(BPF_PROG_LOAD, {...}, 148) = 5\n100 1000.015000 bpf(BPF_LINK_CREATE, {...}, 64) = 6\n100 1000.017500 ioctl(6, PERF_EVENT_IOC_ENABLE, 0) = 0\n100 1000.020000 ioctl(7, PERF_EVENT_IOC_ENABLE, 0) = -1 EINVAL\n";
        let ms = parse_strace_attach_ms(t).unwrap();
        assert!((ms - 17.5).abs() < 1e-6, "{ms}");
        assert_eq!(parse_strace_attach_ms("nothing"), None);
    }

    #[test]
    fn markdown_has_a_table_per_workload() {
        let doc = json!({
            "date": "2026-11-29", "machine": {"cpu": "x", "cpus": 2, "kernel": "6.18"}, "quick": true, "rounds": 5, "wall_s": 100,
            "workloads": [{"workload": "w1", "rows": [
                {"config": "nothing traced", "median": 4.0, "min": 3.9, "max": 4.2, "unit": "us/op", "slowdown_pct": 0.0, "runs": 5},
                {"config": "tracekit ctxsw", "median": 4.4, "min": 4.3, "max": 4.6, "unit": "us/op", "slowdown_pct": 10.0, "tracer_cpu_ms": 12.0, "rss_kib": 4096.0, "rss_peak_kib": 8192.0, "events_lost": 0, "runs": 5},
                {"config": "x", "status": "N/A: needs kprobes"}
            ]}],
            "startup": [{"tool": "tracekit", "median_ms": 17.0, "min_ms": 16.0, "max_ms": 18.0, "runs": 5,
                "exit_median_ms": 2.5, "exit_min_ms": 2.0, "exit_max_ms": 3.0}]
        });
        let m = markdown(&doc);
        assert!(m.contains("## w1"));
        assert!(
            m.contains(
                "| tracekit ctxsw | 4.40 us/op | 4.30–4.60 | 10.0% | 12.00 ms | 4.0 / 8.0 MiB | 0 |"
            ),
            "{m}"
        );
        assert!(m.contains("| x | N/A: needs kprobes |"));
        assert!(
            m.contains("| tracekit | 17.0 ms | 16.0–18.0 ms | – | 2.5 ms | 2.0–3.0 ms |"),
            "{m}"
        );
    }
}
