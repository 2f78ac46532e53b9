use super::{schema::sizes_text, *};

#[test]
fn sizes_show_the_commonest() {
    let mut s = [0u64; NSIZES];
    s[13] = 10;
    assert_eq!(sizes_text(&s), "4K");
    s[18] = 30;
    assert_eq!(sizes_text(&s), "128K 75%,4K 25%");
    assert_eq!(sizes_text(&[0; NSIZES]), "-");
    s[0] = 1;
    assert!(sizes_text(&s).starts_with("128K"));
}

#[test]
fn a_disk_added_in_the_window_counts_from_zero() {
    let text = "   7       0 loop0 5 0 40 1 0 0 0 0 0 1 1 0 0 0 0 0 0\n";
    let added = "   7     407 loop407 100 0 800 9 0 0 0 0 0 10 9 0 0 0 0 0 0\n";
    let before = disks::parse_diskstats(text);
    let now = disks::parse_diskstats(&format!("{text}{added}"));
    let empty = BTreeMap::new();
    let depth = Default::default();
    let input = |before| Input {
        agg: &[],
        other: &IoVal::ZERO,
        devs: &[],
        depth: &depth,
        disk_before: before,
        disk_now: &now,
        only: None,
        secs: 1.0,
    };
    let d = window_delta(&input(&before), (7, 407)).unwrap();
    assert_eq!((d.reads, d.writes, d.discards), (100, 0, Some(0)));
    assert_eq!(window_delta(&input(&before), (7, 0)).unwrap().reads, 0);
    // No first snapshot at all: nothing was measured.
    assert!(window_delta(&input(&empty), (7, 407)).is_none());
    assert!(window_delta(&input(&before), (7, 1)).is_none());
}

#[test]
fn latency_keys_carry_their_prefix() {
    let mut h = LatHist::ZERO;
    h.record(1000);
    let v = serde_json::to_value(Keyed::of("queue_", &h, LAT_STATS)).unwrap();
    assert_eq!(v["queue_p50_ns"], 1000);
    assert_eq!(v["queue_total_ns"], 1000);
    let v = serde_json::to_value(Keyed::of("", &h, LAT_STATS)).unwrap();
    assert_eq!(v["max_ns"], 1000);
}
