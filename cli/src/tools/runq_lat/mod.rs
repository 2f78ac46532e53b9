//! `tracekit runq-lat`: run-queue latency per process (or thread): how long runnable tasks
//! waited for a CPU, split by how the wait began (a wakeup, or a preemption while runnable), and
//! who held the CPU while a woken task waited.
//!
//! Waits after a wakeup are timed on the wall clock, from `sched_waking` (or, with `--from
//! wakeup`, `sched_wakeup`, where runqlat and `perf sched` start) to the switch-in: the
//! kernel's `sched_info.run_delay` misses most of such a wait when the wakeup preempts (its clock
//! is not updated then, issue #17). Waits after a preemption are `run_delay`'s, and the kernel's
//! `run_delay` total is reported beside them (`kernel_run_delay_ns`), agreeing with
//! `/proc/<pid>/schedstat`. Kernel side: `probes-ebpf/src/bin/sched.rs`.

use std::collections::BTreeMap;

use crate::report::harm::{self, MIN_PREEMPT_NS_PER_S, MIN_WAKE_NS_PER_S};

use crate::report::{
    schema::{Direction::*, Dist, Field, Rows},
    who::ID_FIELDS,
};
use serde::Serialize;

use crate::{
    engine::{Collector, Output, Window},
    error::Result,
    host::{proc::Classes, sysstat::SysStat},
    options::Common,
    report::{
        findings::Cause,
        hist::{self, Keyed, Stat},
        render::fmt_ns,
        rows::{id_columns, Column, Ctx, Section},
    },
    tools::{
        self,
        sched::{self, ByA, Cap, Names, Pair, Peer, Record, Row, SchedSession, Who},
        OpenCtx, ToolInfo,
    },
};

pub const INFO: ToolInfo = ToolInfo {
    name: "runq-lat",
    summary: "How long runnable tasks wait for a CPU, per process (or `--threads`): waits after a wakeup (wall clock from `sched_waking`, the wakeup path and IPI included; `--from wakeup` starts at `sched_wakeup` as runqlat and `perf sched` do) and after a preemption, count, p50/p90/p99/p99.9, max and total, the kernel's own `run_delay` beside them (`/proc/<pid>/schedstat`), and who held the CPU while a woken task waited; findings name the starved process and the hogs.",
    hooks: sched::HOOKS,
    triage: true,
    hidden: false,
    // task_struct's tgid and sched_info.run_delay are read at BTF offsets.
    needs_btf: true,
    rows: &[&SUMMARY_ROWS, &AGGRESSOR_ROWS],
    causes: &[RUNQ_DELAY, CPU_SATURATED],
    by_container: true,
    joins: &[],
};

/// Evidence of a run-queue finding that triage reads (it folds a storm's own waits into
/// ctxsw's storm finding).
pub mod ev {
    use crate::report::findings::Ev;
    /// Waits after wakeups, and their total, p50 (every `wake_` key moves with a fold).
    pub const WAKE_WAITS: Ev = Ev("wake_waits");
    pub const WAKE_WAIT_TOTAL_NS: Ev = Ev("wake_wait_total_ns");
    pub const WAKE_P50_NS: Ev = Ev("wake_p50_ns");
    pub const WAKE_P99_NS: Ev = Ev("wake_p99_ns");
    pub const WAKE_P999_NS: Ev = Ev("wake_p999_ns");
    pub const WAKE_MAX_NS: Ev = Ev("wake_max_ns");
    /// Late waits (longer than `wake_late_over_ns`, see report::harm) and their excess over
    /// the median wait: what a latency-sensitive victim felt.
    pub const WAKE_LATE: Ev = Ev("wake_late");
    pub const WAKE_LATE_OVER_NS: Ev = Ev("wake_late_over_ns");
    pub const WAKE_EXCESS_NS: Ev = Ev("wake_excess_ns");
    /// The waits of 1 ms or more, summed: what `culprit_late_delay_ns` is a part of.
    pub const WAKE_LONG_TOTAL_NS: Ev = Ev("wake_long_total_ns");
    /// The prefix of every key about waits after wakeups.
    pub const WAKE_PREFIX: &str = "wake_";
    /// The part of the waits the named culprit held the CPU.
    pub const CULPRIT_DELAY_NS: Ev = Ev("culprit_delay_ns");
    /// The part of the waits of 1 ms or more the named culprit held the CPU.
    pub const CULPRIT_LATE_DELAY_NS: Ev = Ev("culprit_late_delay_ns");
    /// Where the culprit is a CPU's softirq work: the CPU, and its softirq share of the window
    /// (`/proc/stat`, ppm).
    pub const SOFTIRQ_CPU: Ev = Ev("softirq_cpu");
    pub const CPU_SOFTIRQ_PPM: Ev = Ev("cpu_softirq_ppm");
}

// The causes this tool concludes (listed in INFO; see report::findings::Cause).
pub const RUNQ_DELAY: Cause = Cause::new(
    "runq-delay",
    "A process waits runnable for a CPU that other tasks hold.",
)
.summing(&[
    ev::WAKE_WAITS.0,
    ev::WAKE_WAIT_TOTAL_NS.0,
    ev::WAKE_LATE.0,
    ev::WAKE_LONG_TOTAL_NS.0,
]);
pub const CPU_SATURATED: Cause = Cause::new(
    "cpu-saturated",
    "More runnable CPU-bound threads than CPUs: they wait for each other after preemptions.",
);

const EXAMPLES: &str =
    "  tracekit runq-lat --duration 10s                  # who waits for a CPU, how long, and behind whom
  tracekit runq-lat --duration 10s --threads --hist   # per thread, with latency bars
  tracekit runq-lat --duration 1m --interval 10s --json   # one NDJSON set per 10 s";

#[derive(clap::Args, Debug)]
#[command(after_help = tools::help_footer(EXAMPLES, sched::NEEDS))]
pub struct Args {
    #[command(flatten)]
    pub common: Common,

    /// Rows shown in the text table, largest total wait first (0: all). JSON has every row, up
    /// to 1024 a window (or --rows, or --max-keys, if more): the processes that waited least
    /// beyond that are summed in the [other] row, and a note says how many.
    #[arg(long, default_value_t = 25, value_name = "N")]
    pub rows: usize,

    /// Where a wait after a wakeup starts: `waking` (sched_waking, when the wakeup is issued:
    /// the wakeup path and any IPI to an idle CPU included) or `wakeup` (sched_wakeup, the task
    /// on its run queue: what libbpf-tools runqlat and `perf sched` measure).
    #[arg(long, value_enum, default_value_t = WakeFrom::Waking, value_name = "EVENT")]
    pub from: WakeFrom,
}

pub use sched::WakeFrom;

pub fn run(args: Args) -> Result<()> {
    tools::run_collector(INFO.name, &args.common, |ctx| open(&args, ctx))
}

/// What runq-lat has the `sched` programs record.
fn record(args: &Args) -> Record {
    Record {
        preemptors: false,
        culprits: true,
        wakers: false,
        wake_from: args.from,
        node_time: false,
    }
}

/// Loads and attaches the `sched` programs with what runq-lat records.
pub fn open(args: &Args, ctx: &OpenCtx) -> Result<Box<dyn Collector>> {
    Ok(Box::new(RunqLat {
        s: sched::open(ctx, record(args))?,
        max_rows: args.rows,
        psi: cpu_psi(),
        stat: SysStat::read().ok(),
        virtual_machine: virtual_machine(),
        classes: Classes::default(),
    }))
}

struct RunqLat {
    s: SchedSession,
    max_rows: usize,
    /// `/proc/pressure/cpu` at the start of the window (None without PSI).
    psi: Option<crate::host::psi::Psi>,
    /// `/proc/stat` at the start of the window: each CPU's softirq time.
    stat: Option<SysStat>,
    virtual_machine: bool,
    /// How each task asked to be scheduled, learnt while it lived.
    classes: Classes,
}

/// How often the classes of new tasks are learnt (a task that ran and exited within it is
/// judged as nice 0).
const LEARN_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// System-wide CPU pressure now, if the kernel has PSI.
fn cpu_psi() -> Option<crate::host::psi::Psi> {
    crate::host::psi::system().get("cpu").copied()
}

/// Whether this node is a virtual machine (the `hypervisor` CPU flag).
fn virtual_machine() -> bool {
    crate::host::read_text_capped(
        &crate::host::proc_path("cpuinfo"),
        crate::host::SMALL_FILE * 4,
    )
    .map(|t| {
        t.lines()
            .filter(|l| l.starts_with("flags"))
            .any(|l| l.split_whitespace().any(|w| w == "hypervisor"))
    })
    .unwrap_or(false)
}

/// The statistics of each of a row's three latency groups (`wake_p99_ns`, …).
const RUNQ_STATS: &[Stat] = &[
    Stat::Count,
    Stat::TotalNs,
    Stat::P50Ns,
    Stat::P90Ns,
    Stat::P99Ns,
    Stat::P999Ns,
    Stat::MaxNs,
];

/// One process (or thread) in one window.
#[derive(Serialize)]
struct RunqRow {
    #[serde(flatten)]
    who: Who,
    mean_ns: u64,
    #[serde(flatten)]
    all: Keyed,
    #[serde(flatten)]
    wake: Keyed,
    #[serde(flatten)]
    preempt: Keyed,
    /// The kernel's own run-queue delay over the window (`/proc/<pid>/schedstat`'s second
    /// field): misses most of a wait after a wakeup that preempts.
    kernel_run_delay_ns: u64,
    /// Waits after a wakeup whose wakeup was not seen: timed by run_delay.
    wake_unmeasured: u64,
    /// Who held the CPU while it waited after a wakeup (waits of 20 µs or more): the two tasks
    /// that ran last before it, each with the part of the waits it ran.
    waited_behind: Vec<Peer>,
    /// The same over its waits of 1 ms or more (`harm::LATE_FLOOR_NS`): who held the CPU
    /// during the waits it felt.
    late_waits_behind: Vec<Peer>,
    #[serde(skip)]
    id: u32,
    #[serde(skip)]
    name: String,
    #[serde(skip)]
    behind_text: String,
    #[serde(skip)]
    hists: (probes_common::hist::LatHist, probes_common::hist::LatHist),
}

impl crate::report::rows::Row for RunqRow {
    fn container(&self) -> Option<&crate::report::who::InContainer> {
        Some(&self.who.id.container)
    }
}

const RUNQ_SUMMARY: &[Field] = &[
    Field::stat("mean_ns"),
    Field::count("count", Neutral).export("tracekit_runq_waits", "Waits on a run queue."),
    Field::count("total_ns", LowerIsBetter),
    Field::stat("p50_ns"),
    Field::stat("p90_ns"),
    Field::stat("p99_ns"),
    Field::stat("p999_ns"),
    Field::stat("max_ns"),
    Field::count("wake_count", Neutral),
    Field::count("wake_total_ns", LowerIsBetter),
    Field::stat("wake_p50_ns"),
    Field::stat("wake_p90_ns"),
    Field::stat("wake_p99_ns"),
    Field::stat("wake_p999_ns"),
    Field::stat("wake_max_ns"),
    Field::count("preempt_count", LowerIsBetter),
    Field::count("preempt_total_ns", LowerIsBetter),
    Field::stat("preempt_p50_ns"),
    Field::stat("preempt_p90_ns"),
    Field::stat("preempt_p99_ns"),
    Field::stat("preempt_p999_ns"),
    Field::stat("preempt_max_ns"),
    Field::count("kernel_run_delay_ns", LowerIsBetter).export(
        "tracekit_runq_delay_seconds",
        "Time spent runnable but waiting for a CPU (schedstat).",
    ),
    Field::count("wake_unmeasured", Neutral),
];

/// The summary rows: per process (or thread).
pub const SUMMARY_ROWS: Rows = Rows {
    kind: "summary",
    labels: &[],
    fields: &[ID_FIELDS, RUNQ_SUMMARY],
    dists: &[
        Dist::exported(
            "wake",
            "tracekit_runq_wake_latency_seconds",
            "Run-queue wait after a wakeup.",
        ),
        Dist::exported(
            "preempt",
            "tracekit_runq_preempt_latency_seconds",
            "Run-queue wait after a preemption.",
        ),
    ],
};

const COLUMNS: &[Column<RunqRow>] = &[
    Column::right("PID", |r: &RunqRow, _: &Ctx| r.who.id_text()),
    Column::left("COMM", |r, _| r.name.clone()),
    Column::right("WAITS", |r, _| r.all.s.count.to_string()),
    Column::right("P50", |r, _| fmt_ns(r.all.s.p50_ns)),
    Column::right("P90", |r, _| fmt_ns(r.all.s.p90_ns)),
    Column::right("P99", |r: &RunqRow, _: &Ctx| fmt_ns(r.all.s.p99_ns))
        .sort('9', |r, _| r.all.s.p99_ns as f64),
    Column::right("P99.9", |r: &RunqRow, _: &Ctx| fmt_ns(r.all.s.p999_ns)),
    Column::right("MAX", |r, _| fmt_ns(r.all.s.max_ns)),
    Column::right("TOTAL", |r: &RunqRow, _: &Ctx| fmt_ns(r.all.s.total_ns))
        .sort('t', |r, _| r.all.s.total_ns as f64),
    Column::right("%TIME", |r: &RunqRow, c: &Ctx| {
        format!("{:.1}", r.all.s.total_ns as f64 / 1e7 / c.secs)
    }),
    Column::right("WAKE_P99", |r: &RunqRow, _: &Ctx| fmt_ns(r.wake.s.p99_ns))
        .sort('w', |r, _| r.wake.s.p99_ns as f64),
    Column::right("PREEMPT_N", |r, _| r.preempt.s.count.to_string()),
    Column::right("PREEMPT_P99", |r, _| fmt_ns(r.preempt.s.p99_ns)),
    Column::right("RUN_DELAY", |r, _| fmt_ns(r.kernel_run_delay_ns)),
    Column::left("WAITED_BEHIND", |r, _| r.behind_text.clone()),
];

/// A task that held the CPU while others waited after their wakeups.
#[derive(Serialize)]
struct Aggressor {
    #[serde(flatten)]
    who: Who,
    /// Wall-clock time tasks woken on its CPU waited while it held it.
    delay_caused_ns: u64,
    waits: u64,
    victims: u64,
    #[serde(skip)]
    text: String,
}

impl crate::report::rows::Row for Aggressor {
    fn container(&self) -> Option<&crate::report::who::InContainer> {
        Some(&self.who.id.container)
    }
}

const RUNQ_AGGRESSOR: &[Field] = &[
    Field::count("delay_caused_ns", LowerIsBetter),
    Field::count("waits", LowerIsBetter),
    Field::count("victims", Neutral),
];

/// Who held the CPUs others waited for.
pub const AGGRESSOR_ROWS: Rows = Rows {
    kind: "aggressor",
    labels: &[],
    fields: &[ID_FIELDS, RUNQ_AGGRESSOR],
    dists: &[],
};

const AGGRESSORS: &[Column<Aggressor>] = &[
    Column::left("HELD_THE_CPU", |r, _| r.text.clone()),
    Column::right("DELAY_CAUSED", |r, _| fmt_ns(r.delay_caused_ns)),
    Column::right("%TIME", |r, c| {
        format!("{:.1}", r.delay_caused_ns as f64 / 1e7 / c.secs)
    }),
    Column::right("WAITS", |r, _| r.waits.to_string()),
    Column::right("VICTIMS", |r, _| r.victims.to_string()),
];

/// The aggressors of a window (of the victims in `rows`: the pairs are not filtered in the
/// kernel), most delay caused first.
fn aggressors(pairs: &[Pair], victims: &[u32], names: &Names, threads: bool) -> Vec<Aggressor> {
    let mut by: BTreeMap<u32, (u32, u64, u64, u64)> = BTreeMap::new();
    for p in pairs.iter().filter(|p| victims.binary_search(&p.a).is_ok()) {
        let e = by.entry(p.b).or_insert((p.b_tgid, 0, 0, 0));
        e.1 += p.ns;
        e.2 += p.count;
        e.3 += 1;
    }
    let mut v: Vec<Aggressor> = by
        .into_iter()
        .map(|(id, (tgid, ns, waits, victims))| {
            let peer = Peer::new(id, tgid, waits, Some(ns), names, threads);
            Aggressor {
                text: peer.text(),
                who: peer.who,
                delay_caused_ns: ns,
                waits,
                victims,
            }
        })
        .collect();
    v.sort_by(|a, b| {
        b.delay_caused_ns
            .cmp(&a.delay_caused_ns)
            .then(a.who.pid.cmp(&b.who.pid))
    });
    v
}

impl RunqLat {
    fn row(&self, r: &Row, names: &Names, (culprits, late): (&ByA, &ByA)) -> RunqRow {
        let threads = self.s.scope.threads;
        let all = hist::stats(&r.waits());
        let waited_behind = culprits.peers(r.id, names, threads, true);
        let late_waits_behind = late.peers(r.id, names, threads, true);
        let behind_text = waited_behind
            .iter()
            .take(2)
            .map(|p| format!("{} {}", p.text(), fmt_ns(p.delay_ns.unwrap_or(0))))
            .collect::<Vec<_>>()
            .join(" ");
        let who = self.s.who(r);
        let name = who.row_name(r);
        RunqRow {
            who,
            mean_ns: all.mean_ns,
            all: Keyed::new("", all, RUNQ_STATS),
            wake: Keyed::new("wake_", hist::stats(&r.v.wake), RUNQ_STATS),
            preempt: Keyed::new("preempt_", hist::stats(&r.v.preempt), RUNQ_STATS),
            kernel_run_delay_ns: r.v.run_delay_ns,
            wake_unmeasured: r.v.wake_unmeasured,
            waited_behind,
            late_waits_behind,
            id: r.id,
            name,
            behind_text,
            hists: (r.v.wake, r.v.preempt),
        }
    }
}

impl Collector for RunqLat {
    fn name(&self) -> &'static str {
        INFO.name
    }

    fn meta(&self) -> crate::engine::Meta {
        self.s.meta(INFO.name, "run-queue latency")
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

    fn poll_interval(&self) -> Option<std::time::Duration> {
        Some(LEARN_EVERY)
    }

    fn on_events(&mut self) -> Result<()> {
        self.classes.learn(self.s.task_ids());
        Ok(())
    }

    fn collect(&mut self, w: &Window) -> Result<Output> {
        let secs = w.secs();
        // A process a finding could name keeps its row whatever the cap.
        let (wake_min, preempt_min) = (
            (MIN_WAKE_NS_PER_S as f64 * secs) as u64,
            (MIN_PREEMPT_NS_PER_S as f64 * secs) as u64,
        );
        let cap = Cap::new(
            &self.s.scope,
            self.max_rows,
            |v| v.wake.sum + v.preempt.sum,
            Box::new(move |v| {
                v.wake.sum >= wake_min
                    || v.preempt.sum >= preempt_min
                    || (v.wake.max > harm::LATE_FLOOR_NS && v.wake.count >= harm::MIN_LATE_WAITS)
            }),
        );
        let iv = self.s.drain(&cap)?;
        let threads = self.s.scope.threads;
        let names = Names::of_window(&iv);
        let culprits = ByA::of(&iv.culprits);
        let late = ByA::of(&iv.late_culprits);
        let mut rows: Vec<RunqRow> = iv
            .rows
            .iter()
            .map(|r| self.row(r, &names, (&culprits, &late)))
            .filter(|r| r.all.s.count > 0)
            .collect();
        rows.sort_by(|a, b| {
            b.all
                .s
                .total_ns
                .cmp(&a.all.s.total_ns)
                .then(a.id.cmp(&b.id))
        });
        let waits: u64 = rows.iter().map(|r| r.all.s.count).sum();
        let total: u64 = rows.iter().map(|r| r.all.s.total_ns).sum();
        let mut out = Output {
            title: format!(
                "runq-lat: {waits} run-queue waits, {} waited in total, in {}; {}; {}",
                fmt_ns(total),
                self.s.scope.describe(),
                w.span(),
                self.s.wake_from().definition(self.s.wall_clock()),
            ),
            ..Output::default()
        };
        let nothing = rows.is_empty().then_some("no run-queue waits seen");
        out.notes.extend(self.s.window_notes(&iv, nothing));
        let psi = cpu_psi();
        let stat = SysStat::read().ok();
        let node = NodeLoad {
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu_pressure_ppm: match (psi, self.psi) {
                (Some(now), Some(before)) => Some(now.share_ppm(&before, secs).0),
                _ => None,
            },
            virtual_machine: self.virtual_machine,
            softirq_ppm: match (&stat, &self.stat) {
                (Some(now), Some(before)) => now.softirq_ppm(before),
                _ => Vec::new(),
            },
        };
        self.psi = psi;
        self.stat = stat;
        out.findings = findings(&rows, secs, &node, &|pid| self.classes.of(pid));
        let ctx = Ctx { secs };
        let cols = id_columns(COLUMNS, threads);
        out.sections.push(
            Section::build(&SUMMARY_ROWS, &rows, &cols, &ctx, self.max_rows).with_dists(
                &rows,
                |r| format!("{} {}", r.id, r.name),
                |r| vec![("wake", r.hists.0), ("preempt", r.hists.1)],
            ),
        );
        drop((culprits, late));
        let aggr = aggressors(&iv.culprits, &iv.ids, &names, threads);
        out.sections.push(
            Section::build(&AGGRESSOR_ROWS, &aggr, AGGRESSORS, &ctx, 10).caption(format!(
                "Who held the CPU while woken tasks waited (waits of {} or more):",
                fmt_ns(sched::CULPRIT_MIN_NS)
            )),
        );
        out.footnotes.push(
            "%TIME: share of the window spent waiting (summed over the threads); WAKE: waits after a wakeup, to running on the wall clock, from sched_waking (the wakeup path and any IPI included) or with --from wakeup from sched_wakeup (the task enqueued), where runqlat and perf sched start; PREEMPT: waits after being preempted while runnable; RUN_DELAY: the kernel's own run_delay (/proc/<pid>/schedstat), which misses most of a wait after a wakeup that preempts; WAITED_BEHIND: who held the CPU while it waited after a wakeup (the two tasks that ran last before it, for their part of each wait of 20 us or more)."
                .into(),
        );
        if !self.s.wall_clock() {
            out.footnotes.push(
                "No wakeup hook on this kernel: WAKE waits are the kernel's run_delay.".into(),
            );
        }
        out.stats = Some(sched::stats(&iv, waits));
        Ok(out)
    }
}

mod findings;
#[cfg(test)] // triage's fold tests build findings as runq-lat ends them
pub(crate) use findings::handoffs;
pub use findings::waits_are_handoffs;
use findings::{findings, NodeLoad};

#[cfg(test)]
mod tests;
