//! io-lat's findings: the I/O scheduler adding queue time on a device that needs none, the
//! request queue at its limit, and one process saturating a device. Each scores the I/O wait of
//! the processes that wait (sync requests) per second, or the request rate when nobody waits.

use std::collections::BTreeMap;

use probes_common::hist::LatHist;

use super::rows::{DeviceRow, SummaryRow};
use crate::report::{
    findings::{rank, Finding, Score, Subject},
    hist,
    render::fmt_ns,
    who::{bracket, Title},
};

/// Below this many requests in a window a device's numbers are too few to conclude from.
const MIN_REQUESTS: u64 = 50;
/// Queue time share of an op's request time that makes the scheduler worth a finding.
const SCHED_SHARE_PCT: f64 = 25.0;
/// ... and its p99 queue time must be at least this (the scheduler's own cost is ~1 µs).
const SCHED_MIN_P99_NS: u64 = 50_000;
/// Share of the window at the request limit worth a finding.
const FULL_PCT: f64 = 20.0;
/// A device this busy (diskstats util) with one process behind most of its requests.
const BUSY_UTIL_PCT: f64 = 50.0;
const TOP_SHARE_PCT: f64 = 75.0;

/// Time per second where a process waits (`ns`: summed over sync requests), else the rate.
fn score(wait_ns: u64, count: u64, secs: f64) -> Score {
    if wait_ns > 0 {
        Score::NsPerS((wait_ns as f64 / secs) as u64)
    } else {
        Score::RatePerS((count as f64 / secs * 1000.0).round() / 1000.0)
    }
}

/// One process's requests on one device.
struct Issuer {
    pid: u32,
    comm: String,
    title: Title,
    container: Option<crate::host::container::Container>,
    cgroup: Option<String>,
    kthread: bool,
    count: u64,
    sync_ns: u64,
    async_writes: u64,
}

/// Issuers of `dev`'s requests, most requests first (tracekit itself left out).
fn issuers(rows: &[SummaryRow], kdev: u32) -> Vec<Issuer> {
    let me = std::process::id();
    let mut by: BTreeMap<u32, Issuer> = BTreeMap::new();
    for r in rows
        .iter()
        .filter(|r| !r.other && r.kdev == kdev && r.who.pid != me && r.who.processes.is_none())
    {
        let e = by.entry(r.who.pid).or_insert_with(|| Issuer {
            pid: r.who.pid,
            comm: crate::report::sanitize::text(&r.who.comm_raw),
            title: r.who.title.clone(),
            container: r.who.container.get().cloned(),
            cgroup: r.cgroup.clone(),
            kthread: r.kthread == Some(true),
            count: 0,
            sync_ns: 0,
            async_writes: 0,
        });
        e.count += r.count;
        if r.sync {
            e.sync_ns += r.lat.total.s.total_ns;
        } else if r.op == "write" {
            e.async_writes += r.count;
        }
    }
    let mut v: Vec<Issuer> = by.into_values().collect();
    v.sort_by(|a, b| b.count.cmp(&a.count).then(a.pid.cmp(&b.pid)));
    v
}

fn subject(i: &Issuer) -> Subject {
    Subject::process(i.pid, i.comm.clone())
        .with_title(&i.title)
        .with_container(i.container.as_ref())
        .with_cgroup(i.cgroup.clone())
}

/// `fio (pid 812)`, or `kworker/u8:3 (pid 95, writeback for /app)` for a flusher.
fn who(i: &Issuer) -> String {
    let wb = if i.kthread && i.async_writes * 2 >= i.count {
        match &i.cgroup {
            Some(c) => format!(", writeback charged to {c}"),
            None => ", writeback".to_string(),
        }
    } else {
        String::new()
    };
    let title = match &i.title.cmdline {
        Some(t) if *t != i.comm => bracket(t.as_bytes()),
        _ => String::new(),
    };
    let inside = match &i.container {
        Some(c) => format!(
            " in container {}",
            crate::report::sanitize::text(c.label().as_bytes())
        ),
        None => String::new(),
    };
    format!("{}{title} (pid {}{wb}){inside}", i.comm, i.pid)
}

/// The top issuer when it stands for at least half of the device's requests.
fn culprit(top: Option<&Issuer>, count: u64) -> Option<Subject> {
    top.filter(|t| t.count * 2 >= count).map(subject)
}

pub fn find(rows: &[SummaryRow], devices: &[DeviceRow], secs: f64) -> Vec<Finding> {
    let mut out = Vec::new();
    for d in devices.iter().filter(|d| d.count >= MIN_REQUESTS) {
        let iss = issuers(rows, d.kdev);
        out.extend(scheduler(d, iss.first(), secs));
        out.extend(queue_full(d, iss.first(), secs));
        out.extend(top_issuer(d, iss.first(), secs));
    }
    rank(&mut out);
    out
}

/// A scheduler's queue time on a non-rotational device: the op with the largest share.
fn scheduler(d: &DeviceRow, top: Option<&Issuer>, secs: f64) -> Option<Finding> {
    let sched = d.facts.scheduler.as_deref()?;
    if sched == "none" || d.facts.rotational != Some(false) {
        return None;
    }
    let share = |q: &LatHist, t: &LatHist| {
        if t.sum == 0 {
            0.0
        } else {
            q.sum as f64 * 100.0 / t.sum as f64
        }
    };
    let (op, o) = d
        .by_op
        .iter()
        .filter(|(_, o)| o.count >= MIN_REQUESTS)
        .max_by(|a, b| share(&a.1.queue, &a.1.total).total_cmp(&share(&b.1.queue, &b.1.total)))?;
    let pct = share(&o.queue, &o.total);
    let (q, dv) = (hist::stats(&o.queue), hist::stats(&o.device));
    if pct < SCHED_SHARE_PCT || q.p99_ns < SCHED_MIN_P99_NS {
        return None;
    }
    Some(
        Finding {
            tool: super::INFO.name,
            cause: super::IO_SCHEDULER,
            subject: Subject::named("device", d.dev.clone()),
            culprit: culprit(top, d.count),
            score: score(o.sync_queue_ns, o.count, secs),
            summary: format!(
                "{}: {pct:.0} % of {op} latency is queue time under {sched} (p99 queue {}, device {}) on a non-rotational device.",
                d.dev,
                fmt_ns(q.p99_ns),
                fmt_ns(dv.p99_ns),
            ),
            evidence: vec![],
            advice: format!(
                "try the `none` scheduler (echo none > /sys/block/{}/queue/scheduler; persist it with a udev rule); a fast device reorders on its own, the scheduler only serialises dispatch",
                d.dev
            ),
            next: Some(format!("tracekit io-lat --dev {} --duration 30s", d.dev)),
            fold: None,
            members: Vec::new(),
        }
        .evidence("queue_share_pct", (pct * 10.0).round() / 10.0)
        .evidence("queue_p99_ns", q.p99_ns)
        .evidence("device_p99_ns", dv.p99_ns)
        .evidence("queue_ns", o.queue.sum)
        .evidence("request_ns", o.total.sum)
        .evidence("requests", o.count),
    )
}

/// Requests at the limit the block layer allows (`nr_requests`) for much of the window.
fn queue_full(d: &DeviceRow, top: Option<&Issuer>, secs: f64) -> Option<Finding> {
    let full = d.depth.full_pct?;
    let limit = d.queue_limit?;
    if full < FULL_PCT {
        return None;
    }
    let nr = d.facts.nr_requests.unwrap_or(limit);
    let hw = d.facts.hw_queue_depth.unwrap_or(0);
    let sched = d.facts.scheduler.as_deref().unwrap_or("none");
    // Without a scheduler nr_requests is the driver's own depth: raising it is not possible.
    let advice = if sched != "none" || limit < hw {
        format!(
            "raise nr_requests (echo {} > /sys/block/{}/queue/nr_requests), or lower the issuers' queue depth: submitters beyond the limit sleep for a free request before the block layer sees them",
            (nr * 4).min(1024).max(nr + 1),
            d.dev
        )
    } else {
        "the device's own queue (its driver tags) is full: the device is saturated; spread the load over more devices or lower the issuers' queue depth".to_string()
    };
    Some(
        Finding {
            tool: super::INFO.name,
            cause: super::IO_QUEUE,
            subject: Subject::named("device", d.dev.clone()),
            culprit: culprit(top, d.count),
            score: score(d.sync_time_ns, d.count, secs),
            summary: format!(
                "{}: requests at nr_requests ({nr}{}) {full:.0} % of the window (in flight mean {:.1}, queued mean {:.1}; device queue depth {hw}).",
                d.dev,
                if limit != nr { format!(" × {} hardware queues", limit / nr.max(1)) } else { String::new() },
                d.depth.inflight_mean.unwrap_or(0.0),
                d.depth.queued_mean.unwrap_or(0.0),
            ),
            evidence: vec![],
            advice,
            next: Some(format!("tracekit io-lat --dev {} --interval 1s --duration 30s", d.dev)),
            fold: None,
            members: Vec::new(),
        }
        .evidence("full_pct", full)
        .evidence("nr_requests", nr)
        .evidence("queue_limit", limit)
        .evidence("hw_queue_depth", hw)
        .evidence("inflight_max", d.depth.inflight_max.unwrap_or(0))
        .evidence("queued_max", d.depth.queued_max.unwrap_or(0))
        .evidence("requests", d.count),
    )
}

/// A busy device with one process behind most of its requests.
fn top_issuer(d: &DeviceRow, top: Option<&Issuer>, secs: f64) -> Option<Finding> {
    let t = top?;
    let share = t.count as f64 * 100.0 / d.count.max(1) as f64;
    if d.util_pct < BUSY_UTIL_PCT || share < TOP_SHARE_PCT || t.count < MIN_REQUESTS {
        return None;
    }
    let p99 = d.lat.total.s.p99_ns;
    Some(
        Finding {
            tool: super::INFO.name,
            cause: crate::tools::io_lat::IO_LATENCY,
            subject: subject(t),
            culprit: None,
            // A kernel thread's waits (a loop device's worker, the flusher) are felt by whom it
            // serves, whose own findings carry that time (report::harm): its share of the device
            // ranks as a rate, after the victims.
            score: score(if t.kthread { 0 } else { t.sync_ns }, t.count, secs),
            summary: format!(
                "{} issues {share:.0} % of {}'s I/O ({} of {} requests, {:.0}/s); {} is busy {:.0} % of the time, p99 request {}.",
                who(t),
                d.dev,
                t.count,
                d.count,
                t.count as f64 / secs,
                d.dev,
                d.util_pct,
                fmt_ns(p99),
            ),
            evidence: vec![],
            advice: format!(
                "if other work on {} suffers, throttle this issuer (its cgroup's io.max or blkio.throttle, ionice -c3 for batch work) or move it to another device; if it is the workload that matters, the device is its limit",
                d.dev
            ),
            next: Some(format!(
                "tracekit io-lat --dev {} --pid {} --duration 30s",
                d.dev, t.pid
            )),
            fold: None,
            members: Vec::new(),
        }
        .evidence("share_pct", (share * 10.0).round() / 10.0)
        .evidence("requests", t.count)
        .evidence("device_requests", d.count)
        .evidence("util_pct", d.util_pct)
        .evidence("p99_ns", p99)
        .evidence("wait_ns", t.sync_ns),
    )
}

#[cfg(test)]
mod tests {
    use probes_common::io_lat::NSIZES;

    use super::*;
    use crate::{
        host::disks::QueueFacts,
        report::{findings::Num, who::Id},
        tools::io_lat::rows::Lats,
    };

    const VDA: u32 = 254 << 20;

    /// `n` requests of `ns` each.
    fn hist(n: u64, ns: u64) -> LatHist {
        let mut h = LatHist::ZERO;
        for _ in 0..n {
            h.record(ns);
        }
        h
    }

    /// `count` sync reads of 2 ms each on vda by `pid` (a kernel thread's async writes with
    /// `writeback`).
    fn issued(pid: u32, comm: &str, count: u64, writeback: bool) -> SummaryRow {
        let total = hist(count, 2_000_000);
        SummaryRow {
            dev: "vda".into(),
            major: 254,
            minor: 0,
            who: Id {
                pid,
                comm: comm.into(),
                comm_raw: comm.as_bytes().to_vec(),
                ..Default::default()
            },
            kthread: Some(writeback),
            cgroup_id: 0,
            cgroup: writeback.then(|| "/app".to_string()),
            cgroup_bytes: None,
            op: if writeback { "write" } else { "read" }.into(),
            sync: !writeback,
            count,
            iops: 0.0,
            bytes: count * 4096,
            bytes_per_s: 0.0,
            direct: 0,
            queued: 0,
            submitted: 0,
            errors: BTreeMap::new(),
            sizes: vec![],
            lat: Lats::of(&LatHist::ZERO, &total, &total, &LatHist::ZERO),
            other: false,
            cgroup_raw: vec![],
            kdev: VDA,
            sizes_raw: [0; NSIZES],
            device_hist: total,
            total_hist: total,
        }
    }

    /// vda with `count` requests of 2 ms, busy `util_pct` of the window; no queue trouble.
    fn vda(count: u64, util_pct: f64) -> DeviceRow {
        let total = hist(count, 2_000_000);
        DeviceRow {
            dev: "vda".into(),
            major: 254,
            minor: 0,
            facts: QueueFacts {
                scheduler: Some("none".into()),
                rotational: Some(false),
                ..Default::default()
            },
            queue_limit: None,
            count,
            iops: 0.0,
            bytes: count * 4096,
            bytes_per_s: 0.0,
            reads: count,
            writes: 0,
            discards: 0,
            diskstats_reads: Some(count),
            diskstats_writes: Some(0),
            diskstats_discards: None,
            diskstats_flushes: None,
            untracked_reads: 0,
            untracked_writes: 0,
            unseen_reads: Some(0),
            unseen_writes: Some(0),
            util_pct,
            aqu_sz: 0.0,
            sync_time_ns: total.sum,
            queue_share_pct: 0.0,
            lat: Lats::of(&LatHist::ZERO, &total, &total, &LatHist::ZERO),
            depth: Default::default(),
            kdev: VDA,
            by_op: BTreeMap::new(),
        }
    }

    fn ev(f: &Finding, name: &str) -> Num {
        f.evidence
            .iter()
            .find(|(k, _)| *k == name)
            .unwrap_or_else(|| panic!("no evidence {name}: {f:?}"))
            .1
    }

    #[test]
    fn one_process_behind_a_busy_device_is_named() {
        let rows = [
            issued(812, "fio", 930, false),
            issued(900, "cron", 70, false),
        ];
        let dev = vda(1000, 96.0);
        let p99 = dev.lat.total.s.p99_ns;
        assert!((1_900_000..=2_000_000).contains(&p99), "{p99}");
        let f = find(&rows, std::slice::from_ref(&dev), 10.0);
        assert_eq!(f.len(), 1, "{f:?}");
        let t = &f[0];
        assert_eq!(t.cause, crate::tools::io_lat::IO_LATENCY);
        assert_eq!(t.subject.kind, "process");
        assert_eq!(t.subject.pid, Some(812));
        assert_eq!(t.subject.name.as_deref(), Some("fio"));
        assert_eq!(
            t.summary,
            format!(
                "fio (pid 812) issues 93 % of vda's I/O (930 of 1000 requests, 93/s); vda is busy 96 % of the time, p99 request {}.",
                fmt_ns(p99)
            )
        );
        // It waited for its own reads: 930 × 2 ms in 10 s.
        assert_eq!(t.score, Score::NsPerS(186_000_000));
        assert_eq!(ev(t, "share_pct"), Num::F(93.0));
        assert_eq!(ev(t, "requests"), Num::U(930));
        assert_eq!(ev(t, "device_requests"), Num::U(1000));
        assert_eq!(ev(t, "util_pct"), Num::F(96.0));
        assert_eq!(ev(t, "wait_ns"), Num::U(1_860_000_000));
        assert!(t.advice.contains("io.max"), "{}", t.advice);
        assert_eq!(
            t.next.as_deref(),
            Some("tracekit io-lat --dev vda --pid 812 --duration 30s")
        );
    }

    #[test]
    fn top_issuer_needs_a_busy_device_and_most_of_its_requests() {
        let rows = [
            issued(812, "fio", 930, false),
            issued(900, "cron", 70, false),
        ];
        // Not busy enough.
        assert!(find(&rows, &[vda(1000, 40.0)], 10.0).is_empty());
        // Busy, but shared: 60 %.
        let shared = [
            issued(812, "fio", 600, false),
            issued(900, "cron", 400, false),
        ];
        assert!(find(&shared, &[vda(1000, 96.0)], 10.0).is_empty());
        // Too few requests to conclude from.
        let few = [issued(812, "fio", 40, false)];
        assert!(find(&few, &[vda(40, 96.0)], 10.0).is_empty());
        // tracekit's own I/O is never a finding.
        let me = [issued(std::process::id(), "tracekit", 1000, false)];
        assert!(find(&me, &[vda(1000, 96.0)], 10.0).is_empty());
    }

    #[test]
    fn writeback_issuer_is_shown_as_writeback_and_scored_by_rate() {
        let rows = [issued(95, "kworker/u8:3", 800, true)];
        let f = find(&rows, &[vda(800, 80.0)], 10.0);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(
            f[0].summary
                .starts_with("kworker/u8:3 (pid 95, writeback charged to /app) issues 100 % of vda's I/O (800 of 800 requests, 80/s)"),
            "{}",
            f[0].summary
        );
        // Nobody waits for async writeback: the request rate ranks it.
        assert_eq!(f[0].score, Score::RatePerS(80.0));
        assert_eq!(f[0].subject.cgroup.as_deref(), Some("/app"));
    }
}
