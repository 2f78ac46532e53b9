//! `compare --html`: one self-contained page (no script, no network, no external font or
//! style) with the settings that changed, the ranked table, and for the top changes the
//! histograms of both runs overlaid and the per-interval series side by side.
//!
//! The plots are SVG written here rather than with `plotters`: they are two simple shapes
//! (steps and polylines over a few axes), and `plotters` lays out text with a font backend
//! (`ttf` needs fontconfig and system fonts, `ab_glyph` a font file embedded in the binary) to
//! draw what an SVG `<text>` element lets the browser draw. Every name from the recordings is
//! escaped, and the page is well-formed XML as well as HTML.

use std::fmt::Write as _;

use probes_common::hist::{bucket_low, NBUCKETS};

use super::{model::Kind, Args, Change};
use crate::report::sanitize;

/// Changes drawn.
const DRAWN: usize = 6;
const W: f64 = 460.0;
const H: f64 = 200.0;
const PAD: f64 = 40.0;
const BEFORE: &str = "#1f77b4";
const AFTER: &str = "#d62728";

/// XML/HTML text escaping of a name from a recording, shown as the text report shows it
/// ([`sanitize::text`]: control characters, DEL, C1 and bidi overrides as `\xNN`, which XML 1.0
/// would refuse or a viewer would act on).
pub fn esc(s: &str) -> String {
    let safe = sanitize::text(s.as_bytes());
    let mut o = String::with_capacity(safe.len());
    for c in safe.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

fn svg_open(s: &mut String, title: &str) {
    let _ = write!(
        s,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}"><rect x="0" y="0" width="{W}" height="{H}" fill="#ffffff" stroke="#cccccc"/><text x="{PAD}" y="14" font-size="12" font-family="sans-serif">{}</text>"##,
        esc(title)
    );
}

fn axes(s: &mut String, x_lo: &str, x_hi: &str, y_hi: &str) {
    let (x0, y0, x1, y1) = (PAD, H - PAD / 2.0 - 8.0, W - 10.0, 24.0);
    let _ = write!(
        s,
        r##"<line x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}" stroke="#333333"/><line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}" stroke="#333333"/><text x="{x0}" y="{}" font-size="10" font-family="sans-serif">{}</text><text x="{x1}" y="{}" font-size="10" font-family="sans-serif" text-anchor="end">{}</text><text x="{}" y="{}" font-size="10" font-family="sans-serif" text-anchor="end">{}</text>"##,
        y0 + 12.0,
        esc(x_lo),
        y0 + 12.0,
        esc(x_hi),
        x0 - 2.0,
        y1 + 8.0,
        esc(y_hi)
    );
}

fn legend(s: &mut String) {
    let _ = write!(
        s,
        r#"<rect x="{}" y="6" width="10" height="10" fill="{BEFORE}"/><text x="{}" y="15" font-size="10" font-family="sans-serif">before</text><rect x="{}" y="6" width="10" height="10" fill="{AFTER}"/><text x="{}" y="15" font-size="10" font-family="sans-serif">after</text>"#,
        W - 110.0,
        W - 96.0,
        W - 55.0,
        W - 41.0
    );
}

/// Both runs' histograms as step lines over the non-empty bucket range, each normalised to its
/// share of events.
pub fn hist_svg(c: &Change) -> Option<String> {
    let (hb, ha) = (c.sides.0.hist.as_ref()?, c.sides.1.hist.as_ref()?);
    let nz = |i: usize| hb.buckets[i] > 0 || ha.buckets[i] > 0;
    let lo = (0..NBUCKETS).find(|i| nz(*i))?;
    let hi = (0..NBUCKETS).rev().find(|i| nz(*i))?;
    let share =
        |h: &probes_common::hist::LatHist, i: usize| h.buckets[i] as f64 / h.count.max(1) as f64;
    let top = (lo..=hi)
        .map(|i| share(hb, i).max(share(ha, i)))
        .fold(0.0, f64::max)
        .max(1e-9);
    let mut s = String::new();
    svg_open(
        &mut s,
        &format!(
            "{} distribution",
            c.metric
                .trim_start_matches("p50 ")
                .trim_start_matches("p99 ")
        ),
    );
    legend(&mut s);
    let span = (hi - lo + 1) as f64;
    let (x0, y0, x1, y1) = (PAD, H - PAD / 2.0 - 8.0, W - 10.0, 24.0);
    for (h, colour) in [(hb, BEFORE), (ha, AFTER)] {
        let mut pts = String::new();
        for i in lo..=hi {
            let xa = x0 + (i - lo) as f64 / span * (x1 - x0);
            let xb = x0 + (i - lo + 1) as f64 / span * (x1 - x0);
            let y = y0 - share(h, i) / top * (y0 - y1);
            let _ = write!(pts, "{xa:.1},{y:.1} {xb:.1},{y:.1} ");
        }
        let _ = write!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="1.5"/>"#,
            pts.trim_end()
        );
    }
    axes(
        &mut s,
        &crate::report::render::fmt_ns(bucket_low(lo)),
        &crate::report::render::fmt_ns(bucket_low(hi + 1).max(bucket_low(hi))),
        &format!("{:.0} %", top * 100.0),
    );
    s.push_str("</svg>");
    Some(s)
}

/// Both runs' per-interval samples as polylines (interval index on x).
pub fn series_svg(c: &Change) -> String {
    let (b, a) = (&c.sides.0.samples, &c.sides.1.samples);
    let n = b.len().max(a.len()).max(2);
    let top = b.iter().chain(a).copied().fold(0.0, f64::max).max(1e-9);
    let mut s = String::new();
    svg_open(&mut s, &format!("{} per interval", c.metric));
    legend(&mut s);
    let (x0, y0, x1, y1) = (PAD, H - PAD / 2.0 - 8.0, W - 10.0, 24.0);
    for (v, colour) in [(b, BEFORE), (a, AFTER)] {
        let pts: Vec<String> = v
            .iter()
            .enumerate()
            .map(|(i, y)| {
                format!(
                    "{:.1},{:.1}",
                    x0 + i as f64 / (n - 1) as f64 * (x1 - x0),
                    y0 - y / top * (y0 - y1)
                )
            })
            .collect();
        let _ = write!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="1.5"/>"#,
            pts.join(" ")
        );
    }
    axes(&mut s, "interval 1", &format!("interval {n}"), &c.fmt(top));
    s.push_str("</svg>");
    s
}

/// The whole page.
pub fn page(args: &Args, cmp: &super::Comparison) -> String {
    let (b, a) = (&cmp.before, &cmp.after);
    let (facts, ch) = (&cmp.facts, &cmp.changes);
    let mut s = String::from(
        "<!DOCTYPE html>\n<html xmlns=\"http://www.w3.org/1999/xhtml\" lang=\"en\"><head><meta charset=\"utf-8\"/><title>tracekit compare</title><style>body{font-family:sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right;white-space:nowrap}td.l{white-space:normal}td.l,th.l{text-align:left}.worse{color:#b00000;font-weight:bold}.better{color:#006000;font-weight:bold}figure{display:inline-block;margin:6px}</style></head><body>",
    );
    let _ = write!(
        s,
        "<h1>tracekit compare</h1><p>{} → {}</p>",
        esc(&super::describe(&args.before, b)),
        esc(&super::describe(&args.after, a))
    );
    for n in &cmp.notes {
        let _ = write!(s, "<p>Note: {}.</p>", esc(n));
    }
    s.push_str("<h2>Node settings that changed</h2>");
    if facts.is_empty() {
        s.push_str("<p>No difference.</p>");
    } else {
        s.push_str("<table><tr><th class=\"l\">setting</th><th class=\"l\">before</th><th class=\"l\">after</th></tr>");
        for (k, x, y) in facts {
            let _ = write!(
                s,
                "<tr><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td></tr>",
                esc(k),
                esc(x),
                esc(y)
            );
        }
        s.push_str("</table>");
    }
    let _ = write!(
        s,
        "<h2>Changes</h2><p>Ranked {}; two-sided Mann–Whitney U over the per-interval samples, p &lt; {}.</p><table><tr><th>#</th><th class=\"l\">metric</th><th class=\"l\">subject</th><th>before median</th><th>p99</th><th>mean</th><th>CV</th><th>after median</th><th>p99</th><th>mean</th><th>CV</th><th>change</th><th>p</th><th class=\"l\">verdict</th></tr>",
        esc(super::RANKING),
        super::ALPHA
    );
    for (i, c) in ch
        .iter()
        .take(crate::report::rows::shown(args.top, ch.len()))
        .enumerate()
    {
        let class = match c.verdict {
            "worse" => " worse",
            "better" => " better",
            _ => "",
        };
        let _ = write!(
            s,
            "<tr><td>{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.2}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.2}</td><td>{}</td><td>{}</td><td class=\"l{class}\">{}</td></tr>",
            i + 1,
            esc(&c.metric),
            esc(&c.subject),
            esc(&c.fmt(c.before.median)),
            esc(&c.fmt(c.before.p99)),
            esc(&c.fmt(c.before.mean)),
            c.before.cv,
            esc(&c.fmt(c.after.median)),
            esc(&c.fmt(c.after.p99)),
            esc(&c.fmt(c.after.mean)),
            c.after.cv,
            c.change_pct.map(|p| format!("{p:+.1} %")).unwrap_or_else(|| "-".into()),
            esc(&c.p.map(super::fmt_p).unwrap_or_else(|| "-".into())),
            esc(c.verdict)
        );
    }
    s.push_str("</table><h2>Top changes</h2>");
    for c in ch.iter().take(DRAWN) {
        let _ = write!(s, "<h3>{}</h3>", esc(&c.sentence()));
        if matches!(c.kind, Kind::Latency(_)) {
            if let Some(svg) = hist_svg(c) {
                let _ = write!(s, "<figure>{svg}</figure>");
            }
        }
        let _ = write!(s, "<figure>{}</figure>", series_svg(c));
    }
    s.push_str("</body></html>\n");
    s
}
