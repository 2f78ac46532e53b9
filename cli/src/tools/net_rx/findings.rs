//! net-rx's verdicts: for each culprit of the receive path, who (the socket's owner, the port,
//! the CPU, the device, the conntrack table), how much (drops per second, or NET_RX time per
//! second), the evidence as named numbers, the fix, and what to run next.

use std::collections::BTreeMap;

use super::{
    listen::{Accept, ListenRow},
    reasons,
    rows::{ConntrackRow, CpuRow, DeviceRow, DropRow, SockRow},
    INFO,
};
use crate::{
    host::sysctl,
    report::{
        findings::{self, Cause, Finding, Score, Subject},
        harm,
        render::fmt_ns,
    },
};

/// Below these a kind of drop is not worth a finding (a port scan's few NO_SOCKET drops).
const MIN_DROPS: u64 = 10;
const MIN_DROPS_PER_S: f64 = 1.0;
/// `NOT_SPECIFIED` is also what some normal frees report: only a high rate is worth a look.
const MIN_UNSPECIFIED_PER_S: f64 = 100.0;
/// NET_RX imbalance: the busiest CPU spends at least this much of its time in NET_RX…
const MIN_SOFTIRQ_NS_PER_S: u64 = 50_000_000;
/// …and carries at least this share of all NET_RX time.
const MIN_SHARE_PCT: f64 = 75.0;
/// Conntrack fill worth a warning even before it drops.
const CONNTRACK_FULL_PCT: f64 = 90.0;

/// Everything one window shows.
pub struct Evidence<'a> {
    pub drops: &'a [DropRow],
    pub socks: &'a [SockRow],
    /// Listening ports whose accept queue overflowed (see `listen`).
    pub listens: &'a [ListenRow],
    pub cpus: &'a [CpuRow],
    pub devices: &'a [DeviceRow],
    pub conntrack: &'a ConntrackRow,
    /// The window's protocol counters (`/proc/net/snmp`, `netstat`, `snmp6` deltas).
    pub counters: &'a BTreeMap<String, i64>,
    pub secs: f64,
    /// CPUs of the machine (an imbalance needs more than one).
    pub ncpus: usize,
}

fn worth(count: u64, secs: f64) -> bool {
    count >= MIN_DROPS && count as f64 / secs >= MIN_DROPS_PER_S
}

fn finding(cause: Cause, subject: Subject, score: Score, summary: String) -> Finding {
    Finding::new(INFO.name, cause, subject, score, summary)
}

fn with(mut f: Finding, advice: impl Into<String>, next: Option<String>) -> Finding {
    f.advice = advice.into();
    f.next = next;
    f
}

/// The window's length: `10.0s`, `350ms`.
fn dur(secs: f64) -> String {
    fmt_ns((secs * 1e9) as u64)
}

fn kib(b: u64) -> String {
    if b < 10 * 1024 {
        format!("{b} B")
    } else {
        format!("{} KiB", b / 1024)
    }
}

/// Every finding of the window, most harmful first.
pub fn findings(e: &Evidence) -> Vec<Finding> {
    let mut out = Vec::new();
    sockets(e, &mut out);
    listen_queues(e, &mut out);
    closed_ports(e, &mut out);
    backlog(e, &mut out);
    imbalance(e, &mut out);
    rings(e, &mut out);
    conntrack(e, &mut out);
    other_reasons(e, &mut out);
    findings::rank(&mut out);
    out
}

/// Packets of `proto` the node delivered to its readers in the window: datagrams read (UDP's
/// InDatagrams counts at `recvmsg`), segments received (TCP's InSegs, both families). The
/// kernel keeps no such count per socket: the node's is a bound from above on any socket's.
fn delivered(e: &Evidence, proto: &str) -> Option<u64> {
    let keys: &[&str] = match proto {
        "udp" => &[
            "Udp:InDatagrams",
            "Udp6:InDatagrams",
            "UdpLite:InDatagrams",
            "UdpLite6:InDatagrams",
        ],
        "tcp" => &["Tcp:InSegs"],
        _ => return None,
    };
    Some(
        keys.iter()
            .map(|k| e.counters.get(*k).copied().unwrap_or(0).max(0) as u64)
            .sum(),
    )
}

/// A receiver whose socket buffer overflowed, scored by the share of its traffic it lost
/// (`harm::lost_share_ns_per_s`), at least: what the node delivered stands in for its own.
fn sockets(e: &Evidence, out: &mut Vec<Finding>) {
    let me = std::process::id();
    for s in e.socks.iter().filter(|s| {
        matches!(s.reason.as_str(), "SOCKET_RCVBUFF" | "SOCKET_BACKLOG")
            && worth(s.count, e.secs)
            && s.owner.pid != Some(me)
    }) {
        let who = match (s.owner.pid, &s.owner.comm) {
            (Some(p), Some(_)) => {
                format!("{} :{} ({}, pid {p})", s.proto, s.port, s.owner.comm_text())
            }
            _ => format!("{} :{} (no process holds it now)", s.proto, s.port),
        };
        let buffer = match (s.rcvbuf, s.full) {
            (Some(b), Some(f)) => format!(
                ", rcvbuf {} full {:.0} % of the drops",
                kib(b),
                f as f64 * 100.0 / s.count.max(1) as f64
            ),
            _ => match s.rx_queue {
                Some(q) => format!(
                    ", {} queued unread at the end (this kernel does not pass the socket to the drop hook, so its buffer at the drop is unknown)",
                    kib(q)
                ),
                None => String::new(),
            },
        };
        let subject = s
            .owner
            .subject()
            .unwrap_or_else(|| Subject::named("socket", format!("{}/{}", s.proto, s.port)));
        let rmem_max = sysctl("net.core.rmem_max").unwrap_or_else(|| "?".into());
        let got = delivered(e, &s.proto);
        let (score, lost) = match got {
            Some(d) => {
                let ns = harm::lost_share_ns_per_s(s.count, d);
                let meanwhile = match (s.proto.as_str(), d) {
                    ("tcp", _) => format!("the node received {d} segments meanwhile"),
                    (_, 0) => "no datagram was read on the node meanwhile".into(),
                    _ => format!("the node's readers took {d} datagrams meanwhile"),
                };
                (
                    Score::NsPerS(ns),
                    format!(
                        ": at least {:.1} % of what reached it lost ({meanwhile})",
                        ns as f64 / 1e7
                    ),
                )
            }
            None => (Score::RatePerS(s.rate_per_s), String::new()),
        };
        let mut f = finding(
            super::NET_DROPS,
            subject,
            score,
            format!(
                "{who}: {} drops in {} ({:.0}/s){lost}, {}{buffer}.",
                s.count,
                dur(e.secs),
                s.rate_per_s,
                s.reason
            ),
        )
        .evidence("drops", s.count)
        .evidence("drops_per_s", s.rate_per_s)
        .evidence("port", u64::from(s.port));
        if let Some(d) = got {
            f = f.evidence("delivered_on_node", d).evidence(
                "lost_share_ppm",
                harm::lost_share_ns_per_s(s.count, d) / 1_000,
            );
        }
        if let Some(b) = s.rcvbuf {
            f = f.evidence("rcvbuf_bytes", b);
        }
        if let Some(x) = s.full {
            f = f.evidence("full_drops", x);
        }
        let flag = if s.proto == "tcp" { "t" } else { "u" };
        out.push(with(
            f,
            format!("raise the socket's receive buffer (SO_RCVBUF; the kernel caps it at net.core.rmem_max = {rmem_max}) or read faster (more reader threads, SO_REUSEPORT, recvmmsg)"),
            Some(format!("ss -{flag}ampn 'sport = :{}'", s.port)),
        ));
    }
}

/// Listeners whose accept queue overflowed, from the kernel's counters (how many) and the
/// listeners full or dropped at (where); scored by the share of connection attempts lost.
fn listen_queues(e: &Evidence, out: &mut Vec<Finding>) {
    let a = Accept::of(e.counters);
    let lost = a.lost();
    if !worth(lost, e.secs) {
        return;
    }
    let rate = lost as f64 / e.secs;
    let share = harm::lost_share_ns_per_s(lost, a.passive_opens);
    let somaxconn = sysctl("net.core.somaxconn");
    let counted = format!(
        "TcpExt ListenOverflows +{}, ListenDrops +{}, SyncookiesSent +{}; {:.1} % of connection attempts (Tcp PassiveOpens +{})",
        a.overflows,
        a.drops,
        a.cookies_sent,
        share as f64 / 1e7,
        a.passive_opens
    );
    let evidence = |f: Finding| {
        f.evidence("listen_overflows", a.overflows)
            .evidence("listen_drops", a.drops)
            .evidence("syncookies_sent", a.cookies_sent)
            .evidence("passive_opens", a.passive_opens)
            .evidence("lost_share_ppm", share / 1_000)
            .evidence("drops_per_s", rate)
    };
    if e.listens.is_empty() {
        let f = finding(
            super::LISTEN_OVERFLOW,
            Subject::named("system", "accept queues"),
            Score::NsPerS(share),
            format!(
                "{lost} handshakes dropped at full accept queues in {} ({rate:.0}/s; {counted}), each costing its client a retransmission (a second or more); no listener was full at the end and no drop named a port.",
                dur(e.secs)
            ),
        );
        out.push(with(
            evidence(f),
            "find the listener with `ss -ltn` while it happens (Recv-Q at Send-Q is full), then accept faster or raise its backlog",
            Some("watch -n1 \"ss -ltn; nstat -az TcpExtListenOverflows TcpExtListenDrops\"".into()),
        ));
        return;
    }
    let node_wide = if e.listens.len() > 1 {
        " (node-wide counters)"
    } else {
        ""
    };
    for l in e.listens {
        let holders = match (l.owner.pid, l.pids.len()) {
            (Some(p), 1) => format!("{}, pid {p}", l.owner.comm_text()),
            (Some(p), n) => format!(
                "{}, pid {p}, one of {n} processes holding it: {}",
                l.owner.comm_text(),
                l.pids
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            _ => "no process holds it now".into(),
        };
        let drops = if l.drops > 0 {
            format!("; drops to the port: {}", l.drop_reasons)
        } else {
            String::new()
        };
        let limit = match somaxconn.as_deref().and_then(|s| s.parse::<u64>().ok()) {
            Some(m) if l.backlog >= m => format!("backlog {} = net.core.somaxconn", l.backlog),
            Some(m) => format!(
                "backlog {} from listen(), below net.core.somaxconn {m}",
                l.backlog
            ),
            None => format!("backlog {}", l.backlog),
        };
        let subject = l
            .owner
            .subject()
            .unwrap_or_else(|| Subject::named("socket", format!("tcp/{}", l.port)));
        let f = finding(
            super::LISTEN_OVERFLOW,
            subject,
            Score::NsPerS(share),
            format!(
                "tcp/{} ({holders}): accept queue full, {lost} handshakes dropped in {} ({rate:.0}/s; {counted}){node_wide}, each costing its client a retransmission (a second or more); {limit}, {} waiting at the end{drops}.",
                l.port,
                dur(e.secs),
                l.queued
            ),
        )
        .evidence("port", u64::from(l.port))
        .evidence("backlog", l.backlog)
        .evidence("queued", l.queued)
        .evidence("port_drops", l.drops);
        let m = somaxconn.clone().unwrap_or_else(|| "?".into());
        let advice = if somaxconn
            .as_deref()
            .and_then(|s| s.parse::<u64>().ok())
            .is_some_and(|m| l.backlog >= m)
        {
            format!("the backlog is capped by net.core.somaxconn ({m}): raise it (sysctl -w net.core.somaxconn=4096) and the application's listen() backlog (nginx `listen {} backlog=4096`, Redis `tcp-backlog`), then restart the service so listen() runs again; and accept faster (more workers)", l.port)
        } else {
            format!("the application's listen() backlog ({}) is the limit: raise it in its configuration (nginx `listen {} backlog=N`, Redis `tcp-backlog`) and restart it; net.core.somaxconn ({m}) caps it; and accept faster (more workers)", l.backlog, l.port)
        };
        out.push(with(
            evidence(f),
            advice,
            Some(format!("ss -ltnp 'sport = :{}'", l.port)),
        ));
    }
}

/// Packets to ports nobody listens on.
fn closed_ports(e: &Evidence, out: &mut Vec<Finding>) {
    let mut by_port: BTreeMap<(&str, u16), (u64, &DropRow)> = BTreeMap::new();
    for d in e
        .drops
        .iter()
        .filter(|d| d.reason == "NO_SOCKET" && d.port != 0 && !d.listened)
    {
        by_port
            .entry((d.proto.as_str(), d.port))
            .or_insert((0, d))
            .0 += d.count;
    }
    for ((proto, port), (count, d)) in by_port {
        if !worth(count, e.secs) {
            continue;
        }
        let rate = count as f64 / e.secs;
        let what = if proto == "tcp" {
            "connection attempts refused"
        } else {
            "packets dropped"
        };
        let f = finding(
            super::NET_DROPS,
            Subject::named("socket", format!("{proto}/{port}")),
            Score::RatePerS(rate),
            format!(
                "nobody listens on {proto}/{port}: {count} {what} in {} ({rate:.0}/s), sent to {}.",
                dur(e.secs),
                if d.daddr.is_empty() { "?" } else { &d.daddr },
            ),
        )
        .evidence("drops", count)
        .evidence("drops_per_s", rate)
        .evidence("port", u64::from(port));
        out.push(with(
            f,
            format!("start the service that should listen on {proto}/{port} (or correct the port it binds or the senders use), or stop what sends there"),
            Some(format!("tcpdump -ni any {proto} dst port {port} -c 20")),
        ));
    }
}

/// CPUs whose input backlog overflowed (softnet_stat `dropped`).
fn backlog(e: &Evidence, out: &mut Vec<Finding>) {
    let total: u64 = e.cpus.iter().map(|c| c.backlog_drops).sum();
    if total == 0 {
        return;
    }
    let Some(top) = e.cpus.iter().max_by_key(|c| c.backlog_drops) else {
        return;
    };
    let rate = total as f64 / e.secs;
    let max = sysctl("net.core.netdev_max_backlog").unwrap_or_else(|| "?".into());
    // Packets the CPUs' receive path took in (softnet_stat `processed`) beside those their
    // backlogs refused: the share lost, of every receiver behind those CPUs.
    let processed: u64 = e.cpus.iter().map(|c| c.processed).sum();
    let score = harm::lost_share_ns_per_s(total, processed);
    let f = finding(
        super::NET_BACKLOG,
        Subject::named("cpu", format!("CPU {}", top.cpu)),
        Score::NsPerS(score),
        format!(
            "{total} packets dropped in {} because a CPU's input backlog was full (net.core.netdev_max_backlog = {max}), {:.1} % of the {} that reached the CPUs' receive path; CPU {} dropped {}.",
            dur(e.secs), score as f64 / 1e7, total + processed, top.cpu, top.backlog_drops
        ),
    )
    .evidence("backlog_drops", total)
    .evidence("processed", processed)
    .evidence("lost_share_ppm", score / 1_000)
    .evidence("drops_per_s", rate)
    .evidence("cpu", top.cpu);
    out.push(with(
        f,
        "raise net.core.netdev_max_backlog, and spread receive work over CPUs with RPS (/sys/class/net/DEV/queues/rx-N/rps_cpus) or more NIC queues",
        Some("cat /proc/net/softnet_stat".into()),
    ));
}

/// One CPU doing most of the NET_RX softirq work.
fn imbalance(e: &Evidence, out: &mut Vec<Finding>) {
    let total: u64 = e.cpus.iter().filter_map(|c| c.softirq_ns).sum();
    let Some(top) = e.cpus.iter().max_by_key(|c| c.softirq_ns.unwrap_or(0)) else {
        return;
    };
    let top_ns = top.softirq_ns.unwrap_or(0);
    let per_s = (top_ns as f64 / e.secs) as u64;
    let share = top.share_pct.unwrap_or(0.0);
    if e.ncpus < 2 || total == 0 || per_s < MIN_SOFTIRQ_NS_PER_S || share < MIN_SHARE_PCT {
        return;
    }
    let on_cpu: Vec<String> = e
        .devices
        .iter()
        .filter(|d| {
            !d.irqs.is_empty()
                && d.irqs.iter().all(|i| {
                    i.per_cpu.keys().all(|c| *c == top.cpu)
                        || i.affinity.as_deref() == Some(&[top.cpu][..])
                })
        })
        .map(|d| shown(&d.dev))
        .collect();
    let busiest = e.devices.iter().max_by_key(|d| d.rx_packets);
    let loopback = busiest.is_some_and(|d| d.dev == "lo");
    let mut why = String::new();
    if !on_cpu.is_empty() {
        why = format!(" ({} interrupts all on CPU {})", on_cpu.join(", "), top.cpu);
    }
    if let Some(d) = busiest.filter(|d| d.rps_cpus.values().all(Vec::is_empty) && !loopback) {
        why.push_str(&format!("; RPS off on {}", shown(&d.dev)));
    }
    let f = finding(
        super::SOFTIRQ_IMBALANCE,
        Subject::named("cpu", format!("CPU {}", top.cpu)),
        Score::NsPerS(per_s),
        format!(
            "CPU {} handles {share:.0} % of NET_RX softirq time: {} in {} ({:.1} % of that CPU){why}.",
            top.cpu,
            fmt_ns(top_ns),
            dur(e.secs),
            top.softirq_pct.unwrap_or(0.0)
        ),
    )
    .evidence("softirq_ns", top_ns)
    .evidence("share_pct", share)
    .evidence("cpu", top.cpu)
    .evidence("full_budget_polls", top.squeezed.unwrap_or(0))
    .evidence("time_squeeze", top.time_squeeze);
    let advice = if loopback {
        "loopback traffic runs NET_RX on the sending CPU: spread the senders over CPUs".to_string()
    } else {
        "spread the device's queue interrupts over CPUs (/proc/irq/N/smp_affinity_list or irqbalance), add queues (ethtool -L DEV combined N), or enable RPS (echo MASK > /sys/class/net/DEV/queues/rx-0/rps_cpus)".to_string()
    };
    out.push(with(
        f,
        advice,
        Some("grep -E 'CPU|eth|virtio|mlx|ixgbe|i40e' /proc/interrupts".into()),
    ));
}

/// A device name as findings print it: escapes shown (`\x1b`), never sent to the terminal.
fn shown(dev: &str) -> String {
    crate::report::sanitize::text(dev.as_bytes())
}

/// Drops the NIC counted: its receive ring was full.
fn rings(e: &Evidence, out: &mut Vec<Finding>) {
    for d in e.devices {
        // rx_dropped counts ring overflows on most physical NICs; on virtual devices it also
        // counts unknown protocols, so only devices with a ring include it.
        let lost = d.ring_drops() + if d.ring.is_some() { d.rx_dropped } else { 0 };
        if !worth(lost, e.secs) {
            continue;
        }
        let rate = lost as f64 / e.secs;
        let ring = match d.ring {
            Some(r) => format!("; ring {} of max {}", r.rx, r.rx_max),
            None => String::new(),
        };
        let f = finding(
            super::NET_DROPS,
            Subject::named("device", shown(&d.dev)),
            Score::RatePerS(rate),
            format!(
                "{}: {lost} packets lost at the NIC in {} (rx_missed_errors +{}, rx_fifo_errors +{}, rx_over_errors +{}, rx_dropped +{}){ring}.",
                shown(&d.dev),
                dur(e.secs),
                d.rx_missed_errors, d.rx_fifo_errors, d.rx_over_errors, d.rx_dropped
            ),
        )
        .evidence("drops", lost)
        .evidence("drops_per_s", rate);
        let advice = match d.ring {
            Some(r) if r.rx < r.rx_max => format!(
                "enlarge the receive ring (ethtool -G {} rx {}) and spread its interrupts over CPUs",
                shown(&d.dev), r.rx_max
            ),
            Some(_) => "the ring is at its maximum: add queues (ethtool -L) and spread their interrupts, or lower the per-packet cost (GRO, fewer iptables rules)".to_string(),
            None => format!("enlarge the receive ring (ethtool -G {} rx N) where the driver allows it", shown(&d.dev)),
        };
        out.push(with(
            f,
            advice,
            Some(format!(
                "ethtool -S {} | grep -iE 'drop|miss|fifo|over'",
                shown(&d.dev)
            )),
        ));
    }
}

/// A full connection-tracking table.
fn conntrack(e: &Evidence, out: &mut Vec<Finding>) {
    let c = e.conntrack;
    let lost = c.drop.unwrap_or(0) + c.early_drop.unwrap_or(0) + c.insert_failed.unwrap_or(0);
    let fill = c.fill_pct.unwrap_or(0.0);
    if !c.loaded || (lost == 0 && fill < CONNTRACK_FULL_PCT) {
        return;
    }
    let rate = lost as f64 / e.secs;
    let f = finding(
        super::CONNTRACK_FULL,
        Subject::named("system", "conntrack"),
        Score::RatePerS(rate),
        format!(
            "conntrack table {} of {} entries ({fill:.1} %); in {} {} new connections dropped, {} entries evicted early, {} inserts failed.",
            c.count.unwrap_or(0),
            c.max.unwrap_or(0),
            dur(e.secs),
            c.drop.unwrap_or(0),
            c.early_drop.unwrap_or(0),
            c.insert_failed.unwrap_or(0)
        ),
    )
    .evidence("entries", c.count.unwrap_or(0))
    .evidence("max", c.max.unwrap_or(0))
    .evidence("dropped", lost);
    out.push(with(
        f,
        "raise net.netfilter.nf_conntrack_max (and the hash size, nf_conntrack_buckets), shorten the timeouts of idle entries, or exempt high-volume traffic from tracking (a notrack rule)",
        Some("conntrack -S".into()),
    ));
}

/// Drops of other reasons, one finding per reason; routine teardown and duplicates
/// (`reasons::routine`) are none.
fn other_reasons(e: &Evidence, out: &mut Vec<Finding>) {
    let covered = |r: &str| {
        matches!(
            r,
            "NO_SOCKET" | "CPU_BACKLOG" | "[other]" | "unknown" | "CONSUMED"
        ) || reasons::routine(r).is_some()
            || (r == "TCP_LISTEN_OVERFLOW" && Accept::of(e.counters).lost() > 0)
            || (matches!(r, "SOCKET_RCVBUFF" | "SOCKET_BACKLOG")
                && e.socks.iter().any(|s| s.reason == r))
    };
    // Drops to a port whose accept queue overflowed are that finding's evidence.
    let at_listener = |d: &DropRow| d.proto == "tcp" && e.listens.iter().any(|l| l.port == d.port);
    let mut by_reason: BTreeMap<&str, (u64, &DropRow)> = BTreeMap::new();
    for d in e
        .drops
        .iter()
        .filter(|d| !covered(&d.reason) && !at_listener(d))
    {
        // Rows are sorted by count: the first of a reason is its top place.
        by_reason.entry(&d.reason).or_insert((0, d)).0 += d.count;
    }
    for (reason, (count, top)) in by_reason {
        let rate = count as f64 / e.secs;
        let min = if reason == "NOT_SPECIFIED" {
            MIN_UNSPECIFIED_PER_S
        } else {
            MIN_DROPS_PER_S
        };
        if count < MIN_DROPS || rate < min {
            continue;
        }
        let mut place = vec![top.proto.clone()];
        if !top.daddr.is_empty() {
            place.push(match top.port {
                0 => format!("to {}", top.daddr),
                p => format!("to {}:{p}", top.daddr),
            });
        }
        if !top.dev.is_empty() {
            place.push(format!("on {}", shown(&top.dev)));
        }
        let f = finding(
            super::NET_DROPS,
            Subject::named("system", reason.to_string()),
            Score::RatePerS(rate),
            format!(
                "{count} packets dropped with reason {reason} in {} ({rate:.0}/s); most {} in {}.",
                dur(e.secs),
                place.join(" ").trim(),
                top.location
            ),
        )
        .evidence("drops", count)
        .evidence("drops_per_s", rate);
        // Every place of this reason, with the CPUs and the dropping functions.
        let next = Some(if reason == "NETFILTER_DROP" {
            "nft list ruleset".to_string()
        } else {
            format!("tracekit net-rx --duration 30s --rows 0 --json | jq -c 'select(.type==\"drop\" and .reason==\"{reason}\")'")
        });
        out.push(with(f, reasons::advice(reason), next));
    }
}
