//! Where a request's time starts: by default at its first bio's submission (the wait for a
//! tag included, shown apart as `before_*`), with `--from request` where the block layer first
//! holds it, as biolatency -Q starts. Both staged on a loop device with 4 tags and 8 readers,
//! against fio's own completion latency.

use tracekit_tests::*;

use super::{fio_test, fixtures::*};

/// io-lat (`extra` added) around eight fio threads reading at random, one synchronous 4 KiB
/// read each, from a loop device whose queue holds 4 requests (`nr_requests`, scheduler
/// `none`): half of them wait for a tag inside `submit_bio`, before the block layer holds them
/// as requests.
fn tag_waits(name: &str, extra: &[&str]) -> (LoopDev, Run) {
    let lo = LoopDev::new(name);
    lo.set("nr_requests", "4");
    let run = traced(&lo, extra, || {
        fio(
            &lo.dev,
            &[
                "--rw=randread",
                "--bs=4k",
                "--ioengine=psync",
                "--thread",
                "--numjobs=8",
                "--group_reporting",
                "--io_size=4M",
                "--randseed=5",
            ],
        )
    });
    (lo, run)
}

/// #33: a request's time starts at its first bio's submission, so it holds the wait for a tag
/// that io-lat timed from the issue used to miss (fio's clat p50 155 µs against io-lat's
/// 102 µs in the field report). Eight fio threads read at random, one synchronous read each,
/// from a loop device whose queue holds 4 requests (`nr_requests`, scheduler `none`): half of
/// them wait for a tag inside `submit_bio`. fio's clat is the whole `pread`; at p99, where the
/// tag waits are, io-lat's whole request must match it as the percentiles test bounds a p99
/// (within 10 %, or below by at most a quarter), while its device time alone falls short of
/// that, and the part before the issue is shown apart.
#[test]
fn total_starts_at_the_bio_submission() {
    let _serial = fio_test();
    let (lo, run) = tag_waits("iolat-submit", &[]);
    let r = rows(&run.lines, &lo.name);
    let row = r
        .iter()
        .find(|x| x["op"] == "read" && x["comm"] == "fio")
        .unwrap_or_else(|| panic!("no fio read row: {r:?}"));
    let n = |k: &str| row[k].as_u64().unwrap_or_else(|| panic!("{k} in {row}"));
    let clat = |q: &str| {
        run.job["read"]["clat_ns"]["percentile"][q]
            .as_u64()
            .unwrap_or_else(|| panic!("fio read clat {q}: {}", run.job["read"]))
    };
    eprintln!(
        "io-lat: {} requests, {} timed from submission; before p50 {} p99 {}; device p50 {} p99 {}; total p50 {} p99 {}; fio clat p50 {} p99 {}",
        n("count"),
        n("submitted"),
        n("before_p50_ns"),
        n("before_p99_ns"),
        n("device_p50_ns"),
        n("device_p99_ns"),
        n("p50_ns"),
        n("p99_ns"),
        clat("50.000000"),
        clat("99.000000"),
    );
    // fio starts after the programs attached: every request was seen submitted. (A read that
    // finds another still waiting for the driver next to it merges into that request: fio's
    // 8192 reads were 8024-8192 requests; the exact counts are the counting tests'.)
    // A stamp lost to the table's eviction (another test's merged writes leave stamps nothing
    // takes) is said as `bio_stamp_evicted`; any other shortfall fails.
    let kinds = last_stats(&run.lines)["anomaly_kinds"].clone();
    let evicted: u64 = run
        .lines
        .iter()
        .filter(|l| l["type"] == "stats")
        .filter_map(|l| l["anomaly_kinds"]["bio_stamp_evicted"].as_u64())
        .sum();
    assert!(
        n("submitted") <= n("count") && n("submitted") + evicted >= n("count"),
        "{row}; anomalies {kinds}"
    );
    let ios = run.job["read"]["total_ios"].as_u64().unwrap();
    assert!(
        n("count") <= ios && n("count") * 10 >= ios * 9,
        "fio did {ios} reads: {row}"
    );
    // The tag waits are milliseconds in the tail (4 tags, 8 readers): at p99 the whole
    // request must be fio's clat as the percentiles test bounds it (within 10 %, or below by
    // at most a quarter: fio's own wakeup after the completion), and the device time alone
    // must fall short of that bound, the shortfall io-lat had.
    let want = clat("99.000000");
    let (total, device) = (n("p99_ns"), n("device_p99_ns"));
    let matches =
        |got: u64| got.abs_diff(want) * 10 <= want || (got <= want && got * 4 >= want * 3);
    assert!(
        matches(total),
        "total p99 {total} ns against fio's clat p99 {want} ns: {row}"
    );
    assert!(
        device * 4 < want * 3,
        "the staged tag wait did not happen: device p99 {device} ns, fio clat p99 {want} ns"
    );
    assert!(
        n("before_p99_ns") * 4 >= want,
        "the wait before the issue is not shown apart: {row}"
    );
}

/// `--from request` times each request from where the block layer first holds it, as
/// `biolatency -Q` does: on the loop device of [`total_starts_at_the_bio_submission`] (4 tags,
/// 8 readers) the tag waits are then outside every request's time, so its p99 falls well short
/// of fio's clat p99, and nothing is shown for the time before. No bio program is loaded, and
/// the meta line says so.
#[test]
fn from_request_leaves_the_wait_for_a_tag_out() {
    let _serial = fio_test();
    let (lo, run) = tag_waits("iolat-fromrq", &["--from", "request"]);
    let meta = run.lines.iter().find(|l| l["type"] == "meta").unwrap();
    assert_eq!(meta["from"], "request", "{meta}");
    let programs: Vec<&str> = meta["programs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert!(programs.contains(&"tk_io_issue"), "{programs:?}");
    assert!(
        programs.iter().all(|p| !p.starts_with("tk_io_bio")),
        "a bio program loaded under --from request: {programs:?}"
    );
    assert!(
        meta["left_out"].to_string().contains("block_bio_queue"),
        "{meta}"
    );
    let r = rows(&run.lines, &lo.name);
    let row = r
        .iter()
        .find(|x| x["op"] == "read" && x["comm"] == "fio")
        .unwrap_or_else(|| panic!("no fio read row: {r:?}"));
    let n = |k: &str| row[k].as_u64().unwrap_or_else(|| panic!("{k} in {row}"));
    let want = run.job["read"]["clat_ns"]["percentile"]["99.000000"]
        .as_u64()
        .unwrap_or_else(|| panic!("fio read clat: {}", run.job["read"]));
    eprintln!(
        "io-lat --from request: {} requests; device p99 {}; total p99 {}; fio clat p99 {want}",
        n("count"),
        n("device_p99_ns"),
        n("p99_ns"),
    );
    let ios = run.job["read"]["total_ios"].as_u64().unwrap();
    assert!(
        n("count") <= ios && n("count") * 10 >= ios * 9,
        "fio did {ios} reads: {row}"
    );
    assert_eq!(n("submitted"), 0, "{row}");
    for k in ["before_p50_ns", "before_p99_ns", "before_max_ns"] {
        assert!(row[k].is_null(), "{k} not measured, yet given: {row}");
    }
    // The same staging gives a total p99 within 10 % of fio's from the submission (the test
    // above); from the request, the milliseconds waiting for a tag are left out.
    assert!(
        n("p99_ns") * 4 < want * 3,
        "total p99 {} ns holds the tag wait (fio clat p99 {want} ns): {row}",
        n("p99_ns")
    );
}
