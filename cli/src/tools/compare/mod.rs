//! `tracekit compare before.tkr after.tkr`: what changed between two recordings. The node
//! settings that differ come first; then every (subject, metric) found in both runs, with the
//! before/after median, p99, mean and coefficient of variation, the change, a two-sided
//! Mann–Whitney U test over the per-interval samples ([`stats`]) and a verdict (better, worse,
//! changed, no significant change), ranked as [`RANKING`] says.
//! `--html` draws the top changes; `--fail-on-regression` exits 7 when any line is worse.

use std::path::PathBuf;

use serde::Serialize;
use serde_json::json;

use crate::{
    error::{Error, Result},
    report::{output::Sink, render::fmt_ns, sanitize},
    tools::{self, record::format::Recording, ToolInfo},
};

pub mod html;
pub mod model;
pub mod stats;

use model::{Direction, Kind};

pub const INFO: ToolInfo = ToolInfo::command(
    "compare",
    "Compare two recordings (`tracekit record`): node settings that changed, then every process, device and node metric with its median, p99, mean and spread before and after, a Mann–Whitney test per line and a verdict (better, worse, no significant change), what the workload waited first (weighed by the waiting a change adds per second); `--html` for overlaid histograms and series, `--fail-on-regression` for CI.",
);

const EXAMPLES: &str = "  tracekit compare before.tkr after.tkr
  tracekit compare before.tkr after.tkr --html report.html
  tracekit compare before.tkr after.tkr --json --fail-on-regression   # exit 7 when anything got worse";

/// Significance level of the test.
pub const ALPHA: f64 = 0.05;
/// Fewest intervals on each side for a verdict.
pub const MIN_SAMPLES: usize = 3;
/// Smallest change that counts, in % of the before value (a noise threshold, as criterion's):
/// for latency one bucket of the recorded histograms (12.5 %: two runs whose medians fall in
/// neighbouring buckets differ by less than the layout can tell), else 5 %. A tiny shift every
/// interval shares (a busier CPU making a 150 ns syscall 160 ns) is real to the test and
/// nothing to act on.
pub fn min_change_pct(kind: Kind) -> f64 {
    match kind {
        Kind::Latency(_) => 100.0 / probes_common::hist::SUB_COUNT as f64,
        _ => 5.0,
    }
}

#[derive(clap::Args, Debug)]
#[command(after_help = tools::help_footer(EXAMPLES, "none (reads two files)."))]
pub struct Args {
    /// The recording before the change.
    #[arg(value_name = "BEFORE")]
    pub before: PathBuf,
    /// The recording after the change.
    #[arg(value_name = "AFTER")]
    pub after: PathBuf,
    /// NDJSON: `fact` lines, then one `change` line per metric (ranked), then one `compare`.
    #[arg(long)]
    pub json: bool,
    /// Also write a self-contained HTML page (no network) with the top changes drawn.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Exit 7 when any change is significant and for the worse.
    #[arg(long)]
    pub fail_on_regression: bool,
    /// Lines shown in the text report (0: all); JSON has them all.
    #[arg(long, default_value_t = 25, value_name = "N")]
    pub top: usize,
}

/// The side of a line.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct SideOut {
    pub intervals: usize,
    pub median: f64,
    pub p99: f64,
    pub mean: f64,
    pub cv: f64,
}

/// One compared (subject, metric).
#[derive(Clone, Debug, Serialize)]
pub struct Change {
    pub subject: String,
    pub metric: String,
    /// `ns` for latency, else the metric's own unit.
    pub unit: &'static str,
    pub before: SideOut,
    pub after: SideOut,
    /// Change of the headline value (the latency statistic, or the median of the samples), %.
    pub change_pct: Option<f64>,
    pub u: Option<f64>,
    pub p: Option<f64>,
    pub exact: bool,
    pub significant: bool,
    pub direction: Direction,
    /// `better`, `worse`, `changed`, `no significant change`, `no change` (the same number
    /// as shown), `too few intervals`.
    pub verdict: &'static str,
    /// How much waiting per second the change added (positive) or removed, in ns/s: for a
    /// latency, the change of its mean times its events per second (the busier side's); for
    /// a time counter (ns per second), the change of its median. Absent for other metrics.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub felt_ns_per_s: Option<i64>,
    #[serde(skip)]
    pub kind: Kind,
    #[serde(skip)]
    pub sides: (model::Side, model::Side),
}

/// How the lines are ranked, as the reports say it ([`changes`] sorts so).
pub const RANKING: &str = "significant first; then what the workload waited (its latency and time lost, the most waiting added or removed per second first), its drops and errors, its activity, and last the node and kernel threads; then the largest change";

/// Kernel threads by name: their work is on behalf of the workload (writeback, softirqs,
/// reclaim), so their changes rank after the workload's own (issue #33: a bfq regression sat
/// below 23 kworker and ksoftirqd lines).
const KTHREADS: &[&str] = &[
    "kworker/",
    "ksoftirqd/",
    "kswapd",
    "kcompactd",
    "khugepaged",
    "migration/",
    "rcu_",
    "jbd2/",
    "irq/",
    "cpuhp/",
    "watchdog",
    "kthreadd",
    "kauditd",
    "kblockd",
    "writeback",
];

impl Change {
    /// The subject's comm (`postgres [fsync-lat summary]` → `postgres`); `None` for the node
    /// and rows without a process.
    fn comm(&self) -> Option<&str> {
        let (comm, _) = self.subject.split_once(" [")?;
        (!comm.is_empty()).then_some(comm)
    }

    /// How directly the user's workload felt this metric, first first: 0 its latency and the
    /// time it lost, 1 its other counts with a better way (drops, errors), 2 its activity
    /// (counts without a better way, such as requests queued or bytes), 3 the node's series
    /// and kernel threads.
    fn tier(&self) -> u8 {
        let kthread = self
            .comm()
            .is_some_and(|c| KTHREADS.iter().any(|k| c.starts_with(k)));
        if kthread || self.kind == Kind::Node {
            return 3;
        }
        match (self.kind, self.direction) {
            (Kind::Latency(_), _) => 0,
            (_, Direction::LowerIsBetter) if self.unit == "ns" => 0,
            (_, Direction::LowerIsBetter | Direction::HigherIsBetter) => 1,
            _ => 2,
        }
    }

    /// Waiting per second the change added or removed ([`Change::felt_ns_per_s`]), from the
    /// recordings' lengths in seconds.
    fn felt(&self, secs: (f64, f64)) -> Option<f64> {
        match self.kind {
            Kind::Latency(_) => {
                let rate = |side: &model::Side, secs: f64| {
                    side.hist.as_ref().map_or(0.0, |h| h.count as f64) / secs.max(1e-9)
                };
                let per_s = rate(&self.sides.0, secs.0).max(rate(&self.sides.1, secs.1));
                Some((self.after.mean - self.before.mean) * per_s)
            }
            Kind::Counter if self.unit == "ns" && self.direction == Direction::LowerIsBetter => {
                Some(self.after.median - self.before.median)
            }
            _ => None,
        }
    }

    /// The headline values (before, after).
    fn headline(&self) -> (f64, f64) {
        match self.kind {
            Kind::Latency("p99") => (self.before.p99, self.after.p99),
            _ => (self.before.median, self.after.median),
        }
    }

    pub fn fmt(&self, v: f64) -> String {
        if self.unit == "ns" {
            fmt_ns(v.max(0.0).round() as u64)
        } else if v.abs() >= 100.0 {
            format!("{v:.0}")
        } else {
            format!("{v:.3}")
                .trim_end_matches('0')
                .trim_end_matches('.')
                .to_string()
        }
    }

    /// `p99 fsync latency of tk-workload [fsync-lat summary syscall=fsync]: 1.2ms → 2.5ms (+108 %), worse (significant, p=0.0002)`.
    pub fn sentence(&self) -> String {
        let (b, a) = self.headline();
        let pct = match self.change_pct {
            Some(c) => format!(" ({c:+.0} %)"),
            None => String::new(),
        };
        let p = match self.p {
            Some(p) if self.significant => format!(" (significant, p{})", p_rel(p)),
            Some(p) => format!(" (p{})", p_rel(p)),
            None => String::new(),
        };
        // The waiting it added or removed, where it is a verdict's (a reader weighs a
        // change by it, as the ranking does).
        let felt = match self.felt_ns_per_s {
            Some(f) if self.significant && f != 0 => format!(
                "; {} {} of waiting per second",
                if f > 0 { "adds" } else { "saves" },
                fmt_ns(f.unsigned_abs())
            ),
            _ => String::new(),
        };
        format!(
            "{} of {}: {} → {}{pct}, {}{p}{felt}",
            self.metric,
            self.subject,
            self.fmt(b),
            self.fmt(a),
            self.verdict
        )
    }
}

/// A p-value after `p`: `=0.0192`, `<0.0001`.
fn p_rel(p: f64) -> String {
    let t = fmt_p(p);
    if t.starts_with('<') {
        t
    } else {
        format!("={t}")
    }
}

/// A p-value for a table cell: `0.0192`, `<0.0001`.
fn fmt_p(p: f64) -> String {
    if p < 0.0001 {
        "<0.0001".into()
    } else {
        format!("{p:.4}")
    }
}

fn side_out(kind: Kind, s: &model::Side) -> SideOut {
    match (kind, &s.hist) {
        (Kind::Latency(_), Some(h)) => {
            let st = crate::report::hist::stats(h);
            SideOut {
                intervals: s.samples.len(),
                median: st.p50_ns as f64,
                p99: st.p99_ns as f64,
                mean: st.mean_ns as f64,
                cv: st.cv,
            }
        }
        _ => {
            let st = stats::summarize(&s.samples);
            SideOut {
                intervals: st.n,
                median: st.median,
                p99: st.p99,
                mean: st.mean,
                cv: st.cv,
            }
        }
    }
}

/// Compares every (subject, metric) present in both recordings, ranked; and how many series
/// of each were dropped past [`model::series_cap`].
pub fn changes(before: &Recording, after: &Recording) -> (Vec<Change>, [usize; 2]) {
    let split = model::ambiguous(&[before, after]);
    let length = |r: &Recording| r.intervals.iter().map(|i| i.secs).sum::<f64>();
    let secs = (length(before), length(after));
    let ((b, db), (mut a, da)) = (model::series(before, &split), model::series(after, &split));
    let mut out = Vec::new();
    for ((subject, metric), (kind, bs)) in b {
        let Some((_, as_)) = a.remove(&(subject.clone(), metric.clone())) else {
            continue;
        };
        let (bo, ao) = (side_out(kind, &bs), side_out(kind, &as_));
        let mut c = Change {
            unit: bs.unit,
            direction: bs.direction,
            subject,
            metric,
            before: bo,
            after: ao,
            change_pct: None,
            u: None,
            p: None,
            exact: false,
            significant: false,
            verdict: "too few intervals",
            felt_ns_per_s: None,
            kind,
            sides: (bs, as_),
        };
        c.felt_ns_per_s = c.felt(secs).map(|f| f.round() as i64);
        let (hb, ha) = c.headline();
        if hb != 0.0 {
            c.change_pct = Some((ha - hb) / hb.abs() * 100.0);
        }
        if let Some(t) = stats::mann_whitney(&c.sides.0.samples, &c.sides.1.samples) {
            c.u = Some(t.u);
            c.p = Some(t.p);
            c.exact = t.exact;
        }
        let enough =
            c.sides.0.samples.len() >= MIN_SAMPLES && c.sides.1.samples.len() >= MIN_SAMPLES;
        // What the reader sees as the same number is no change ("0 → 0, changed" was one),
        // whatever the samples' test says.
        let same = c.fmt(hb) == c.fmt(ha);
        if same && enough {
            c.verdict = "no change";
        } else if enough {
            let large = c.change_pct.is_none_or(|x| x.abs() >= min_change_pct(kind));
            c.significant = large && c.p.is_some_and(|p| p < ALPHA);
            // Which way the samples moved: the sign of the difference of their medians (the
            // headline can sit in the same bucket when the bulk moved).
            let up = {
                let (sb, sa) = (
                    stats::summarize(&c.sides.0.samples),
                    stats::summarize(&c.sides.1.samples),
                );
                if sa.median != sb.median {
                    sa.median > sb.median
                } else {
                    sa.mean > sb.mean
                }
            };
            c.verdict = match (c.significant, c.direction, up) {
                (false, ..) => "no significant change",
                (true, Direction::Neutral, _) => "changed",
                (true, Direction::LowerIsBetter, true)
                | (true, Direction::HigherIsBetter, false) => "worse",
                (true, ..) => "better",
            };
        }
        out.push(c);
    }
    // Nothing of tracekit's own: its processes are the measurement, not the workload.
    out.retain(|c| c.comm() != Some("tracekit"));
    // Significant first, then what the workload felt before activity; among what it felt,
    // the most waiting added or removed per second first (a 4x p99 of a process that waits 5
    // times a second is not the news beside +1 ms on 4000 requests a second), then by the
    // size of the change.
    out.sort_by(|x, y| {
        let size = |c: &Change| c.change_pct.map(f64::abs).unwrap_or(0.0);
        let felt = |c: &Change| c.felt_ns_per_s.map_or(0, i64::unsigned_abs);
        y.significant
            .cmp(&x.significant)
            .then(x.tier().cmp(&y.tier()))
            .then(felt(y).cmp(&felt(x)))
            .then(size(y).total_cmp(&size(x)))
            .then(x.subject.cmp(&y.subject))
            .then(x.metric.cmp(&y.metric))
    });
    (out, [db, da])
}

/// Node settings that differ: (name, before, after); absent is `-`.
pub fn fact_changes(before: &Recording, after: &Recording) -> Vec<(String, String, String)> {
    let keys: std::collections::BTreeSet<&String> =
        before.facts.keys().chain(after.facts.keys()).collect();
    keys.into_iter()
        .filter_map(|k| {
            let (b, a) = (before.facts.get(k), after.facts.get(k));
            (b != a).then(|| {
                let s = |v: Option<&String>| v.cloned().unwrap_or_else(|| "-".into());
                (k.clone(), s(b), s(a))
            })
        })
        .collect()
}

fn describe(path: &std::path::Path, r: &Recording) -> String {
    let iv = r.intervals.first().map(|i| i.secs).unwrap_or(0.0);
    let mut s = format!(
        "{} ({}, {} × {:.2} s, Linux {}",
        path.display(),
        r.header
            .get("started")
            .and_then(|v| v.as_str())
            .unwrap_or("?"),
        r.intervals.len(),
        iv,
        r.facts
            .get("sysctl:kernel.osrelease")
            .map(String::as_str)
            .unwrap_or("?"),
    );
    if !r.complete {
        s.push_str(if r.truncated {
            ", cut short: last line dropped"
        } else {
            ", incomplete: no end line"
        });
    }
    s.push(')');
    s
}

/// What a comparison found: both recordings, the node settings that changed and every
/// metric's change, ranked, and what was left out; the text, JSON and HTML reports are views
/// of it.
pub struct Comparison {
    pub before: Recording,
    pub after: Recording,
    pub facts: Vec<(String, String, String)>,
    pub changes: Vec<Change>,
    /// What the reader or the series bounds dropped, one sentence each.
    pub notes: Vec<String>,
}

impl Comparison {
    /// Refuses a side with no complete interval: a CI gate must not pass on "0 of 0 lines"
    /// because a recording was killed after its header (or cut inside its first interval).
    pub fn of(
        (bp, before): (&std::path::Path, Recording),
        (ap, after): (&std::path::Path, Recording),
    ) -> Result<Comparison> {
        for (p, r) in [(bp, &before), (ap, &after)] {
            if r.intervals.is_empty() {
                return Err(Error::Usage(format!(
                    "{}: no complete interval ({}): nothing to compare",
                    p.display(),
                    if r.truncated || !r.notes.is_empty() {
                        "the run was cut before its first interval ended"
                    } else {
                        "a header only: the run was killed before its first interval ended"
                    }
                )));
            }
        }
        Ok(Comparison::new(before, after, [bp, ap]))
    }

    pub fn new(before: Recording, after: Recording, paths: [&std::path::Path; 2]) -> Comparison {
        let (changes, dropped) = changes(&before, &after);
        let mut notes: Vec<String> = before.notes.iter().chain(&after.notes).cloned().collect();
        for ((p, n), r) in paths.iter().zip(dropped).zip([&before, &after]) {
            if n > 0 {
                let at_least = if n >= model::MAX_DROPPED_COUNTED {
                    "at least "
                } else {
                    ""
                };
                notes.push(format!(
                    "{}: {at_least}{n} series dropped past the first {} kept (at most {} series, {} samples per recording)",
                    p.display(),
                    model::series_cap(r.intervals.len()),
                    model::MAX_SERIES,
                    model::MAX_POINTS
                ));
            }
        }
        Comparison {
            facts: fact_changes(&before, &after),
            changes,
            notes,
            before,
            after,
        }
    }
}

/// The text report.
pub fn text(args: &Args, cmp: &Comparison) -> String {
    let (b, a) = (&cmp.before, &cmp.after);
    let (facts, ch) = (&cmp.facts, &cmp.changes);
    let mut s = format!(
        "tracekit compare: {} → {}\n\n",
        describe(&args.before, b),
        describe(&args.after, a)
    );
    if facts.is_empty() {
        s.push_str("Node settings: no difference.\n\n");
    } else {
        s.push_str("Node settings that changed:\n");
        for (k, x, y) in facts {
            s.push_str(&format!("  {k}  {x} → {y}\n"));
        }
        s.push('\n');
    }
    let shown = crate::report::rows::shown(args.top, ch.len());
    s.push_str(&format!(
        "Changes, {RANKING} (two-sided Mann–Whitney U over per-interval samples, p < {ALPHA}, and a change of at least {:.1} % for latency, {:.0} % otherwise); {} of {} lines:\n",
        min_change_pct(Kind::Latency("p50")),
        min_change_pct(Kind::Counter),
        shown,
        ch.len()
    ));
    for (i, c) in ch.iter().take(shown).enumerate() {
        s.push_str(&format!("{:>3}. {}\n", i + 1, c.sentence()));
    }
    use crate::report::table::{Align, Table};
    let mut t = Table::new(&[
        ("#", Align::Right),
        ("BEFORE MEDIAN", Align::Right),
        ("P99", Align::Right),
        ("MEAN", Align::Right),
        ("CV", Align::Right),
        ("AFTER MEDIAN", Align::Right),
        ("P99", Align::Right),
        ("MEAN", Align::Right),
        ("CV", Align::Right),
        ("N", Align::Right),
        ("CHANGE", Align::Right),
        ("P", Align::Right),
        ("VERDICT", Align::Left),
    ]);
    for (i, c) in ch.iter().take(shown).enumerate() {
        t.push(vec![
            (i + 1).to_string(),
            c.fmt(c.before.median),
            c.fmt(c.before.p99),
            c.fmt(c.before.mean),
            format!("{:.2}", c.before.cv),
            c.fmt(c.after.median),
            c.fmt(c.after.p99),
            c.fmt(c.after.mean),
            format!("{:.2}", c.after.cv),
            format!("{}/{}", c.sides.0.samples.len(), c.sides.1.samples.len()),
            c.change_pct
                .map(|p| format!("{p:+.1}%"))
                .unwrap_or_else(|| "-".into()),
            c.p.map(fmt_p).unwrap_or_else(|| "-".into()),
            c.verdict.to_string(),
        ]);
    }
    if shown > 0 {
        s.push('\n');
        s.push_str(&t.render());
    }
    s.push_str("\nMedian, p99, mean and CV of latency are over every event of the run (the recorded histograms); of other metrics over the per-interval samples. N: intervals with samples, before/after.\n");
    for n in &cmp.notes {
        s.push_str(&format!("Note: {n}.\n"));
    }
    // Subjects, metrics, settings and paths come from the recordings (a comm is whatever a
    // process named itself): every line is made terminal-safe as the tools' own reports are.
    s.split_inclusive('\n')
        .map(|l| {
            let (body, nl) = l.strip_suffix('\n').map_or((l, ""), |b| (b, "\n"));
            sanitize::text(body.as_bytes()) + nl
        })
        .collect()
}

pub fn run(args: Args) -> Result<()> {
    let before = Recording::read(&args.before)?;
    let after = Recording::read(&args.after)?;
    let cmp = Comparison::of((&args.before, before), (&args.after, after))?;
    let (facts, ch) = (&cmp.facts, &cmp.changes);
    // Checked before the work: a path that cannot be written costs nothing.
    let mut page = match &args.html {
        Some(p) => Some(Sink::open(Some(p), false)?),
        None => None,
    };
    let worse = ch.iter().filter(|c| c.verdict == "worse").count();
    let mut out = Sink::Stdout;
    let body = if args.json {
        let mut s = String::new();
        for (k, b, a) in facts {
            s.push_str(&json!({"type": "fact", "name": k, "before": b, "after": a}).to_string());
            s.push('\n');
        }
        for (i, c) in ch.iter().enumerate() {
            let mut v = serde_json::to_value(c).unwrap_or_default();
            v["type"] = "change".into();
            v["rank"] = (i + 1).into();
            s.push_str(&v.to_string());
            s.push('\n');
        }
        s.push_str(&json!({"type": "compare", "before": args.before, "after": args.after, "facts_changed": facts.len(), "lines": ch.len(), "significant": ch.iter().filter(|c| c.significant).count(), "worse": worse, "alpha": ALPHA, "notes": cmp.notes}).to_string());
        s.push('\n');
        s
    } else {
        text(&args, &cmp)
    };
    if !out.put(&body)? {
        return Ok(());
    }
    if let Some(sink) = page.as_mut() {
        sink.write(&html::page(&args, &cmp))?;
        sink.finish()?;
    }
    if args.fail_on_regression && worse > 0 {
        return Err(Error::Regression(format!(
            "{worse} significant regression(s) between {} and {}",
            args.before.display(),
            args.after.display()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
