use super::*;

fn row(pid: u32, vol: u64, invol: u64, own: u64) -> CtxswRow {
    CtxswRow {
        who: Who::named(pid, None, format!("p{pid}").into_bytes()),
        voluntary: vol,
        involuntary: invol,
        migrations: 0,
        switches_per_s: 0.0,
        voluntary_per_s: 0.0,
        involuntary_per_s: 0.0,
        migrations_per_s: 0.0,
        runq_count: 0,
        runq_total_ns: 0,
        runq_p50_ns: 0,
        runq_p99_ns: 0,
        kernel_run_delay_ns: 0,
        own_wakeups: own,
        preempted_by: vec![],
        id: pid,
        alive: (0, u64::MAX),
        alive_ns: 0,
        name: format!("p{pid}"),
        preempted_text: String::new(),
        woken: vol,
        waits: probes_common::hist::LatHist::ZERO,
    }
}

#[test]
fn a_storm_between_own_threads_is_named_quiet_processes_are_not() {
    let rows = vec![row(10, 90_000, 10_000, 80_000), row(11, 500, 10, 0)];
    let f = findings(&rows, 2.0, &[]);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].subject.pid, Some(10));
    assert_eq!(f[0].cause, CTXSW_STORM);
    assert!(
        f[0].summary.contains("between its own threads"),
        "{}",
        f[0].summary
    );
    assert!(f[0].summary.contains("50000 times/s"), "{}", f[0].summary);
    assert!(f[0].advice.starts_with("its threads hand work"));
    // tracekit itself is never blamed.
    let me = std::process::id();
    assert!(findings(&[row(me, 1_000_000, 0, 0)], 1.0, &[]).is_empty());
}

/// A storm ranks on the time scale of the stalls by its run-queue waits: a pipe ping-pong
/// in a CI run switched 25,000 times/s and ranked after a 5 % CPU-steal finding as a rate.
/// Waits under 5 ms/s leave it a rate.
#[test]
fn a_storm_that_waits_ranks_by_its_waits() {
    let mut r = row(10, 14_000, 11_000, 0);
    r.runq_total_ns = 500_000_000;
    let f = findings(&[r], 2.0, &[]);
    assert_eq!(f[0].score, Score::NsPerS(250_000_000));
    assert!(
        f[0].summary
            .contains("it waited 500ms for a CPU (25.0 % of its time)"),
        "{}",
        f[0].summary
    );
    assert_eq!(f[0].ev("runq_total_ns"), Some(500_000_000.0));
    let mut r = row(10, 14_000, 11_000, 0);
    r.runq_total_ns = 8_000_000;
    let f = findings(&[r], 2.0, &[]);
    assert_eq!(f[0].score, Score::RatePerS(12_500.0));
}

#[test]
fn an_involuntary_storm_names_its_preemptor() {
    let rows = vec![row(10, 1_000, 30_000, 0)];
    let pairs = [sched::Pair {
        a: 10,
        a_tgid: 10,
        b: 77,
        b_tgid: 77,
        count: 25_000,
        ns: 0,
    }];
    let f = findings(&rows, 1.0, &pairs);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].culprit.as_ref().and_then(|c| c.pid), Some(77));
    assert!(f[0].advice.starts_with("it is preempted"));
    // A preemptor with a row of its own keeps the name the kernel gave it, though /proc no
    // longer knows it (iperf3's server exited before triage's window was read: the finding
    // said "preempted most by [exited]", its culprit an empty name).
    let gone = 4_000_000 - 7;
    let rows = vec![row(10, 1_000, 30_000, 0), row(gone, 100, 0, 0)];
    let pairs = [sched::Pair {
        a: 10,
        a_tgid: 10,
        b: gone,
        b_tgid: gone,
        count: 25_000,
        ns: 0,
    }];
    let f = findings(&rows, 1.0, &pairs);
    let c = f[0].culprit.as_ref().unwrap();
    assert_eq!(c.name.as_deref(), Some(format!("p{gone}").as_str()));
    assert!(
        f[0].summary.contains(&format!(
            "preempted most by p{gone} (pid {gone}), 25000 times"
        )),
        "{}",
        f[0].summary
    );
    // Without a row, /proc's name, or [exited].
    let rows = vec![row(10, 1_000, 30_000, 0)];
    let f = findings(&rows, 1.0, &pairs);
    assert_eq!(
        f[0].culprit.as_ref().unwrap().name.as_deref(),
        Some("[exited]")
    );
}

/// A 12 s storm in a 15 s window: 88,000 switches a second while alive, not the 70,400 a
/// second of the window; the summary says it lived part of the window. A process alive for
/// 5 ms is rated over a second, not over its 5 ms.
#[test]
fn a_storm_is_rated_over_its_life_in_the_window() {
    let mut r = row(10, 1_056_000, 0, 0);
    let s = 1_000_000_000;
    r.alive = (100 * s, 112 * s);
    let f = findings(&[r], 15.0, &[]);
    assert_eq!(f[0].ev("switches_per_s"), Some(88_000.0));
    assert_eq!(f[0].ev("alive_ns"), Some(12e9));
    assert!(
        f[0].summary
            .contains("switched 88000 times/s while alive (12.0s of the 15.0s window)"),
        "{}",
        f[0].summary
    );
    // Its threads' lives together: one thread the first 4 s, another the last 6 s.
    let (mut a, mut b) = (row(10, 500_000, 0, 0), row(10, 556_000, 0, 0));
    (a.alive, b.alive) = ((100 * s, 104 * s), (106 * s, 112 * s));
    let f = findings(&[a, b], 15.0, &[]);
    assert_eq!(f[0].ev("switches_per_s"), Some(88_000.0));
    // Short-lived: 300 switches in 5 ms is no storm.
    let mut r = row(11, 300, 0, 0);
    r.alive = (100 * s, 100 * s + 5_000_000);
    assert!(findings(&[r], 15.0, &[]).is_empty());
    // The whole window: no "while alive".
    let f = findings(&[row(10, 300_000, 0, 0)], 15.0, &[]);
    assert!(
        f[0].summary.contains("switched 20000 times/s ("),
        "{}",
        f[0].summary
    );
}

#[test]
fn columns_sort_by_rates() {
    let mut rows = vec![row(1, 10, 0, 0), row(2, 0, 40, 0)];
    (rows[0].switches_per_s, rows[1].switches_per_s) = (5.0, 20.0);
    let s = Section::build(&SUMMARY_ROWS, &rows, COLUMNS, &Ctx { secs: 2.0 }, 0);
    let keys: Vec<char> = s.table.sort.iter().map(|c| c.hotkey).collect();
    assert_eq!(keys, ['t', 'v', 'i', 'm', 'd']);
    assert_eq!(s.table.sort[0].keys, [5.0, 20.0]);
    assert_eq!(s.json[1]["involuntary"], 40);
    assert!(s.json[0].get("tid").is_none());
}
