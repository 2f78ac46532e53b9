//! `tracekit runq-lat`: run-queue latency per process (or thread): how long runnable tasks
//! waited for a CPU, split by how the wait began (a wakeup, or a preemption while runnable).
//!
//! Each wait is the kernel's own accounting (`task_struct.sched_info.run_delay`, read at the
//! task's switch-out, see `probes-ebpf/src/sched.rs`), so the total agrees with
//! `/proc/<pid>/schedstat` (second field) by construction.

use serde_json::json;

use crate::{
    engine::{self, Collector, Window},
    kernel::loader,
    options::Common,
    report::hist::{self, LatStats},
    report::render::{fmt_ns, Align, Report, Table},
    report::sanitize,
    tools::{
        self,
        sched::{self, SchedSession},
        Hook,
    },
};

pub const NAME: &str = "runq-lat";
pub const HOOKS: &[Hook] = sched::HOOKS;
pub const REQUIRES_BTF: bool = sched::REQUIRES_BTF;

const EXAMPLES: &str =
    "  tracekit runq-lat --duration 10s                  # who waits for a CPU, and how long
  tracekit runq-lat --duration 10s --threads --hist   # per thread, with latency bars
  tracekit runq-lat --duration 1m --interval 10s --json   # one NDJSON set per 10 s";

#[derive(clap::Args, Debug)]
#[command(after_help = tools::help_footer(EXAMPLES, sched::NEEDS))]
pub struct Args {
    #[command(flatten)]
    pub common: Common,

    /// Rows shown in the text table, largest total wait first (0: all). JSON has every row.
    #[arg(long, default_value_t = 25, value_name = "N")]
    pub rows: usize,
}

const PROGRAMS: sched::Programs = sched::Programs {
    switch_btf: "tk_runq_switch",
    switch_raw: "tk_runq_switch_raw",
    free_btf: "tk_runq_free",
    free_raw: "tk_runq_free_raw",
    exec_btf: "tk_runq_exec",
    exec_raw: "tk_runq_exec_raw",
};

struct RunqLat {
    s: SchedSession,
    common: Common,
    max_rows: usize,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let common = args.common;
    let sink = tools::preflight(NAME, &common)?;
    let s = sched::open(loader::RUNQ_LAT, &PROGRAMS, &common, false)?;
    tools::announce::<&str, &str>("run-queue latency", &common, &s.session, &[]);
    let mut tool = RunqLat {
        s,
        common: common.clone(),
        max_rows: args.rows,
    };
    engine::drive(&common, sink, &mut tool)?;
    Ok(())
}

fn stats_json(prefix: &str, s: &LatStats, line: &mut serde_json::Value) {
    for (k, v) in [
        ("count", s.count),
        ("total_ns", s.total_ns),
        ("p50_ns", s.p50_ns),
        ("p90_ns", s.p90_ns),
        ("p99_ns", s.p99_ns),
        ("p999_ns", s.p999_ns),
        ("max_ns", s.max_ns),
    ] {
        line[format!("{prefix}{k}")] = json!(v);
    }
}

impl Collector for RunqLat {
    fn preamble(&self) -> Option<Report> {
        tools::meta_report(
            NAME,
            &self.common,
            &self.s.session,
            json!({"notes": self.s.notes}),
        )
    }

    fn collect(&mut self, w: &Window) -> anyhow::Result<Report> {
        let iv = self.s.drain(self.common.threads)?;
        let rows: Vec<_> = iv
            .rows
            .iter()
            .map(|r| {
                (
                    r,
                    hist::stats(&r.waits()),
                    hist::stats(&r.wake),
                    hist::stats(&r.preempt),
                )
            })
            .filter(|x| x.1.count > 0)
            .collect();
        let mut order: Vec<usize> = (0..rows.len()).collect();
        order.sort_by(|&a, &b| {
            rows[b]
                .1
                .total_ns
                .cmp(&rows[a].1.total_ns)
                .then(rows[a].0.id.cmp(&rows[b].0.id))
        });
        let secs = w.secs();
        let waits: u64 = rows.iter().map(|r| r.1.count).sum();
        let total: u64 = rows.iter().map(|r| r.1.total_ns).sum();
        let st = &iv.stats;
        let mut report = Report::default();
        let when = if w.interval {
            format!("interval {} ending {}, ", w.index + 1, w.end_json().0)
        } else {
            String::new()
        };
        report.title = format!(
            "runq-lat: {waits} run-queue waits, {} waited in total, in {}; {when}{secs:.2}s ({})",
            fmt_ns(total),
            tools::scope(&self.common),
            w.stop.as_str(),
        );
        report.notes.extend(self.s.notes.iter().cloned());
        report.notes.extend(sched::stats_notes(st));
        let id_col = if self.common.threads { "TID" } else { "PID" };
        let mut t = Table::new(&[
            (id_col, Align::Right),
            ("COMM", Align::Left),
            ("WAITS", Align::Right),
            ("P50", Align::Right),
            ("P90", Align::Right),
            ("P99", Align::Right),
            ("P99.9", Align::Right),
            ("MAX", Align::Right),
            ("TOTAL", Align::Right),
            ("%TIME", Align::Right),
            ("WAKE_P99", Align::Right),
            ("PREEMPT_N", Align::Right),
            ("PREEMPT_P99", Align::Right),
        ]);
        let (end_text, end_ns) = w.end_json();
        let shown = if self.max_rows == 0 {
            order.len()
        } else {
            self.max_rows.min(order.len())
        };
        for (pos, &i) in order.iter().enumerate() {
            let (r, all, wake, pre) = &rows[i];
            if pos == shown {
                report.footnotes.push(format!(
                    "{} more row(s) with less total wait not shown (--rows 0 shows all)",
                    order.len() - shown
                ));
            }
            if pos < shown {
                t.push(vec![
                    r.id.to_string(),
                    r.name_text(),
                    all.count.to_string(),
                    fmt_ns(all.p50_ns),
                    fmt_ns(all.p90_ns),
                    fmt_ns(all.p99_ns),
                    fmt_ns(all.p999_ns),
                    fmt_ns(all.max_ns),
                    fmt_ns(all.total_ns),
                    format!("{:.1}", all.total_ns as f64 / 1e7 / secs),
                    fmt_ns(wake.p99_ns),
                    pre.count.to_string(),
                    fmt_ns(pre.p99_ns),
                ]);
                report.hists.push((
                    format!("wake[{} {}]", r.id, sanitize::text(&r.comm)),
                    r.wake,
                ));
                report.hists.push((
                    format!("preempt[{} {}]", r.id, sanitize::text(&r.comm)),
                    r.preempt,
                ));
            }
            let mut line = json!({
                "tool": NAME,
                "type": "summary",
                "pid": if self.common.threads { r.tgid } else { r.id },
                "mean_ns": all.mean_ns,
                "interval_ns": w.elapsed.as_nanos() as u64,
                "interval_end": end_text,
                "interval_end_ns": end_ns,
            });
            stats_json("", all, &mut line);
            stats_json("wake_", wake, &mut line);
            stats_json("preempt_", pre, &mut line);
            r.put_names(&mut line);
            if self.common.threads {
                line["tid"] = json!(r.id);
            }
            report.json.push(line);
        }
        if rows.is_empty() {
            report.notes.push("no run-queue waits seen".into());
        }
        report.tables.push(t);
        report.footnotes.push(
            "%TIME: share of the interval spent waiting (summed over the threads); WAKE: waits after a wakeup, PREEMPT: waits after being preempted while runnable."
                .into(),
        );
        report.json.push(sched::stats_line(NAME, w, st, waits));
        Ok(report)
    }
}
