//! why's findings: for each process (or thread), the largest part of its time it lost to
//! someone or something else — waiting for a CPU, storage, memory management, a lock or
//! another thread — when it is a real share of its life, with the culprit where one was
//! measured, in the causes the other tools conclude, and the tool that shows the detail.

use crate::report::{
    findings::{Cause, Finding, Score},
    harm,
    render::fmt_ns,
    units::ppm,
};

use super::{
    classify::Part,
    rows::{PartRow, SummaryRow},
    INFO,
};
use crate::tools::{fsync_lat, io_lat, memstall, profile, runq_lat};

/// A lock part with fewer waits that ended in the window is no finding.
pub const MIN_LOCK_WAITS: u64 = 5;

/// A harmful part below this share of the row's wall time is no finding: 10 %.
pub const MIN_SHARE_PPM: u64 = 100_000;

/// The cause, the fix and the next command for the largest harmful part of `s`, whose largest
/// kind of wait is `top`.
fn verdict(part: Part, top: &PartRow, pid: u32, s: &SummaryRow) -> (Cause, String, String) {
    match part {
        Part::Runnable => {
            let preempt = top.what == "after preemption";
            if preempt {
                (
                    runq_lat::CPU_SATURATED,
                    "its threads are CPU-bound and wait for each other or for other CPU-bound tasks after preemptions: more CPUs (or a CPU limit that matches its threads), fewer busy threads, or the other hogs reniced or moved (taskset, cpuset)".into(),
                    format!("tracekit runq-lat --pid {pid} --duration 10s"),
                )
            } else {
                (
                    runq_lat::RUNQ_DELAY,
                    "it waits for a CPU after its wakeups: renice or move the task holding the CPU (taskset, cpuset), or give this service CPUs of its own".into(),
                    format!("tracekit runq-lat --pid {pid} --duration 10s"),
                )
            }
        }
        Part::Storage => {
            if top.what == "fsync" {
                (
                    fsync_lat::FSYNC,
                    "it waits for its own fsyncs: batch them (group commit), move the data to a device with a write cache it can trust, or take the fsync off the request path".into(),
                    format!("tracekit fsync-lat --pid {pid} --duration 10s"),
                )
            } else {
                (
                    io_lat::IO_LATENCY,
                    format!("it waits for block I/O ({}): find the device and who else issues to it; more page cache for its reads, or a faster device", top.what),
                    "tracekit io-lat --duration 10s".into(),
                )
            }
        }
        Part::Memory => {
            let cause = match top.what.as_str() {
                "compaction" => memstall::THP_COMPACTION,
                "memcg reclaim" => memstall::MEMCG_LIMIT,
                _ => memstall::RECLAIM,
            };
            (
                cause,
                match top.what.as_str() {
                    "compaction" => "it stalls building huge pages: THP defrag to defer or madvise (/sys/kernel/mm/transparent_hugepage/defrag)".into(),
                    "memcg reclaim" => "its memory cgroup is at its limit: raise the limit or shrink its working set".into(),
                    _ => "the node is short of free memory: raise vm.min_free_kbytes / watermark_scale_factor so kswapd starts earlier, or free memory".into(),
                },
                format!("tracekit memstall --pid {pid} --duration 10s"),
            )
        }
        _ => (
            profile::OFF_CPU_WAIT,
            format!(
                "it waits on {} that another thread holds{}: shorten what is done under it, or split it",
                top.what,
                if s.threads > 1 { " (see --threads for which thread waits on which)" } else { "" }
            ),
            format!("tracekit profile --off-cpu --pid {pid} --duration 10s"),
        ),
    }
}

/// The other parts of `s` over 5 %, as `running 40 %, sleep 29 %`.
fn the_rest(s: &SummaryRow, skip: Part) -> String {
    let mut v: Vec<(Part, u64)> = Part::ALL
        .iter()
        .map(|&p| (p, s.part_ns(p)))
        .filter(|&(p, n)| p != skip && ppm(n, s.wall_ns as f64) >= 50_000)
        .collect();
    v.sort_by_key(|&(_, n)| std::cmp::Reverse(n));
    v.iter()
        .map(|(p, n)| {
            format!(
                "{} {:.0} %",
                p.name(),
                *n as f64 * 100.0 / s.wall_ns.max(1) as f64
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// One finding per row whose largest harmful part is at least [`MIN_SHARE_PPM`] of its wall
/// time and [`harm::MIN_NS_PER_S`] per second.
pub fn findings(summaries: &[SummaryRow], parts: &[PartRow], secs: f64) -> Vec<Finding> {
    let window_ns = (secs * 1e9) as u64;
    let mut out = Vec::new();
    for s in summaries {
        let Some(part) = Part::ALL
            .iter()
            .copied()
            .filter(|p| p.harmful())
            .max_by_key(|&p| (s.part_ns(p), std::cmp::Reverse(p)))
        else {
            continue;
        };
        let ns = s.part_ns(part);
        let share = ppm(ns, s.wall_ns as f64);
        // Per second of one thread's life: a process of several threads has several seconds.
        let life = s.wall_ns / s.threads.max(1);
        let score = harm::per_second_alive(ns / s.threads.max(1), life, window_ns);
        if share < MIN_SHARE_PPM || score < harm::MIN_NS_PER_S {
            continue;
        }
        let mine: Vec<&PartRow> = parts
            .iter()
            .filter(|r| {
                r.who.pid == s.who.pid && r.who.tid == s.who.tid && r.part_enum == Some(part)
            })
            .collect();
        let Some(top) = mine.iter().max_by_key(|r| r.total_ns).copied() else {
            continue;
        };
        // A thread parked on a futex the whole window (a join, an idle pool's condition
        // variable) waits for work, not for a holder: a lock needs waits that ended.
        if part == Part::Lock && top.count < MIN_LOCK_WAITS {
            continue;
        }
        let mut subject = s.who.subject();
        subject.tid = s.who.tid;
        let (cause, advice, next) = verdict(part, top, s.who.pid, s);
        let detail = format!(
            "{}: {} occurrences ended, p50 {}, p99 {}, max {}",
            top.what,
            top.count,
            fmt_ns(top.lat.s.p50_ns),
            fmt_ns(top.lat.s.p99_ns),
            fmt_ns(top.lat.s.max_ns)
        );
        if part == Part::Memory {
            subject = subject.with_cgroup(s.cgroup.clone());
        }
        let culprit_text = match (part, top.by_ppm) {
            (Part::Runnable | Part::Lock, Some(p)) if top.by_pid.is_some() => format!(
                "; mostly {} {} ({:.0} % of it)",
                if part == Part::Runnable {
                    "behind"
                } else {
                    "woken by"
                },
                top.by_text(),
                p as f64 / 1e4
            ),
            (Part::Memory, _) if top.what == "memcg reclaim" => s
                .cgroup
                .as_ref()
                .map(|c| {
                    format!(
                        "; its memory cgroup {} is at its limit",
                        crate::report::sanitize::text(c.as_bytes())
                    )
                })
                .unwrap_or_default(),
            _ => String::new(),
        };
        let rest = the_rest(s, part);
        let summary = format!(
            "{}: {:.0} % of its time ({} of {}) {} — {detail}{culprit_text}{}",
            subject.text(),
            share as f64 / 1e4,
            fmt_ns(ns),
            fmt_ns(s.wall_ns),
            part.phrase(),
            if rest.is_empty() {
                String::new()
            } else {
                format!("; the rest: {rest}")
            }
        );
        let mut f = Finding::new(INFO.name, cause, subject, Score::NsPerS(score), summary)
            .evidence("wall_ns", s.wall_ns)
            .evidence("part_ns", ns)
            .evidence("part_ppm", share)
            .evidence("count", top.count)
            .evidence("p99_ns", top.lat.s.p99_ns)
            .evidence("max_ns", top.lat.s.max_ns)
            .evidence(crate::report::findings::WINDOW_NS, window_ns);
        if matches!(part, Part::Runnable | Part::Lock) {
            if let (Some(bp), Some(c)) = (top.by_pid, &top.by_comm) {
                // Another process, or with --threads another thread of this one.
                let other_thread = s.who.tid.is_some() && top.by_tid != s.who.tid;
                if bp != 0 && (bp != s.who.pid || other_thread) {
                    let mut who = crate::report::findings::Subject::process(bp, c.clone());
                    who.tid = top.by_tid.filter(|&t| t != bp || other_thread);
                    f.culprit = Some(who);
                }
            }
        }
        f.advice = advice;
        f.next = Some(next);
        out.push(f);
    }
    crate::report::findings::rank(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::who::{Id, Title};
    use probes_common::hist::LatHist;

    fn id() -> Id {
        Id::new(42, 42, false, b"app".to_vec(), Title::default())
    }

    fn hist(v: &[u64]) -> LatHist {
        let mut h = LatHist::ZERO;
        for &x in v {
            h.record(x);
        }
        h
    }

    #[test]
    fn the_largest_harmful_part_is_named_with_its_detail_and_next_command() {
        // 10 s: 40 % running, 30 % fsync, 30 % sleep.
        let s = SummaryRow::new(
            id(),
            1,
            &[4_000_000_000, 0, 3_000_000_000, 0, 0, 0, 3_000_000_000, 0],
        );
        let p = PartRow::new(
            id(),
            Part::Storage,
            "fsync".into(),
            3_000_000_000,
            s.wall_ns,
            &hist(&[10_000_000; 300]),
        );
        let f = findings(&[s], &[p], 10.0);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].cause, fsync_lat::FSYNC);
        assert!(
            f[0].summary.contains("30 % of its time"),
            "{}",
            f[0].summary
        );
        assert!(f[0].summary.contains("running 40 %"), "{}", f[0].summary);
        assert_eq!(
            f[0].next.as_deref(),
            Some("tracekit fsync-lat --pid 42 --duration 10s")
        );
        assert_eq!(f[0].score, Score::NsPerS(300_000_000));
    }

    #[test]
    fn memcg_reclaim_names_the_cgroup_at_its_limit() {
        let mut s = SummaryRow::new(
            id(),
            1,
            &[1_000_000_000, 0, 0, 2_000_000_000, 0, 0, 7_000_000_000, 0],
        );
        s.cgroup = Some("/batch".into());
        let p = PartRow::new(
            id(),
            Part::Memory,
            "memcg reclaim".into(),
            2_000_000_000,
            s.wall_ns,
            &hist(&[5_000_000; 400]),
        );
        let f = findings(&[s], &[p], 10.0);
        assert_eq!(f[0].cause, memstall::MEMCG_LIMIT);
        assert_eq!(f[0].subject.cgroup.as_deref(), Some("/batch"));
        assert!(
            f[0].summary
                .contains("its memory cgroup /batch is at its limit"),
            "{}",
            f[0].summary
        );
        assert_eq!(
            f[0].next.as_deref(),
            Some("tracekit memstall --pid 42 --duration 10s")
        );
    }

    #[test]
    fn running_sleeping_and_network_waits_are_no_finding() {
        let s = SummaryRow::new(
            id(),
            1,
            &[
                3_000_000_000,
                100_000_000,
                0,
                0,
                0,
                4_000_000_000,
                2_900_000_000,
                0,
            ],
        );
        let p = PartRow::new(
            id(),
            Part::Runnable,
            "after wakeup".into(),
            100_000_000,
            s.wall_ns,
            &hist(&[1_000_000; 100]),
        );
        assert!(findings(&[s], &[p], 10.0).is_empty());
    }

    #[test]
    fn a_runnable_wait_names_the_cpu_holder() {
        let s = SummaryRow::new(
            id(),
            1,
            &[1_000_000_000, 3_000_000_000, 0, 0, 0, 0, 6_000_000_000, 0],
        );
        let mut p = PartRow::new(
            id(),
            Part::Runnable,
            "after wakeup".into(),
            3_000_000_000,
            s.wall_ns,
            &hist(&[30_000_000; 100]),
        );
        p.by_pid = Some(99);
        p.by_tid = Some(99);
        p.by_comm = Some("hog".into());
        p.by_ppm = Some(900_000);
        let f = findings(&[s], &[p], 10.0);
        assert_eq!(f[0].cause, runq_lat::RUNQ_DELAY);
        assert_eq!(f[0].culprit.as_ref().and_then(|c| c.pid), Some(99));
        assert!(
            f[0].summary.contains("behind hog (pid 99) (90 % of it)"),
            "{}",
            f[0].summary
        );
    }
}
