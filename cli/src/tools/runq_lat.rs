//! `tracekit runq-lat`: run-queue latency per process (or thread): how long runnable tasks
//! waited for a CPU, split by how the wait began (a wakeup, or a preemption while runnable), and
//! who held the CPU while a woken task waited.
//!
//! Waits after a wakeup are timed on the wall clock, from `sched_waking` to the switch-in: the
//! kernel's `sched_info.run_delay` misses most of such a wait when the wakeup preempts (its clock
//! is not updated then, issue #17). Waits after a preemption are `run_delay`'s, and the kernel's
//! `run_delay` total is reported beside them (`kernel_run_delay_ns`), agreeing with
//! `/proc/<pid>/schedstat`. Kernel side: `probes-ebpf/src/bin/sched.rs`.

use crate::report::findings::WINDOW_NS;
use std::collections::BTreeMap;

use crate::report::{
    schema::{Direction::*, Dist, Field, Rows},
    who::ID_FIELDS,
};
use serde::Serialize;

use crate::{
    engine::{Collector, Output, Window},
    error::Result,
    options::Common,
    report::{
        findings::{rank, Cause, Finding, Score, Subject},
        hist::{self, Keyed, Stat},
        render::fmt_ns,
        rows::{id_columns, shown, Column, Ctx, Section},
    },
    tools::{
        self,
        sched::{self, ByA, Cap, Names, Pair, Peer, Record, Row, SchedSession, Who},
        OpenCtx, ToolInfo,
    },
};

pub const INFO: ToolInfo = ToolInfo {
    name: "runq-lat",
    summary: "How long runnable tasks wait for a CPU, per process (or `--threads`): waits after a wakeup (wall clock, as runqlat and `perf sched` time them) and after a preemption, count, p50/p90/p99/p99.9, max and total, the kernel's own `run_delay` beside them (`/proc/<pid>/schedstat`), and who held the CPU while a woken task waited; findings name the starved process and the hogs.",
    hooks: sched::HOOKS,
    triage: true,
    hidden: false,
    // task_struct's tgid and sched_info.run_delay are read at BTF offsets.
    needs_btf: true,
    rows: &[&SUMMARY_ROWS, &AGGRESSOR_ROWS],
    causes: &[RUNQ_DELAY],
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
    pub const WAKE_MAX_NS: Ev = Ev("wake_max_ns");
    /// The prefix of every key about waits after wakeups.
    pub const WAKE_PREFIX: &str = "wake_";
    /// The part of the waits the named culprit held the CPU.
    pub const CULPRIT_DELAY_NS: Ev = Ev("culprit_delay_ns");
}

// The causes this tool concludes (listed in INFO; see report::findings::Cause).
pub const RUNQ_DELAY: Cause = Cause::new(
    "runq-delay",
    "A process waits runnable for a CPU that other tasks hold.",
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
}

pub fn run(args: Args) -> Result<()> {
    tools::run_collector(INFO.name, &args.common, |ctx| open(&args, ctx))
}

/// Loads and attaches the `sched` programs with what runq-lat records.
pub fn open(args: &Args, ctx: &OpenCtx) -> Result<Box<dyn Collector>> {
    let record = Record {
        preemptors: false,
        culprits: true,
        wakers: false,
    };
    Ok(Box::new(RunqLat {
        s: sched::open(ctx, record)?,
        max_rows: args.rows,
    }))
}

struct RunqLat {
    s: SchedSession,
    max_rows: usize,
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
    fn row(&self, r: &Row, names: &Names, culprits: &ByA) -> RunqRow {
        let threads = self.s.scope.threads;
        let all = hist::stats(&r.waits());
        let waited_behind = culprits.peers(r.id, names, threads, true);
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
            id: r.id,
            name,
            behind_text,
            hists: (r.v.wake, r.v.preempt),
        }
    }
}

/// A CPU-bound process waiting this long after its preemptions is starved of CPU time (10 %
/// of the window runnable but not running): below that its CPUs are shared, not saturated.
const MIN_PREEMPT_NS_PER_S: u64 = 100_000_000;

/// A process that spends 5 % of the window waiting for a CPU after its wakeups is starved
/// where it matters (each wakeup is work someone waits for). Below that, waits are what any
/// busy node shows: on two loaded CPUs every process waits 0.5–2 % of its time (measured with
/// the root tests' innocent workloads beside a compiler), and naming them all buries the victim.
const MIN_WAKE_NS_PER_S: u64 = 50_000_000;

/// Whether a wake-wait finding's waits are the process's own handoffs: it is woken as often as
/// a context-switch storm switches, and no other process held the CPU for half of the wait.
/// Fewer handoffs is then the fix before any priority change, and triage folds the wait into
/// the storm's finding.
pub fn waits_are_handoffs(f: &Finding) -> bool {
    let (Some(waits), Some(wait_ns), Some(window_ns)) = (
        f.ev(ev::WAKE_WAITS),
        f.ev(ev::WAKE_WAIT_TOTAL_NS),
        f.ev(WINDOW_NS),
    ) else {
        return false;
    };
    waits * 1e9 / window_ns.max(1.0) >= super::ctxsw::STORM_PER_S
        && f.ev(ev::CULPRIT_DELAY_NS).unwrap_or(0.0) * 2.0 < wait_ns
}

/// The findings of a window: processes that waited after their wakeups (the latency-sensitive
/// victims), each with the tasks that held the CPU meanwhile; then, when no victim names them,
/// CPU-bound processes starved by time-slicing. tracekit itself is never a victim or a culprit.
fn findings(rows: &[RunqRow], secs: f64) -> Vec<Finding> {
    let me = std::process::id();
    // Per process: wake stats of its biggest row, totals, culprits merged by process.
    struct Acc {
        subject: Subject,
        wake_ns: u64,
        wake_n: u64,
        p50: u64,
        p99: u64,
        max: u64,
        preempt_ns: u64,
        kernel_ns: u64,
        behind: BTreeMap<u32, (String, u64, u64)>,
    }
    let mut per: BTreeMap<u32, Acc> = BTreeMap::new();
    for r in rows
        .iter()
        .filter(|r| r.id != 0 && r.who.pid != me && r.who.processes.is_none())
    {
        let a = per.entry(r.who.pid).or_insert_with(|| Acc {
            subject: r.who.subject(),
            wake_ns: 0,
            wake_n: 0,
            p50: 0,
            p99: 0,
            max: 0,
            preempt_ns: 0,
            kernel_ns: 0,
            behind: BTreeMap::new(),
        });
        let w = &r.wake.s;
        if w.total_ns >= a.wake_ns {
            (a.p50, a.p99) = (w.p50_ns, w.p99_ns);
        }
        a.wake_ns += w.total_ns;
        a.wake_n += w.count;
        a.max = a.max.max(w.max_ns);
        a.preempt_ns += r.preempt.s.total_ns;
        a.kernel_ns += r.kernel_run_delay_ns;
        for p in r.waited_behind.iter().filter(|p| p.who.pid != me) {
            let e = a
                .behind
                .entry(p.who.pid)
                .or_insert((p.who.comm.clone(), 0, 0));
            e.1 += p.delay_ns.unwrap_or(0);
            e.2 += p.count;
        }
    }
    let mut out = Vec::new();
    let mut aggressors: Vec<u32> = Vec::new();
    for (pid, a) in &per {
        // Time spent while the CPU was idle and waking up (its exit from a sleep state, the
        // IPI) is wakeup latency, not contention: nobody held the CPU. A ping-pong whose every
        // hop wakes an idle CPU is a context-switch storm, not a starved process.
        let idle_ns = a.behind.get(&0).map_or(0, |v| v.1);
        let ns_per_s = (a.wake_ns.saturating_sub(idle_ns) as f64 / secs) as u64;
        if ns_per_s < MIN_WAKE_NS_PER_S {
            continue;
        }
        let mut behind: Vec<(u32, &(String, u64, u64))> =
            a.behind.iter().map(|(p, v)| (*p, v)).collect();
        behind.sort_by(|x, y| y.1 .1.cmp(&x.1 .1).then(x.0.cmp(&y.0)));
        aggressors.extend(behind.iter().map(|b| b.0).filter(|p| *p != 0));
        let held: Vec<String> = behind
            .iter()
            .take(3)
            .map(|(p, (c, ns, n))| {
                if *p == 0 {
                    format!("an idle CPU waking up for {} ({n} waits)", fmt_ns(*ns))
                } else if p == pid {
                    format!("its own threads for {} ({n} waits)", fmt_ns(*ns))
                } else {
                    format!("{c} (pid {p}) for {} ({n} waits)", fmt_ns(*ns))
                }
            })
            .collect();
        // The culprit is another process: a wait behind its own threads is not a neighbour's.
        let culprit = behind.iter().find(|b| b.0 != 0 && b.0 != *pid);
        let mut summary = format!(
            "{} waited {} of {} for a CPU after its wakeups ({:.1} % of the time): {} waits, p50 {}, p99 {}, max {}",
            a.subject.text(),
            fmt_ns(a.wake_ns),
            fmt_ns((secs * 1e9) as u64),
            a.wake_ns as f64 / secs / 1e7,
            a.wake_n,
            fmt_ns(a.p50),
            fmt_ns(a.p99),
            fmt_ns(a.max),
        );
        if !held.is_empty() {
            summary.push_str(&format!("; the CPU was held by {}", held.join(", ")));
        }
        summary.push('.');
        let advice = match behind.first() {
            Some((0, _)) => "its wakeups wait for idle CPUs to wake: limit deep C-states (cpupower idle-set, the PM QoS latency target) or keep it on a busy CPU",
            _ => "give it the CPU first: raise its weight (nice -n -5, cpu.weight) or lower the hogs' (nice 19, SCHED_IDLE, a smaller cpu.weight or cpu.max), or keep the hogs off its CPUs (cpusets, taskset)",
        };
        let mut f = Finding {
            tool: INFO.name,
            cause: RUNQ_DELAY,
            subject: a.subject.clone(),
            culprit: culprit.map(|(p, (c, _, _))| Subject::process(*p, c.clone())),
            score: Score::NsPerS(ns_per_s),
            summary,
            evidence: vec![],
            advice: advice.into(),
            next: Some(format!(
                "tracekit runq-lat --pid {pid} --threads --duration 10s"
            )),
        }
        .evidence(ev::WAKE_WAITS, a.wake_n)
        .evidence(ev::WAKE_WAIT_TOTAL_NS, a.wake_ns)
        .evidence(ev::WAKE_P50_NS, a.p50)
        .evidence(ev::WAKE_P99_NS, a.p99)
        .evidence(ev::WAKE_MAX_NS, a.max)
        .evidence("kernel_run_delay_ns", a.kernel_ns);
        if let Some((_, (_, ns, n))) = culprit {
            f = f
                .evidence(ev::CULPRIT_DELAY_NS, *ns)
                .evidence("culprit_waits", *n);
        }
        f = f.evidence(WINDOW_NS, (secs * 1e9) as u64);
        if waits_are_handoffs(&f) {
            f.advice = "it is woken more than 10,000 times/s and each wakeup waits its turn: batch the handoffs that wake it (larger queue items, fewer wakeups per item) before changing priorities".into();
            f.next = Some(format!(
                "tracekit ctxsw --pid {pid} --threads --duration 10s"
            ));
        }
        out.push(f);
    }
    for (pid, a) in &per {
        let ns_per_s = (a.preempt_ns as f64 / secs) as u64;
        if ns_per_s < MIN_PREEMPT_NS_PER_S || aggressors.contains(pid) {
            continue;
        }
        out.push(
            Finding {
                tool: INFO.name,
                cause: RUNQ_DELAY,
                subject: a.subject.clone(),
                culprit: None,
                score: Score::NsPerS(ns_per_s),
                summary: format!(
                    "{} was runnable but not running for {} of {} after being preempted ({:.1} % of the time): its CPUs are saturated.",
                    a.subject.text(),
                    fmt_ns(a.preempt_ns),
                    fmt_ns((secs * 1e9) as u64),
                    a.preempt_ns as f64 / secs / 1e7,
                ),
                evidence: vec![],
                advice: "more runnable threads than CPUs: add CPUs or a CPU quota for the others, cut thread counts, or lower the priority of batch work".into(),
                next: Some("tracekit ctxsw --duration 10s".into()),
            }
            .evidence("preempt_wait_total_ns", a.preempt_ns)
            .evidence("kernel_run_delay_ns", a.kernel_ns)
            .evidence(WINDOW_NS, (secs * 1e9) as u64),
        );
    }
    rank(&mut out);
    out
}

impl Collector for RunqLat {
    fn name(&self) -> &'static str {
        INFO.name
    }

    fn meta(&self) -> crate::engine::Meta {
        self.s.meta(INFO.name, "run-queue latency")
    }

    fn session(&mut self) -> Option<&mut crate::kernel::loader::Session> {
        Some(&mut self.s.session)
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
            Box::new(move |v| v.wake.sum >= wake_min || v.preempt.sum >= preempt_min),
        );
        let iv = self.s.drain(&cap)?;
        let threads = self.s.scope.threads;
        let names = Names::of_window(&iv);
        let culprits = ByA::of(&iv.culprits);
        let mut rows: Vec<RunqRow> = iv
            .rows
            .iter()
            .map(|r| self.row(r, &names, &culprits))
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
                "runq-lat: {waits} run-queue waits, {} waited in total, in {}; {}",
                fmt_ns(total),
                self.s.scope.describe(),
                w.span(),
            ),
            ..Output::default()
        };
        let nothing = rows.is_empty().then_some("no run-queue waits seen");
        out.notes.extend(self.s.window_notes(&iv, nothing));
        let shown = shown(self.max_rows, rows.len());
        for r in rows.iter().take(shown) {
            out.hists
                .push((format!("wake[{} {}]", r.id, r.name), r.hists.0));
            out.hists
                .push((format!("preempt[{} {}]", r.id, r.name), r.hists.1));
        }
        out.findings = findings(&rows, secs);
        let ctx = Ctx { secs };
        let cols = id_columns(COLUMNS, threads);
        out.sections.push(
            Section::build(&SUMMARY_ROWS, &rows, &cols, &ctx, self.max_rows)
                .with_dists(&rows, |r| vec![("wake", r.hists.0), ("preempt", r.hists.1)]),
        );
        drop(culprits);
        let aggr = aggressors(&iv.culprits, &iv.ids, &names, threads);
        out.sections.push(
            Section::build(&AGGRESSOR_ROWS, &aggr, AGGRESSORS, &ctx, 10).caption(format!(
                "Who held the CPU while woken tasks waited (waits of {} or more):",
                fmt_ns(sched::CULPRIT_MIN_NS)
            )),
        );
        out.footnotes.push(
            "%TIME: share of the window spent waiting (summed over the threads); WAKE: waits after a wakeup, wakeup to running on the wall clock; PREEMPT: waits after being preempted while runnable; RUN_DELAY: the kernel's own run_delay (/proc/<pid>/schedstat), which misses most of a wait after a wakeup that preempts; WAITED_BEHIND: who held the CPU while it waited after a wakeup (the two tasks that ran last before it, for their part of each wait of 20 us or more)."
                .into(),
        );
        if !self.s.wall_clock {
            out.footnotes.push(
                "No wakeup hook on this kernel: WAKE waits are the kernel's run_delay.".into(),
            );
        }
        out.stats = Some(sched::stats(&iv, waits));
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use probes_common::hist::LatHist;

    fn row(pid: u32, wake: &[u64], preempt: &[u64], behind: Vec<Peer>) -> RunqRow {
        let (mut w, mut p) = (LatHist::ZERO, LatHist::ZERO);
        wake.iter().for_each(|v| w.record(*v));
        preempt.iter().for_each(|v| p.record(*v));
        let mut all = w;
        all.merge(&p);
        RunqRow {
            who: Who::named(pid, None, format!("p{pid}").into_bytes()),
            mean_ns: 0,
            all: Keyed::new("", hist::stats(&all), RUNQ_STATS),
            wake: Keyed::new("wake_", hist::stats(&w), RUNQ_STATS),
            preempt: Keyed::new("preempt_", hist::stats(&p), RUNQ_STATS),
            kernel_run_delay_ns: 0,
            wake_unmeasured: 0,
            waited_behind: behind,
            id: pid,
            name: format!("p{pid}"),
            behind_text: String::new(),
            hists: (w, p),
        }
    }

    fn peer(pid: u32, n: u64, ns: u64) -> Peer {
        Peer {
            who: Who::named(pid, None, format!("hog{pid}").into_bytes()),
            count: n,
            delay_ns: Some(ns),
            id: pid,
            name: format!("hog{pid}").into_bytes(),
        }
    }

    #[test]
    fn the_victim_ranks_first_and_names_the_hogs_who_get_no_finding() {
        let victim = row(
            5,
            &[2_000_000; 200],
            &[],
            vec![peer(8, 120, 240_000_000), peer(9, 80, 160_000_000)],
        );
        // The hogs wait far longer, but only after preemptions, and they are the culprits.
        let hogs = [8, 9].map(|p| row(p, &[], &[3_000_000; 300], vec![]));
        let mut rows = vec![victim];
        rows.extend(hogs);
        let f = findings(&rows, 1.0);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].subject.pid, Some(5));
        assert_eq!(f[0].culprit.as_ref().and_then(|c| c.pid), Some(8));
        assert!(f[0].summary.contains("hog8 (pid 8)"), "{}", f[0].summary);
        assert!(f[0].summary.contains("hog9 (pid 9)"), "{}", f[0].summary);
        let j = f[0].json();
        assert_eq!(j["culprit_pid"], 8);
        assert_eq!(j["evidence"]["culprit_delay_ns"], 240_000_000u64);
    }

    /// A process waiting behind its own threads most is not its own culprit: the culprit is the
    /// other process, and the text says "its own threads".
    #[test]
    fn own_threads_are_named_as_such_and_never_the_culprit() {
        let victim = row(
            5,
            &[2_000_000; 200],
            &[],
            vec![peer(5, 150, 300_000_000), peer(9, 50, 100_000_000)],
        );
        let f = findings(&[victim], 1.0);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].culprit.as_ref().and_then(|c| c.pid), Some(9));
        assert!(
            f[0].summary.contains("its own threads for 300ms"),
            "{}",
            f[0].summary
        );
        assert!(!f[0].summary.contains("hog5"), "{}", f[0].summary);
    }

    /// Woken 20,000 times a second, 10 us each, with no process holding the CPU for half of
    /// it: the advice is fewer handoffs and the next command is ctxsw; a hog's victim woken as
    /// often keeps the priority advice.
    #[test]
    fn a_process_woken_at_storm_rates_is_told_to_batch_its_handoffs() {
        let pp = row(5, &[10_000; 20_000], &[], vec![peer(9, 40, 40_000_000)]);
        let f = findings(&[pp], 1.0);
        assert!(
            f[0].advice.contains("batch the handoffs"),
            "{}",
            f[0].advice
        );
        assert_eq!(
            f[0].next.as_deref(),
            Some("tracekit ctxsw --pid 5 --threads --duration 10s")
        );
        let starved = row(5, &[10_000; 20_000], &[], vec![peer(9, 40, 150_000_000)]);
        let f = findings(&[starved], 1.0);
        assert!(
            f[0].advice.contains("give it the CPU first"),
            "{}",
            f[0].advice
        );
    }

    #[test]
    fn saturation_without_victims_and_quiet_rows_give_findings_as_due() {
        let rows = vec![
            row(8, &[], &[3_000_000; 300], vec![]),
            row(9, &[1_000; 10], &[1_000; 10], vec![]),
        ];
        let f = findings(&rows, 1.0);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].subject.pid, Some(8));
        assert!(f[0].summary.contains("saturated"), "{}", f[0].summary);
    }

    #[test]
    fn aggressors_count_every_victim_of_the_window_even_folded_ones() {
        let p = |a, b, ns| Pair {
            a,
            a_tgid: a,
            b,
            b_tgid: b,
            count: 1,
            ns,
        };
        // 5 and 6 waited (6 summed in [other] by the row cap); 7 is out of scope.
        let pairs = [p(5, 9, 100), p(6, 9, 50), p(7, 9, 1000), p(6, 8, 10)];
        let a = aggressors(&pairs, &[5, 6], &Names::of(&[]), false);
        let got: Vec<(u32, u64, u64)> = a
            .iter()
            .map(|x| (x.who.pid, x.delay_caused_ns, x.victims))
            .collect();
        assert_eq!(got, [(9, 150, 2), (8, 10, 1)]);
    }

    #[test]
    fn json_keeps_the_prefixed_keys() {
        let r = row(5, &[1_000, 3_000], &[7_000], vec![peer(8, 1, 3_000)]);
        let s = Section::build(&SUMMARY_ROWS, &[r], COLUMNS, &Ctx { secs: 1.0 }, 0);
        let j = &s.json[0];
        assert_eq!(j["count"], 3);
        assert_eq!(j["wake_count"], 2);
        assert_eq!(j["preempt_count"], 1);
        assert!(j["wake_p99_ns"].as_u64().unwrap() >= 2_800);
        assert_eq!(j["waited_behind"][0]["pid"], 8);
        assert_eq!(j["waited_behind"][0]["delay_ns"], 3_000);
        assert!(j.get("kernel_run_delay_ns").is_some());
    }
}
