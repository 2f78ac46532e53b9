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
//! Metrics, as each tool declares its rows ([`schema::Rows`]): each row histogram
//! (`Section.dists`) gives a latency metric (p50 and p99, lower is better); each number
//! declared a count a counter metric per second, each level one as it is, with the direction
//! the declaration gives. Statistics (percentiles, means, rates) are not additive across merged
//! processes and come from the histograms instead; ids are neither measures nor identity. A
//! number no declaration names is not compared. The node series are node metrics, declared in
//! [`record::NODE_SERIES`](crate::tools::record::NODE_SERIES).

use std::collections::{BTreeMap, BTreeSet, HashSet};

use probes_common::hist::LatHist;
use serde_json::Value;

use crate::tools::record::format::{Recording, Row};

/// Text fields that describe a subject but are not its identity across runs (a title changes
/// with what a process does; a file's state with the run). Numbers are identity only where
/// their declaration says so ([`Role::Id`]); arrays (the `_bytes` fields) never are.
const IDS: &[&str] = &["cmdline", "exec_from", "file_state"];

/// Characters of a title kept in a subject's name.
const TITLE_CHARS: usize = 40;

pub use crate::report::schema::Direction;
use crate::report::schema::{NodeSeries, Role, Rows};

/// How `compare` judges a recorded node series: as `record` declares it.
fn node_direction(key: &str) -> Direction {
    crate::tools::record::NODE_SERIES
        .iter()
        .find(|n| n.matches(key))
        .map_or(Direction::Neutral, |n: &NodeSeries| n.direction)
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
    /// Which way is better, as declared.
    pub direction: Direction,
    /// `ns` for latencies and fields in nanoseconds.
    pub unit: &'static str,
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
    let rows = crate::tools::rows_of(&r.tool, &r.kind);
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
            Value::Number(n)
                if rows
                    .and_then(|d| d.field(k))
                    .is_some_and(|f| f.role == Role::Id) =>
            {
                parts.push(format!("{k}={n}"))
            }
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

/// The compared metric a row field is, as its declaration says: its name (`count/s`,
/// `time_ppm`), direction and unit; `None` for statistics, ids and undeclared numbers.
fn counter_name(
    rows: Option<&Rows>,
    k: &str,
    v: &Value,
) -> Option<(String, Direction, &'static str)> {
    let n = v.as_f64()?;
    if !n.is_finite() {
        return None;
    }
    let f = rows?.field(k)?;
    let unit = if k.ends_with("_ns") { "ns" } else { "" };
    Some((f.compared_as()?, f.direction, unit))
}

/// One subject's rows of one interval, merged: counters summed (with each one's direction and
/// unit), histograms by metric.
type Merged = (
    BTreeMap<String, (f64, Direction, &'static str)>,
    BTreeMap<String, LatHist>,
);

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
            let rows = crate::tools::rows_of(&r.tool, &r.kind);
            for (k, v) in &r.fields {
                if let Some((name, direction, unit)) = counter_name(rows, k, v) {
                    let add = v.as_f64().unwrap_or(0.0);
                    let per_s = if name.ends_with("/s") {
                        add / iv.secs
                    } else {
                        add
                    };
                    let cur = e.0.entry(name).or_insert((0.0, direction, unit));
                    cur.0 += per_s;
                }
            }
            for (name, h) in &r.dists {
                e.1.entry(name.clone()).or_insert(LatHist::ZERO).merge(h);
            }
        }
        for (subject, (counters, hists)) in merged {
            for (name, (v, direction, unit)) in counters {
                let key = (subject.clone(), name);
                let Some(side) = side(&mut out, &mut dropped, cap, key, Kind::Counter) else {
                    continue;
                };
                (side.direction, side.unit) = (direction, unit);
                // Counters are 0 in the intervals where the subject did not appear.
                side.samples.resize(i, 0.0);
                side.samples.push(v);
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
                    (side.direction, side.unit) = (Direction::LowerIsBetter, "ns");
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
                side.direction = node_direction(k);
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

    /// Issue #32: a tool whose compared measures all lack a direction can only ever be
    /// "changed" in compare, and a regression in it never "worse" (nor exit 7). Every tool
    /// `record` runs by default must declare one that has.
    #[test]
    fn every_recorded_tool_declares_a_measure_with_a_direction() {
        for t in crate::tools::TOOLS.iter().filter(|t| t.triage && !t.hidden) {
            assert!(
                t.rows.iter().any(|r| r.judged()),
                "{}: record runs it, but none of its rows declares a distribution or a compared \
                 count or level with a direction, so compare can never call it worse",
                t.name
            );
        }
    }

    /// Directions come from the declarations: a key name means nothing by itself (ctxsw's
    /// `migrations` held "ratio" and was never compared; `wakee_pid` and `cgroup_id` were
    /// compared as counters per second).
    #[test]
    fn directions_and_roles_are_the_declarations() {
        let a = rec(vec![vec![
            Row {
                kind: "drop".into(),
                ..row(
                    "net-rx",
                    json!({"reason": "NO_SOCKET", "count": 4, "port": 5140, "rate_per_s": 2.0}),
                )
            },
            row(
                "ctxsw",
                json!({"pid": 1, "comm": "pp", "migrations": 6, "involuntary": 2, "voluntary_per_s": 3.0}),
            ),
            row(
                "memstall",
                json!({"pid": 1, "comm": "pp", "kind": "compaction", "cgroup_id": 77, "time_ppm": 10}),
            ),
            row(
                "fsync-lat",
                json!({"pid": 1, "comm": "pp", "undeclared": 5}),
            ),
        ]]);
        let (s, _) = series(&a, &ambiguous(&[&a]));
        let get = |subject: &str, metric: &str| {
            s.get(&(subject.to_string(), metric.to_string()))
                .map(|(_, side)| side.direction)
        };
        let drop = "[net-rx drop reason=NO_SOCKET]";
        assert_eq!(
            get(drop, "count/s"),
            Some(Direction::LowerIsBetter),
            "{s:#?}"
        );
        assert_eq!(get(drop, "port/s"), None);
        assert_eq!(get(drop, "rate_per_s/s"), None);
        assert_eq!(
            get("pp [ctxsw summary]", "migrations/s"),
            Some(Direction::Neutral)
        );
        assert_eq!(
            get("pp [ctxsw summary]", "involuntary/s"),
            Some(Direction::LowerIsBetter)
        );
        let m = "pp [memstall summary kind=compaction]";
        assert_eq!(get(m, "time_ppm"), Some(Direction::LowerIsBetter));
        assert_eq!(get(m, "cgroup_id/s"), None);
        assert!(!s.keys().any(|(_, m)| m.starts_with("undeclared")));
        assert_eq!(node_direction("cpu_idle_pct"), Direction::HigherIsBetter);
        assert_eq!(node_direction("psi_io_some_pct"), Direction::LowerIsBetter);
        assert_eq!(node_direction("cpu_user_pct"), Direction::Neutral);
    }
}
