//! irq-lat's findings: a CPU that takes most of a vector's (or of all hard-IRQ) time while
//! others could share it, and a CPU whose time goes to interrupt work.

use crate::report::units::{ppm, window_ppm};
use std::collections::BTreeMap;

use crate::{
    host::net::Irq,
    report::{
        findings::{rank, Finding, Score, Subject},
        render::fmt_ns,
    },
};

use super::{rows::*, INFO, IRQ_IMBALANCE, IRQ_STORM};

/// Below this a group's time is not worth an imbalance finding: 1 % of one CPU.
pub const MIN_IMBALANCE_PPM: u64 = 10_000;
/// The share of a group's time on one CPU that is an imbalance.
pub const IMBALANCE_SHARE_PPM: u64 = 800_000;
/// Interrupt work above this share of a CPU is a storm: 10 %.
pub const STORM_PPM: u64 = 100_000;

/// Softirq vectors whose work can be steered to other CPUs (RSS/RPS/XPS, completion
/// affinity); TIMER, HRTIMER, SCHED and RCU run where their CPU raised them.
const STEERABLE: [&str; 5] = ["NET_RX", "NET_TX", "BLOCK", "IRQ_POLL", "TASKLET"];

/// What to do about `r` (the IRQ or vector with the most time) and where to look next.
fn advice(r: &IrqRow, irqs: &[Irq]) -> (String, String) {
    let again = "tracekit irq-lat --duration 30s --interval 5s".to_string();
    if r.kind == "hard" {
        let aff = irqs
            .iter()
            .find(|i| i.irq == r.num)
            .and_then(|i| i.affinity.as_ref())
            .map(|a| {
                let l: Vec<String> = a.iter().map(u32::to_string).collect();
                format!(" (allowed CPUs now: {})", l.join(","))
            })
            .unwrap_or_default();
        let none = if r.unhandled * 10 >= r.count.max(1) {
            format!(
                "; {} of its {} runs returned IRQ_NONE: a shared or misrouted line, or a device that keeps interrupting",
                r.unhandled, r.count
            )
        } else {
            String::new()
        };
        return (
            format!(
                "spread the device's interrupts: more queues (ethtool -L <dev> combined N for a NIC, more hardware queues for a disk), each queue's IRQ on its own CPU via irqbalance or /proc/irq/{}/smp_affinity_list{aff}; fewer interrupts with coalescing (ethtool -C <dev> adaptive-rx on){none}",
                r.num
            ),
            again,
        );
    }
    match r.name.as_str() {
        "NET_RX" => (
            "spread receive work: RSS with more NIC queues (ethtool -L <dev> combined N) and their IRQs on different CPUs (irqbalance, /proc/irq/N/smp_affinity_list), or RPS for a single-queue NIC (/sys/class/net/<dev>/queues/rx-*/rps_cpus); loopback traffic runs NET_RX on the sending CPU, so spread the senders".into(),
            "tracekit net-rx --duration 10s".into(),
        ),
        "NET_TX" => (
            "spread transmit completion: XPS (/sys/class/net/<dev>/queues/tx-*/xps_cpus) and more queues, the senders on more CPUs".into(),
            "tracekit net-rx --duration 10s".into(),
        ),
        "BLOCK" => (
            "block completions land on one CPU: /sys/block/<dev>/queue/rq_affinity = 2 completes each request on the CPU that issued it; more hardware queues or the disk's IRQ on other CPUs".into(),
            "tracekit io-lat --duration 10s".into(),
        ),
        "TIMER" | "HRTIMER" => (
            "timers fire often on this CPU: look for processes with high-frequency timers (short sleeps, timerfd, polling loops) and move them, or coarsen their timers".into(),
            "tracekit ctxsw --duration 10s".into(),
        ),
        "RCU" => (
            "RCU callback processing: offload it from busy CPUs (rcu_nocbs= with rcutree.use_softirq=0), find who frees so much (mass unlink, short-lived sockets)".into(),
            again,
        ),
        "SCHED" => (
            "scheduler load balancing: many idle/busy transitions; pin or consolidate the chattiest threads".into(),
            "tracekit runq-lat --duration 10s".into(),
        ),
        _ => (
            "spread the work raising this softirq over more CPUs (its IRQs' affinity, the threads that raise it)".into(),
            again,
        ),
    }
}

/// One finding per imbalanced group and per drowning CPU, ranked.
pub fn findings(
    rows: &[IrqRow],
    cpus: &[CpuRow],
    irqs: &[Irq],
    ncpu: usize,
    secs: f64,
) -> Vec<Finding> {
    let window_ns = (secs * 1e9) as u64;
    let mut out = Vec::new();
    // Imbalance: per steerable vector, and hard IRQs as a whole (one MSI vector always runs on
    // one CPU: the question is whether all of the node's IRQ time does).
    if ncpu >= 2 {
        let mut groups: BTreeMap<String, Vec<&IrqRow>> = BTreeMap::new();
        for r in rows.iter().filter(|r| r.cpu.is_some()) {
            let g = if r.kind == "hard" {
                "hard IRQ".to_string()
            } else if STEERABLE.contains(&r.name.as_str()) {
                r.what()
            } else {
                continue;
            };
            groups.entry(g).or_default().push(r);
        }
        for (group, rs) in groups {
            let total: u64 = rs.iter().map(|r| r.total_ns).sum();
            if total == 0 || window_ppm(total, secs) < MIN_IMBALANCE_PPM {
                continue;
            }
            let mut per_cpu: BTreeMap<u32, u64> = BTreeMap::new();
            for r in &rs {
                *per_cpu.entry(r.cpu.unwrap_or(0)).or_default() += r.total_ns;
            }
            let Some((&cpu, &on)) = per_cpu.iter().max_by_key(|(c, ns)| (**ns, u32::MAX - **c))
            else {
                continue;
            };
            let share = ppm(on, total as f64);
            if share < IMBALANCE_SHARE_PPM {
                continue;
            }
            let top = rs
                .iter()
                .filter(|r| r.cpu == Some(cpu))
                .max_by_key(|r| r.total_ns)
                .copied()
                .unwrap_or(rs[0]);
            let (advice, next) = advice(top, irqs);
            let runs: u64 = rs
                .iter()
                .filter(|r| r.cpu == Some(cpu))
                .map(|r| r.count)
                .sum();
            let mut f = Finding::new(
                INFO.name,
                IRQ_IMBALANCE,
                Subject::named("cpu", format!("CPU {cpu}")),
                Score::NsPerS((on as f64 / secs) as u64),
                format!(
                    "CPU {cpu} takes {:.0} % of the node's {group} time ({} of {} in {}, {:.1} % of the CPU, {runs} runs); most of it {}.",
                    share as f64 / 1e4,
                    fmt_ns(on),
                    fmt_ns(total),
                    fmt_ns(window_ns),
                    window_ppm(on, secs) as f64 / 1e4,
                    top.what(),
                ),
            )
            .evidence("cpu", cpu as u64)
            .evidence("group_ns", total)
            .evidence("cpu_ns", on)
            .evidence("share_ppm", share)
            .evidence("cpu_ppm", window_ppm(on, secs))
            .evidence("runs", runs)
            .evidence("top_num", top.num as u64)
            .evidence("top_ns", top.total_ns)
            .evidence("cpus", ncpu as u64)
            .evidence("window_ns", window_ns);
            f.advice = advice;
            f.next = Some(next);
            out.push(f);
        }
    }
    // Storm: a CPU whose time goes to interrupt work.
    for c in cpus.iter().filter(|c| c.irq_ppm >= STORM_PPM) {
        let Some(top) = rows
            .iter()
            .filter(|r| r.cpu == Some(c.cpu))
            .max_by_key(|r| r.total_ns)
        else {
            continue;
        };
        let (advice, next) = advice(top, irqs);
        let total = c.hard_ns + c.soft_ns;
        let mut f = Finding::new(
            INFO.name,
            IRQ_STORM,
            Subject::named("cpu", format!("CPU {}", c.cpu)),
            Score::NsPerS((total as f64 / secs) as u64),
            format!(
                "CPU {} spends {:.1} % of its time in interrupt work ({} in {}: hard IRQs {} in {} runs, softirqs {} in {} runs); most of it {} ({}, {} runs, p99 {}).",
                c.cpu,
                c.irq_ppm as f64 / 1e4,
                fmt_ns(total),
                fmt_ns(window_ns),
                fmt_ns(c.hard_ns),
                c.hard_count,
                fmt_ns(c.soft_ns),
                c.soft_count,
                top.what(),
                fmt_ns(top.total_ns),
                top.count,
                fmt_ns(top.lat.s.p99_ns),
            ),
        )
        .evidence("cpu", c.cpu as u64)
        .evidence("irq_ns", total)
        .evidence("hard_ns", c.hard_ns)
        .evidence("soft_ns", c.soft_ns)
        .evidence("cpu_ppm", c.irq_ppm)
        .evidence("top_num", top.num as u64)
        .evidence("top_ns", top.total_ns)
        .evidence("top_runs", top.count)
        .evidence("top_unhandled", top.unhandled)
        .evidence("window_ns", window_ns);
        f.advice = advice;
        f.next = Some(next);
        out.push(f);
    }
    rank(&mut out);
    out
}
