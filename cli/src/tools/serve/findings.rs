//! Findings as series. Each window, `serve` runs triage's judgement
//! ([`crate::tools::triage::judge`], the same code, not a copy) over its collectors' outputs
//! and exports each finding as one `tracekit_finding_score` series, replaced at the next
//! window: a finding that ends is gone from the next scrape (Prometheus marks its series stale)
//! rather than a zero kept forever.
//!
//! Labels: `cause`; `tool`, the collector that concluded it; the victim, as `comm` for a
//! process or thread or else `subject` (`cpu CPU 1`, `device loop0`, `socket udp/5140`); its
//! `container`, `pod` and `namespace`; `culprit_comm` and `culprit_container` where a culprit
//! is measured (a culprit that is not a process, a CPU's softirq work, is `culprit_subject`);
//! `unit`, `seconds_per_second` (time lost per second, or the share of packets lost) or
//! `per_second` (a rate); `pid` with `--pid-labels`. Findings with the same labels (two
//! processes of one name and cause, without `pid`) are one series, the larger score.
//!
//! Cardinality: at most `--max-series` findings a window, triage's top ranks; the rest are
//! counted in `tracekit_findings_dropped_total`. `tracekit_findings` is how many the window
//! had in all.
//!
//! There is no `tracekit_finding_info` carrying the finding's one-line summary: a summary holds
//! the window's numbers, so every window would make a new series, kept by Prometheus for its
//! whole retention (unbounded cardinality). The alerts (deploy/alerts.yml) build their text
//! from the labels and the value, and name the command that prints the summary on the node.

use super::metrics::Labels;
use crate::report::findings::{Finding, Score};

/// One finding of the last window as a series.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    pub labels: Labels,
    pub value: f64,
}

/// The unit label of a score, and its value in that unit.
fn value(s: Score) -> (&'static str, f64) {
    match s {
        Score::NsPerS(ns) => ("seconds_per_second", ns as f64 / 1e9),
        Score::RatePerS(r) => ("per_second", r),
    }
}

/// The labels of one finding (empty values left out).
fn labels(f: &Finding, pid_labels: bool) -> Labels {
    let mut l: Labels = vec![
        ("cause", f.cause.name.to_string()),
        ("tool", f.tool.to_string()),
    ];
    let s = &f.subject;
    let name = s.name.clone().unwrap_or_default();
    match s.kind {
        "process" | "thread" => l.push(("comm", name)),
        kind => l.push(("subject", format!("{kind} {name}"))),
    }
    for (k, v) in [
        ("container", &s.container),
        ("pod", &s.pod),
        ("namespace", &s.namespace),
    ] {
        if let Some(v) = v {
            l.push((k, v.clone()));
        }
    }
    if let Some(c) = &f.culprit {
        let name = c.name.clone().unwrap_or_default();
        match c.kind {
            "process" | "thread" => l.push(("culprit_comm", name)),
            kind => l.push(("culprit_subject", format!("{kind} {name}"))),
        }
        if let Some(v) = &c.container {
            l.push(("culprit_container", v.clone()));
        }
    }
    l.push(("unit", value(f.score).0.to_string()));
    if pid_labels {
        if let Some(p) = s.pid {
            l.push(("pid", p.to_string()));
        }
    }
    l.retain(|(_, v)| !v.is_empty());
    l
}

/// The series of one window's findings (ranked, as [`crate::tools::triage::judge`] returns
/// them): at most `max`, and how many findings beyond that were left out.
pub fn series(f: &[Finding], max: usize, pid_labels: bool) -> (Vec<Series>, u64) {
    let mut out: Vec<Series> = Vec::new();
    let mut dropped = 0u64;
    for x in f {
        let labels = labels(x, pid_labels);
        let v = value(x.score).1;
        if let Some(s) = out.iter_mut().find(|s| s.labels == labels) {
            s.value = s.value.max(v);
        } else if out.len() < max {
            out.push(Series { labels, value: v });
        } else {
            dropped += 1;
        }
    }
    (out, dropped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::findings::{Cause, Subject};

    const FSYNC: Cause = Cause::new("fsync", "t");
    const BACKLOG: Cause = Cause::new("net-backlog", "t");

    fn finding(pid: u32, comm: &str, score: Score) -> Finding {
        Finding::new(
            "fsync-lat",
            FSYNC,
            Subject::process(pid, comm),
            score,
            "s".into(),
        )
    }

    #[test]
    fn one_series_per_finding_in_rank_order_with_its_unit() {
        let mut wal = finding(7, "postgres", Score::NsPerS(940_000_000));
        wal.subject.container = Some("shop/db-0/postgres".into());
        wal.subject.pod = Some("db-0".into());
        wal.subject.namespace = Some("shop".into());
        wal.culprit = Some(Subject::process(9, "dd"));
        let cpu = Finding::new(
            "net-rx",
            BACKLOG,
            Subject::named("cpu", "CPU 1"),
            Score::RatePerS(1200.0),
            "s".into(),
        );
        let (s, dropped) = series(&[wal, cpu], 20, false);
        assert_eq!(dropped, 0);
        assert_eq!(
            s[0].labels,
            vec![
                ("cause", "fsync".to_string()),
                ("tool", "fsync-lat".into()),
                ("comm", "postgres".into()),
                ("container", "shop/db-0/postgres".into()),
                ("pod", "db-0".into()),
                ("namespace", "shop".into()),
                ("culprit_comm", "dd".into()),
                ("unit", "seconds_per_second".into()),
            ]
        );
        assert_eq!(s[0].value, 0.94);
        assert_eq!(
            s[1].labels,
            vec![
                ("cause", "net-backlog".to_string()),
                ("tool", "net-rx".into()),
                ("subject", "cpu CPU 1".into()),
                ("unit", "per_second".into()),
            ]
        );
        assert_eq!(s[1].value, 1200.0);
    }

    #[test]
    fn same_labels_are_one_series_and_the_cap_counts_the_rest() {
        let f: Vec<Finding> = (0..30)
            .map(|i| {
                finding(
                    100 + i,
                    &format!("w{}", i % 25),
                    Score::NsPerS(1_000 * (30 - i) as u64),
                )
            })
            .collect();
        // w0..w4 twice (the larger score kept), 25 names for 20 series: 5 left out.
        let (s, dropped) = series(&f, 20, false);
        assert_eq!(s.len(), 20);
        assert_eq!(dropped, 5);
        assert_eq!(s[0].value, 30_000.0 / 1e9);
        // With pid labels every finding is its own series.
        let (s, dropped) = series(&f, 20, true);
        assert_eq!((s.len(), dropped), (20, 10));
        assert_eq!(s[0].labels.last(), Some(&("pid", "100".to_string())));
    }
}
