//! What `serve` exports: every counter and histogram the tools declare beside their rows
//! ([`schema::Rows`](crate::report::schema::Rows): a field's or distribution's `export`), the
//! totals kept per series across windows, and the top-N folding that bounds them.
//!
//! Each window's rows are deltas (the run is windowed, so every collector drains and resets its
//! maps); `serve` adds them to totals kept here, so counters only grow. A metric keeps at most
//! `max_series` label sets: after each window the most active ones (activity decays by half per
//! window) stay, the rest are folded into one overflow series labelled `overflow="true"` and
//! nothing else (its totals absorb theirs, so sums over a metric stay exact; no row ever has an
//! `overflow` label, so a process named `other` is a series like any other) and counted in
//! `tracekit_series_dropped_total`. Memory is bounded by the metrics × `max_series`, whatever
//! number of processes comes and goes.
//!
//! Series budget: a histogram label set is 52 samples (49 bounds, `+Inf`, `_sum`, `_count`), a
//! counter's one. With the default `--max-series 20` and every default collector, a node
//! exports at most 21 × (6 × 52 + 14) ≈ 6,900 samples plus a few dozen of tracekit's own.

use std::collections::HashMap;

use serde_json::Value;

use super::buckets::Buckets;
use crate::{
    report::{
        render::Output,
        schema::{Dist, Field, Rows},
    },
    tools::ToolInfo,
};

/// One tool's rows of one kind that export anything, and where their families start in
/// [`Totals::families`]: its exported fields, then its exported distributions.
#[derive(Debug)]
struct Exported {
    tool: &'static str,
    rows: &'static Rows,
    base: usize,
    counters: Vec<&'static Field>,
    hists: Vec<&'static Dist>,
}

/// Every exported row kind of `tools`, in registry order.
fn exported(tools: &[ToolInfo]) -> Vec<Exported> {
    let mut out = Vec::new();
    let mut base = 0;
    for t in tools {
        for rows in t.rows {
            let counters: Vec<&Field> = rows.all_fields().filter(|f| f.export.is_some()).collect();
            let hists: Vec<&Dist> = rows.dists.iter().filter(|d| d.export.is_some()).collect();
            if counters.is_empty() && hists.is_empty() {
                continue;
            }
            let n = counters.len() + hists.len();
            out.push(Exported {
                tool: t.name,
                rows,
                base,
                counters,
                hists,
            });
            base += n;
        }
    }
    out
}

/// Row keys that become labels when a row has them (set by container attribution).
const CONTAINER_LABELS: &[&str] = &["container", "pod", "namespace"];

/// The only label of the series other series are folded into: a label no row has (rows are
/// labelled by comm, container, pod, namespace, their spec's labels and pid), so no process
/// name, however chosen, can land in it.
pub const OVERFLOW: (&str, &str) = ("overflow", "true");

pub type Labels = Vec<(&'static str, String)>;

#[derive(Clone, Debug, PartialEq)]
pub enum Total {
    Counter(u64),
    Hist(Box<Buckets>),
}

impl Total {
    fn add(&mut self, o: &Total) {
        match (self, o) {
            (Total::Counter(a), Total::Counter(b)) => *a += b,
            (Total::Hist(a), Total::Hist(b)) => a.add(b),
            _ => {}
        }
    }

    /// How much happened (the ranking key): the counter's value or the histogram's count.
    fn activity(&self) -> u64 {
        match self {
            Total::Counter(v) => *v,
            Total::Hist(b) => b.count,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Series {
    pub total: Total,
    /// Activity, halved every window.
    score: f64,
    /// Window in which the series appeared (older wins ties: stable label sets).
    born: u64,
}

/// One metric: its series, the overflow series, and how many were folded.
#[derive(Debug)]
pub struct Family {
    /// The collector that declares it.
    pub tool: &'static str,
    pub name: &'static str,
    pub help: &'static str,
    pub hist: bool,
    pub ns: bool,
    pub series: HashMap<Labels, Series>,
    pub other: Option<Total>,
    pub dropped: u64,
}

/// Every metric's totals.
#[derive(Debug)]
pub struct Totals {
    pub families: Vec<Family>,
    exported: Vec<Exported>,
    max_series: usize,
    pid_labels: bool,
    windows: u64,
}

impl Totals {
    /// Totals of every metric the registry's collectors declare.
    pub fn new(max_series: usize, pid_labels: bool) -> Totals {
        Totals::of(crate::tools::TOOLS, max_series, pid_labels)
    }

    /// Whether series carry a `pid` label (`--pid-labels`).
    pub fn pid_labels(&self) -> bool {
        self.pid_labels
    }

    /// Totals of every metric `tools` declare.
    pub fn of(tools: &[ToolInfo], max_series: usize, pid_labels: bool) -> Totals {
        let exported = exported(tools);
        let mut families = Vec::new();
        for e in &exported {
            for c in e.counters.iter().filter_map(|f| f.export) {
                families.push(Family::new(e.tool, c.name, c.help, false, c.ns));
            }
            for (name, help) in e.hists.iter().filter_map(|d| d.export) {
                families.push(Family::new(e.tool, name, help, true, false));
            }
        }
        Totals {
            families,
            exported,
            max_series: max_series.max(1),
            pid_labels,
            windows: 0,
        }
    }

    /// The labels of one row.
    fn labels(&self, rows: &Rows, row: &Value) -> Labels {
        let mut l: Labels = Vec::new();
        let text = |v: &Value| match v {
            Value::String(s) => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        };
        for k in ["comm"]
            .iter()
            .chain(CONTAINER_LABELS)
            .chain(rows.labels)
            .chain(if self.pid_labels { &["pid"][..] } else { &[] })
        {
            if let Some(v) = row.get(*k).and_then(text).filter(|v| !v.is_empty()) {
                l.push((k, v));
            }
        }
        l
    }

    /// Adds one window's outputs (`tools[i]` produced `outs[i]`), then folds each metric down
    /// to its most active series.
    pub fn ingest(&mut self, tools: &[&str], outs: &[Output]) {
        let mut deltas: Vec<HashMap<Labels, Total>> =
            self.families.iter().map(|_| HashMap::new()).collect();
        for (tool, out) in tools.iter().zip(outs) {
            for sec in &out.sections {
                let Some(e) = self
                    .exported
                    .iter()
                    .find(|e| e.tool == *tool && e.rows.kind == sec.kind)
                else {
                    continue;
                };
                let base = e.base;
                for (ri, row) in sec.json.iter().enumerate() {
                    let labels = self.labels(e.rows, row);
                    for (ci, c) in e.counters.iter().enumerate() {
                        let v = row.get(c.key).and_then(Value::as_u64).unwrap_or(0);
                        if v > 0 {
                            deltas[base + ci]
                                .entry(labels.clone())
                                .or_insert(Total::Counter(0))
                                .add(&Total::Counter(v));
                        }
                    }
                    for (hi, dist) in e.hists.iter().enumerate() {
                        for (d, h) in sec.dists_of(ri) {
                            if *d == dist.name && h.count > 0 {
                                let slot = deltas[base + e.counters.len() + hi]
                                    .entry(labels.clone())
                                    .or_insert_with(|| Total::Hist(Box::default()));
                                if let Total::Hist(b) = slot {
                                    b.add_hist(h);
                                }
                            }
                        }
                    }
                }
            }
        }
        let w = self.windows;
        for (f, d) in self.families.iter_mut().zip(deltas) {
            f.apply(d, w, self.max_series);
        }
        self.windows += 1;
    }
}

impl Family {
    fn new(
        tool: &'static str,
        name: &'static str,
        help: &'static str,
        hist: bool,
        ns: bool,
    ) -> Family {
        Family {
            tool,
            name,
            help,
            hist,
            ns,
            series: HashMap::new(),
            other: None,
            dropped: 0,
        }
    }

    /// Adds a window's deltas, decays every score, and folds all but the `max` most active
    /// series into the overflow series.
    fn apply(&mut self, deltas: HashMap<Labels, Total>, window: u64, max: usize) {
        for s in self.series.values_mut() {
            s.score /= 2.0;
        }
        for (labels, d) in deltas {
            match self.series.get_mut(&labels) {
                Some(s) => {
                    s.score += d.activity() as f64;
                    s.total.add(&d);
                }
                None => {
                    self.series.insert(
                        labels,
                        Series {
                            score: d.activity() as f64,
                            total: d,
                            born: window,
                        },
                    );
                }
            }
        }
        if self.series.len() <= max {
            return;
        }
        let mut ranked: Vec<(f64, u64, Labels)> = self
            .series
            .iter()
            .map(|(l, s)| (s.score, s.born, l.clone()))
            .collect();
        ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        for (_, _, l) in ranked.into_iter().skip(max) {
            if let Some(s) = self.series.remove(&l) {
                self.fold(s.total);
                self.dropped += 1;
            }
        }
    }

    fn fold(&mut self, v: Total) {
        match &mut self.other {
            Some(o) => o.add(&v),
            None => self.other = Some(v),
        }
    }

    /// The series in a stable order, the overflow series last.
    pub fn sorted(&self) -> Vec<(Labels, &Total)> {
        let mut v: Vec<(Labels, &Total)> = self
            .series
            .iter()
            .map(|(l, s)| (l.clone(), &s.total))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        if let Some(o) = &self.other {
            v.push((vec![(OVERFLOW.0, OVERFLOW.1.to_string())], o));
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::rows::{Column, Ctx, Section};
    use probes_common::hist::LatHist;
    use serde::Serialize;

    #[derive(Serialize)]
    struct Row {
        pid: u32,
        comm: String,
        syscall: &'static str,
        count: u64,
        errors: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        container: Option<String>,
        #[serde(skip)]
        hist: LatHist,
    }

    impl crate::report::rows::Row for Row {}

    fn row(pid: u32, comm: &str, count: u64, container: Option<&str>) -> Row {
        let mut hist = LatHist::ZERO;
        for i in 0..count {
            hist.record(1_000_000 + i);
        }
        Row {
            pid,
            comm: comm.into(),
            syscall: "fsync",
            count,
            errors: 0,
            container: container.map(String::from),
            hist,
        }
    }

    const COLS: &[Column<Row>] = &[Column::right("PID", |r, _| r.pid.to_string())];
    // Ingest finds fsync-lat's declaration in the registry by tool and kind.
    const ROWS: crate::report::schema::Rows = crate::report::schema::Rows::plain("summary");

    fn out(rows: &[Row]) -> Output {
        Output {
            sections: vec![
                Section::build(&ROWS, rows, COLS, &Ctx { secs: 1.0 }, 0).with_dists(
                    rows,
                    |r| r.pid.to_string(),
                    |r| vec![("fsync", r.hist)],
                ),
            ],
            ..Default::default()
        }
    }

    fn family<'a>(t: &'a Totals, name: &str) -> &'a Family {
        t.families.iter().find(|f| f.name == name).unwrap()
    }

    /// The overflow series' activity.
    fn overflow(f: &Family) -> u64 {
        f.sorted()
            .iter()
            .filter(|(l, _)| *l == vec![(OVERFLOW.0, OVERFLOW.1.to_string())])
            .map(|(_, v)| v.activity())
            .sum()
    }

    fn counter(f: &Family, comm: &str) -> u64 {
        f.sorted()
            .iter()
            .filter(|(l, _)| l.iter().any(|(k, v)| *k == "comm" && v == comm))
            .map(|(_, v)| v.activity())
            .sum()
    }

    #[test]
    fn totals_grow_across_windows_and_merge_by_labels() {
        let mut t = Totals::new(50, false);
        // Two processes of one comm are one series; pid is no label by default.
        t.ingest(
            &["fsync-lat"],
            &[out(&[row(1, "db", 3, None), row(2, "db", 4, None)])],
        );
        t.ingest(&["fsync-lat"], &[out(&[row(1, "db", 5, Some("web-1"))])]);
        let calls = family(&t, "tracekit_fsync_calls");
        assert_eq!(counter(calls, "db"), 12);
        assert_eq!(calls.series.len(), 2, "with and without a container label");
        assert!(calls
            .sorted()
            .iter()
            .all(|(l, _)| l.iter().all(|(k, _)| *k != "pid")));
        let lat = family(&t, "tracekit_fsync_latency_seconds");
        assert_eq!(counter(lat, "db"), 12);
        assert!(family(&t, "tracekit_fsync_errors").series.is_empty());
        let mut p = Totals::new(50, true);
        p.ingest(
            &["fsync-lat"],
            &[out(&[row(1, "db", 3, None), row(2, "db", 4, None)])],
        );
        assert_eq!(family(&p, "tracekit_fsync_calls").series.len(), 2);
    }

    #[test]
    fn folding_keeps_the_most_active_and_sums_exact() {
        let mut t = Totals::new(3, false);
        let rows: Vec<Row> = (0..10)
            .map(|i| row(i, &format!("p{i}"), 1 + i as u64, None))
            .collect();
        t.ingest(&["fsync-lat"], &[out(&rows)]);
        let f = family(&t, "tracekit_fsync_calls");
        assert_eq!(f.series.len(), 3);
        for keep in ["p9", "p8", "p7"] {
            assert!(counter(f, keep) > 0, "{keep} kept");
        }
        assert_eq!(f.dropped, 7);
        assert_eq!(overflow(f), (1..=7).sum::<u64>());
        let all: u64 = f.sorted().iter().map(|(_, v)| v.activity()).sum();
        assert_eq!(all, (1..=10).sum::<u64>());
        // Many windows of new short-lived processes: memory stays bounded, overflow only grows.
        let mut last_other = overflow(f);
        for w in 0..50u32 {
            let rows: Vec<Row> = (0..20)
                .map(|i| row(1000 + w * 20 + i, &format!("short{w}-{i}"), 1, None))
                .collect();
            t.ingest(&["fsync-lat"], &[out(&rows)]);
            let f = family(&t, "tracekit_fsync_calls");
            assert!(f.series.len() <= 3);
            assert!(overflow(f) >= last_other);
            last_other = overflow(f);
        }
        let f = family(&t, "tracekit_fsync_calls");
        let all: u64 = f.sorted().iter().map(|(_, v)| v.activity()).sum();
        assert_eq!(all, 55 + 50 * 20);
    }

    #[test]
    fn a_process_named_other_is_its_own_series_not_the_overflow() {
        let mut t = Totals::new(2, false);
        let rows = [
            row(1, "other", 100, None),
            row(2, "db", 50, None),
            row(3, "tiny", 1, None),
        ];
        t.ingest(&["fsync-lat"], &[out(&rows)]);
        let f = family(&t, "tracekit_fsync_calls");
        let sorted = f.sorted();
        let named: Vec<&Labels> = sorted
            .iter()
            .map(|(l, _)| l)
            .filter(|l| l.iter().any(|(k, v)| *k == "comm" && v == "other"))
            .collect();
        assert_eq!(named.len(), 1, "{sorted:?}");
        assert_eq!(counter(f, "other"), 100, "the process, alone");
        assert_eq!(overflow(f), 1, "only `tiny` overflowed");
        assert_eq!(f.dropped, 1);
        // Its overflow series carries no comm, so `comm="other"` selects the process only.
        let (last, _) = sorted.last().unwrap();
        assert!(last.iter().all(|(k, _)| *k != "comm"), "{last:?}");
        // Under the cap nothing overflows, whatever the names.
        let mut t = Totals::new(10, false);
        t.ingest(
            &["fsync-lat"],
            &[out(&[
                row(1, "other", 3, None),
                row(2, "overflow", 2, None),
            ])],
        );
        let f = family(&t, "tracekit_fsync_calls");
        assert_eq!(
            (counter(f, "other"), counter(f, "overflow"), overflow(f)),
            (3, 2, 0)
        );
        assert!(f.other.is_none());
    }

    /// Issue #32: `numa` ran under serve and exported nothing, because serve kept its own
    /// table of every tool's metrics and it had no line for numa.
    #[test]
    fn every_collector_serve_runs_exports_a_metric() {
        for t in crate::tools::TOOLS.iter().filter(|t| t.triage && !t.hidden) {
            assert!(
                t.rows.iter().any(|r| r.exports()),
                "{} runs under serve but declares no exported metric",
                t.name
            );
        }
        let t = Totals::new(1, false);
        for name in ["tracekit_numa_pages_migrated", "tracekit_fsync_calls"] {
            assert!(t.families.iter().any(|f| f.name == name), "{name}");
        }
    }

    #[test]
    fn every_spec_metric_name_is_unique() {
        let t = Totals::new(1, false);
        let mut names: Vec<&str> = t.families.iter().map(|f| f.name).collect();
        let n = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), n);
        assert!(names.iter().all(|n| n.starts_with("tracekit_")));
    }
}
