//! docs/benchmarks.md from the measurements (docs/benchmarks.json).

use serde_json::Value;

fn fmt_opt(v: &Value, digits: usize) -> String {
    v.as_f64()
        .map(|x| format!("{x:.digits$}"))
        .unwrap_or_else(|| "–".into())
}

/// A string field, empty when absent.
fn text(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

/// `a / b` with `digits` decimals, `–` when either is missing or `b` is not positive.
fn ratio(a: Option<f64>, b: Option<f64>, digits: usize) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.digits$}", a / b),
        _ => "–".into(),
    }
}

/// A row's `RSS / peak` cell.
fn rss(r: &Value) -> String {
    match (r["rss_kib"].as_f64(), r["rss_peak_kib"].as_f64()) {
        (Some(a), Some(b)) => format!("{:.1} / {:.1} MiB", a / 1024.0, b / 1024.0),
        _ => "–".into(),
    }
}

/// One Markdown table row (`| a | b | |`: an empty cell stays one space wide).
fn row<S: AsRef<str>>(m: &mut String, cells: &[S]) {
    m.push('|');
    for c in cells {
        let c = c.as_ref();
        if !c.is_empty() {
            m.push(' ');
            m.push_str(c);
        }
        m.push_str(" |");
    }
    m.push('\n');
}

/// The entries of `key` (bpf_stats, bpf_per_call) of one workload (all of them in a document
/// from before they named their workload, under "").
fn of_workload<'a>(doc: &'a Value, key: &str, w: &str) -> Vec<&'a Value> {
    doc[key]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|x| text(&x["workload"]) == w)
        .collect()
}

/// Per workload: the kernel time per event of each tracer beside its slowdown in the overhead
/// table, then per program.
fn kernel_time(m: &mut String, doc: &Value) {
    m.push_str(&format!("## Where the kernel time goes (kernel.bpf_stats_enabled=1, separate pass, median of {} interleaved rounds)\n\nKernel time per event is the run time of all a tracer's programs over one workload run, divided by the events the kernel itself counted over that run (context switches from /proc/stat `ctxt`, UDP drops from /proc/net/snmp NoPorts + RcvbufErrors, TCP segments received (data and acks, up to 64 KiB each on loopback) from its InSegs, requests completed by the disk from its `stat`; for fsync, the calls made); the whole machine's events count on both sides. Kernel time / untraced run is that run time per run against the untraced run's wall time (median): the slowdown the programs would cause were all of it on the workload's path (it is not, on two CPUs: some runs beside it), a steadier bound than the slowdown measured on a shared machine. Slowdown is from the overhead table of the same workload.\n\n", doc["rounds"]));
    let mut workloads: Vec<&str> = Vec::new();
    for key in ["bpf_per_call", "bpf_stats"] {
        for x in doc[key].as_array().into_iter().flatten() {
            let w = text(&x["workload"]);
            if !workloads.contains(&w) {
                workloads.push(w);
            }
        }
    }
    for w in workloads {
        if !w.is_empty() {
            m.push_str(&format!("### {w}\n\n"));
        }
        let calls = of_workload(doc, "bpf_per_call", w);
        if let Some(first) = calls.first() {
            let event = first["event"].as_str().unwrap_or("fsync call");
            m.push_str(&format!("| tracer | ns per {event} | spread | × floor | events per run | kernel time / untraced run | slowdown |\n|---|---|---|---|---|---|---|\n"));
            let floor = calls
                .iter()
                .find(|c| text(&c["tracer"]).starts_with("floor"))
                .and_then(|c| c["ns_per_call"].as_f64());
            let table = doc["workloads"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|x| x["workload"] == w);
            let rows = table.map(|x| &x["rows"]);
            let run_ns = table.and_then(|x| x["untraced_run_ns"].as_f64());
            for c in &calls {
                let ratio = ratio(c["ns_per_call"].as_f64(), floor, 1);
                let slowdown = rows
                    .and_then(|r| r.as_array())
                    .into_iter()
                    .flatten()
                    .find(|r| r["config"] == c["tracer"])
                    .and_then(|r| r["slowdown_pct"].as_f64())
                    .map(|x| format!("{x:.1}%"))
                    .unwrap_or_else(|| "–".into());
                // The programs' kernel time over a run against the untraced run's wall time:
                // the slowdown they would cause were all of it on the workload's path, steadier
                // than the measured slowdown on a shared machine.
                let share = match (c["ns_per_call"].as_f64(), c["events"].as_f64(), run_ns) {
                    (Some(ns), Some(n), Some(r)) if r > 0.0 => {
                        format!("{:.2}%", ns * n / r * 100.0)
                    }
                    _ => "–".into(),
                };
                row(
                    m,
                    &[
                        text(&c["tracer"]).to_string(),
                        fmt_opt(&c["ns_per_call"], 0),
                        format!("{}–{}", fmt_opt(&c["min"], 0), fmt_opt(&c["max"], 0)),
                        ratio,
                        fmt_opt(&c["events"], 0),
                        share,
                        slowdown,
                    ],
                );
            }
            m.push('\n');
        }
        m.push_str("| tracer | program | attach | runs | ns per run |\n|---|---|---|---|---|\n");
        for p in of_workload(doc, "bpf_stats", w) {
            row(
                m,
                &[
                    text(&p["tracer"]),
                    text(&p["program"]),
                    text(&p["attach"]),
                    &fmt_opt(&p["run_cnt"], 0),
                    &fmt_opt(&p["ns_per_run"], 0),
                ],
            );
        }
        m.push('\n');
    }
}

/// Kernel ns per run of all a tracer's programs on one workload, weighted by their runs (for a
/// profiler: per sample, one run each).
fn kernel_ns_per_run(doc: &Value, w: &str, tracer: &str) -> Option<f64> {
    let (mut ns, mut runs) = (0.0, 0.0);
    for p in of_workload(doc, "bpf_stats", w) {
        if p["tracer"] == tracer {
            let n = p["run_cnt"].as_f64().unwrap_or(0.0);
            ns += p["ns_per_run"].as_f64().unwrap_or(0.0) * n;
            runs += n;
        }
    }
    (runs > 0.0).then(|| ns / runs)
}

/// The profilers' cost per sample, for each workload whose rows count samples (issue 19).
fn profilers(m: &mut String, doc: &Value) {
    for w in doc["workloads"].as_array().into_iter().flatten() {
        let rows: Vec<&Value> = w["rows"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["samples"].is_number())
            .collect();
        if rows.is_empty() {
            continue;
        }
        let name = text(&w["workload"]);
        m.push_str(&format!("## Profilers: cost per sample ({name})\n\n"));
        m.push_str("Samples: what each profiler took in one run (tracekit: its stats, idle samples included, as perf -a takes them; perf: its closing line). Profiler CPU, all its threads: up to attached (start-up), over the workload (to SIGINT), then to its end (exit: tracekit's last report with its symbolisation, perf's build-id pass), and its whole life (the rusage of its exit). Marginal µs per sample: the whole life's CPU from 99 to 999 Hz over the samples it added, a per-sample cost start-up does not weigh on. Kernel ns per sample: the sampling program's run time per run (bpf_stats pass: every sample of the CPU clock, also those a `--comm` scope drops); perf record runs no BPF program (its sampling is the kernel's perf code, paid by the workload: see slowdown). `perf record --call-graph dwarf` only copies the stacks and unwinds at `perf report` time, not measured here; tracekit's DWARF mode unwinds and symbolises live, in its CPU here.\n\n");
        m.push_str("| configuration | slowdown | samples per run | CPU: start-up | over the workload | exit | whole life | marginal µs per sample (99→999 Hz) | kernel ns per sample | RSS / peak |\n|---|---|---|---|---|---|---|---|---|---|\n");
        for r in &rows {
            let config = text(&r["config"]);
            // The same profiler at 99 Hz, for the row at 999 Hz.
            let low = config
                .contains(" 999 ")
                .then(|| config.replace(" 999 ", " 99 "))
                .and_then(|c| rows.iter().find(|x| x["config"] == c.as_str()));
            let marginal = low
                .and_then(|lo| {
                    let d = |k: &str| Some(r[k].as_f64()? - lo[k].as_f64()?);
                    let (ms, n) = (d("tracer_cpu_life_ms")?, d("samples")?);
                    (n > 0.0).then(|| format!("{:.1}", ms * 1000.0 / n))
                })
                .unwrap_or_else(|| "–".into());
            let ms = |k: &str| format!("{} ms", fmt_opt(&r[k], 1));
            row(
                m,
                &[
                    config.to_string(),
                    format!("{}%", fmt_opt(&r["slowdown_pct"], 1)),
                    fmt_opt(&r["samples"], 0),
                    ms("tracer_cpu_start_ms"),
                    ms("tracer_cpu_ms"),
                    ms("tracer_cpu_exit_ms"),
                    ms("tracer_cpu_life_ms"),
                    marginal,
                    kernel_ns_per_run(doc, name, config)
                        .map_or_else(|| "–".into(), |x| format!("{x:.0}")),
                    rss(r),
                ],
            );
        }
        m.push('\n');
    }
}

/// The report as Markdown: one table per workload, then start-up.
/// `serve`'s own cost, with findings and without (`--no-findings`), over the same churn.
fn serve(m: &mut String, s: &Value) {
    if s.is_null() {
        return;
    }
    m.push_str("## serve: its own cost with findings and without\n\n");
    if let Some(status) = s["status"].as_str() {
        m.push_str(&format!("{status}\n\n"));
        return;
    }
    m.push_str(&format!(
        "Measured {}. Both at once, default collectors and 10 s windows, scraped every 15 s, over {} s while {} short-lived processes (`dd … conv=fsync`, `sleep`) came and went, beside an fsync loop (a finding every window). CPU per window: utime + stime over the windows after the first, over their number (a scrape may end a window early); RSS: VmRSS every 10 s.\n\n",
        text(&s["date"]),
        s["seconds"],
        s["churn_processes"]
    ));
    m.push_str("| configuration | windows | CPU per window | RSS after the first window | at 1 min | at the end | highest | findings (most in a window) |\n|---|---|---|---|---|---|---|---|\n");
    let mib = |v: &Value| {
        v.as_f64()
            .map(|k| format!("{:.1} MiB", k / 1024.0))
            .unwrap_or_else(|| "–".into())
    };
    for r in s["rows"].as_array().into_iter().flatten() {
        row(
            m,
            &[
                text(&r["config"]).to_string(),
                r["windows"].to_string(),
                format!("{} ms", fmt_opt(&r["cpu_ms_per_window"], 1)),
                mib(&r["rss_kib_first_window"]),
                mib(&r["rss_kib_1min"]),
                mib(&r["rss_kib_end"]),
                mib(&r["rss_kib_max"]),
                r["findings_max"]
                    .as_u64()
                    .map(|x| x.to_string())
                    .unwrap_or_else(|| "not judged".into()),
            ],
        );
    }
    m.push('\n');
}

/// Kernel time per event with several tracers attached together (absent from older documents).
fn at_once(m: &mut String, a: &Value) {
    let Some(rows) = a["tracers"].as_array() else {
        return;
    };
    let event = text(&a["event"]);
    m.push_str(&format!(
        "## Attached at once: {}\n\nThe kernel-time pass with these tracers attached together for each run, so every {event} runs all their programs, as on a node where several run: each tracer's programs' run time per {event} the kernel counted ({} per run), median over the rounds.\n\n| tracer | ns per {event} | spread | × runqlat |\n|---|---|---|---|\n",
        text(&a["workload"]),
        fmt_opt(&a["events"], 0),
    ));
    let runqlat = rows
        .iter()
        .find(|r| text(&r["tracer"]) == "libbpf-tools runqlat")
        .and_then(|r| r["ns_per_call"].as_f64());
    for r in rows {
        row(
            m,
            &[
                text(&r["tracer"]).to_string(),
                fmt_opt(&r["ns_per_call"], 0),
                format!("{}–{}", fmt_opt(&r["min"], 0), fmt_opt(&r["max"], 0)),
                ratio(r["ns_per_call"].as_f64(), runqlat, 2),
            ],
        );
    }
    m.push('\n');
}

pub fn markdown(doc: &Value) -> String {
    let mut m = String::new();
    m.push_str("# tracekit benchmarks\n\n");
    m.push_str(&format!(
        "Measured {} on {} ({} CPUs, kernel {}) by `cargo xtask bench{}`, {} rounds, {} s.\n\n",
        text(&doc["date"]),
        text(&doc["machine"]["cpu"]),
        doc["machine"]["cpus"],
        text(&doc["machine"]["kernel"]),
        if doc["quick"] == true { " --quick" } else { "" },
        doc["rounds"],
        doc["wall_s"],
    ));
    m.push_str("Method: configurations interleaved in every round (A B C … A B C …); medians with the min–max spread; slowdown is the workload's median against the untraced median of the same run. Tracer CPU is the tracer process's own time on CPU over the workload (se.sum_exec_runtime in /proc/<pid>/task/*/sched, all its threads; the kernel programs' cost shows up in the workload's slowdown, not here); RSS is VmRSS / VmHWM at the end. Events lost: what tracekit's kernel counters say it could not record (– where a tool does not report it). Start-up: exec to the last attach syscall; exit: the report's last write to stdout to the end of the process, detaching included (the process started, not the background child tracekit leaves to close classic tracepoints, which does not hold up the shell) (`strace -f -ttt --seccomp-bpf -e trace=execve,bpf,ioctl,write,exit_group`).\n\n");
    m.push_str("Peers: on block requests, `biolatency -D` (a histogram per disk, issue → complete: two hooks) is the reference issue 12 names, and `biolatency -Q -D` (insert → complete: the insert hook too) is the like-for-like one for `io-lat --from request`, which times from the same hook (the insert, or the issue without a scheduler) and needs it to split queue time from device time; both run. `io-lat` by default also times each request from its first bio's submission (one more hook per bio, `block_bio_queue`), which no peer does: its like-for-like control is the floor with that hook. On the receive path, the one-liner counting `kfree_skb` by reason is issue 11's reference, and a bpftrace script doing what `net-rx` does in the kernel (drops by reason, NET_RX softirq time per CPU, NAPI polls and budget exhaustion; its softirq programs run on every softirq, as `net-rx`'s do) is the like-for-like one. `numa --force` loads its programs on a one-node host (without it, it loads nothing there), so its own `sched_switch` program is measured beside `ctxsw` in the same run.\n\n");
    for w in doc["workloads"].as_array().into_iter().flatten() {
        m.push_str(&format!("## {}\n\n", text(&w["workload"])));
        m.push_str("| configuration | median | spread | slowdown | tracer CPU | RSS / peak | events lost |\n|---|---|---|---|---|---|---|\n");
        for r in w["rows"].as_array().into_iter().flatten() {
            if r["median"].is_null() {
                row(
                    &mut m,
                    &[text(&r["config"]), text(&r["status"]), "", "", "", "", ""],
                );
                continue;
            }
            row(
                &mut m,
                &[
                    text(&r["config"]).to_string(),
                    format!("{} {}", fmt_opt(&r["median"], 2), text(&r["unit"])),
                    format!("{}–{}", fmt_opt(&r["min"], 2), fmt_opt(&r["max"], 2)),
                    format!("{}%", fmt_opt(&r["slowdown_pct"], 1)),
                    format!("{} ms", fmt_opt(&r["tracer_cpu_ms"], 2)),
                    rss(r),
                    r["events_lost"]
                        .as_u64()
                        .map(|x| x.to_string())
                        .unwrap_or_else(|| "–".into()),
                ],
            );
        }
        m.push('\n');
    }
    profilers(&mut m, doc);
    kernel_time(&mut m, doc);
    at_once(&mut m, &doc["at_once"]);
    serve(&mut m, &doc["serve"]);
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
        if s["median_ms"].is_null() {
            let status = s["status"].as_str().unwrap_or("N/A");
            row(&mut m, &[text(&s["tool"]), status, "", "", "", ""]);
            continue;
        }
        let ms = |k: &str| format!("{} ms", fmt_opt(&s[k], 1));
        let spread =
            |lo: &str, hi: &str| format!("{}–{} ms", fmt_opt(&s[lo], 1), fmt_opt(&s[hi], 1));
        row(
            &mut m,
            &[
                text(&s["tool"]).to_string(),
                ms("median_ms"),
                spread("min_ms", "max_ms"),
                ratio(s["median_ms"].as_f64(), runqlat, 2),
                ms("exit_median_ms"),
                spread("exit_min_ms", "exit_max_ms"),
            ],
        );
    }
    m
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn markdown_has_a_table_per_workload() {
        let doc = json!({
            "date": "2026-11-29", "machine": {"cpu": "x", "cpus": 2, "kernel": "6.18"}, "quick": true, "rounds": 5, "wall_s": 100,
            "workloads": [{"workload": "w1", "untraced_run_ns": 1.2e8, "rows": [
                {"config": "nothing traced", "median": 4.0, "min": 3.9, "max": 4.2, "unit": "us/op", "slowdown_pct": 0.0, "runs": 5},
                {"config": "tracekit ctxsw", "median": 4.4, "min": 4.3, "max": 4.6, "unit": "us/op", "slowdown_pct": 10.0, "tracer_cpu_ms": 12.0, "rss_kib": 4096.0, "rss_peak_kib": 8192.0, "events_lost": 0, "runs": 5},
                {"config": "x", "status": "N/A: needs kprobes"}
            ]}],
            "bpf_per_call": [
                {"workload": "w1", "event": "context switch", "events": 100000.0, "tracer": "tracekit ctxsw", "ns_per_call": 60.0, "min": 55.0, "max": 70.0, "rounds": 5},
                {"workload": "w1", "event": "context switch", "events": 100000.0, "tracer": "floor: x", "ns_per_call": 20.0, "min": 19.0, "max": 21.0, "rounds": 5}
            ],
            "bpf_stats": [{"workload": "w1", "tracer": "tracekit ctxsw", "program": "tk_ctxsw_switch", "attach": "tp_btf", "run_cnt": 100000.0, "ns_per_run": 60.0, "rounds": 5}],
            "startup": [{"tool": "tracekit", "median_ms": 17.0, "min_ms": 16.0, "max_ms": 18.0, "runs": 5,
                "exit_median_ms": 2.5, "exit_min_ms": 2.0, "exit_max_ms": 3.0},
                {"tool": "tracekit gone", "status": "N/A: no attach syscall seen"}]
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
            m.contains(
                "| tracer | ns per context switch | spread | × floor | events per run | kernel time / untraced run | slowdown |"
            ),
            "{m}"
        );
        assert!(
            m.contains("| tracekit ctxsw | 60 | 55–70 | 3.0 | 100000 | 5.00% | 10.0% |"),
            "{m}"
        );
        assert!(m.contains("| tracekit ctxsw | tk_ctxsw_switch | tp_btf | 100000 | 60 |"));
        assert!(
            m.contains("| tracekit | 17.0 ms | 16.0–18.0 ms | – | 2.5 ms | 2.0–3.0 ms |"),
            "{m}"
        );
        assert!(
            m.contains("| tracekit gone | N/A: no attach syscall seen | | | | |"),
            "{m}"
        );
        assert!(!m.contains("## Profilers"), "{m}");
    }

    #[test]
    fn at_once_compares_each_tracer_with_runqlat() {
        let mut m = String::new();
        at_once(
            &mut m,
            &json!({"workload": "pipe", "event": "context switch", "events": 400000.0, "tracers": [
                {"tracer": "libbpf-tools runqlat", "ns_per_call": 800.0, "min": 700.0, "max": 900.0, "rounds": 5},
                {"tracer": "tracekit triage", "ns_per_call": 560.0, "min": 500.0, "max": 600.0, "rounds": 5}
            ]}),
        );
        assert!(m.contains("## Attached at once: pipe"), "{m}");
        assert!(m.contains("(400000 per run)"), "{m}");
        assert!(
            m.contains("| tracekit triage | 560 | 500–600 | 0.70 |"),
            "{m}"
        );
        assert!(
            m.contains("| libbpf-tools runqlat | 800 | 700–900 | 1.00 |"),
            "{m}"
        );
        // Older documents have no such section.
        let mut none = String::new();
        at_once(&mut none, &Value::Null);
        assert!(none.is_empty());
    }

    #[test]
    fn serve_cost_has_a_row_per_configuration() {
        let mut m = String::new();
        serve(
            &mut m,
            &json!({"date": "2026-12-06", "seconds": 600, "churn_processes": 7200, "rows": [
                {"config": "tracekit serve", "windows": 61, "cpu_ms_per_window": 41.25,
                 "rss_kib_first_window": 37888, "rss_kib_1min": 38400, "rss_kib_end": 38912,
                 "rss_kib_max": 40960, "findings_max": 3},
                {"config": "tracekit serve --no-findings", "windows": 61, "cpu_ms_per_window": 40.0,
                 "rss_kib_first_window": 37000, "rss_kib_1min": null, "rss_kib_end": 38000,
                 "rss_kib_max": 39000, "findings_max": null}
            ]}),
        );
        assert!(m.contains("Measured 2026-12-06. Both"), "{m}");
        assert!(m.contains("over 600 s while 7200 short-lived"), "{m}");
        assert!(
            m.contains(
                "| tracekit serve | 61 | 41.2 ms | 37.0 MiB | 37.5 MiB | 38.0 MiB | 40.0 MiB | 3 |"
            ),
            "{m}"
        );
        assert!(
            m.contains("| – | 37.1 MiB | 38.1 MiB | not judged |"),
            "{m}"
        );
        let mut na = String::new();
        serve(&mut na, &json!({"status": "N/A: dd: not found"}));
        assert!(na.ends_with("N/A: dd: not found\n\n"), "{na}");
        let mut none = String::new();
        serve(&mut none, &Value::Null);
        assert!(none.is_empty());
    }

    #[test]
    fn profilers_have_a_cost_per_sample_table() {
        let row = |config: &str, slow: f64, start: f64, cpu: f64, exit: f64, life: f64, n: f64| {
            json!({"config": config, "median": 1000.0, "min": 990.0, "max": 1010.0, "unit": "ms CPU",
                "slowdown_pct": slow, "tracer_cpu_start_ms": start, "tracer_cpu_ms": cpu,
                "tracer_cpu_exit_ms": exit, "tracer_cpu_life_ms": life, "samples": n})
        };
        let mut tk99 = row(
            "tracekit profile --freq 99 --unwind fp",
            1.0,
            30.0,
            3.0,
            7.0,
            40.0,
            400.0,
        );
        tk99["rss_kib"] = json!(10240.0);
        tk99["rss_peak_kib"] = json!(20480.0);
        let doc = json!({
            "date": "d", "machine": {"cpu": "x", "cpus": 2, "kernel": "6.18"}, "rounds": 5,
            "workloads": [{"workload": "cpu", "rows": [
                {"config": "nothing traced", "median": 1000.0, "min": 990.0, "max": 1010.0, "unit": "ms CPU", "slowdown_pct": 0.0},
                tk99,
                row("tracekit profile --freq 999 --unwind fp", 3.0, 30.0, 20.0, 20.0, 70.0, 4000.0),
                row("perf record -F 999 -a -g", 2.0, 5.0, 5.0, 70.0, 80.0, 400.0)
            ]}],
            "bpf_stats": [
                {"workload": "cpu", "tracer": "tracekit profile --freq 99 --unwind fp", "program": "tk_profile", "attach": "perf_event", "run_cnt": 300.0, "ns_per_run": 2000.0},
                {"workload": "cpu", "tracer": "tracekit profile --freq 99 --unwind fp", "program": "tk_profile_dwarf", "attach": "perf_event", "run_cnt": 100.0, "ns_per_run": 6000.0},
                {"workload": "cpu", "tracer": "tracekit profile --freq 999 --unwind fp", "program": "tk_profile", "attach": "perf_event", "run_cnt": 1.0, "ns_per_run": 1.0}
            ],
            "startup": []
        });
        let m = markdown(&doc);
        assert!(m.contains("## Profilers: cost per sample (cpu)"), "{m}");
        assert!(
            m.contains("| tracekit profile --freq 99 --unwind fp | 1.0% | 400 | 30.0 ms | 3.0 ms | 7.0 ms | 40.0 ms | – | 3000 | 10.0 / 20.0 MiB |"),
            "{m}"
        );
        // 30 ms more over 3600 samples more: 8.3 µs each.
        assert!(
            m.contains("| tracekit profile --freq 999 --unwind fp | 3.0% | 4000 | 30.0 ms | 20.0 ms | 20.0 ms | 70.0 ms | 8.3 | 1 | – |"),
            "{m}"
        );
        // No 99 Hz sibling: no marginal cost.
        assert!(
            m.contains("| perf record -F 999 -a -g | 2.0% | 400 | 5.0 ms | 5.0 ms | 70.0 ms | 80.0 ms | – | – | – |"),
            "{m}"
        );
        assert!(!m.contains("| nothing traced | 0.0% |"), "{m}");
    }
}
