//! `tracekit ctxsw`: context switches per process (or thread), voluntary and involuntary exactly
//! as the kernel counts them (`nvcsw` / `nivcsw`), CPU migrations, run-queue waits (after a
//! wakeup on the wall clock, after a preemption by `run_delay`), who took the CPU on involuntary
//! switches, and with `--threads` who woke whom; plus a system line from `/proc/stat`
//! (switches, runnable tasks, steal per CPU). Findings name a context-switch storm. `--top` is
//! the engine's live view of the same collector.
//!
//! Kernel side: `probes-ebpf/src/bin/sched.rs`, shared with runq-lat (`tools::sched`).

use std::{io::IsTerminal, time::Duration};

use crate::report::{
    schema::{Direction::*, Dist, Field, Rows},
    units::per_s,
    who::ID_FIELDS,
};
use serde::Serialize;
use serde_json::json;

use crate::{
    engine::{live::Live, Collector, Output, Window},
    error::Result,
    host::sysstat::SysStat,
    options::Common,
    report::{
        findings::{rank, Cause, Finding, Score, Subject},
        hist,
        render::fmt_ns,
        rows::{id_columns, Column, Ctx, Section},
        sanitize,
    },
    tools::{
        self,
        sched::{self, ByA, Cap, Names, Peer, Record, Row, SchedSession, Who},
        OpenCtx, ToolInfo,
    },
};

pub const INFO: ToolInfo = ToolInfo {
    name: "ctxsw",
    summary: "Who context-switches and why: switches/s per process (or `--threads`), voluntary vs involuntary exactly as the kernel counts them (matches `/proc/<pid>/status`), CPU migrations/s, run-queue wait p50/p99 (after a wakeup on the wall clock), who took the CPU on involuntary switches (the noisy neighbour), with `--threads` who wakes whom, and a system line (switches/s vs `/proc/stat` `ctxt`, runnable tasks, steal % per CPU); findings name a switch storm. `--top [N]` is a live view (keys: `s`/Tab sort, `t`/`v`/`i`/`m`/`d`, `p` pause, `q` quit).",
    hooks: sched::HOOKS,
    triage: true,
    hidden: false,
    // task_struct's tgid and sched_info.run_delay are read at BTF offsets.
    needs_btf: true,
    rows: &[&SUMMARY_ROWS, &WAKER_ROWS],
    causes: &[CTXSW_STORM],
    by_container: true,
    joins: &[],
};

/// Evidence of a storm finding that triage reads.
pub mod ev {
    use crate::report::findings::Ev;
    /// Voluntary switches per second: how many handoffs the storm's waits are compared with.
    pub const VOLUNTARY_PER_S: Ev = Ev("voluntary_per_s");
}

// The causes this tool concludes (listed in INFO; see report::findings::Cause).
pub const CTXSW_STORM: Cause = Cause::new(
    "ctxsw-storm",
    "A process switches context so often (tens of thousands of times a second) that the switching is its cost.",
)
.summing(&["switches_per_s", "voluntary_per_s", "involuntary_per_s", "own_preemptions", "runq_total_ns"]);

const EXAMPLES: &str = "  tracekit ctxsw --duration 10s                     # who switches, voluntary or not, and who preempts whom
  tracekit ctxsw --duration 1m --top 20              # live view of the top 20 (per interval without a terminal)
  tracekit ctxsw --duration 10s --threads --comm postgres --json   # one program's threads, who wakes whom, as NDJSON";

#[derive(clap::Args, Debug)]
#[command(after_help = tools::help_footer(EXAMPLES, sched::NEEDS))]
pub struct Args {
    #[command(flatten)]
    pub common: Common,

    /// Live view refreshed every --interval (default 1s), sorted by switch rate; keys: s/Tab
    /// next sort column, t/v/i/m/d sort by total/voluntary/involuntary/migrations/delay, p or
    /// space pause, q or Ctrl-C quit. N limits rows. Without a terminal (or with --json)
    /// prints one table (or JSON set) per interval instead.
    #[arg(long, value_name = "N", num_args = 0..=1, default_missing_value = "0")]
    pub top: Option<usize>,

    /// Rows shown in the text table, most switches first (0: all). JSON has every row, up to
    /// 1024 a window (or --rows, or --max-keys, if more): the processes with the fewest
    /// switches beyond that are summed in the [other] row, and a note says how many.
    #[arg(long, default_value_t = 25, value_name = "N")]
    pub rows: usize,

    /// Preempting processes (threads with --threads) shown per row.
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub top_preemptors: usize,
}

/// `--top` draws in the terminal only when both ends are one: else it prints per interval.
fn live(args: &Args) -> bool {
    args.top.is_some()
        && !args.common.json
        && args.common.output.is_none()
        && std::io::stdout().is_terminal()
        && std::io::stdin().is_terminal()
}

pub fn run(mut args: Args) -> Result<()> {
    if args.top.is_some() && args.common.interval.is_none() {
        args.common.interval = Some(Duration::from_secs(1));
    }
    if live(&args) {
        let limit = args.top.unwrap_or(0);
        tools::run_collector_with(
            INFO.name,
            &args.common,
            |ctx| open(&args, ctx),
            |_, _| Box::new(Live::new(limit)),
        )
    } else {
        tools::run_collector(INFO.name, &args.common, |ctx| open(&args, ctx))
    }
}

/// Loads and attaches the `sched` programs with what ctxsw records.
pub fn open(args: &Args, ctx: &OpenCtx) -> Result<Box<dyn Collector>> {
    let record = Record {
        preemptors: true,
        culprits: false,
        wakers: ctx.scope.threads,
        wake_from: sched::WakeFrom::Waking,
        node_time: false,
    };
    let s = sched::open(ctx, record)?;
    let max_rows = match (live(args), args.top) {
        // The live view sorts every row itself and shows what fits.
        (true, _) => 0,
        (false, Some(n)) if n > 0 => n,
        _ => args.rows,
    };
    Ok(Box::new(Ctxsw {
        s,
        max_rows,
        top_preemptors: args.top_preemptors,
        sys_prev: SysStat::read().ok(),
    }))
}

struct Ctxsw {
    s: SchedSession,
    max_rows: usize,
    top_preemptors: usize,
    sys_prev: Option<SysStat>,
}

/// One process (or thread) in one window.
#[derive(Serialize)]
struct CtxswRow {
    #[serde(flatten)]
    who: Who,
    voluntary: u64,
    involuntary: u64,
    migrations: u64,
    /// How long the task lived in the window: its rates are per second of this (at least of
    /// one second, see `sched::rate_secs`), the node's per second of the window.
    alive_ns: u64,
    switches_per_s: f64,
    voluntary_per_s: f64,
    involuntary_per_s: f64,
    migrations_per_s: f64,
    /// Every run-queue wait: after a wakeup (wall clock) and after a preemption (run_delay).
    runq_count: u64,
    runq_total_ns: u64,
    runq_p50_ns: u64,
    runq_p99_ns: u64,
    /// The kernel's own run-queue delay (`/proc/<pid>/schedstat`): misses most of a wait after
    /// a wakeup that preempts.
    kernel_run_delay_ns: u64,
    /// Wakeups issued by a thread of the same process.
    own_wakeups: u64,
    preempted_by: Vec<Peer>,
    #[serde(skip)]
    id: u32,
    /// Its life in the window (CLOCK_MONOTONIC ns), for a process's life over its threads.
    #[serde(skip)]
    alive: (u64, u64),
    #[serde(skip)]
    name: String,
    #[serde(skip)]
    preempted_text: String,
    /// Waits after a wakeup timed from a seen wakeup (the share of own wakeups is of these).
    #[serde(skip)]
    woken: u64,
    #[serde(skip)]
    waits: probes_common::hist::LatHist,
}

impl crate::report::rows::Row for CtxswRow {
    fn container(&self) -> Option<&crate::report::who::InContainer> {
        Some(&self.who.id.container)
    }
}

fn opt_ns(count: u64, ns: u64) -> String {
    if count > 0 {
        fmt_ns(ns)
    } else {
        "-".into()
    }
}

const CTXSW_SUMMARY: &[Field] = &[
    Field::count("voluntary", Neutral).export(
        "tracekit_ctxsw_voluntary",
        "Voluntary context switches (the task blocked).",
    ),
    Field::count("involuntary", LowerIsBetter).export(
        "tracekit_ctxsw_involuntary",
        "Involuntary context switches (preempted while runnable).",
    ),
    Field::count("migrations", Neutral).export(
        "tracekit_ctxsw_migrations",
        "Moves of a task to another CPU.",
    ),
    Field::stat("alive_ns"),
    Field::stat("switches_per_s"),
    Field::stat("voluntary_per_s"),
    Field::stat("involuntary_per_s"),
    Field::stat("migrations_per_s"),
    Field::count("runq_count", Neutral),
    Field::count("runq_total_ns", LowerIsBetter),
    Field::stat("runq_p50_ns"),
    Field::stat("runq_p99_ns"),
    Field::count("kernel_run_delay_ns", LowerIsBetter),
    Field::count("own_wakeups", Neutral),
];

/// The summary rows: per process (or thread).
pub const SUMMARY_ROWS: Rows = Rows {
    kind: "summary",
    labels: &[],
    fields: &[ID_FIELDS, CTXSW_SUMMARY],
    dists: &[Dist::exported(
        "wake_wait",
        "tracekit_ctxsw_wake_wait_seconds",
        "Time from wakeup to running.",
    )],
};

const COLUMNS: &[Column<CtxswRow>] = &[
    Column::right("PID", |r: &CtxswRow, _: &Ctx| r.who.id_text()),
    Column::left("COMM", |r, _| r.name.clone()),
    Column::right("SW/s", |r: &CtxswRow, _: &Ctx| {
        format!("{:.1}", r.switches_per_s)
    })
    .sort('t', |r, _| r.switches_per_s),
    Column::right("VOL/s", |r: &CtxswRow, _: &Ctx| {
        format!("{:.1}", r.voluntary_per_s)
    })
    .sort('v', |r, _| r.voluntary_per_s),
    Column::right("INVOL/s", |r: &CtxswRow, _: &Ctx| {
        format!("{:.1}", r.involuntary_per_s)
    })
    .sort('i', |r, _| r.involuntary_per_s),
    Column::right("MIGR/s", |r: &CtxswRow, _: &Ctx| {
        format!("{:.1}", r.migrations_per_s)
    })
    .sort('m', |r, _| r.migrations_per_s),
    Column::right("RQ_P50", |r: &CtxswRow, _: &Ctx| {
        opt_ns(r.runq_count, r.runq_p50_ns)
    }),
    Column::right("RQ_P99", |r: &CtxswRow, _: &Ctx| {
        opt_ns(r.runq_count, r.runq_p99_ns)
    })
    .sort('d', |r, _| r.runq_p99_ns as f64),
    Column::left("PREEMPTED_BY", |r, _| r.preempted_text.clone()),
];

/// The system line's figures for one window.
#[derive(Default)]
struct System {
    /// Every traced switch: the rows' and, without --pid/--comm, those away from the idle
    /// task, which belong to no process but make the total comparable with /proc/stat.
    switches: u64,
    idle_switches: u64,
    whole_system: bool,
    ctxt_per_s: Option<f64>,
    procs_running: Option<u32>,
    steal_pct: Vec<Option<f64>>,
}

impl System {
    fn text(&self, secs: f64) -> String {
        let steal: Vec<String> = self
            .steal_pct
            .iter()
            .enumerate()
            .map(|(i, s)| match s {
                Some(p) => format!("cpu{i} {p:.1}%"),
                None => format!("cpu{i} -"),
            })
            .collect();
        let idle = if self.whole_system {
            format!(
                " ({:.0}/s away from the idle task)",
                self.idle_switches as f64 / secs
            )
        } else {
            " (in scope)".to_string()
        };
        format!(
            "system: {:.0} switches/s traced{idle}, /proc/stat ctxt {}/s; runnable tasks {}; steal {}",
            self.switches as f64 / secs,
            self.ctxt_per_s
                .map(|c| format!("{c:.0}"))
                .unwrap_or_else(|| "?".into()),
            self.procs_running
                .map(|r| r.to_string())
                .unwrap_or_else(|| "?".into()),
            if steal.is_empty() {
                "not reported".to_string()
            } else {
                steal.join(", ")
            }
        )
    }

    fn json(&self, secs: f64) -> serde_json::Value {
        json!({
            "type": "system",
            "switches_per_s": per_s(self.switches, secs),
            "switches": self.switches,
            "idle_switches": self.idle_switches,
            "proc_stat_ctxt_per_s": self.ctxt_per_s.map(|c| (c * 1000.0).round() / 1000.0),
            "procs_running": self.procs_running,
            "steal_ppm": self.steal_pct.iter().map(|s| s.map(|p| (p * 10_000.0).round() as u64)).collect::<Vec<_>>(),
        })
    }
}

/// A waker → wakee pair (`--threads`).
#[derive(Serialize)]
struct WakerRow {
    pid: u32,
    tid: u32,
    comm: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    comm_bytes: Option<Vec<u8>>,
    wakee_pid: u32,
    wakee_tid: u32,
    wakee_comm: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    wakee_comm_bytes: Option<Vec<u8>>,
    wakeups: u64,
    wakeups_per_s: f64,
    same_process: bool,
    #[serde(skip)]
    waker_text: String,
    #[serde(skip)]
    wakee_text: String,
}

impl crate::report::rows::Row for WakerRow {}

const CTXSW_WAKER: &[Field] = &[
    Field::key("pid"),
    Field::key("tid"),
    Field::key("wakee_pid"),
    Field::key("wakee_tid"),
    Field::count("wakeups", Neutral),
    Field::stat("wakeups_per_s"),
];

/// `--threads` rows: who wakes whom.
pub const WAKER_ROWS: Rows = Rows {
    kind: "waker",
    labels: &[],
    fields: &[CTXSW_WAKER],
    dists: &[],
};

const WAKERS: &[Column<WakerRow>] = &[
    Column::left("WAKER", |r, _| r.waker_text.clone()),
    Column::left("WAKEE", |r, _| r.wakee_text.clone()),
    Column::right("WAKEUPS/s", |r, _| format!("{:.1}", r.wakeups_per_s)),
    Column::left("SAME_PROCESS", |r, _| {
        if r.same_process { "yes" } else { "no" }.into()
    }),
];

impl Ctxsw {
    fn system(&mut self, rows: &[Row], st: &[u64], secs: f64) -> System {
        let now = SysStat::read().ok();
        let scope = &self.s.scope;
        let whole_system = scope.pids.is_empty() && scope.comm.is_none();
        let idle_switches = if whole_system {
            st[probes_common::sched::STAT_IDLE_SWITCHES as usize]
        } else {
            0
        };
        let mut sys = System {
            switches: rows.iter().map(Row::switches).sum::<u64>() + idle_switches,
            idle_switches,
            whole_system,
            ..System::default()
        };
        if let (Some(a), Some(b)) = (&self.sys_prev, &now) {
            sys.ctxt_per_s = Some(b.ctxt.saturating_sub(a.ctxt) as f64 / secs);
            sys.procs_running = b.procs_running;
            sys.steal_pct = b.steal_pct(a);
        }
        if now.is_some() {
            self.sys_prev = now;
        }
        sys
    }

    fn row(&self, r: &Row, names: &Names, pre: &ByA, secs: f64) -> CtxswRow {
        let threads = self.s.scope.threads;
        let st = hist::stats(&r.waits());
        let preempted_by = pre.peers(r.id, names, threads, false);
        let preempted_text = preempted_by
            .iter()
            .take(self.top_preemptors)
            .map(|p| format!("{}×{}", p.text(), p.count))
            .collect::<Vec<_>>()
            .join(" ");
        let v = &r.v;
        let who = self.s.who(r);
        let name = who.row_name(r);
        let alive_ns = r.alive_ns();
        let rs = sched::rate_secs(alive_ns, secs);
        CtxswRow {
            who,
            voluntary: v.voluntary,
            involuntary: v.involuntary,
            migrations: v.migrations,
            alive_ns,
            switches_per_s: per_s(r.switches(), rs),
            voluntary_per_s: per_s(v.voluntary, rs),
            involuntary_per_s: per_s(v.involuntary, rs),
            migrations_per_s: per_s(v.migrations, rs),
            runq_count: st.count,
            runq_total_ns: st.total_ns,
            runq_p50_ns: st.p50_ns,
            runq_p99_ns: st.p99_ns,
            kernel_run_delay_ns: v.run_delay_ns,
            own_wakeups: v.own_wakeups,
            preempted_by,
            id: r.id,
            alive: r.alive,
            name,
            preempted_text,
            woken: r.woken(),
            waits: r.waits(),
        }
    }

    fn wakers(&self, iv: &sched::Interval, names: &Names, secs: f64) -> Vec<WakerRow> {
        iv.wakers
            .iter()
            .map(|p| {
                let (a, b) = (names.get(p.a), names.get(p.b));
                let (comm, comm_bytes) = sanitize::name_fields(&a);
                let (wakee_comm, wakee_comm_bytes) = sanitize::name_fields(&b);
                WakerRow {
                    pid: p.a_tgid,
                    tid: p.a,
                    comm,
                    comm_bytes,
                    wakee_pid: p.b_tgid,
                    wakee_tid: p.b,
                    wakee_comm,
                    wakee_comm_bytes,
                    wakeups: p.count,
                    wakeups_per_s: per_s(p.count, secs),
                    same_process: p.a_tgid == p.b_tgid,
                    waker_text: format!("{}({}) →", sanitize::text(&a), p.a),
                    wakee_text: format!("{}({})", sanitize::text(&b), p.b),
                }
            })
            .collect()
    }
}

/// The storm threshold is the harm model's ([`crate::report::harm::STORM_PER_S`]).
pub use crate::report::harm::STORM_PER_S;

impl Collector for Ctxsw {
    fn name(&self) -> &'static str {
        INFO.name
    }

    fn meta(&self) -> crate::engine::Meta {
        self.s.meta(INFO.name, "context switches")
    }

    fn flip(&mut self) -> Result<()> {
        self.s.flip()
    }

    fn set_filter_pids(&mut self, pids: &[u32]) -> Result<()> {
        self.s.set_filter_pids(pids)
    }

    fn slow_links(&mut self) -> usize {
        self.s.slow_links()
    }

    fn collect(&mut self, w: &Window) -> Result<Output> {
        let secs = w.secs();
        // A process a storm finding could name keeps its row whatever the cap: one that
        // lived the shortest span a rate is taken over (`sched::rate_secs`).
        let storm = (STORM_PER_S * sched::rate_secs(0, secs)) as u64;
        let cap = Cap::new(
            &self.s.scope,
            self.max_rows,
            |v| v.voluntary + v.involuntary,
            Box::new(move |v| v.voluntary + v.involuntary >= storm),
        );
        let iv = self.s.drain(&cap)?;
        let threads = self.s.scope.threads;
        let sys = self.system(&iv.rows, &iv.stats, secs);
        let names = Names::of_window(&iv);
        let pre = ByA::of(&iv.preemptors);
        let mut rows: Vec<CtxswRow> = iv
            .rows
            .iter()
            .map(|r| self.row(r, &names, &pre, secs))
            .collect();
        drop(pre);
        rows.sort_by(|a, b| {
            (b.voluntary + b.involuntary)
                .cmp(&(a.voluntary + a.involuntary))
                .then(a.id.cmp(&b.id))
        });
        let switches: u64 = rows.iter().map(|r| r.voluntary + r.involuntary).sum();
        let vol: u64 = rows.iter().map(|r| r.voluntary).sum();
        let mut out = Output {
            title: format!(
                "ctxsw: {switches} switches ({vol} voluntary, {} involuntary) in {}; {}",
                switches - vol,
                self.s.scope.describe(),
                w.span(),
            ),
            ..Output::default()
        };
        out.notes.push(sys.text(secs));
        let nothing = rows.is_empty().then_some("no context switches seen");
        out.notes.extend(self.s.window_notes(&iv, nothing));
        out.findings = findings(&rows, secs, &iv.preemptors);
        let cols = id_columns(COLUMNS, threads);
        let ctx = Ctx { secs };
        out.sections.push(
            Section::build(&SUMMARY_ROWS, &rows, &cols, &ctx, self.max_rows).with_dists(
                &rows,
                |r| format!("{} {}", r.id, r.name),
                |r| vec![("wake_wait", r.waits)],
            ),
        );
        if threads {
            let wakers = self.wakers(&iv, &names, secs);
            out.sections.push(
                Section::build(&WAKER_ROWS, &wakers, WAKERS, &ctx, self.max_rows)
                    .caption("Who wakes whom (sched_waking), most wakeups first:"),
            );
        }
        out.extra_json.push(sys.json(secs));
        let window_ns = (secs * 1e9) as u64;
        if rows
            .iter()
            .any(|r| r.id != 0 && r.alive_ns * 20 < window_ns * 19)
        {
            out.footnotes.push(
                "*/s: a process's rates are per second of its life in the window (alive_ns in JSON; a second at least), the system line's per second of the window.".into(),
            );
        }
        if !self.s.wall_clock() {
            out.footnotes.push(
                "RQ_*: waits after a wakeup are the kernel's run_delay here (no wakeup hook), which misses most of a wait after a wakeup that preempts.".into(),
            );
        }
        out.stats = Some(sched::stats(&iv, switches));
        Ok(out)
    }
}

mod findings;
use findings::findings;

#[cfg(test)]
mod tests;
