//! From two recordings to comparable series: subjects matched across runs, and per subject and
//! metric one sample per interval.
//!
//! Matching. Process ids differ between runs, so a process is its `comm` (rows of several pids
//! with one comm are merged per interval: counters summed, histograms merged), with its title
//! (`cmdline`) added only where one comm covers processes with different titles in the same
//! interval (postgres's walwriter vs its backends). A row's other text fields (syscall, device,
//! container, reason, …) and its `cpu`/`node` numbers are part of its identity; ids (`pid`,
//! `tid`, `fd`, inode) are not.
//!
//! Metrics. Each row histogram (`Section.dists`) gives a latency metric; each additive number
//! of a row (counts, totals, shares in ppm) a counter metric, per second unless it is a level
//! (`_ppm`, `_kib`, `_pages`). Percentiles, means and ratios in rows are not additive across
//! merged processes and come from the histograms instead. The node series are node metrics.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use probes_common::hist::LatHist;
use serde_json::{Map, Value};

use crate::tools::record::format::{Recording, Row};

/// Row fields never part of a subject's identity, nor metrics.
const IDS: &[&str] = &[
    "pid",
    "tid",
    "tgid",
    "ppid",
    "fd",
    "inode",
    "inode_generation",
    "comm_bytes",
    "cmdline",
    "cmdline_bytes",
    "exec_from",
    "file_bytes",
    "file_state",
];

/// Numeric fields that identify a subject (a CPU, a NUMA node, a device number).
const NUMERIC_IDS: &[&str] = &["cpu", "node", "major", "minor"];

/// Characters of a title kept in a subject's name.
const TITLE_CHARS: usize = 40;

/// Which way is better for a metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    LowerIsBetter,
    HigherIsBetter,
    Neutral,
}

/// Lower is better for latency and for anything counting lost time, drops or errors.
pub fn direction(metric: &str) -> Direction {
    const LOWER: &[&str] = &[
        "latency",
        "drop",
        "err",
        "miss",
        "stall",
        "fail",
        "oom",
        "steal",
        "iowait",
        "psi_",
        "wait",
        "total_ns",
        "time_ppm",
        "preempt",
        "involuntary",
        "reclaim",
        "compact",
        "lost",
        "squeeze",
        "procs_running",
        "queue",
        "remote",
    ];
    if metric == "cpu_idle_pct" {
        Direction::HigherIsBetter
    } else if LOWER.iter().any(|w| metric.contains(w)) {
        Direction::LowerIsBetter
    } else {
        Direction::Neutral
    }
}

/// What a metric's samples are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A latency statistic (`p50` or `p99`) of a histogram, in ns.
    Latency(&'static str),
    /// A row counter per second, or a level.
    Counter,
    /// A node series value.
    Node,
}

/// One metric of one subject in one recording.
#[derive(Clone, Debug, Default)]
pub struct Side {
    /// One sample per interval.
    pub samples: Vec<f64>,
    /// Latency metrics: the whole run's histogram (boxed: 2.4 KiB that counter and node
    /// series do not carry).
    pub hist: Option<Box<LatHist>>,
}

/// (subject, metric) → a side, for one recording.
pub type Series = BTreeMap<(String, String), (Kind, Side)>;

/// Most series kept of one recording (a triage run has a few hundred); the first ones seen are
/// kept, the rest dropped and counted.
pub const MAX_SERIES: usize = 10_000;
/// Most samples all series of one recording hold together (8 bytes each): a counter series has
/// one per interval (zero where its subject did not appear), so a file of many intervals and
/// many one-off subjects would otherwise ask for intervals × subjects of them.
pub const MAX_POINTS: usize = 4_000_000;

/// Dropped series counted one by one up to this many ("at least" past it).
pub const MAX_DROPPED_COUNTED: usize = 1_000_000;
/// Longest subject or metric name kept whole (a row's names come from the recording: a
/// megabyte of them, cloned for each of its metrics, would be a hostile file's multiplier).
pub const MAX_NAME: usize = 240;

fn hash_of(k: &impl std::hash::Hash) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault};
    BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(k)
}

/// `s`, or its first [`MAX_NAME`] bytes, `…` and a hash of the whole (two long names that
/// share a start stay two subjects; both recordings cut them the same way, so they still match).
pub fn bounded(s: String) -> String {
    if s.len() <= MAX_NAME {
        return s;
    }
    let mut cut = MAX_NAME;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}…#{:016x}", &s[..cut], hash_of(&s))
}

/// How many series of a recording of `intervals` intervals are kept.
pub fn series_cap(intervals: usize) -> usize {
    MAX_SERIES.min(MAX_POINTS / intervals.max(1)).max(1)
}

/// A row's identity without its title, and its title.
fn identity(r: &Row) -> (String, Option<String>) {
    let mut parts: Vec<String> = Vec::new();
    let mut comm = None;
    for (k, v) in &r.fields {
        if IDS.contains(&k.as_str()) {
            continue;
        }
        match v {
            Value::String(s) if k == "comm" => comm = Some(s.clone()),
            Value::String(s) => parts.push(format!("{k}={s}")),
            Value::Bool(b) => parts.push(format!("{k}={b}")),
            Value::Number(n) if NUMERIC_IDS.contains(&k.as_str()) => parts.push(format!("{k}={n}")),
            _ => {}
        }
    }
    let mut what = format!("{} {}", r.tool, r.kind);
    for p in parts {
        what.push(' ');
        what.push_str(&p);
    }
    let key = match comm {
        Some(who) => format!("{who} [{what}]"),
        None => format!("[{what}]"),
    };
    let title = r
        .fields
        .get("cmdline")
        .and_then(Value::as_str)
        .map(str::to_string);
    (key, title)
}

/// Subjects whose comm covers processes with different titles within one interval, in either
/// recording: those are told apart by title.
pub fn ambiguous(recs: &[&Recording]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for rec in recs {
        for iv in &rec.intervals {
            let mut seen: BTreeMap<String, Option<String>> = BTreeMap::new();
            for r in &iv.rows {
                let (key, title) = identity(r);
                match seen.get(&key) {
                    Some(t) if *t != title => {
                        out.insert(key);
                    }
                    Some(_) => {}
                    None => {
                        seen.insert(key, title);
                    }
                }
            }
        }
    }
    out
}

/// Whether a row field is an additive metric, and its metric name (`count/s`, `time_ppm`).
fn counter_name(k: &str, v: &Value) -> Option<String> {
    let n = v.as_f64()?;
    if !n.is_finite() || IDS.contains(&k) || NUMERIC_IDS.contains(&k) {
        return None;
    }
    let non_additive = (k.ends_with("_ns") && k != "total_ns")
        || k.ends_with("_pct")
        || k.contains("cv")
        || k.contains("mean")
        || k.contains("avg")
        || k.contains("ratio")
        || k.starts_with("max")
        || k.starts_with("min")
        || k == "rate_per_s"
        || k.ends_with("_per_s");
    if non_additive {
        return None;
    }
    let level = k.ends_with("_ppm") || k.ends_with("_kib") || k.ends_with("_pages");
    Some(if level {
        k.to_string()
    } else {
        format!("{k}/s")
    })
}

/// One subject's rows of one interval, merged: counters summed, histograms by metric.
type Merged = (Map<String, Value>, BTreeMap<String, LatHist>);

/// Every (subject, metric) series of one recording, at most [`series_cap`] of them, and how
/// many more there were (dropped). `split`: subjects told apart by title.
pub fn series(rec: &Recording, split: &BTreeSet<String>) -> (Series, usize) {
    let mut out: Series = BTreeMap::new();
    let n = rec.intervals.len();
    let cap = series_cap(n);
    let mut dropped: HashSet<u64> = HashSet::new();
    // The side of (subject, metric), created while fewer than `cap` exist.
    fn side<'a>(
        out: &'a mut Series,
        dropped: &mut HashSet<u64>,
        cap: usize,
        (subject, metric): (String, String),
        kind: Kind,
    ) -> Option<&'a mut Side> {
        let key = (bounded(subject), bounded(metric));
        if !out.contains_key(&key) {
            if out.len() >= cap {
                // Counted once per series by a hash of its name (bounded too).
                if dropped.len() < MAX_DROPPED_COUNTED {
                    dropped.insert(hash_of(&key));
                }
                return None;
            }
            out.insert(key.clone(), (kind, Side::default()));
        }
        out.get_mut(&key).map(|e| &mut e.1)
    }
    for (i, iv) in rec.intervals.iter().enumerate() {
        // This interval's merged rows: subject → (counters, histograms).
        let mut merged: BTreeMap<String, Merged> = BTreeMap::new();
        for r in &iv.rows {
            let (mut key, title) = identity(r);
            if split.contains(&key) {
                // Titles are cut as a text table cuts them (matching uses the same cut).
                let t = title.unwrap_or_default();
                let cut: String = t.chars().take(TITLE_CHARS).collect();
                let more = if cut.len() < t.len() { "…" } else { "" };
                key = format!("{key} ({cut}{more})");
            }
            let e = merged.entry(key).or_default();
            for (k, v) in &r.fields {
                if let Some(name) = counter_name(k, v) {
                    let add = v.as_f64().unwrap_or(0.0);
                    let per_s = if name.ends_with("/s") {
                        add / iv.secs
                    } else {
                        add
                    };
                    let cur = e.0.get(&name).and_then(Value::as_f64).unwrap_or(0.0);
                    e.0.insert(name, (cur + per_s).into());
                }
            }
            for (name, h) in &r.dists {
                e.1.entry(name.clone()).or_insert(LatHist::ZERO).merge(h);
            }
        }
        for (subject, (counters, hists)) in merged {
            for (name, v) in counters {
                let key = (subject.clone(), name);
                let Some(side) = side(&mut out, &mut dropped, cap, key, Kind::Counter) else {
                    continue;
                };
                // Counters are 0 in the intervals where the subject did not appear.
                side.samples.resize(i, 0.0);
                side.samples.push(v.as_f64().unwrap_or(0.0));
            }
            for (name, h) in hists {
                if h.count == 0 {
                    continue;
                }
                let st = crate::report::hist::stats(&h);
                for (stat, value) in [("p50", st.p50_ns), ("p99", st.p99_ns)] {
                    let key = (subject.clone(), format!("{stat} {name} latency"));
                    let kind = Kind::Latency(stat);
                    let Some(side) = side(&mut out, &mut dropped, cap, key, kind) else {
                        continue;
                    };
                    side.samples.push(value as f64);
                    side.hist
                        .get_or_insert_with(|| Box::new(LatHist::ZERO))
                        .merge(&h);
                }
            }
        }
        for (k, v) in &iv.node {
            let key = ("node".to_string(), k.clone());
            if let Some(side) = side(&mut out, &mut dropped, cap, key, Kind::Node) {
                side.samples.push(*v);
            }
        }
    }
    for ((_, _), (kind, side)) in out.iter_mut() {
        if *kind == Kind::Counter {
            side.samples.resize(n, 0.0);
        }
    }
    (out, dropped.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn row(tool: &str, fields: Value) -> Row {
        Row {
            tool: tool.into(),
            kind: "summary".into(),
            fields: fields.as_object().unwrap().clone(),
            dists: Vec::new(),
        }
    }

    fn rec(intervals: Vec<Vec<Row>>) -> Recording {
        Recording {
            intervals: intervals
                .into_iter()
                .enumerate()
                .map(|(i, rows)| crate::tools::record::format::Interval {
                    index: i as u64,
                    secs: 2.0,
                    rows,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn processes_match_by_comm_and_merge() {
        let a = rec(vec![
            vec![
                row(
                    "fsync-lat",
                    json!({"pid": 10, "comm": "pg", "syscall": "fsync", "count": 4, "p99_ns": 9}),
                ),
                row(
                    "fsync-lat",
                    json!({"pid": 11, "comm": "pg", "syscall": "fsync", "count": 6, "p99_ns": 7}),
                ),
                row(
                    "fsync-lat",
                    json!({"pid": 12, "comm": "pg", "syscall": "fdatasync", "count": 2}),
                ),
            ],
            vec![],
            vec![row(
                "io-lat",
                json!({"device": "vda", "major": 253, "count": 8}),
            )],
        ]);
        let s = series(&a, &ambiguous(&[&a])).0;
        let fs = &s[&(
            "pg [fsync-lat summary syscall=fsync]".to_string(),
            "count/s".to_string(),
        )]
            .1;
        // 10 calls in a 2 s interval, none in the others (zero-filled).
        assert_eq!(fs.samples, [5.0, 0.0, 0.0]);
        assert!(s.contains_key(&(
            "pg [fsync-lat summary syscall=fdatasync]".into(),
            "count/s".into()
        )));
        assert!(
            !s.keys().any(|(_, m)| m.contains("p99_ns")),
            "percentiles are not summed"
        );
        assert!(s.contains_key(&(
            "[io-lat summary device=vda major=253]".into(),
            "count/s".into()
        )));
    }

    #[test]
    fn titles_split_a_comm_only_when_needed() {
        let b = rec(vec![vec![
            row(
                "fsync-lat",
                json!({"pid": 1, "comm": "postgres", "cmdline": "postgres: walwriter", "count": 2}),
            ),
            row(
                "fsync-lat",
                json!({"pid": 2, "comm": "postgres", "cmdline": "postgres: checkpointer", "count": 4}),
            ),
            row(
                "fsync-lat",
                json!({"pid": 3, "comm": "nginx", "cmdline": "nginx: worker", "count": 4}),
            ),
        ]]);
        let split = ambiguous(&[&b]);
        assert_eq!(split.len(), 1);
        let s = series(&b, &split).0;
        let keys: Vec<&String> = s.keys().map(|(k, _)| k).collect();
        assert!(
            keys.iter().any(|k| k.ends_with("(postgres: walwriter)")),
            "{keys:?}"
        );
        assert!(
            keys.iter()
                .any(|k| k.starts_with("nginx [") && !k.contains("worker")),
            "{keys:?}"
        );
    }

    #[test]
    fn directions() {
        assert_eq!(direction("p99 fsync latency"), Direction::LowerIsBetter);
        assert_eq!(direction("drops/s"), Direction::LowerIsBetter);
        assert_eq!(direction("cpu_idle_pct"), Direction::HigherIsBetter);
        assert_eq!(direction("count/s"), Direction::Neutral);
    }
}
