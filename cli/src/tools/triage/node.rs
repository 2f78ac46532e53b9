//! The node checks `triage` runs beside the collectors, from counters the kernel keeps anyway
//! (no BPF): CPU steal per CPU (/proc/stat), pressure stall information (/proc/pressure),
//! memory cgroups hitting their limit (v1 `memory.failcnt`, v2 `memory.events`), swapping
//! (/proc/vmstat), conntrack fill, backlog drops (/proc/net/softnet_stat). Each is a `Collector`
//! like any tool, so the engine windows it with the others.

use std::collections::BTreeMap;

use serde_json::json;

use crate::{
    engine::{Collector, Meta, Output, Window},
    error::Result,
    host::{
        cgroup::{Layout, MemoryCounters},
        memcg,
        net::{self, Conntrack, Softnet},
        psi::{self, Psi},
        sysstat::SysStat,
        vmstat::Vmstat,
    },
    report::findings::{Cause, Finding, Score, Subject},
};

/// Steal worth a finding: 5 % of a CPU's time on average, or 10 % on any one CPU. Below that a
/// busy hypervisor costs less than the run-queue noise of a shared node; above it, every
/// latency on the node stretches by that share.
const STEAL_MEAN_PPM: u64 = 50_000;
const STEAL_ANY_PPM: u64 = 100_000;
/// Pressure worth a finding (share of the window some tasks stalled): CPU 20 %, memory 5 %
/// (or 1 % with every task stalled: `full`), I/O 10 %. CPU pressure is normal on a busy node;
/// memory stalls are not.
const PSI_SOME_PPM: [(&str, u64); 3] = [("cpu", 200_000), ("memory", 50_000), ("io", 100_000)];
const PSI_FULL_MEMORY_PPM: u64 = 10_000;
/// Swapping worth a finding: 100 pages/s in or out.
const SWAP_PAGES_PER_S: f64 = 100.0;
/// Conntrack fill worth a finding.
const CONNTRACK_FILL_PCT: u64 = 90;

pub struct Node {
    layout: Layout,
    stat: Option<SysStat>,
    psi: BTreeMap<&'static str, Psi>,
    /// When `psi` was read: PSI totals are shares of their own span, not the engine's window
    /// (read a few ms apart; a ratio over the wrong span read 100.7 % on a saturated node).
    psi_at: std::time::Instant,
    vm: Option<Vmstat>,
    memcg: BTreeMap<String, MemoryCounters>,
    conntrack: Option<Conntrack>,
    softnet: Vec<Softnet>,
}

impl Node {
    pub fn open() -> Node {
        let layout = Layout::detect();
        Node {
            stat: SysStat::read().ok(),
            psi: psi::system(),
            psi_at: std::time::Instant::now(),
            vm: Vmstat::read().ok(),
            memcg: memcg::snapshot(&layout),
            conntrack: net::conntrack(),
            softnet: net::softnet().unwrap_or_default(),
            layout,
        }
    }

    /// What the node checks looked at, for triage's `checked` line.
    pub fn checks() -> &'static [&'static str] {
        &[
            "cpu steal (/proc/stat)",
            "pressure (/proc/pressure)",
            "memory cgroups at their limit",
            "swap (/proc/vmstat)",
            "conntrack fill",
            "backlog drops (/proc/net/softnet_stat)",
        ]
    }
}

fn finding(
    cause: Cause,
    subject: Subject,
    score: Score,
    summary: String,
    advice: &str,
    next: &str,
) -> Finding {
    Finding {
        advice: advice.into(),
        next: Some(next.into()),
        ..Finding::new("triage", cause, subject, score, summary)
    }
}

/// Steal is capacity the node lost, like a saturation of its own CPUs: every CPU-bound task slows
/// by that share, and a latency-sensitive one feels it as the stolen part of its waits, which
/// runq-lat charges to the hypervisor in that process's own finding. Its score (the mean share
/// of a second) is no victim's time, so it ranks below every finding that names a process that
/// lost time (on a fresh guest at 11 % steal, 112 ms/s ranked above a sleeper whose wakeups
/// waited up to 4 ms behind two hogs, 17 ms/s of excess by its own clock); alone, it is first.
pub(super) fn rank_steal_below_victims(f: &mut [Finding]) {
    let Some(floor) = f
        .iter()
        .filter(|x| x.tool != "triage" && x.subject.pid.is_some())
        .filter_map(|x| match x.score {
            Score::NsPerS(v) if v > 0 => Some(v),
            _ => None,
        })
        .min()
    else {
        return;
    };
    for x in f.iter_mut().filter(|x| x.cause == super::CPU_STEAL) {
        x.rank_below(Score::NsPerS(floor));
    }
}

impl Collector for Node {
    fn name(&self) -> &'static str {
        "node"
    }

    fn meta(&self) -> Meta {
        Meta {
            tool: "node",
            what: "node counters".into(),
            scope: "the node".into(),
            programs: json!([]),
            programs_text: "no kernel programs".into(),
            ..Default::default()
        }
    }

    fn flip(&mut self) -> Result<()> {
        Ok(())
    }

    fn collect(&mut self, w: &Window) -> Result<Output> {
        let secs = w.secs();
        let mut out = Output::default();
        let mut f = Vec::new();

        if let (Some(before), Ok(now)) = (&self.stat, SysStat::read()) {
            let steal: Vec<u64> = now
                .steal_pct(before)
                .iter()
                .map(|p| p.map(|p| (p * 10_000.0) as u64).unwrap_or(0))
                .collect();
            let mean = steal.iter().sum::<u64>() / steal.len().max(1) as u64;
            let max = steal.iter().copied().max().unwrap_or(0);
            out.extra_json
                .push(json!({"type": "node", "check": "cpu-steal", "steal_ppm": steal}));
            if mean >= STEAL_MEAN_PPM || max >= STEAL_ANY_PPM {
                let per: Vec<String> = steal
                    .iter()
                    .enumerate()
                    .map(|(i, s)| format!("CPU {i} {:.1} %", *s as f64 / 10_000.0))
                    .collect();
                let mut x = finding(
                    super::CPU_STEAL,
                    Subject::named("system", "the node"),
                    Score::NsPerS(mean * 1_000),
                    format!(
                        "The hypervisor took {:.1} % of the CPUs' time on average ({}): every task's latency stretches by that share.",
                        mean as f64 / 10_000.0,
                        per.join(", ")
                    ),
                    "the host is oversubscribed: ask the provider for dedicated CPUs (or a larger instance), move noisy neighbours off the host, or stop overcommitting vCPUs on it",
                    "tracekit runq-lat --duration 30s",
                )
                .evidence("steal_mean_ppm", mean)
                .evidence("steal_max_ppm", max);
                x.evidence.push(("window_ns", ((secs * 1e9) as u64).into()));
                f.push(x);
            }
            self.stat = Some(now);
        }

        let psi_now = psi::system();
        let psi_secs = self.psi_at.elapsed().as_secs_f64();
        self.psi_at = std::time::Instant::now();
        for (res, some_min) in PSI_SOME_PPM {
            let (Some(a), Some(b)) = (self.psi.get(res), psi_now.get(res)) else {
                continue;
            };
            let (some, full) = b.share_ppm(a, psi_secs);
            out.extra_json.push(json!({"type": "node", "check": "pressure", "resource": res, "some_ppm": some, "full_ppm": full}));
            let full_hit = res == "memory" && full.is_some_and(|x| x >= PSI_FULL_MEMORY_PPM);
            if some >= some_min || full_hit {
                let (advice, next) = match res {
                    "memory" => ("find who stalls in reclaim or compaction and why (a cgroup limit, THP defrag, too little free memory)", "tracekit memstall --duration 30s"),
                    "io" => ("find the device and the process behind the I/O wait", "tracekit io-lat --duration 30s"),
                    _ => ("find who waits for a CPU and who holds it", "tracekit runq-lat --duration 30s"),
                };
                f.push(
                    finding(
                        super::PRESSURE,
                        Subject::named("system", format!("{res} pressure")),
                        // A symptom, node-wide: ranked after the findings that name who lost
                        // time, as the share of the window in percent.
                        Score::RatePerS(some as f64 / 10_000.0),
                        format!(
                            "Some tasks were stalled on {res} {:.1} % of the window{} (/proc/pressure/{res}).",
                            some as f64 / 10_000.0,
                            full.map(|x| format!(", all tasks {:.1} %", x as f64 / 10_000.0)).unwrap_or_default()
                        ),
                        advice,
                        next,
                    )
                    .evidence("some_ppm", some)
                    .evidence("full_ppm", full.unwrap_or(0)),
                );
            }
        }
        self.psi = psi_now;

        if let (Some(before), Ok(now)) = (&self.vm, Vmstat::read()) {
            let d = now.since(before);
            let swap = d.get("pswpin").unwrap_or(0) + d.get("pswpout").unwrap_or(0);
            let rate = swap as f64 / secs;
            if rate >= SWAP_PAGES_PER_S {
                f.push(
                    finding(
                        crate::tools::memstall::RECLAIM,
                        Subject::named("system", "the node"),
                        Score::RatePerS(rate),
                        format!(
                            "The node is swapping: {} pages in, {} out in {secs:.0} s ({rate:.0} pages/s); every task touching swapped memory waits on the disk.",
                            d.get("pswpin").unwrap_or(0),
                            d.get("pswpout").unwrap_or(0)
                        ),
                        "memory is overcommitted: lower the working sets or the cgroup limits that force it out, add memory, or lower vm.swappiness",
                        "tracekit memstall --duration 30s",
                    )
                    .evidence("pswpin", d.get("pswpin").unwrap_or(0))
                    .evidence("pswpout", d.get("pswpout").unwrap_or(0)),
                );
            }
            self.vm = Some(now);
        }

        let mc = memcg::snapshot(&self.layout);
        for (path, now) in &mc {
            let Some(before) = self.memcg.get(path) else {
                continue;
            };
            let hits = now.hit_limit().saturating_sub(before.hit_limit());
            let ooms = now.oom_kills().saturating_sub(before.oom_kills());
            if hits == 0 && ooms == 0 {
                continue;
            }
            let cause = if ooms > 0 {
                crate::tools::memstall::OOM_KILL
            } else {
                crate::tools::memstall::MEMCG_LIMIT
            };
            let limit = now
                .limit_bytes
                .map(|l| format!(" ({} MiB limit)", l >> 20))
                .unwrap_or_default();
            f.push(
                finding(
                    cause,
                    Subject::named("cgroup", path.clone()).with_cgroup(Some(path.clone())),
                    Score::RatePerS(hits as f64 / secs),
                    format!(
                        "Memory cgroup {path}{limit} hit its limit {hits} times in {secs:.0} s{}: its processes reclaim (stall) on every allocation over it.",
                        if ooms > 0 { format!(", and {ooms} process(es) in it were OOM-killed") } else { String::new() }
                    ),
                    "raise the cgroup's limit (memory.max on v2, memory.limit_in_bytes on v1) or shrink its working set (page cache counts: O_DIRECT or posix_fadvise DONTNEED for streaming writes)",
                    "tracekit memstall --duration 30s",
                )
                .evidence("hit_limit", hits)
                .evidence("oom_kills", ooms)
                .evidence("limit_bytes", now.limit_bytes.unwrap_or(0)),
            );
        }
        self.memcg = mc;

        if let Some(now) = net::conntrack() {
            let fill = now.count * 100 / now.max.max(1);
            let before = self.conntrack.as_ref();
            let delta = |k: &str| {
                now.stats
                    .get(k)
                    .copied()
                    .unwrap_or(0)
                    .saturating_sub(before.and_then(|b| b.stats.get(k).copied()).unwrap_or(0))
            };
            let (drop, failed, early) =
                (delta("drop"), delta("insert_failed"), delta("early_drop"));
            if fill >= CONNTRACK_FILL_PCT || drop + failed + early > 0 {
                f.push(
                    finding(
                        crate::tools::net_rx::CONNTRACK_FULL,
                        Subject::named("system", "conntrack table"),
                        Score::RatePerS((drop + failed + early) as f64 / secs),
                        format!(
                            "The conntrack table holds {} of {} entries ({fill} %); {drop} packets dropped, {failed} insert failures, {early} early drops in {secs:.0} s: new connections fail.",
                            now.count, now.max
                        ),
                        "raise net.netfilter.nf_conntrack_max (and the hash size), shorten the timeouts of idle states, or exempt high-rate traffic from tracking (NOTRACK)",
                        "tracekit net-rx --duration 30s",
                    )
                    .evidence("entries", now.count)
                    .evidence("max", now.max)
                    .evidence("drops", drop)
                    .evidence("insert_failed", failed),
                );
            }
            self.conntrack = Some(now);
        }

        let sn = net::softnet().unwrap_or_default();
        let dropped: Vec<(u32, u64)> = sn
            .iter()
            .filter_map(|n| {
                let b = self.softnet.iter().find(|b| b.cpu == n.cpu)?;
                let d = n.since(b).dropped;
                (d > 0).then_some((n.cpu, d))
            })
            .collect();
        if !dropped.is_empty() {
            let total: u64 = dropped.iter().map(|x| x.1).sum();
            let per: Vec<String> = dropped
                .iter()
                .map(|(c, d)| format!("CPU {c}: {d}"))
                .collect();
            f.push(
                finding(
                    crate::tools::net_rx::NET_BACKLOG,
                    Subject::named("system", "receive backlog"),
                    Score::RatePerS(total as f64 / secs),
                    format!(
                        "{total} packets were dropped because a CPU's receive backlog was full ({}): net.core.netdev_max_backlog is too small for the bursts, or one CPU takes all the receive work.",
                        per.join(", ")
                    ),
                    "raise net.core.netdev_max_backlog, and spread receive work (RPS, or IRQ affinity across CPUs)",
                    "tracekit net-rx --duration 30s",
                )
                .evidence("backlog_drops", total),
            );
        }
        self.softnet = sn;

        out.title = format!("node: {} finding(s) from the kernel's counters", f.len());
        out.findings = f;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::runq_lat;

    fn steal(ppm: u64) -> Finding {
        finding(
            super::super::CPU_STEAL,
            Subject::named("system", "the node"),
            Score::NsPerS(ppm * 1_000),
            "steal".into(),
            "",
            "",
        )
    }

    /// The numbers of the fresh guest's run: 11.2 % steal against a sleeper's 17.1 ms/s.
    #[test]
    fn steal_ranks_below_a_process_that_lost_time_and_first_alone() {
        let victim = Finding::new(
            "runq-lat",
            runq_lat::RUNQ_DELAY,
            Subject::process(7, "sleeper"),
            Score::NsPerS(17_100_000),
            "waited".into(),
        );
        let mut f = vec![steal(111_961), victim];
        rank_steal_below_victims(&mut f);
        crate::report::findings::rank(&mut f);
        assert_eq!(f[0].subject.pid, Some(7), "{f:#?}");
        assert_eq!(f[1].cause, super::super::CPU_STEAL);
        assert_eq!(f[1].score, Score::NsPerS(17_099_999));

        let mut alone = vec![steal(111_961)];
        rank_steal_below_victims(&mut alone);
        assert_eq!(alone[0].score, Score::NsPerS(111_961_000));
    }
}
