//! Issue #33: `tracekit compare` of a real scheduler change, recorded as a user records one
//! (`tracekit record` with every collector it runs by default, so kernel threads, softirqs and
//! the node's own processes are in both recordings beside the workload).
//!
//! The change: fio's random reads and writes on a loop device of our own, first under `none`,
//! then under kyber with a 1 µs read target. Kyber finds the reads over their target in every
//! window and throttles the domains that meet theirs (the writes, 10 ms target) down to a depth
//! of one or two, so writes wait in the scheduler behind it while the reads keep going: fio's own
//! write completion latency rises severalfold. compare must rank that, fio's own latency change,
//! first, with fio's direction, ahead of every kernel thread, the node and tracekit itself.

use std::path::Path;

use serde_json::Value;
use tracekit_tests::*;

use super::fixtures::*;

/// fio's job report for a 4 s run of random 4 KiB reads and writes (libaio, 16 in flight),
/// recorded into `out` at 250 ms intervals.
fn recorded(lo: &LoopDev, out: &Path) -> Value {
    let tk = start_recording(out, &["--duration", "60s", "--interval", "250ms"]);
    let job = fio(
        &lo.dev,
        &[
            "--rw=randrw",
            "--bs=4k",
            "--ioengine=libaio",
            "--iodepth=16",
            "--time_based",
            "--runtime=4",
            "--randseed=7",
        ],
    );
    end_recording(tk);
    job
}

/// fio's own completion latency of `op` (`read`, `write`): (p50, p99) in ns.
fn clat(job: &Value, op: &str) -> (f64, f64) {
    let q = |p: &str| {
        job[op]["clat_ns"]["percentile"][p]
            .as_f64()
            .unwrap_or_else(|| panic!("fio {op} clat {p}: {}", job[op]))
    };
    (q("50.000000"), q("99.000000"))
}

#[test]
fn compare_ranks_the_workloads_own_latency_change_first() {
    let _serial = super::fio_test();
    let lo = LoopDev::new("iolat-compare");
    let dir = scratch("iolat-compare");
    let (before, after) = (dir.join("none.tkr"), dir.join("kyber.tkr"));
    // The staging: fio's writes at least 1.3× as slow at the median under kyber, by fio's own
    // clock. Kyber's throttled writes take 1.8–2.9 ms here, but the baseline under `none` grows
    // with the machine's other work: a busy host staged ×1.49 to ×1.51 in runs where a quiet
    // one staged ×2.2 to ×2.9 (12-06), while io-lat's own view of the same writes moved ×10
    // (their queue time in kyber). So the bar is that fio felt it, and the pair is recorded
    // again, at most three times, until it did.
    let mut felt = Vec::new();
    for attempt in 1..=3 {
        // start_recording waits for the file's header: a file left by an attempt has one.
        for f in [&before, &after] {
            let _ = std::fs::remove_file(f);
        }
        let jb = recorded(&lo, &before);
        lo.set("scheduler", "kyber");
        lo.set("iosched/read_lat_nsec", "1000");
        let ja = recorded(&lo, &after);
        lo.set("scheduler", "none");
        // What fio itself felt, per op.
        felt.clear();
        for op in ["read", "write"] {
            let ((b50, b99), (a50, a99)) = (clat(&jb, op), clat(&ja, op));
            eprintln!(
                "fio {op}: clat p50 {b50} -> {a50} ns, p99 {b99} -> {a99} ns; {} -> {} I/Os",
                jb[op]["total_ios"], ja[op]["total_ios"]
            );
            felt.push((op, a50 / b50, a99 / b99));
        }
        let (_, write_p50_ratio, _) = felt[1];
        if write_p50_ratio >= 1.3 {
            break;
        }
        assert!(
            attempt < 3,
            "kyber did not slow fio's writes (p50 ×{write_p50_ratio:.2}) in {attempt} attempts: the staging failed"
        );
        eprintln!("attempt {attempt}: writes p50 ×{write_p50_ratio:.2} only; recording again");
    }

    let (b, a) = (before.to_str().unwrap(), after.to_str().unwrap());
    let (code, stdout, stderr) = compare(&["--json", "--fail-on-regression", b, a]);
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let changes: Vec<&Value> = lines.iter().filter(|l| l["type"] == "change").collect();
    for c in changes.iter().take(12) {
        eprintln!(
            "#{} {} of {}: {} -> {} ({:?} %), {}",
            c["rank"],
            c["metric"],
            c["subject"],
            c["before"]["p99"],
            c["after"]["p99"],
            c["change_pct"],
            c["verdict"]
        );
    }
    assert_eq!(code, 7, "a regression was staged: {stderr}");
    // The first line is what fio waited, in time: a latency of its requests, or the time they
    // spent (queued, in total) per second; with fio's own direction for that op (its median:
    // under load fio's own p99 also holds its reaping, 4.11 -> 3.95 ms once while its p50
    // went 0.54 -> 1.32 ms).
    let first = changes.first().expect("no change lines");
    let subject = first["subject"].as_str().unwrap();
    let metric = first["metric"].as_str().unwrap();
    assert!(
        subject.starts_with("fio [io-lat summary ")
            && first["unit"] == "ns"
            && first["significant"] == true,
        "the first change is not what fio waited: {first}"
    );
    let (op, r50, _) = *felt
        .iter()
        .find(|(op, ..)| subject.contains(&format!(" op={op}")))
        .unwrap_or_else(|| panic!("no op in {subject}"));
    let want = if r50 > 1.0 { "worse" } else { "better" };
    assert_eq!(
        first["verdict"], want,
        "fio's {op} p50 moved ×{r50:.2} by its own clock, compare's first line is {metric}: {first}"
    );
    // The regression fio reported (its writes) is in the report as worse, above every line
    // that is not fio's.
    let pos = |pred: &dyn Fn(&Value) -> bool| changes.iter().position(|c| pred(c));
    let writes_worse = pos(&|c| {
        c["subject"]
            .as_str()
            .is_some_and(|s| s.starts_with("fio [io-lat summary ") && s.contains(" op=write"))
            && c["metric"] == "p50 total latency"
            && c["verdict"] == "worse"
    })
    .unwrap_or_else(|| panic!("fio's slower writes are not a worse p50 total latency line"));
    let not_fio = pos(&|c| {
        !c["subject"]
            .as_str()
            .is_some_and(|s| s.starts_with("fio ["))
    });
    assert!(
        not_fio.is_none_or(|n| writes_worse < n),
        "fio's writes rank #{} below {}",
        writes_worse + 1,
        changes[not_fio.unwrap()]
    );
    // The text report says the same first.
    let (_, text, _) = compare(&["--top", "6", b, a]);
    eprintln!("{text}");
    let line1 = text
        .lines()
        .find(|l| l.trim_start().starts_with("1. "))
        .unwrap_or_else(|| panic!("no ranked line: {text}"));
    assert!(line1.contains(&format!("{metric} of {subject}")), "{line1}");
    let _ = std::fs::remove_dir_all(dir);
}
