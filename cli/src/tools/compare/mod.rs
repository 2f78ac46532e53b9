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
mod tests {
    use super::*;
    use crate::tools::record::format::dist_json;
    use probes_common::hist::LatHist;
    use std::path::Path;

    /// A recording of `n` intervals of one row of `comm` (a counter named `field` and an fsync
    /// histogram) with `facts`; `tail` appended as it is (a cut line).
    fn recording(n: u64, comm: &str, field: &str, facts: Value, tail: &str) -> String {
        let header = json!({"format": "tracekit-record", "version": 1, "type": "header", "tools": ["fsync-lat"], "facts": facts});
        let mut s = format!("{header}\n");
        for i in 0..n {
            let mut h = LatHist::ZERO;
            for v in [1_000, 2_000 + i * 100, 90_000] {
                h.record(v);
            }
            for l in [
                json!({"type": "interval", "i": i, "secs": 1.0, "end_ns": i}),
                json!({"type": "row", "i": i, "tool": "fsync-lat", "kind": "summary", "row": {"pid": 5, "comm": comm, field: 3 + i}, "dists": {"fsync": dist_json(&h)}}),
                json!({"type": "node", "i": i, "cpu_user_pct": 10 + i}),
            ] {
                s.push_str(&l.to_string());
                s.push('\n');
            }
        }
        s.push_str(tail);
        s
    }

    fn parse(text: &str, name: &str) -> Recording {
        Recording::parse(text.as_bytes(), Path::new(name)).unwrap()
    }

    fn args(before: &Path, after: &Path) -> Args {
        Args {
            before: before.into(),
            after: after.into(),
            json: false,
            html: None,
            fail_on_regression: false,
            top: 0,
        }
    }

    use serde_json::Value;

    /// Issue #31 (6): comms and settings printed raw (`count/s of ^[]0;PWN^G^[[2J…`).
    #[test]
    fn text_and_html_carry_no_terminal_escapes() {
        const EVIL: &str = "\u{1b}]0;PWN\u{7}\u{1b}[2J\u{7f}\u{9b}31m";
        let b = recording(
            4,
            &format!("pg{EVIL}"),
            &format!("count{EVIL}"),
            json!({"sysctl:vm.swappiness": format!("60{EVIL}"), format!("sysctl:x{EVIL}"): "1"}),
            "",
        );
        let a = recording(
            4,
            &format!("pg{EVIL}"),
            &format!("count{EVIL}"),
            json!({"sysctl:vm.swappiness": "10"}),
            "",
        );
        let (bp, ap) = (Path::new("b\u{1b}[2J.tkr"), Path::new("a.tkr"));
        let cmp = Comparison::of((bp, parse(&b, "b.tkr")), (ap, parse(&a, "a.tkr"))).unwrap();
        assert!(!cmp.changes.is_empty() && !cmp.facts.is_empty());
        let args = args(bp, ap);
        let text = text(&args, &cmp);
        let page = html::page(&args, &cmp);
        for (what, out) in [("text", &text), ("html", &page)] {
            let bad: Vec<(usize, u8)> = out
                .bytes()
                .enumerate()
                .filter(|(_, b)| (*b < 0x20 && *b != b'\n') || *b == 0x7f)
                .collect();
            assert!(bad.is_empty(), "{what}: control bytes {bad:?} in {out}");
            assert!(!out.contains('\u{9b}'), "{what}: C1 CSI in {out}");
            // Shown, escaped, rather than dropped: two names never print the same.
            assert!(
                out.contains("pg\\x1b]0;PWN\\x07\\x1b[2J\\x7f"),
                "{what}: {out}"
            );
            assert!(out.contains("60\\x1b]0;PWN"), "{what}: {out}");
        }
    }

    /// A recording of `n` intervals whose rows `rows(i)` makes (tool, kind, row, fsync
    /// latencies of the interval in ns).
    fn recording_of(n: u64, rows: impl Fn(u64) -> Vec<(&'static str, Value, Vec<u64>)>) -> String {
        let header = json!({"format": "tracekit-record", "version": 1, "type": "header", "tools": ["fsync-lat", "io-lat"], "facts": {}});
        let mut s = format!("{header}\n");
        for i in 0..n {
            s.push_str(&json!({"type": "interval", "i": i, "secs": 1.0, "end_ns": i}).to_string());
            s.push('\n');
            for (tool, row, lat) in rows(i) {
                let mut line =
                    json!({"type": "row", "i": i, "tool": tool, "kind": "summary", "row": row});
                if !lat.is_empty() {
                    let mut h = LatHist::ZERO;
                    for v in lat {
                        h.record(v);
                    }
                    line["dists"] = json!({"fsync": dist_json(&h)});
                }
                s.push_str(&line.to_string());
                s.push('\n');
            }
            s.push_str(&json!({"type": "node", "i": i}).to_string());
            s.push('\n');
        }
        s
    }

    /// Issue #33 (8): after switching a scheduler off, compare's #1 was "queued/s 4662 → 0,
    /// better" (an accounting artifact), with "0 → 0, changed (significant)" lines, tracekit's
    /// own processes, and the real regression below kworker lines. Now: the workload's latency
    /// first, kernel threads after it, never tracekit, never a change between equal numbers.
    #[test]
    fn the_workloads_latency_ranks_first_and_artifacts_do_not() {
        let side = |after: bool| {
            recording_of(8, move |i| {
                let lat = if after { 4_000_000 } else { 1_000_000 };
                vec![
                    (
                        "fsync-lat",
                        json!({"pid": 5, "comm": "sysbench", "count": 100}),
                        vec![lat; 50],
                    ),
                    (
                        "io-lat",
                        json!({"pid": 5, "comm": "sysbench", "count": 4662, "queued": if after { 0 } else { 4662 }}),
                        vec![],
                    ),
                    (
                        "io-lat",
                        json!({"pid": 9, "comm": "kworker/u4:1", "count": if after { 9000 + i } else { 10 + i }}),
                        vec![],
                    ),
                    (
                        "fsync-lat",
                        json!({"pid": 7, "comm": "tracekit", "count": if after { 500 + i } else { 1 + i }}),
                        vec![],
                    ),
                    // Mostly zero on both sides: medians 0 → 0.
                    (
                        "fsync-lat",
                        json!({"pid": 8, "comm": "zz", "errors": if !after && i >= 5 { 9 } else { 0 }}),
                        vec![],
                    ),
                ]
            })
        };
        let (b, a) = (parse(&side(false), "b.tkr"), parse(&side(true), "a.tkr"));
        let cmp = Comparison::of((Path::new("b.tkr"), b), (Path::new("a.tkr"), a)).unwrap();
        let sig: Vec<(&str, &str, &str)> = cmp
            .changes
            .iter()
            .filter(|c| c.significant)
            .map(|c| (c.subject.as_str(), c.metric.as_str(), c.verdict))
            .collect();
        assert!(
            sig.first()
                .is_some_and(|(s, m, v)| s.starts_with("sysbench")
                    && m.contains("fsync latency")
                    && *v == "worse"),
            "{sig:#?}"
        );
        let kworker = sig
            .iter()
            .position(|(s, ..)| s.starts_with("kworker"))
            .expect("kworker's change is kept");
        let queued = sig.iter().position(|(_, m, _)| *m == "queued/s");
        assert!(queued.is_some_and(|q| q < kworker), "{sig:#?}");
        assert!(
            cmp.changes
                .iter()
                .filter(|c| c.metric == "queued/s")
                .all(|c| c.verdict != "better"),
            "fewer queued is no improvement"
        );
        assert!(!cmp
            .changes
            .iter()
            .any(|c| c.subject.starts_with("tracekit")));
        for c in &cmp.changes {
            let (hb, ha) = c.headline();
            assert!(
                !(c.significant && c.fmt(hb) == c.fmt(ha)),
                "{} {}: {} → {} called {}",
                c.subject,
                c.metric,
                c.fmt(hb),
                c.fmt(ha),
                c.verdict
            );
        }
    }

    /// Issue #33: among what the workload waited, the most waiting added per second ranks
    /// first, not the largest ratio: a service whose 4000 calls a second got 1 ms slower
    /// (+50 %) outranks a process whose 5 calls a second got four times slower (+300 %).
    #[test]
    fn the_most_waiting_added_per_second_ranks_first() {
        let side = |after: bool| {
            recording_of(8, move |_| {
                let (db, cron) = if after {
                    (3_000_000, 400_000)
                } else {
                    (2_000_000, 100_000)
                };
                vec![
                    (
                        "fsync-lat",
                        json!({"pid": 5, "comm": "db", "count": 4000}),
                        vec![db; 4000],
                    ),
                    (
                        "fsync-lat",
                        json!({"pid": 6, "comm": "cron", "count": 5}),
                        vec![cron; 5],
                    ),
                ]
            })
        };
        let (b, a) = (parse(&side(false), "b.tkr"), parse(&side(true), "a.tkr"));
        let cmp = Comparison::of((Path::new("b.tkr"), b), (Path::new("a.tkr"), a)).unwrap();
        let lat: Vec<&Change> = cmp
            .changes
            .iter()
            .filter(|c| c.significant && c.metric.ends_with("fsync latency"))
            .collect();
        let names: Vec<(&str, &str, Option<i64>, Option<f64>)> = lat
            .iter()
            .map(|c| {
                (
                    c.subject.as_str(),
                    c.metric.as_str(),
                    c.felt_ns_per_s,
                    c.change_pct,
                )
            })
            .collect();
        assert_eq!(lat.len(), 4, "{names:#?}");
        assert!(
            lat[..2].iter().all(|c| c.subject.starts_with("db ")),
            "{names:#?}"
        );
        // 1 ms more on each of 4000 calls a second: 4 s of waiting per second, within the
        // histogram's resolution; cron's 300 µs more on 5 a second: 1.5 ms.
        let db = lat[0].felt_ns_per_s.unwrap();
        assert!((3_500_000_000..4_500_000_000).contains(&db), "{names:#?}");
        let cron = lat[2].felt_ns_per_s.unwrap();
        assert!((1_000_000..2_000_000).contains(&cron), "{names:#?}");
        assert!(lat[2].change_pct > lat[0].change_pct, "{names:#?}");
        assert!(
            lat[0].sentence().contains("adds 4."),
            "{}",
            lat[0].sentence()
        );
    }

    /// Issue #31 (10): a side killed after its header (or cut inside its only interval) gave
    /// "0 of 0 lines" and exit 0 under --fail-on-regression. It is bad input now (exit 2, one
    /// line naming the file); a cut last line after good intervals is a note.
    #[test]
    fn a_side_with_no_complete_interval_is_an_error() {
        let dir = std::env::temp_dir().join(format!("tk-compare-empty-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let good = recording(4, "pg", "count", json!({}), "");
        let header_only = good.lines().next().unwrap().to_string() + "\n";
        let first = good.lines().take(3).collect::<Vec<_>>().join("\n");
        let cut_first = &first[..first.len() - 20];
        let cut_later = recording(
            4,
            "pg",
            "count",
            json!({}),
            "{\"type\":\"interval\",\"i\":4,\"se",
        );
        let p = |n: &str, t: &str| {
            let p = dir.join(n);
            std::fs::write(&p, t).unwrap();
            p
        };
        let g = p("good.tkr", &good);
        for bad in [p("header.tkr", &header_only), p("cut.tkr", cut_first)] {
            for (b, a) in [(&g, &bad), (&bad, &g)] {
                let e = run(Args {
                    json: true,
                    fail_on_regression: true,
                    ..args(b, a)
                })
                .expect_err("a side with no interval is an error");
                let line = crate::error::one_line(&e);
                assert_eq!(e.exit(), crate::error::Exit::Usage, "{line}");
                assert!(line.starts_with(&bad.display().to_string()), "{line}");
                assert!(line.contains("no complete interval"), "{line}");
            }
        }
        let later = p("later.tkr", &cut_later);
        let cmp = Comparison::of(
            (&g, Recording::read(&g).unwrap()),
            (&later, Recording::read(&later).unwrap()),
        )
        .unwrap();
        assert_eq!(cmp.after.intervals.len(), 4);
        assert!(
            cmp.notes.iter().any(|n| n.contains("cut")),
            "{:?}",
            cmp.notes
        );
        let text = text(&args(&g, &later), &cmp);
        assert!(text.contains("Note: ") && text.contains("cut"), "{text}");
        let _ = std::fs::remove_dir_all(dir);
    }

    /// Issue #31 (5), the bounds themselves: names cut with a hash (both sides alike), series
    /// capped with the count of the dropped said, rows' fields and histograms capped.
    #[test]
    fn series_and_rows_are_bounded_and_what_was_dropped_is_said() {
        let long = "y".repeat(5_000);
        assert_eq!(model::bounded(long.clone()), model::bounded(long.clone()));
        assert!(model::bounded(long.clone()).len() < 300);
        assert_ne!(
            model::bounded(long.clone()),
            model::bounded(format!("{long}z"))
        );
        // Many intervals, each with a subject of its own: at most series_cap series.
        let mut s = recording(0, "", "", json!({}), "");
        let n = 4_000u64;
        for i in 0..n {
            for l in [
                json!({"type": "interval", "i": i, "secs": 1.0}),
                json!({"type": "row", "i": i, "tool": "io-lat", "kind": "summary", "row": {"comm": format!("p{i}"), "count": 1, "bytes": 2}}),
                json!({"type": "node", "i": i}),
            ] {
                s.push_str(&l.to_string());
                s.push('\n');
            }
        }
        let r = parse(&s, "m.tkr");
        let (series, dropped) = model::series(&r, &Default::default());
        assert_eq!(series.len(), model::series_cap(n as usize));
        assert_eq!(series.len() + dropped, 2 * n as usize);
        let cmp = Comparison::of((Path::new("m.tkr"), r.clone()), (Path::new("m.tkr"), r)).unwrap();
        assert!(
            cmp.notes.iter().any(|n| n.contains("series dropped")),
            "{:?}",
            cmp.notes
        );
        // One row of 10,000 fields and 1,000 histograms keeps the first of each.
        let mut h = LatHist::ZERO;
        h.record(5);
        let mut row = serde_json::Map::new();
        for f in 0..10_000 {
            row.insert(format!("f{f:05}"), 1.into());
        }
        let dists: serde_json::Map<String, Value> = (0..1_000)
            .map(|d| (format!("d{d:04}"), dist_json(&h)))
            .collect();
        let mut s = recording(0, "", "", json!({}), "");
        for l in [
            json!({"type": "interval", "i": 0, "secs": 1.0}),
            json!({"type": "row", "i": 0, "tool": "t", "kind": "k", "row": row, "dists": dists}),
            json!({"type": "node", "i": 0}),
        ] {
            s.push_str(&l.to_string());
            s.push('\n');
        }
        let r = parse(&s, "w.tkr");
        let row = &r.intervals[0].rows[0];
        use crate::tools::record::format::{MAX_DISTS_PER_ROW, MAX_FIELDS_PER_ROW};
        assert_eq!(
            (row.fields.len(), row.dists.len()),
            (MAX_FIELDS_PER_ROW, MAX_DISTS_PER_ROW)
        );
        let notes = r.notes.join("; ");
        assert!(
            notes.contains("9744 field(s)") && notes.contains("968 histogram(s)"),
            "{notes}"
        );
        // A bucket list longer than the layout is not a histogram.
        let many: Vec<Value> = (0..400).map(|_| json!([1, 1])).collect();
        let d = json!({"count": 400, "sum": 400, "min": 1, "max": 1, "b": many});
        let bad = format!(
            "{}{}\n",
            recording(1, "pg", "count", json!({}), ""),
            json!({"type": "interval", "i": 1, "secs": 1.0})
        ) + &json!({"type": "row", "i": 1, "tool": "t", "kind": "k", "row": {}, "dists": {"x": d}}).to_string();
        let e = Recording::parse(bad.as_bytes(), Path::new("b.tkr")).unwrap_err();
        assert!(crate::error::one_line(&e).contains("buckets listed"), "{e}");
    }
}
