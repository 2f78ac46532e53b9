//! The three passes of a run: overhead (every configuration interleaved, round after round),
//! where the kernel time goes (bpf_stats), and start-up/exit (strace).

use std::{collections::BTreeMap, path::Path};

use anyhow::Result;
use serde_json::{json, Value};

use super::{
    parse::{median, spread},
    tracer::{bpf_stats_pass, measure, startup_ms, Sample, Tracer},
    workload::Workload,
};

/// One program's figures over the rounds of the bpf_stats pass: attach mode, ns per run (rounds
/// where it ran), run counts.
type ProgRounds = (Value, Vec<f64>, Vec<f64>);

/// The overhead table of one workload: nothing traced, then each tracer, interleaved over
/// `rounds` rounds.
pub(super) fn overhead(
    w: &Workload,
    tracers: &[Tracer],
    rounds: usize,
    wl: &Path,
    scratch: &Path,
) -> Value {
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
            match measure(w, t, wl, scratch) {
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
            "tracer_cpu_start_ms": opt_med(&|s| s.cpu_start_ms),
            "tracer_cpu_life_ms": opt_med(&|s| s.cpu_life_ms),
            // The exit's share: the whole life less start-up and the workload's span.
            "tracer_cpu_exit_ms": opt_med(&|s| {
                Some((s.cpu_life_ms? - s.cpu_start_ms? - s.cpu_ms?).max(0.0))
            }),
            "samples": opt_med(&|s| s.samples.map(|x| x as f64)),
        }));
    }
    json!({"workload": w.name(), "rows": rows, "untraced_run_ns": w.run_ns(base)})
}

/// Where the kernel time goes on one workload, per program (separate pass, bpf_stats on): every
/// tracer once per round, interleaved like the overhead pass, medians over the rounds (one run
/// each was mostly noise: the same program measured 147 and 460 ns per run a minute apart
/// here). Also the kernel time of all a tracer's programs per event: per event the kernel
/// counted over the run (`Workload::events`), else per call of `calls`.
#[allow(clippy::too_many_arguments)]
pub(super) fn kernel_time(
    w: &Workload,
    tracers: &[Tracer],
    calls: Option<f64>,
    rounds: usize,
    wl: &Path,
    scratch: &Path,
    prog_stats: &mut Vec<Value>,
    per_call: &mut Vec<Value>,
) {
    eprintln!(
        "bench: kernel time on {} ({} tracers × {rounds} rounds)",
        w.name(),
        tracers.len()
    );
    // (tracer, program) -> (attach, [ns per run], [run count]); tracer -> [ns per event]
    let mut runs: BTreeMap<(usize, String), ProgRounds> = BTreeMap::new();
    let mut calls_ns: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
    let mut events_seen: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
    for _ in 0..rounds {
        for (i, t) in tracers.iter().enumerate() {
            match bpf_stats_pass(w, &[t], wl, scratch) {
                Ok((mut v, events)) => {
                    let v = v.remove(0);
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
                    if let Some(n) = events.or(calls).filter(|n| *n > 0.0) {
                        calls_ns.entry(i).or_default().push(total / n);
                        events_seen.entry(i).or_default().push(n);
                    }
                }
                Err(e) => eprintln!("bench: bpf stats for {}: {e:#}", t.name),
            }
        }
    }
    for ((i, prog), (attach, ns, cnt)) in runs {
        prog_stats.push(json!({
            "workload": w.name(), "tracer": tracers[i].name, "program": prog, "attach": attach,
            "run_cnt": median(&cnt), "ns_per_run": if ns.is_empty() { 0.0 } else { median(&ns) },
            "rounds": ns.len(),
        }));
    }
    for (i, v) in calls_ns {
        let (lo, hi) = spread(&v);
        per_call.push(json!({
            "workload": w.name(), "event": w.event_name(),
            "events": events_seen.get(&i).map(|e| median(e)),
            "tracer": tracers[i].name, "ns_per_call": median(&v), "min": lo, "max": hi,
            "rounds": v.len(),
        }));
    }
}

/// Kernel time per event of `tracers` attached at once (issue 30): every switch of the run
/// fires all their programs, so each pays for the others' cache and clock traffic as on a node
/// where several tracers run. Each round starts them all, runs the workload once and reads
/// each tracer's programs; medians over the rounds.
pub(super) fn at_once(
    w: &Workload,
    tracers: &[&Tracer],
    rounds: usize,
    wl: &Path,
    scratch: &Path,
) -> Value {
    eprintln!(
        "bench: kernel time on {} with {} tracers attached at once × {rounds} rounds",
        w.name(),
        tracers.len()
    );
    let mut per_event: Vec<Vec<f64>> = vec![Vec::new(); tracers.len()];
    let mut events_seen = Vec::new();
    for _ in 0..rounds {
        match bpf_stats_pass(w, tracers, wl, scratch) {
            Ok((progs, Some(n))) if n > 0.0 => {
                events_seen.push(n);
                for (i, v) in progs.iter().enumerate() {
                    let ns: f64 = v.iter().filter_map(|p| p["run_time_ns"].as_f64()).sum();
                    per_event[i].push(ns / n);
                }
            }
            Ok(_) => eprintln!("bench: at once: the kernel counted no {}", w.event_name()),
            Err(e) => eprintln!("bench: at once: {e:#}"),
        }
    }
    let rows: Vec<Value> = tracers
        .iter()
        .zip(&per_event)
        .filter(|(_, v)| !v.is_empty())
        .map(|(t, v)| {
            let (lo, hi) = spread(v);
            json!({"tracer": t.name, "ns_per_call": median(v), "min": lo, "max": hi, "rounds": v.len()})
        })
        .collect();
    json!({
        "workload": w.name(), "event": w.event_name(),
        "events": (!events_seen.is_empty()).then(|| median(&events_seen)),
        "tracers": rows,
    })
}

/// Start-up (exec to the last attach syscall) and exit (the report's last write to the end) of
/// each case.
pub(super) fn startup(st_cases: &[(String, Vec<String>)], rounds: usize) -> Result<Vec<Value>> {
    let mut startup = Vec::new();
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
        if v.is_empty() {
            startup.push(json!({
                "tool": name,
                "status": "N/A: no attach syscall seen under strace (not in this build, or it failed: run it by hand)",
            }));
            continue;
        }
        let (lo, hi) = spread(&v);
        let (xlo, xhi) = spread(&x);
        startup.push(json!({
            "tool": name, "median_ms": median(&v), "min_ms": lo, "max_ms": hi, "runs": v.len(),
            "exit_median_ms": if x.is_empty() { Value::Null } else { json!(median(&x)) },
            "exit_min_ms": xlo, "exit_max_ms": xhi,
        }));
    }
    Ok(startup)
}
