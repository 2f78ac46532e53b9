//! Rendering shared by every tool: aligned text tables, bpftrace-style bar histograms, findings,
//! NDJSON. Tools build an [`Output`]; they never format output themselves.

use std::fmt::Write as _;

use probes_common::{
    hist::{bucket_low, log2_floor, LatHist},
    stats::{NAMES, NSTATS},
};
use serde_json::{Map, Value};

use super::{findings::Finding, rows::Section};

/// What one collection window of one tool produced.
#[derive(Debug, Default)]
pub struct Output {
    /// First line: what was traced, for how long, and what was missed.
    pub title: String,
    /// Further header lines (what was missed, skipped hooks).
    pub notes: Vec<String>,
    /// Typed rows: text tables and NDJSON lines.
    pub sections: Vec<Section>,
    /// Verdicts: who, what, how much, the evidence, the fix, the next command.
    pub findings: Vec<Finding>,
    /// Lines after the tables (legends).
    pub footnotes: Vec<String>,
    /// JSON lines of other types (`system`, `vmstat`), each with its own `"type"`.
    pub extra_json: Vec<Value>,
    /// The `"type":"stats"` line: the kernel's counters of what could not be recorded (named as
    /// in `probes_common::stats`), plus tool-specific keys (`missed`, `count`, …).
    pub stats: Option<Stats>,
    /// Facts `triage` links findings of different collectors by (never printed).
    pub links: Vec<super::links::Link>,
}

impl Output {
    /// The header note for what the programs could not record (in-flight map or ring buffer
    /// full, keys over `--max-keys`), when anything was: `unit` names what is counted
    /// (`call`, `request`), `aside` follows the ring-buffer count. Returns the missed count
    /// (in-flight map full + ring buffer full) the title line carries.
    pub fn note_missed(&mut self, st: &[u64; NSTATS as usize], unit: &str, aside: &str) -> u64 {
        use probes_common::stats::{KEY_MAP_FULL, RINGBUF_FULL, START_MAP_FULL};
        let (start, ring, over_cap) = (
            st[START_MAP_FULL as usize],
            st[RINGBUF_FULL as usize],
            st[KEY_MAP_FULL as usize],
        );
        if start + ring > 0 || over_cap > 0 {
            self.notes.push(format!(
                "missed: in-flight map full {start}, ring buffer full {ring}{aside}; {over_cap} {unit}(s) over the --max-keys cap are counted in the [other] row"
            ));
        }
        start + ring
    }

    /// A header note per optional hook that was not attached, and why (each once).
    pub fn note_skipped(&mut self, skipped: &[(&'static str, String)]) {
        for (n, r) in skipped {
            let line = format!("skipped {n}: {r}");
            if !self.notes.contains(&line) {
                self.notes.push(line);
            }
        }
    }
}

/// What the programs could not record in a window, and other per-window run facts.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub counters: [u64; NSTATS as usize],
    pub extra: Map<String, Value>,
}

impl Stats {
    pub fn new(counters: [u64; NSTATS as usize]) -> Stats {
        Stats {
            counters,
            extra: Map::new(),
        }
    }

    pub fn with(mut self, key: &str, v: impl Into<Value>) -> Stats {
        self.extra.insert(key.to_string(), v.into());
        self
    }
}

/// A duration in nanoseconds with a unit and three significant digits: `850ns`, `12.3us`,
/// `4.56ms`, `1.23s`; zero is `0`.
pub fn fmt_ns(ns: u64) -> String {
    let (v, unit) = if ns == 0 {
        return "0".to_string();
    } else if ns < 1_000 {
        return format!("{ns}ns");
    } else if ns < 1_000_000 {
        (ns as f64 / 1e3, "us")
    } else if ns < 1_000_000_000 {
        (ns as f64 / 1e6, "ms")
    } else {
        (ns as f64 / 1e9, "s")
    };
    if v >= 100.0 {
        format!("{v:.0}{unit}")
    } else if v >= 10.0 {
        format!("{v:.1}{unit}")
    } else {
        format!("{v:.2}{unit}")
    }
}

/// A byte count for a person: `512B`, `12.5KiB`, `880.0MiB` (units of 1024).
pub fn fmt_bytes(b: u64) -> String {
    match b {
        0..10_240 => format!("{b}B"),
        10_240..10_485_760 => format!("{:.1}KiB", b as f64 / 1024.0),
        _ => format!("{:.1}MiB", b as f64 / 1048576.0),
    }
}

/// Power-of-two bucket bound in bpftrace's notation: `512`, `16K`, `4M`, `2G` (units of 1024).
fn bound_label(n: u64) -> String {
    match n {
        0..1024 => n.to_string(),
        1024..0x10_0000 => format!("{}K", n >> 10),
        0x10_0000..0x4000_0000 => format!("{}M", n >> 20),
        _ => format!("{}G", n >> 30),
    }
}

/// bpftrace-style bars. The fine kernel buckets are folded into powers of two for display only;
/// percentiles are always computed from the fine buckets.
pub fn bars(h: &LatHist) -> String {
    let mut pow2 = [0u64; 64];
    for (i, &c) in h.buckets.iter().enumerate() {
        if c == 0 {
            continue;
        }
        let low = bucket_low(i);
        let slot = if low == 0 {
            0
        } else {
            log2_floor(low) as usize + 1
        };
        pow2[slot] += c;
    }
    let Some(first) = pow2.iter().position(|&c| c > 0) else {
        return String::new();
    };
    let last = pow2.iter().rposition(|&c| c > 0).unwrap_or(first);
    let peak = *pow2.iter().max().unwrap_or(&1);
    const WIDTH: u64 = 52;
    let rows: Vec<(String, u64)> = (first..=last)
        .map(|slot| {
            let label = if slot == 0 {
                "[0, 1)".to_string()
            } else {
                let lo = 1u64 << (slot - 1);
                format!(
                    "[{}, {})",
                    bound_label(lo),
                    bound_label(lo.saturating_mul(2))
                )
            };
            (label, pow2[slot])
        })
        .collect();
    let lw = rows.iter().map(|(l, _)| l.len()).max().unwrap_or(0);
    let cw = rows
        .iter()
        .map(|(_, c)| c.to_string().len())
        .max()
        .unwrap_or(1);
    let mut out = String::new();
    for (label, c) in rows {
        let n = (c * WIDTH).div_ceil(peak.max(1)) as usize;
        let n = if c == 0 { 0 } else { n.max(1) };
        let _ = writeln!(
            out,
            "{label:<lw$} {c:>cw$} |{}{}|",
            "@".repeat(n),
            " ".repeat(WIDTH as usize - n)
        );
    }
    out
}

/// Text rendering of one tool's window.
pub fn text(out: &Output, with_hist: bool) -> String {
    let mut s = String::new();
    if !out.title.is_empty() {
        s.push_str(&out.title);
        s.push('\n');
    }
    for n in &out.notes {
        s.push_str(n);
        s.push('\n');
    }
    let mut hidden = Vec::new();
    // A table without rows would be a bare header: the notes say what was not seen instead.
    for sec in out.sections.iter().filter(|x| !x.table.rows.is_empty()) {
        s.push('\n');
        s.push_str(&sec.table.render());
        if sec.hidden > 0 {
            hidden.push(format!(
                "{} more {} row(s) not shown (--rows 0 shows all; JSON has every row)",
                sec.hidden, sec.kind
            ));
        }
    }
    if with_hist {
        // The rows shown in the tables, each distribution of theirs as `@name[row]`.
        for sec in &out.sections {
            for (i, label) in sec.labels.iter().enumerate() {
                for (name, h) in sec.dists_of(i).iter().filter(|(_, h)| h.count > 0) {
                    let _ = write!(s, "\n@{name}[{label}] (ns):\n{}", bars(h));
                }
            }
        }
    }
    if !out.findings.is_empty() {
        s.push_str("\nFindings:\n");
        for (i, f) in out.findings.iter().enumerate() {
            s.push_str(&f.text(&format!("{}. ", i + 1)));
            s.push('\n');
        }
    }
    if !out.footnotes.is_empty() || !hidden.is_empty() {
        s.push('\n');
        for f in hidden.iter().chain(&out.footnotes) {
            s.push_str(f);
            s.push('\n');
        }
    }
    s
}

/// Sets `key` in a JSON object unless the tool set it already.
fn put_default(v: &mut Value, key: &str, x: &Value) {
    if let Value::Object(m) = v {
        m.entry(key.to_string()).or_insert_with(|| x.clone());
    }
}

/// Every NDJSON line of one tool's window, with the keys every line carries (`tool`, `type`,
/// and the window's `common` keys such as `interval_ns`) added in this one place; `run` keys
/// (why the window ended, tracekit's own memory) go on the `stats` line.
pub fn json_lines(
    out: &Output,
    tool: &str,
    common: &Map<String, Value>,
    run: &Map<String, Value>,
) -> Vec<Value> {
    let mut lines = Vec::new();
    let mut add = |mut v: Value, kind: &str| {
        put_default(&mut v, "tool", &Value::from(tool));
        put_default(&mut v, "type", &Value::from(kind));
        for (k, x) in common {
            put_default(&mut v, k, x);
        }
        lines.push(v);
    };
    for sec in &out.sections {
        for row in &sec.json {
            add(row.clone(), sec.kind);
        }
    }
    for v in &out.extra_json {
        add(v.clone(), "extra");
    }
    for f in &out.findings {
        add(f.json(), "finding");
    }
    if let Some(st) = &out.stats {
        let mut m = Map::new();
        for (name, value) in NAMES.iter().zip(st.counters.iter()) {
            if !name.starts_with("reserved") {
                m.insert(name.to_string(), (*value).into());
            }
        }
        for (k, x) in run.iter().chain(&st.extra) {
            m.insert(k.clone(), x.clone());
        }
        add(Value::Object(m), "stats");
    }
    lines
}

/// NDJSON text of [`json_lines`].
pub fn json(
    out: &Output,
    tool: &str,
    common: &Map<String, Value>,
    run: &Map<String, Value>,
) -> String {
    let mut s = String::new();
    for v in json_lines(out, tool, common, run) {
        s.push_str(&v.to_string());
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::table::{Align, Table};

    const PLAIN: crate::report::schema::Rows = crate::report::schema::Rows::plain("summary");
    use serde_json::json;
    use std::path::Path;

    #[test]
    fn missed_and_skipped_notes() {
        let mut out = Output::default();
        let mut st = [0u64; NSTATS as usize];
        assert_eq!(out.note_missed(&st, "call", ""), 0);
        assert!(out.notes.is_empty(), "nothing missed, no note");
        st[probes_common::stats::START_MAP_FULL as usize] = 2;
        st[probes_common::stats::RINGBUF_FULL as usize] = 3;
        st[probes_common::stats::KEY_MAP_FULL as usize] = 4;
        assert_eq!(out.note_missed(&st, "event", " (names may be missing)"), 5);
        assert_eq!(
            out.notes,
            ["missed: in-flight map full 2, ring buffer full 3 (names may be missing); 4 event(s) over the --max-keys cap are counted in the [other] row"]
        );
        out.notes.clear();
        let skipped = [
            ("sched:a", "EPERM".to_string()),
            ("sched:a", "EPERM".to_string()),
        ];
        out.note_skipped(&skipped);
        assert_eq!(out.notes, ["skipped sched:a: EPERM"]);
    }

    fn golden(name: &str, actual: &str) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/golden")
            .join(name);
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::write(&path, actual).unwrap();
        }
        let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (run with UPDATE_GOLDEN=1 to create)",
                path.display()
            )
        });
        assert_eq!(actual, want, "golden file {} differs", path.display());
    }

    fn sample() -> Output {
        let mut t = Table::new(&[
            ("PID", Align::Right),
            ("COMM", Align::Left),
            ("COUNT", Align::Right),
            ("P99", Align::Right),
            ("FILE", Align::Left),
        ]);
        t.push(vec![
            "42".into(),
            "postgres".into(),
            "1200".into(),
            fmt_ns(1_830_000),
            "/var/lib/pg/wal/000001".into(),
        ]);
        t.push(vec![
            "7".into(),
            "a\\x1b[2J".into(),
            "3".into(),
            fmt_ns(950),
            "-".into(),
        ]);
        let mut h = LatHist::ZERO;
        for v in [900, 1_500, 1_600, 3_000, 3_100, 3_200, 70_000] {
            h.record(v);
        }
        Output {
            title: "fsync-lat: traced fsync for 10.00s; 1203 calls, 0 missed".into(),
            notes: vec!["skipped: none".into()],
            sections: vec![Section {
                kind: "summary",
                schema: &PLAIN,
                table: t,
                json: vec![json!({"pid": 42, "comm": "postgres\u{1b}", "p99_ns": 1830000})],
                hidden: 0,
                dists: vec![vec![("fsync", h)]],
                labels: vec!["42 postgres".into()],
            }],
            footnotes: vec!["! CV > 1: skewed, trust p50 over the mean".into()],
            ..Default::default()
        }
    }

    #[test]
    fn text_report_matches_golden() {
        golden("report.txt", &text(&sample(), true));
    }

    #[test]
    fn json_report_matches_golden() {
        let j = json(&sample(), "fsync-lat", &Map::new(), &Map::new());
        golden("report.ndjson", &j);
        for line in j.lines() {
            let v: Value = serde_json::from_str(line).unwrap();
            assert_eq!(v["comm"], "postgres\u{1b}");
        }
    }

    #[test]
    fn empty_tables_are_not_printed() {
        let r = Output {
            title: "t".into(),
            notes: vec!["no sync-family calls seen".into()],
            sections: vec![Section {
                kind: "summary",
                schema: &PLAIN,
                table: Table::new(&[("PID", Align::Right), ("COMM", Align::Left)]),
                json: vec![],
                hidden: 0,
                dists: Vec::new(),
                labels: Vec::new(),
            }],
            ..Default::default()
        };
        assert_eq!(text(&r, false), "t\nno sync-family calls seen\n");
    }

    #[test]
    fn every_line_carries_tool_type_and_window_keys() {
        let mut o = sample();
        o.stats = Some(Stats::new([1, 2, 3, 4, 5, 0, 0, 0, 0, 0]).with("missed", 3u64));
        o.extra_json.push(json!({"type": "system", "switches": 5}));
        let mut common = Map::new();
        common.insert("interval_ns".into(), 10u64.into());
        let mut run = Map::new();
        run.insert("stop".into(), "duration elapsed".into());
        let lines = json_lines(&o, "t", &common, &run);
        assert_eq!(lines.len(), 3);
        for l in &lines {
            assert_eq!(l["tool"], "t");
            assert_eq!(l["interval_ns"], 10);
        }
        assert_eq!(lines[0]["type"], "summary");
        assert_eq!(lines[1]["type"], "system");
        assert_eq!(lines[2]["type"], "stats");
        assert_eq!(lines[2]["events"], 1);
        assert_eq!(lines[2]["missed"], 3);
        assert_eq!(lines[2]["stop"], "duration elapsed");
        assert!(lines[2].get("reserved5").is_none());
    }

    #[test]
    fn durations_carry_units() {
        assert_eq!(fmt_ns(0), "0");
        assert_eq!(fmt_ns(999), "999ns");
        assert_eq!(fmt_ns(1_000), "1.00us");
        assert_eq!(fmt_ns(12_345), "12.3us");
        assert_eq!(fmt_ns(4_560_000), "4.56ms");
        assert_eq!(fmt_ns(123_400_000), "123ms");
        assert_eq!(fmt_ns(1_230_000_000), "1.23s");
    }

    #[test]
    fn bars_fold_into_powers_of_two() {
        let mut h = LatHist::ZERO;
        h.record(0);
        h.record(1_500);
        h.record(1_900);
        let b = bars(&h);
        let lines: Vec<&str> = b.lines().collect();
        assert!(lines[0].starts_with("[0, 1)"), "{b}");
        assert!(lines.last().unwrap().starts_with("[1K, 2K)   2 |"), "{b}");
        assert!(bars(&LatHist::ZERO).is_empty());
    }
}
