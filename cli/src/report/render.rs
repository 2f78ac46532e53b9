//! Rendering shared by every tool: aligned text tables, bpftrace-style bar histograms, NDJSON.
//! Tools build a [`Report`]; they never format output themselves.

use std::fmt::Write as _;

use probes_common::hist::{bucket_low, log2_floor, LatHist};
use serde_json::Value;

/// What one collection window produced.
#[derive(Debug, Default)]
pub struct Report {
    /// First line: what was traced, for how long, and what was missed.
    pub title: String,
    /// Further header lines (skipped hooks, notes).
    pub notes: Vec<String>,
    pub tables: Vec<Table>,
    /// `--hist`: (label, histogram) pairs.
    pub hists: Vec<(String, LatHist)>,
    /// Lines after the tables (legends, verdicts).
    pub footnotes: Vec<String>,
    /// NDJSON lines for `--json`.
    pub json: Vec<Value>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

#[derive(Debug, Default)]
pub struct Table {
    pub caption: Option<String>,
    pub columns: Vec<(String, Align)>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(columns: &[(&str, Align)]) -> Table {
        Table {
            caption: None,
            columns: columns.iter().map(|(n, a)| (n.to_string(), *a)).collect(),
            rows: Vec::new(),
        }
    }

    pub fn push(&mut self, row: Vec<String>) {
        debug_assert_eq!(row.len(), self.columns.len());
        self.rows.push(row);
    }

    /// Columns padded to their widest cell (counted in characters), two spaces apart; the last
    /// left-aligned column is not padded, so long paths do not widen every line.
    pub fn render(&self) -> String {
        let n = self.columns.len();
        let mut widths: Vec<usize> = self
            .columns
            .iter()
            .map(|(h, _)| h.chars().count())
            .collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(n) {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        let mut out = String::new();
        if let Some(c) = &self.caption {
            out.push_str(c);
            out.push('\n');
        }
        let line = |cells: &mut dyn Iterator<Item = &str>, out: &mut String| {
            let mut s = String::new();
            for (i, cell) in cells.enumerate().take(n) {
                if i > 0 {
                    s.push_str("  ");
                }
                let pad = widths[i].saturating_sub(cell.chars().count());
                match self.columns[i].1 {
                    Align::Right => {
                        s.extend(std::iter::repeat_n(' ', pad));
                        s.push_str(cell);
                    }
                    Align::Left => {
                        s.push_str(cell);
                        if i + 1 < n {
                            s.extend(std::iter::repeat_n(' ', pad));
                        }
                    }
                }
            }
            out.push_str(s.trim_end());
            out.push('\n');
        };
        line(&mut self.columns.iter().map(|(h, _)| h.as_str()), &mut out);
        for row in &self.rows {
            line(&mut row.iter().map(|c| c.as_str()), &mut out);
        }
        out
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

/// Text rendering of a report.
pub fn text(report: &Report, with_hist: bool) -> String {
    let mut out = String::new();
    if !report.title.is_empty() {
        out.push_str(&report.title);
        out.push('\n');
    }
    for n in &report.notes {
        out.push_str(n);
        out.push('\n');
    }
    // A table without rows would be a bare header: the notes say what was not seen instead.
    for t in report.tables.iter().filter(|t| !t.rows.is_empty()) {
        out.push('\n');
        out.push_str(&t.render());
    }
    if with_hist {
        for (label, h) in &report.hists {
            let _ = write!(out, "\n@{label} (ns):\n{}", bars(h));
        }
    }
    if !report.footnotes.is_empty() {
        out.push('\n');
        for f in &report.footnotes {
            out.push_str(f);
            out.push('\n');
        }
    }
    out
}

/// NDJSON rendering: one compact object per line.
pub fn json(report: &Report) -> String {
    let mut out = String::new();
    for v in &report.json {
        out.push_str(&v.to_string());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::path::Path;

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

    fn sample() -> Report {
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
        Report {
            title: "fsync-lat: traced fsync for 10.00s; 1203 calls, 0 missed".into(),
            notes: vec!["skipped: none".into()],
            tables: vec![t],
            hists: vec![("fsync[42 postgres]".into(), h)],
            footnotes: vec!["! CV > 1: skewed, trust p50 over the mean".into()],
            json: vec![
                json!({"tool": "fsync-lat", "pid": 42, "comm": "postgres\u{1b}", "p99_ns": 1830000}),
            ],
        }
    }

    #[test]
    fn text_report_matches_golden() {
        golden("report.txt", &text(&sample(), true));
    }

    #[test]
    fn json_report_matches_golden() {
        let j = json(&sample());
        golden("report.ndjson", &j);
        for line in j.lines() {
            let v: Value = serde_json::from_str(line).unwrap();
            assert_eq!(v["comm"], "postgres\u{1b}");
        }
    }

    #[test]
    fn empty_tables_are_not_printed() {
        let r = Report {
            title: "t".into(),
            notes: vec!["no sync-family calls seen".into()],
            tables: vec![Table::new(&[("PID", Align::Right), ("COMM", Align::Left)])],
            ..Default::default()
        };
        assert_eq!(text(&r, false), "t\nno sync-family calls seen\n");
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
