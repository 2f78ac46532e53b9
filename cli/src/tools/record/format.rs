//! The `.tkr` file: NDJSON, one JSON object per line, documented in `docs/record-format.md`.
//!
//! Why NDJSON rather than a compact binary with a JSON header: a recording is small (one line
//! per row per interval; histograms are sparse, a few dozen non-empty buckets of 304), `jq`
//! reads it with no tool of ours, a run killed mid-write leaves every complete line readable
//! (the reader drops only a cut last line and says so), and a newer field is ignored by an
//! older reader instead of shifting every byte after it. The first line names the format and
//! its version; a reader refuses any version it does not know, with the version it reads.
//!
//! Lines, in order: `header`, then per interval one `interval` line, its `row` lines (every row
//! of every section of every collector, with each row's full histograms), one `node` line (the
//! `sar`-style series), and after the last interval an `end` line.

use std::{
    collections::BTreeMap,
    io::{BufRead, Read},
    path::Path,
};

use probes_common::hist::{LatHist, MAX_EXP, NBUCKETS, SUB_BITS};
use serde_json::{json, Map, Value};

use crate::error::{Error, Result};

/// The `format` value of the header.
pub const FORMAT: &str = "tracekit-record";
/// The version this tracekit writes and reads.
pub const VERSION: u64 = 1;
/// Longest line read (a row with a few histograms is a few KiB): a hostile file cannot make the
/// reader hold more.
pub const MAX_LINE: u64 = 4 << 20;
/// Most lines read (a day of 1 s intervals with a few hundred rows each is far below).
pub const MAX_LINES: usize = 20_000_000;
/// Most intervals kept (a day of 1 s intervals is 86,400); later ones are dropped and said.
pub const MAX_INTERVALS: usize = 100_000;
/// Most fields kept of one row (a real row has a few dozen); the rest are dropped and said.
pub const MAX_FIELDS_PER_ROW: usize = 256;
/// Most histograms kept of one row (a real row has one to four).
pub const MAX_DISTS_PER_ROW: usize = 32;
/// What the intervals kept of one file may cost in memory, estimated as [`INTERVAL_COST`] per
/// interval, [`ROW_COST`] per row, [`FIELD_COST`] per field or node value (plus the bytes of
/// its names) and [`DIST_COST`] per histogram: a 3.8 MB line of 75,000 empty histograms is
/// 180 MB as [`LatHist`]s, and 100,000 one-row intervals 160 MB as read. The reader keeps
/// intervals until this is spent and drops (and counts) the rest of the file, whole intervals
/// only: an interval without some of its rows would read as zero counts. A 60 s triage
/// recording costs a few MiB; this holds some 25,000 rows of 20 fields.
pub const MAX_KEPT_BYTES: usize = 64 << 20;
pub const INTERVAL_COST: usize = 400;
pub const ROW_COST: usize = 800;
pub const FIELD_COST: usize = 96;
pub const DIST_COST: usize = std::mem::size_of::<LatHist>() + 48;

/// The histogram layout recordings carry (`probes_common::hist`), so a reader can check it.
pub fn layout_json() -> Value {
    json!({"layout": "log-linear", "sub_bits": SUB_BITS, "max_exp": MAX_EXP, "buckets": NBUCKETS})
}

/// A histogram, sparsely: `{"count","sum","min","max","b":[[index,count],…]}` (non-empty
/// buckets only, indexes ascending).
pub fn dist_json(h: &LatHist) -> Value {
    let b: Vec<Value> = h
        .buckets
        .iter()
        .enumerate()
        .filter(|(_, c)| **c > 0)
        .map(|(i, c)| json!([i, c]))
        .collect();
    json!({"count": h.count, "sum": h.sum, "min": h.min().unwrap_or(0), "max": h.max, "b": b})
}

/// One recorded row.
#[derive(Clone, Debug, Default)]
pub struct Row {
    pub tool: String,
    /// The section kind (`summary`, `device`, …).
    pub kind: String,
    pub fields: Map<String, Value>,
    /// Latency distributions by metric (`fsync`, `wake`, …).
    pub dists: Vec<(String, LatHist)>,
}

/// One interval: its rows and the node's series.
#[derive(Clone, Debug, Default)]
pub struct Interval {
    pub index: u64,
    pub secs: f64,
    pub end_ns: u64,
    pub rows: Vec<Row>,
    /// `cpu_user_pct`, `ctxsw_per_s`, `psi_io_some_pct`, … (see the node line).
    pub node: BTreeMap<String, f64>,
}

/// A whole recording.
#[derive(Clone, Debug, Default)]
pub struct Recording {
    pub header: Map<String, Value>,
    /// Node settings (`sysctl:vm.swappiness` → `60`, …).
    pub facts: BTreeMap<String, String>,
    pub tools: Vec<String>,
    pub intervals: Vec<Interval>,
    /// The `end` line was read (the run ended normally).
    pub complete: bool,
    /// The last line was cut (a run killed mid-write): dropped.
    pub truncated: bool,
    /// What the reader dropped, one sentence each (a cut last interval, rows or intervals past
    /// the memory bounds): shown by `compare` in its text and JSON.
    pub notes: Vec<String>,
}

const MEMORY_BOUND: &str = "the intervals before them reached the reader's memory bound (64 MiB)";

impl Dropped {
    /// Skips every line from interval `i` on.
    fn stop(&mut self, i: u64, why: &'static str) {
        self.skipping = true;
        self.from = Some(i);
        self.why = why;
    }

    /// Keeps `cost` more bytes of interval `i` if [`MAX_KEPT_BYTES`] allows; else skips that
    /// interval (the caller drops what it kept of it) and every later one: whole intervals only.
    fn keep(&mut self, i: u64, cost: usize) -> bool {
        if self.kept_bytes + cost > MAX_KEPT_BYTES {
            self.stop(i, MEMORY_BOUND);
            self.intervals += 1;
            return false;
        }
        self.kept_bytes += cost;
        true
    }
}

/// What [`Recording::parse`] left out, counted.
#[derive(Default)]
struct Dropped {
    /// Intervals dropped, from the first of them on (`from`), and why.
    intervals: u64,
    from: Option<u64>,
    why: &'static str,
    fields: u64,
    dists: u64,
    /// Intervals kept so far cost this much (see [`MAX_KEPT_BYTES`]).
    kept_bytes: usize,
    /// The last interval's node line (which ends an interval) has not been read yet.
    open: bool,
    /// Every line from here on is skipped (a bound was reached).
    skipping: bool,
}

fn bad(path: &Path, line: usize, msg: impl std::fmt::Display) -> Error {
    Error::Usage(format!("{}: line {line}: {msg}", path.display()))
}

impl Recording {
    /// Reads and checks a recording. Every problem is one line naming the file and line; a
    /// file that is not a recording, or of another version, is refused (exit 2).
    pub fn read(path: &Path) -> Result<Recording> {
        // Never blocks (a FIFO given as a recording would hold the open forever) and only a
        // regular file: its lines are read with a cap each, so no total cap here.
        let f = crate::host::open_regular(path, u64::MAX).map_err(|e| match e {
            crate::host::HostError::NotRegular { what, .. } => Error::Usage(format!(
                "{}: {what}, not a regular file (a recording is a file written by tracekit record)",
                path.display()
            )),
            crate::host::HostError::Read { source, .. } => Error::Io {
                what: format!("reading {}", path.display()),
                source,
            },
            other => Error::Usage(other.to_string()),
        })?;
        Recording::parse(std::io::BufReader::new(f), path)
    }

    /// Parses a recording from `r` (`path` names it in messages).
    pub fn parse(mut r: impl BufRead, path: &Path) -> Result<Recording> {
        let mut rec = Recording::default();
        let mut drop = Dropped::default();
        let mut buf = Vec::new();
        let mut n = 0usize;
        loop {
            buf.clear();
            let got = (&mut r)
                .take(MAX_LINE + 1)
                .read_until(b'\n', &mut buf)
                .map_err(|source| Error::Io {
                    what: format!("reading {}", path.display()),
                    source,
                })?;
            if got == 0 {
                break;
            }
            n += 1;
            if n > MAX_LINES {
                return Err(bad(path, n, format!("more than {MAX_LINES} lines")));
            }
            let ended = buf.last() == Some(&b'\n');
            if !ended && buf.len() as u64 > MAX_LINE {
                return Err(bad(path, n, format!("line longer than {MAX_LINE} bytes")));
            }
            let v: Value = match serde_json::from_slice(&buf) {
                Ok(v) => v,
                // A cut last line (no newline) of a run killed mid-write: dropped.
                Err(_) if !ended && n > 1 => {
                    rec.truncated = true;
                    break;
                }
                Err(e) if n == 1 => {
                    return Err(bad(
                        path,
                        1,
                        format!("not a tracekit recording (the first line is not JSON: {e})"),
                    ))
                }
                Err(e) => return Err(bad(path, n, format!("not JSON: {e}"))),
            };
            if n == 1 {
                rec.header = header(&v).map_err(|m| bad(path, 1, m))?;
                // Values that are not strings are skipped (a hand-edited header).
                let text = |v: &Value| v.as_str().map(str::to_string);
                let facts = rec.header.get("facts").and_then(Value::as_object);
                rec.facts = facts
                    .into_iter()
                    .flatten()
                    .filter_map(|(k, v)| Some((k.clone(), text(v)?)))
                    .collect();
                let tools = rec.header.get("tools").and_then(Value::as_array);
                rec.tools = tools.into_iter().flatten().filter_map(text).collect();
                continue;
            }
            rec.line(&v, &mut drop).map_err(|m| bad(path, n, m))?;
        }
        if n == 0 {
            return Err(Error::Usage(format!(
                "{}: empty file, not a tracekit recording",
                path.display()
            )));
        }
        rec.dropped_notes(&drop, path);
        Ok(rec)
    }

    /// The notes of what was dropped; an interval whose node line never came (a run killed
    /// while writing it) is dropped here, as its rows may be a part of them.
    fn dropped_notes(&mut self, d: &Dropped, path: &Path) {
        let p = path.display();
        if d.open && !d.skipping {
            if let Some(last) = self.intervals.pop() {
                self.notes.push(format!(
                    "{p}: interval {} was cut before its end (a run killed mid-write): dropped",
                    last.index
                ));
            }
        } else if self.truncated {
            self.notes.push(format!(
                "{p}: the last line was cut (a run killed mid-write): dropped"
            ));
        }
        if let Some(from) = d.from {
            self.notes.push(format!(
                "{p}: {} interval(s) from interval {from} on dropped: {}",
                d.intervals, d.why
            ));
        }
        if d.fields > 0 {
            self.notes.push(format!(
                "{p}: {} field(s) of rows with more than {MAX_FIELDS_PER_ROW} dropped",
                d.fields
            ));
        }
        if d.dists > 0 {
            self.notes.push(format!(
                "{p}: {} histogram(s) of rows with more than {MAX_DISTS_PER_ROW} dropped",
                d.dists
            ));
        }
    }

    fn line(&mut self, v: &Value, drop: &mut Dropped) -> std::result::Result<(), String> {
        let o = v.as_object().ok_or("not a JSON object")?;
        let kind = o.get("type").and_then(Value::as_str).unwrap_or("");
        let idx = || {
            o.get("i")
                .and_then(Value::as_u64)
                .ok_or("no interval index \"i\"")
        };
        match kind {
            "interval" => {
                let index = idx()?;
                if self.intervals.last().is_some_and(|l| l.index >= index) {
                    return Err(format!("interval {index} out of order"));
                }
                let secs = o.get("secs").and_then(Value::as_f64).unwrap_or(0.0);
                if !(secs.is_finite() && secs > 0.0 && secs < 1e9) {
                    return Err(format!("interval {index}: bad length {secs}"));
                }
                drop.open = true;
                if !drop.skipping && self.intervals.len() >= MAX_INTERVALS {
                    drop.stop(index, "more than the reader keeps (100,000)");
                }
                let cost = INTERVAL_COST;
                if !drop.skipping && drop.kept_bytes + cost > MAX_KEPT_BYTES {
                    drop.stop(index, MEMORY_BOUND);
                }
                if drop.skipping {
                    drop.intervals += 1;
                    return Ok(());
                }
                drop.kept_bytes += cost;
                self.intervals.push(Interval {
                    index,
                    secs,
                    end_ns: o.get("end_ns").and_then(Value::as_u64).unwrap_or(0),
                    ..Default::default()
                });
            }
            "row" if drop.skipping => {}
            "row" => {
                let cur = self.current(idx()?)?;
                let tool = o
                    .get("tool")
                    .and_then(Value::as_str)
                    .ok_or("row without tool")?;
                let sec = o
                    .get("kind")
                    .and_then(Value::as_str)
                    .ok_or("row without kind")?;
                let all = o
                    .get("row")
                    .and_then(Value::as_object)
                    .ok_or("row without \"row\" object")?;
                let d = match o.get("dists") {
                    Some(d) => Some(d.as_object().ok_or("\"dists\" is not an object")?),
                    None => None,
                };
                // Only scalars are kept: what `compare` reads (names, numbers, flags); an array
                // or object in a row (`comm_bytes`) could nest a whole line.
                let scalar = all.iter().filter(|(_, v)| !(v.is_array() || v.is_object()));
                let nd = d.map_or(0, Map::len);
                let kd = nd.min(MAX_DISTS_PER_ROW);
                let (mut fields, mut cost) = (Map::new(), ROW_COST);
                for (k, v) in scalar {
                    if fields.len() == MAX_FIELDS_PER_ROW {
                        drop.fields += 1;
                        continue;
                    }
                    cost += FIELD_COST + k.len() + v.as_str().map_or(0, str::len);
                    fields.insert(k.clone(), v.clone());
                }
                let names = d.into_iter().flatten().take(kd);
                cost += names.map(|(k, _)| DIST_COST + k.len()).sum::<usize>();
                if !drop.keep(cur.index, cost) {
                    self.intervals.pop();
                    return Ok(());
                }
                drop.dists += (nd - kd) as u64;
                let mut dists = Vec::with_capacity(kd);
                for (name, h) in d.into_iter().flatten().take(kd) {
                    dists.push((
                        name.clone(),
                        parse_dist(h).map_err(|e| format!("{name}: {e}"))?,
                    ));
                }
                cur.rows.push(Row {
                    tool: tool.to_string(),
                    kind: sec.to_string(),
                    fields,
                    dists,
                });
            }
            "node" if drop.skipping => drop.open = false,
            "node" => {
                let cur = self.current(idx()?)?;
                drop.open = false;
                let cost: usize = o.keys().map(|k| FIELD_COST + k.len()).sum();
                if !drop.keep(cur.index, cost) {
                    self.intervals.pop();
                    return Ok(());
                }
                for (k, x) in o {
                    if let Some(f) = x.as_f64().filter(|f| f.is_finite()) {
                        if k != "i" {
                            cur.node.insert(k.clone(), f);
                        }
                    }
                }
            }
            "end" => self.complete = true,
            // Lines of types this version does not know are skipped (a later minor addition).
            _ => {}
        }
        Ok(())
    }

    fn current(&mut self, i: u64) -> std::result::Result<&mut Interval, String> {
        match self.intervals.last_mut() {
            Some(l) if l.index == i => Ok(l),
            _ => Err(format!("line for interval {i} outside that interval")),
        }
    }
}

/// Checks the header line: format and version.
fn header(v: &Value) -> std::result::Result<Map<String, Value>, String> {
    let o = v
        .as_object()
        .filter(|o| o.get("format").and_then(Value::as_str) == Some(FORMAT))
        .ok_or("not a tracekit recording (the first line has no \"format\":\"tracekit-record\")")?;
    match o.get("version").and_then(Value::as_u64) {
        Some(VERSION) => Ok(o.clone()),
        Some(v) if v > VERSION => Err(format!(
            "recording format version {v} is newer than this tracekit reads (version {VERSION}): compare it with a newer tracekit"
        )),
        Some(v) => Err(format!(
            "recording format version {v} is older than this tracekit reads (version {VERSION}): record again"
        )),
        None => Err("the header has no integer \"version\"".into()),
    }
}

/// A sparse histogram back into a [`LatHist`], checked: indexes in range, counts adding up.
fn parse_dist(v: &Value) -> std::result::Result<LatHist, String> {
    let num = |k: &str| {
        v.get(k)
            .and_then(Value::as_u64)
            .ok_or(format!("no integer {k:?}"))
    };
    let mut h = LatHist {
        count: num("count")?,
        sum: num("sum")?,
        max: num("max")?,
        ..LatHist::ZERO
    };
    let min = num("min")?;
    if h.count > 0 {
        h.min_plus1 = min.checked_add(1).ok_or("min out of range")?;
        if min > h.max {
            return Err("min above max".into());
        }
    }
    let b = v
        .get("b")
        .and_then(Value::as_array)
        .ok_or("no bucket list \"b\"")?;
    // The writer lists each non-empty bucket once, ascending: a longer list is not a histogram.
    if b.len() > NBUCKETS {
        return Err(format!(
            "{} buckets listed, more than the {NBUCKETS} there are",
            b.len()
        ));
    }
    let mut total = 0u64;
    for pair in b {
        let (i, c) = match pair.as_array().map(Vec::as_slice) {
            Some([i, c]) => (i.as_u64(), c.as_u64()),
            _ => (None, None),
        };
        let (Some(i), Some(c)) = (i, c) else {
            return Err("a bucket is not [index, count]".into());
        };
        let i = usize::try_from(i)
            .ok()
            .filter(|i| *i < NBUCKETS)
            .ok_or(format!("bucket index {i} out of range (0..{NBUCKETS})"))?;
        h.buckets[i] = h.buckets[i]
            .checked_add(c)
            .ok_or("bucket count overflows")?;
        total = total.checked_add(c).ok_or("bucket counts overflow")?;
    }
    if total != h.count {
        return Err(format!(
            "buckets hold {total} values, count says {}",
            h.count
        ));
    }
    Ok(h)
}

#[cfg(test)]
#[path = "format_tests.rs"]
mod tests;
