//! Root tests for `tracekit runq-lat`: the total run-queue wait per pid must agree with the
//! kernel's own `run_delay` (`/proc/<pid>/schedstat`, second field) that the workload reads
//! about itself.

use std::time::Duration;

use serde_json::Value;
use tracekit_tests::*;

fn compare(workload: &[&str]) -> (Vec<Value>, Value) {
    require_root();
    let mut tk = Tracer::spawn(&["runq-lat", "--json"]);
    tk.wait_attached();
    let w = run_workload(workload);
    tk.signal(libc::SIGINT);
    let (status, lines, stderr) = tk.finish(Duration::from_secs(15));
    assert!(status.success(), "exit {status}: {stderr}");
    for p in w["procs"].as_array().unwrap() {
        let pid = p["pid"].as_u64().unwrap() as u32;
        let rows = rows_for(&lines, "runq-lat", pid);
        assert_eq!(rows.len(), 1, "one row for pid {pid}: {rows:?}");
        let r = rows[0];
        for k in [
            "tool", "pid", "comm", "count", "total_ns", "p50_ns", "p99_ns", "max_ns",
        ] {
            assert!(!r[k].is_null(), "JSON contract: {k} missing");
        }
        let total = r["total_ns"].as_u64().unwrap();
        let own = p["run_delay_ns"].as_u64().unwrap();
        let err = total.abs_diff(own) as f64 / own.max(1) as f64;
        eprintln!(
            "{workload:?} pid {pid}: tracekit total {total} ns over {} waits, schedstat run_delay delta {own} ns ({:.2} %)",
            r["count"],
            err * 100.0
        );
        assert!(own > 0, "the workload waited on no run queue: {p}");
        assert!(
            err <= 0.10,
            "pid {pid}: tracekit {total} ns vs run_delay {own} ns ({:.1} % off)",
            err * 100.0
        );
        let (p50, p99, max) = (
            r["p50_ns"].as_u64().unwrap(),
            r["p99_ns"].as_u64().unwrap(),
            r["max_ns"].as_u64().unwrap(),
        );
        assert!(p50 <= p99 && p99 <= max, "{r}");
        assert_eq!(
            r["count"].as_u64().unwrap(),
            r["wake_count"].as_u64().unwrap() + r["preempt_count"].as_u64().unwrap()
        );
    }
    (lines, w)
}

#[test]
fn pingpong_total_wait_matches_schedstat() {
    compare(&["pingpong", "20000"]);
}

#[test]
fn pinned_spinners_wait_after_preemption() {
    let (lines, w) = compare(&["spin", "1500"]);
    for p in w["procs"].as_array().unwrap() {
        let pid = p["pid"].as_u64().unwrap() as u32;
        let r = rows_for(&lines, "runq-lat", pid)[0];
        // Two spinners sharing a CPU wait mostly after being preempted, not after wakeups.
        assert!(
            r["preempt_total_ns"].as_u64().unwrap() > r["wake_total_ns"].as_u64().unwrap(),
            "{r}"
        );
    }
}

/// A process that execs is reported under its new name, with the name before the exec.
#[test]
fn exec_renames_the_row() {
    require_root();
    let mut tk = Tracer::spawn(&["runq-lat", "--json"]);
    tk.wait_attached();
    let pid = run_exec_workload();
    tk.signal(libc::SIGINT);
    let (status, lines, stderr) = tk.finish(Duration::from_secs(15));
    assert!(status.success(), "{stderr}");
    let rows = rows_for(&lines, "runq-lat", pid);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["comm"], "tk-workload", "{}", rows[0]);
    assert_eq!(rows[0]["exec_from"], "sh", "{}", rows[0]);
}
