//! runq-lat's unit tests: findings from fixture rows, the aggressor table, the JSON keys.

use super::findings::*;
use super::*;
use crate::host::proc::SchedClass;
use crate::report::findings::{Finding, Score};
use probes_common::hist::LatHist;
use probes_common::sched::STEAL_ID;

/// Findings as a run on a node of two CPUs, every process of the default class.
fn findings(rows: &[RunqRow], secs: f64) -> Vec<Finding> {
    let node = NodeLoad {
        cpus: 2,
        ..NodeLoad::default()
    };
    super::findings(rows, secs, &node, &|_| SchedClass::default())
}

fn row(pid: u32, wake: &[u64], preempt: &[u64], behind: Vec<Peer>) -> RunqRow {
    let (mut w, mut p) = (LatHist::ZERO, LatHist::ZERO);
    wake.iter().for_each(|v| w.record(*v));
    preempt.iter().for_each(|v| p.record(*v));
    let mut all = w;
    all.merge(&p);
    RunqRow {
        who: Who::named(pid, None, format!("p{pid}").into_bytes()),
        mean_ns: 0,
        all: Keyed::new("", hist::stats(&all), RUNQ_STATS),
        wake: Keyed::new("wake_", hist::stats(&w), RUNQ_STATS),
        preempt: Keyed::new("preempt_", hist::stats(&p), RUNQ_STATS),
        kernel_run_delay_ns: 0,
        wake_unmeasured: 0,
        late_waits_behind: behind.clone(),
        waited_behind: behind,
        id: pid,
        name: format!("p{pid}"),
        behind_text: String::new(),
        hists: (w, p),
    }
}

fn peer(pid: u32, n: u64, ns: u64) -> Peer {
    Peer {
        who: Who::named(pid, None, format!("hog{pid}").into_bytes()),
        count: n,
        delay_ns: Some(ns),
        id: pid,
        name: format!("hog{pid}").into_bytes(),
    }
}

#[test]
fn the_victim_ranks_first_and_names_the_hogs_who_get_no_finding() {
    let victim = row(
        5,
        &[2_000_000; 200],
        &[],
        vec![peer(8, 120, 240_000_000), peer(9, 80, 160_000_000)],
    );
    // The hogs wait far longer, but only after preemptions, and they are the culprits.
    let hogs = [8, 9].map(|p| row(p, &[], &[3_000_000; 300], vec![]));
    let mut rows = vec![victim];
    rows.extend(hogs);
    let f = findings(&rows, 1.0);
    assert_eq!(f.len(), 2, "the victim, then the saturation: {f:?}");
    assert_eq!(f[0].subject.pid, Some(5));
    assert_eq!(f[0].culprit.as_ref().and_then(|c| c.pid), Some(8));
    assert_eq!(f[1].cause, CPU_SATURATED);
    assert_eq!(f[1].subject.kind, "node");
    assert!(f[1].score.ns_per_s() < f[0].score.ns_per_s(), "{f:?}");
    assert!(
        f[1].summary.contains("the work that suffers is p5 (pid 5)"),
        "{}",
        f[1].summary
    );
    assert!(f[0].summary.contains("hog8 (pid 8)"), "{}", f[0].summary);
    assert!(f[0].summary.contains("hog9 (pid 9)"), "{}", f[0].summary);
    let j = f[0].json();
    assert_eq!(j["culprit_pid"], 8);
    assert_eq!(j["evidence"]["culprit_delay_ns"], 240_000_000u64);
}

/// A process waiting behind its own threads most is not its own culprit: the culprit is the
/// other process, and the text says "its own threads".
#[test]
fn own_threads_are_named_as_such_and_never_the_culprit() {
    let victim = row(
        5,
        &[2_000_000; 200],
        &[],
        vec![peer(5, 150, 300_000_000), peer(9, 50, 100_000_000)],
    );
    let f = findings(&[victim], 1.0);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].culprit.as_ref().and_then(|c| c.pid), Some(9));
    assert!(
        f[0].summary.contains("its own threads for 300ms"),
        "{}",
        f[0].summary
    );
    assert!(!f[0].summary.contains("hog5"), "{}", f[0].summary);
}

/// Woken 20,000 times a second, 10 us each, with no process holding the CPU for half of
/// it: the advice is fewer handoffs and the next command is ctxsw; a hog's victim woken as
/// often keeps the priority advice.
#[test]
fn a_process_woken_at_storm_rates_is_told_to_batch_its_handoffs() {
    let pp = row(5, &[10_000; 20_000], &[], vec![peer(9, 40, 40_000_000)]);
    let f = findings(&[pp], 1.0);
    assert!(
        f[0].advice.contains("batch the handoffs"),
        "{}",
        f[0].advice
    );
    assert_eq!(
        f[0].next.as_deref(),
        Some("tracekit ctxsw --pid 5 --threads --duration 10s")
    );
    let starved = row(5, &[10_000; 20_000], &[], vec![peer(9, 40, 150_000_000)]);
    let f = findings(&[starved], 1.0);
    assert!(
        f[0].advice.contains("give it the CPU first"),
        "{}",
        f[0].advice
    );
}

#[test]
fn saturation_without_victims_and_quiet_rows_give_findings_as_due() {
    let rows = vec![
        row(8, &[], &[3_000_000; 300], vec![]),
        row(9, &[1_000; 10], &[1_000; 10], vec![]),
    ];
    let f = findings(&rows, 1.0);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].cause, CPU_SATURATED);
    assert_eq!(f[0].culprit.as_ref().and_then(|c| c.pid), Some(8));
    assert!(
        f[0].summary.contains("2 CPUs saturated"),
        "{}",
        f[0].summary
    );
    assert!(
        f[0].summary
            .contains("no latency-sensitive process suffered"),
        "{}",
        f[0].summary
    );
}

/// A 1 ms sleeper: 990 wakeups at 10 us, 10 behind a hog for 3 ms. It lost 4 % of its
/// time (under the 5 % of a starved process) but 1 in 100 wakeups was late: a victim, ranked
/// above the saturation its hog and a batch job (14 % lost to time-slicing) make.
#[test]
fn a_sleeper_with_a_tail_outranks_the_saturation_though_it_lost_little_time() {
    let mut wake = vec![10_000; 990];
    wake.extend([3_000_000; 10]);
    let sleeper = row(5, &wake, &[], vec![peer(8, 10, 29_000_000)]);
    let hog = row(8, &[], &[2_000_000; 70], vec![]);
    let batch = row(9, &[100_000; 5], &[2_000_000; 70], vec![]);
    let f = findings(&[sleeper, hog, batch], 1.0);
    assert_eq!(f.len(), 2, "{f:?}");
    assert_eq!(f[0].subject.pid, Some(5));
    assert_eq!(f[0].culprit.as_ref().and_then(|c| c.pid), Some(8));
    assert!(
        f[0].summary.contains("1 in 100 wakeups waited over 1.00ms"),
        "{}",
        f[0].summary
    );
    let excess = f[0].ev(ev::WAKE_EXCESS_NS).unwrap();
    assert!((28e6..=32e6).contains(&excess), "{excess}");
    assert_eq!(f[1].cause, CPU_SATURATED);
    assert!(
        f[1].summary.contains("p9 (pid 9) waited 14 %"),
        "{}",
        f[1].summary
    );
}

/// A page-cache writer woken 100 times a second, as a CI run on a VM with 15 % steal saw it:
/// 1 in 30 wakeups over 1 ms, 7.6 ms/s of excess. The task it usually follows (a 3 ms burster)
/// held 52 ms of its waits, most of them short; who held its long waits decides.
#[test]
fn a_tail_victim_is_named_for_whoever_held_its_long_waits() {
    let mut wake = vec![27_000; 750];
    wake.extend([2_400_000; 26]);
    let all = vec![peer(8, 104, 52_000_000)];
    let writer = |late: Vec<Peer>| RunqRow {
        late_waits_behind: late,
        ..row(5, &wake, &[], all.clone())
    };
    // Its long waits were spent on idle CPUs waking (the hypervisor running the vCPU late):
    // nobody to renice, and cpu-steal or the idle states are the finding.
    let f = findings(
        &[writer(vec![peer(0, 26, 45_000_000), peer(8, 6, 9_000_000)])],
        8.0,
    );
    assert!(f.is_empty(), "{f:?}");
    // Spent behind the burster: it is the culprit, for its part of those waits.
    let f = findings(&[writer(vec![peer(8, 26, 50_000_000)])], 8.0);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].culprit.as_ref().and_then(|c| c.pid), Some(8));
    assert_eq!(f[0].ev(ev::CULPRIT_LATE_DELAY_NS), Some(50e6));
    assert_eq!(f[0].ev(ev::CULPRIT_DELAY_NS), Some(52e6));
    let long = f[0].ev(ev::WAKE_LONG_TOTAL_NS).unwrap();
    assert!((26.0 * 2.25e6..=26.0 * 2.55e6).contains(&long), "{long}");
    assert!(
        f[0].summary.contains(
            "in its waits over 1.00ms the CPU was held by hog8 (pid 8) for 50.0ms (26 waits)"
        ),
        "{}",
        f[0].summary
    );
}

/// The fsync incident on a guest with 18.5 % steal: the writer's long waits were charged to a
/// 0.5 ms burster at 7.8 ms a wait. With the steal clock read, most of each wait is the
/// hypervisor's: nobody on the node to renice, so no run-queue finding (cpu-steal tells it);
/// a wait mostly spent behind a task that really ran keeps its culprit.
#[test]
fn waits_the_hypervisor_stole_name_no_culprit() {
    let mut wake = vec![30_000; 750];
    wake.extend([5_000_000; 12]);
    let all = vec![peer(8, 104, 52_000_000)];
    let writer = |late: Vec<Peer>| RunqRow {
        late_waits_behind: late,
        ..row(5, &wake, &[], all.clone())
    };
    let f = findings(
        &[writer(vec![
            peer(STEAL_ID, 12, 48_000_000),
            peer(8, 6, 9_000_000),
        ])],
        8.0,
    );
    assert!(f.is_empty(), "{f:?}");
    let f = findings(
        &[writer(vec![
            peer(8, 12, 45_000_000),
            peer(STEAL_ID, 4, 9_000_000),
        ])],
        8.0,
    );
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].culprit.as_ref().and_then(|c| c.pid), Some(8));
    assert!(
        f[0].summary
            .contains("the hypervisor (CPU steal) for 9.00ms (4 waits)"),
        "{}",
        f[0].summary
    );
    // Starved, but mostly by steal: what is left is under the 5 % a starved process needs.
    let starved = row(
        5,
        &[2_000_000; 200],
        &[],
        vec![peer(STEAL_ID, 200, 380_000_000), peer(8, 50, 20_000_000)],
    );
    assert!(findings(&[starved], 1.0).is_empty());
}

/// A victim at nice 19 (or SCHED_IDLE) asked to wait; a kernel thread is not a culprit to
/// renice.
#[test]
fn low_priority_victims_and_kernel_culprits_are_not_named() {
    let mut wake = vec![10_000; 990];
    wake.extend([3_000_000; 10]);
    let sleeper = || row(5, &wake, &[], vec![peer(8, 10, 29_000_000)]);
    let node = NodeLoad {
        cpus: 2,
        ..NodeLoad::default()
    };
    let niced = |pid| SchedClass {
        nice: if pid == 5 { 19 } else { 0 },
        ..SchedClass::default()
    };
    assert!(super::findings(&[sleeper()], 1.0, &node, &niced).is_empty());
    let kworker = |pid| SchedClass {
        kthread: pid == 8,
        ..SchedClass::default()
    };
    // Late waits behind a kernel thread only: its cause is another tool's (memstall, irq-lat).
    assert!(super::findings(&[sleeper()], 1.0, &node, &kworker).is_empty());
    // Starved behind it: named, with no culprit to renice.
    let starved = row(5, &[2_000_000; 200], &[], vec![peer(8, 200, 400_000_000)]);
    let f = super::findings(&[starved], 1.0, &node, &kworker);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].culprit, None);
    assert!(f[0].advice.contains("kernel work"), "{}", f[0].advice);
    // A kernel thread starved by a hog is named, ranked as a rate (its waits per second).
    let kworker_starved = row(8, &[2_000_000; 200], &[], vec![peer(9, 200, 400_000_000)]);
    let f = super::findings(&[kworker_starved], 1.0, &node, &kworker);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].score, Score::RatePerS(200.0));
}

/// The staged incident: a sleeper pinned to the CPU that runs lo's receive work (RPS) under a
/// UDP flood. Its long waits were held by that CPU's ksoftirqd: a kernel thread, nobody to
/// renice, but the CPU's softirq work is the culprit when the CPU spent a tenth of the window
/// in softirqs; below that, or held by another kernel thread, no finding.
#[test]
fn long_waits_held_by_a_busy_cpus_softirq_work_name_that_cpu() {
    let mut wake = vec![10_000; 12_000];
    wake.extend([3_000_000; 20]);
    let ksoftirqd = |cpu: u32, pid: u32, ns: u64| Peer {
        who: Who::named(pid, None, format!("ksoftirqd/{cpu}").into_bytes()),
        count: 12,
        delay_ns: Some(ns),
        id: pid,
        name: format!("ksoftirqd/{cpu}").into_bytes(),
    };
    let sleeper = |late: Vec<Peer>| RunqRow {
        late_waits_behind: late,
        ..row(5, &wake, &[], vec![peer(8, 30, 4_000_000)])
    };
    let kthreads = |pid| SchedClass {
        kthread: pid == 24 || pid == 83,
        ..SchedClass::default()
    };
    let node = |cpu1_ppm| NodeLoad {
        cpus: 2,
        softirq_ppm: vec![Some(3_000), Some(cpu1_ppm)],
        ..NodeLoad::default()
    };
    let held = vec![ksoftirqd(1, 24, 40_000_000), peer(83, 5, 15_000_000)];
    let f = super::findings(&[sleeper(held.clone())], 5.0, &node(250_000), &kthreads);
    assert_eq!(f.len(), 1, "{f:?}");
    let c = f[0].culprit.as_ref().expect("a culprit");
    assert_eq!(
        (c.kind, c.name.as_deref(), c.pid),
        ("cpu", Some("CPU 1"), None)
    );
    assert_eq!(f[0].ev(ev::SOFTIRQ_CPU), Some(1.0));
    assert_eq!(f[0].ev(ev::CPU_SOFTIRQ_PPM), Some(250_000.0));
    assert_eq!(f[0].ev(ev::CULPRIT_LATE_DELAY_NS), Some(40e6));
    assert!(
        f[0].summary
            .contains("CPU 1 spent 25.0 % of the window in softirqs (/proc/stat)"),
        "{}",
        f[0].summary
    );
    assert!(f[0].advice.contains("rps_cpus"), "{}", f[0].advice);
    assert_eq!(
        f[0].next.as_deref(),
        Some("tracekit irq-lat --duration 10s")
    );
    let j = f[0].json();
    assert_eq!(j["culprit"]["kind"], "cpu");
    assert!(j.get("culprit_pid").is_none(), "{j}");
    // A CPU that was not busy with softirqs: ksoftirqd ran for another reason; no finding.
    assert!(super::findings(&[sleeper(held)], 5.0, &node(40_000), &kthreads).is_empty());
    // Held mostly by another kernel thread (kdamond): not softirq work, no finding.
    let other = vec![ksoftirqd(1, 24, 15_000_000), peer(83, 15, 40_000_000)];
    assert!(super::findings(&[sleeper(other)], 5.0, &node(250_000), &kthreads).is_empty());
    // A process held them: it is the culprit, whatever the CPU's softirqs.
    let hog = vec![ksoftirqd(1, 24, 15_000_000), peer(9, 15, 40_000_000)];
    let f = super::findings(&[sleeper(hog)], 5.0, &node(250_000), &kthreads);
    assert_eq!(f[0].culprit.as_ref().and_then(|c| c.pid), Some(9), "{f:?}");
    assert_eq!(f[0].ev(ev::SOFTIRQ_CPU), None);
    // A flood heavy enough that nearly every wakeup waits out a softirq run: its median wait
    // is 1 ms, so no wait is late, and it is starved (half its time) behind ksoftirqd/1.
    let starved = row(
        5,
        &[1_000_000; 4_000],
        &[],
        vec![ksoftirqd(1, 24, 3_000_000_000), peer(0, 2_000, 150_000_000)],
    );
    let f = super::findings(&[starved], 7.0, &node(600_000), &kthreads);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].culprit.as_ref().map(|c| c.kind), Some("cpu"), "{f:?}");
    assert_eq!(f[0].ev(ev::CULPRIT_DELAY_NS), Some(3e9));
    assert_eq!(f[0].ev(ev::CULPRIT_LATE_DELAY_NS), None);
    assert!(
        f[0].summary.contains("waited 4.00s of 7.00s"),
        "{}",
        f[0].summary
    );
}

/// CPU-bound processes that asked to wait (SCHED_IDLE, nice 19) saturate nothing: no
/// saturation finding names them; beside a nice-0 hog they are not counted either.
#[test]
fn low_priority_hogs_saturate_nothing() {
    let hogs = [8, 9].map(|p| row(p, &[], &[3_000_000; 300], vec![]));
    let node = NodeLoad {
        cpus: 2,
        ..NodeLoad::default()
    };
    let idle = |pid| SchedClass {
        policy: if pid == 8 { 5 } else { 0 },
        nice: if pid == 9 { 19 } else { 0 },
        ..SchedClass::default()
    };
    assert!(super::findings(&hogs, 1.0, &node, &idle).is_empty());
    let mut rows = Vec::from(hogs);
    rows.push(row(7, &[], &[3_000_000; 300], vec![]));
    let f = super::findings(&rows, 1.0, &node, &idle);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].culprit.as_ref().and_then(|c| c.pid), Some(7));
    assert_eq!(f[0].ev("hogs"), Some(1.0));
}

/// A CPU-bound kernel thread (kdamond.0, kswapd) is no hog: the saturation names the
/// processes, and a kernel thread alone saturates nothing.
#[test]
fn kernel_threads_are_not_hogs() {
    let node = NodeLoad {
        cpus: 2,
        ..NodeLoad::default()
    };
    let kthread = |pid| SchedClass {
        kthread: pid == 105,
        ..SchedClass::default()
    };
    let kdamond = || row(105, &[], &[3_000_000; 280], vec![]);
    assert!(super::findings(&[kdamond()], 1.0, &node, &kthread).is_empty());
    let rows = vec![
        kdamond(),
        row(8, &[], &[3_000_000; 180], vec![]),
        row(9, &[], &[3_000_000; 170], vec![]),
    ];
    let f = super::findings(&rows, 1.0, &node, &kthread);
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].culprit.as_ref().and_then(|c| c.pid), Some(8));
    assert_eq!(f[0].ev("hogs"), Some(2.0));
}

/// Hogs that may run only on CPU 1 saturate CPU 1, not the node.
#[test]
fn pinned_hogs_saturate_their_cpus() {
    let rows = vec![
        row(8, &[], &[3_000_000; 300], vec![]),
        row(9, &[], &[3_000_000; 300], vec![]),
    ];
    let node = NodeLoad {
        cpus: 2,
        ..NodeLoad::default()
    };
    let pinned = |_| SchedClass {
        cpus_allowed: Some(0b10),
        ..SchedClass::default()
    };
    let f = super::findings(&rows, 1.0, &node, &pinned);
    assert_eq!(f.len(), 1, "{f:?}");
    assert!(
        f[0].summary.contains("CPU 1 (of 2) saturated"),
        "{}",
        f[0].summary
    );
}

#[test]
fn aggressors_count_every_victim_of_the_window_even_folded_ones() {
    let p = |a, b, ns| Pair {
        a,
        a_tgid: a,
        b,
        b_tgid: b,
        count: 1,
        ns,
    };
    // 5 and 6 waited (6 summed in [other] by the row cap); 7 is out of scope.
    let pairs = [p(5, 9, 100), p(6, 9, 50), p(7, 9, 1000), p(6, 8, 10)];
    let a = aggressors(&pairs, &[5, 6], &Names::of(&[]), false);
    let got: Vec<(u32, u64, u64)> = a
        .iter()
        .map(|x| (x.who.pid, x.delay_caused_ns, x.victims))
        .collect();
    assert_eq!(got, [(9, 150, 2), (8, 10, 1)]);
}

#[test]
fn json_keeps_the_prefixed_keys() {
    let r = row(5, &[1_000, 3_000], &[7_000], vec![peer(8, 1, 3_000)]);
    let s = Section::build(&SUMMARY_ROWS, &[r], COLUMNS, &Ctx { secs: 1.0 }, 0);
    let j = &s.json[0];
    assert_eq!(j["count"], 3);
    assert_eq!(j["wake_count"], 2);
    assert_eq!(j["preempt_count"], 1);
    assert!(j["wake_p99_ns"].as_u64().unwrap() >= 2_800);
    assert_eq!(j["waited_behind"][0]["pid"], 8);
    assert_eq!(j["waited_behind"][0]["delay_ns"], 3_000);
    assert!(j.get("kernel_run_delay_ns").is_some());
}

/// `--from` picks the event waits after a wakeup start at; `waking` unless asked, and
/// nothing else runq-lat records changes with it.
#[test]
fn from_picks_the_wake_event() {
    let parse = crate::options::parse_args::<Args>;
    let from = |extra: &[&str]| record(&parse(extra).unwrap()).wake_from;
    assert_eq!(from(&[]), WakeFrom::Waking);
    assert_eq!(from(&["--from", "waking"]), WakeFrom::Waking);
    assert_eq!(from(&["--from", "wakeup"]), WakeFrom::Wakeup);
    assert_eq!(WakeFrom::Wakeup.event(), "sched_wakeup");
    assert!(parse(&["--from", "sched_wakeup"]).is_err());
    let r = record(&parse(&["--from", "wakeup"]).unwrap());
    assert!(r.culprits && !r.preemptors && !r.wakers);
}
