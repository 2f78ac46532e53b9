//! The reader on good, old, new, cut and hostile recordings.

use std::path::Path;

use super::*;

const HEADER: &str = r#"{"format":"tracekit-record","version":1,"type":"header","tools":["fsync-lat"],"facts":{"sysctl:vm.swappiness":"60"}}"#;

fn parse(text: &str) -> Result<Recording> {
    Recording::parse(text.as_bytes(), Path::new("x.tkr"))
}

fn err(text: &str) -> String {
    crate::error::one_line(&parse(text).unwrap_err())
}

fn good() -> String {
    let mut h = LatHist::ZERO;
    for v in [1_000, 2_000, 2_100, 900_000] {
        h.record(v);
    }
    let row = json!({"type":"row","i":0,"tool":"fsync-lat","kind":"summary","row":{"pid":5,"comm":"pg","count":4},"dists":{"fsync":dist_json(&h)}});
    format!(
        "{HEADER}\n{}\n{row}\n{}\n{}\n",
        json!({"type":"interval","i":0,"secs":1.0,"end_ns":5}),
        json!({"type":"node","i":0,"cpu_user_pct":12.5,"ctxsw_per_s":100}),
        json!({"type":"end","intervals":1})
    )
}

#[test]
fn reads_what_record_writes() {
    let r = parse(&good()).unwrap();
    assert!(r.complete && !r.truncated);
    assert_eq!(r.tools, ["fsync-lat"]);
    assert_eq!(r.facts["sysctl:vm.swappiness"], "60");
    let iv = &r.intervals[0];
    assert_eq!(iv.rows[0].fields["comm"], "pg");
    let (name, h) = &iv.rows[0].dists[0];
    assert_eq!(name, "fsync");
    assert_eq!(
        (h.count, h.sum, h.max, h.min()),
        (4, 905_100, 900_000, Some(1_000))
    );
    let mut want = LatHist::ZERO;
    for v in [1_000, 2_000, 2_100, 900_000] {
        want.record(v);
    }
    assert_eq!(*h, want, "buckets survive the sparse encoding");
    assert_eq!(iv.node["cpu_user_pct"], 12.5);
    assert!(!iv.node.contains_key("i"));
}

#[test]
fn versions_are_read_or_refused_clearly() {
    let newer = good().replacen("\"version\":1", "\"version\":2", 1);
    let e = err(&newer);
    assert!(
        e.contains(
            "line 1: recording format version 2 is newer than this tracekit reads (version 1)"
        ),
        "{e}"
    );
    let older = good().replacen("\"version\":1", "\"version\":0", 1);
    assert!(
        err(&older).contains("version 0 is older"),
        "{}",
        err(&older)
    );
    let none = good().replacen("\"version\":1,", "", 1);
    assert!(err(&none).contains("no integer \"version\""));
    assert!(err("{\"a\":1}\n").contains("not a tracekit recording"));
    assert!(err("\u{7f}ELF\u{2}\u{1}\n").contains("not a tracekit recording"));
    assert!(err("").contains("empty file"));
    let e = parse("x").unwrap_err();
    assert_eq!(e.exit(), crate::error::Exit::Usage);
}

#[test]
fn a_cut_last_line_is_dropped_and_said() {
    let g = good();
    // Cut inside the end line: every interval is whole, the cut line is dropped and said.
    let r = parse(&g[..g.len() - 5]).unwrap();
    assert!(r.truncated && !r.complete);
    assert_eq!(r.intervals.len(), 1);
    assert!(r.notes[0].contains("last line was cut"), "{:?}", r.notes);
    // Cut inside the node line, which ends an interval: that interval is dropped and said
    // (its rows may be a part of them).
    let r = parse(&g[..g.rfind("\"ctxsw").unwrap()]).unwrap();
    assert!(r.truncated && !r.complete);
    assert_eq!(r.intervals.len(), 0);
    assert!(r.notes[0].contains("interval 0 was cut"), "{:?}", r.notes);
    // A broken line in the middle is an error, with its number.
    let bad = g.replacen("\"type\":\"node\"", "\"type\":node", 1);
    assert!(
        err(&bad).starts_with("x.tkr: line 4: not JSON"),
        "{}",
        err(&bad)
    );
}

#[test]
fn hostile_histograms_and_structure_are_refused() {
    let g = good();
    for (from, to, says) in [
        ("[[", "[[99999,1],[", "out of range"),
        (
            "\"count\":4,\"max\"",
            "\"count\":5,\"max\"",
            "buckets hold 4 values",
        ),
        (
            "\"count\":4,\"max\"",
            "\"count\":18446744073709551616,\"max\"",
            "no integer \"count\"",
        ),
        (
            "\"i\":0,\"kind\"",
            "\"i\":7,\"kind\"",
            "outside that interval",
        ),
        ("\"secs\":1.0", "\"secs\":-1", "bad length"),
        ("\"row\":{", "\"row\":[{", "not JSON"),
    ] {
        let t = g.replacen(from, to, 1);
        assert_ne!(t, g, "{from}");
        let e = err(&t);
        assert!(e.contains(says), "{from} → {e}");
        assert!(!e.contains('\n'));
    }
    let huge = format!(
        "{HEADER}\n{{\"type\":\"interval\",\"i\":0,\"secs\":1}}\n{{\"type\":\"row\",\"i\":0,\"tool\":\"t\",\"kind\":\"k\",\"row\":{{}},\"dists\":{{\"x\":{{\"count\":18446744073709551615,\"sum\":0,\"min\":0,\"max\":0,\"b\":[[0,18446744073709551615],[1,1]]}}}}}}\n"
    );
    assert!(err(&huge).contains("overflow"), "{}", err(&huge));
    let deep = format!("{HEADER}\n{}{}\n", "[".repeat(100_000), "]".repeat(100_000));
    assert!(err(&deep).contains("line 2"), "{}", err(&deep));
}

/// Random bytes, random cuts and random single-byte damage of a good file: a clean error or a
/// recording, never a panic.
#[test]
fn fuzzed_files_never_panic() {
    let g = good();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..3000 {
        let mut b: Vec<u8> = match round % 3 {
            0 => (0..next() % 600).map(|_| next() as u8).collect(),
            1 => g.as_bytes()[..(next() as usize % g.len())].to_vec(),
            _ => {
                let mut b = g.as_bytes().to_vec();
                for _ in 0..1 + next() % 4 {
                    let i = next() as usize % b.len();
                    b[i] = next() as u8;
                }
                b
            }
        };
        if round % 7 == 0 {
            b.splice(0..0, HEADER.bytes().chain([b'\n']));
        }
        match Recording::parse(b.as_slice(), Path::new("f.tkr")) {
            Ok(_) => {}
            Err(e) => {
                let line = crate::error::one_line(&e);
                assert!(line.starts_with("f.tkr"), "{line}");
                assert!(!line.contains('\n'), "{line}");
            }
        }
    }
}
