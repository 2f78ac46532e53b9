//! `cargo xtask bench [--quick] [--only PAT,…]`: tracekit's cost beside libbpf-tools and bpftrace, measured the
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

mod config;
mod parse;
mod passes;
mod render;
mod serve;
mod tracer;
mod workload;

use std::{process::Command, time::Instant};

use anyhow::Result;
use serde_json::{json, Value};

use crate::{build, root, toolchain};
use render::markdown;
use workload::Workload;

const PACKAGES: [&str; 7] = [
    "libbpf-tools",
    "bpftrace",
    "linux-perf",
    "stress-ng",
    "fio",
    "strace",
    "bpftool",
];

fn ensure_packages() -> Result<()> {
    toolchain::ensure_debian(
        &PACKAGES,
        "the reference tools and workloads the benchmark runs",
    )
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
    let wl = root().join("target/x86_64-unknown-linux-gnu/release/tk-workload");
    let scratch = root().join("target/bench-scratch");
    std::fs::create_dir_all(&scratch)?;
    let rounds = if quick { 5 } else { 7 };
    let started = Instant::now();

    // `--only PAT[,PAT…]`: the tracers whose name contains a pattern (every tracer of a
    // workload whose name contains one), for checking a change; written beside the scratch
    // files, never over docs/.
    let only: Option<Vec<String>> = args
        .iter()
        .position(|a| a == "--only")
        .map(|i| {
            args.get(i + 1)
                .map(|p| p.split(',').map(str::to_string).collect())
                .ok_or_else(|| anyhow::anyhow!("--only needs PAT[,PAT…]"))
        })
        .transpose()?;
    let mut cases = config::cases(&tk, quick);
    let mut st_cases = config::startup_cases(&tk);
    if let Some(pats) = &only {
        let hit = |name: &str| pats.iter().any(|p| name.contains(p.as_str()));
        for (w, tracers) in &mut cases {
            if !hit(&w.name()) {
                tracers.retain(|t| hit(&t.name));
            }
        }
        cases.retain(|(_, tracers)| !tracers.is_empty());
        st_cases.retain(|(name, _)| hit(name));
    }
    let report: Vec<Value> = cases
        .iter()
        .map(|(w, tracers)| passes::overhead(w, tracers, rounds, &wl, &scratch))
        .collect();

    // Kernel time per program and per event, every tracer (the references too), on the
    // workloads whose events the kernel counts (or, for fsync, the calls made).
    let mut prog_stats = Vec::new();
    let mut per_call = Vec::new();
    for (w, tracers) in &cases {
        let calls = match w {
            Workload::Pipe { pinned: true, .. }
            | Workload::UdpDrops { .. }
            | Workload::TcpStream { .. }
            | Workload::BlockRead { .. } => None,
            Workload::Fsync { n } => Some(f64::from(*n)),
            // Kernel time per sample: ns per run of the sampling program (one run per
            // sample). perf record runs no BPF program: only tracekit is measured.
            Workload::Cpu { .. } | Workload::Python { .. } => {
                let tk: Vec<_> = tracers
                    .iter()
                    .filter(|t| t.name.starts_with("tracekit"))
                    .cloned()
                    .collect();
                passes::kernel_time(
                    w,
                    &tk,
                    None,
                    rounds,
                    &wl,
                    &scratch,
                    &mut prog_stats,
                    &mut per_call,
                );
                continue;
            }
            _ => continue,
        };
        passes::kernel_time(
            w,
            tracers,
            calls,
            rounds,
            &wl,
            &scratch,
            &mut prog_stats,
            &mut per_call,
        );
    }

    // The same kernel time with several tracers attached at once, on the pinned pipe (where
    // every tracer of config::AT_ONCE runs; skipped when --only leaves one out).
    let at_once = cases
        .iter()
        .find(|(w, _)| matches!(w, Workload::Pipe { pinned: true, .. }))
        .and_then(|(w, ts)| {
            let picked: Vec<_> = config::AT_ONCE
                .iter()
                .filter_map(|n| ts.iter().find(|t| t.name == *n))
                .collect();
            (picked.len() == config::AT_ONCE.len())
                .then(|| passes::at_once(w, &picked, rounds, &wl, &scratch))
        })
        .unwrap_or(Value::Null);

    let startup = passes::startup(&st_cases, rounds)?;

    // serve's own cost with findings and without: ten minutes of churn (one and a half with
    // --quick), both at once.
    let serve_cost = match &only {
        Some(p) if !p.iter().any(|p| "tracekit serve".contains(p.as_str())) => Value::Null,
        _ => serve::cost(&tk, &wl, &scratch, if quick { 90 } else { 600 }),
    };

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
        "at_once": at_once,
        "serve": serve_cost,
    });
    let docs = if only.is_some() {
        scratch.clone()
    } else {
        root().join("docs")
    };
    std::fs::create_dir_all(&docs)?;
    std::fs::write(
        docs.join("benchmarks.json"),
        serde_json::to_string_pretty(&doc)? + "\n",
    )?;
    std::fs::write(docs.join("benchmarks.md"), markdown(&doc))?;
    eprintln!(
        "bench: wrote {}/benchmarks.md and .json in {} s",
        docs.display(),
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
