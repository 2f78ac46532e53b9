//! net-rx's typed rows (one `Serialize` struct and one column spec each, for the text tables
//! and the NDJSON lines): drops by reason and place, receiving processes, CPUs, devices,
//! conntrack; and how each is built from a window's kernel maps and host counters.

use crate::report::units::or_dash;
use std::{
    collections::BTreeMap,
    ffi::OsString,
    net::{Ipv4Addr, Ipv6Addr},
    os::unix::ffi::OsStrExt,
};

use crate::report::schema::{Direction::*, Field, Rows};
use probes_common::net_rx::{CpuVal, DropKey, DropVal, SockKey, SockVal};
use serde::Serialize;

pub use super::devices::*;
use super::reasons::{self, proto_name, Reasons};
use crate::{
    host::{kallsyms::Symbolizer, net},
    report::{
        render::{fmt_bytes, fmt_ns},
        rows::Column,
        sanitize,
        who::Owner,
    },
};

/// Drops with one reason at one place (function, destination, device).
#[derive(Clone, Debug, Default, Serialize)]
pub struct DropRow {
    /// The kernel's name for the reason, `reason N` for a value it does not name, `unknown`
    /// on kernels without reasons where neither place nor counters tell.
    pub reason: String,
    /// The raw `enum skb_drop_reason` value (absent on kernels without reasons).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason_code: Option<u32>,
    /// `location`: inferred from the dropping function and the kernel's counters (no reasons).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason_from: Option<&'static str>,
    pub count: u64,
    pub rate_per_s: f64,
    pub bytes: u64,
    /// `udp`, `tcp`, `icmp`, … (empty when the packet had no IP header).
    pub proto: String,
    /// The ethertype (2048 IPv4, 34525 IPv6, 2054 ARP).
    pub l3proto: u16,
    pub daddr: String,
    /// Destination port, 0 when the protocol has none.
    pub port: u16,
    /// The device (lossy where its name is not UTF-8; then `dev_bytes` holds the exact bytes).
    pub dev: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dev_bytes: Option<Vec<u8>>,
    pub ifindex: u32,
    /// Drops per CPU (by CPU number, non-zero only).
    pub cpus: BTreeMap<u32, u64>,
    /// The dropping kernel function, `name+0xoff`.
    pub location: String,
    /// The process owning the socket these packets were for, where known.
    #[serde(flatten)]
    pub owner: Owner,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<&'static str>,
    /// Routine teardown or a duplicate (`reasons::routine`, its meaning in `note`): shown,
    /// never a finding.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub routine: bool,
    /// A `NO_SOCKET` drop to a port something listens on (TCP) or is bound to (UDP) when the
    /// window ends: not a closed port (a SYN-cookie ACK meeting a full accept queue is
    /// dropped so).
    #[serde(skip)]
    pub listened: bool,
    /// `nobody listens on udp/9999` for drops to a closed port.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finding: Option<String>,
}

impl crate::report::rows::Row for DropRow {
    fn container(&self) -> Option<&crate::report::who::InContainer> {
        Some(&self.owner.container)
    }
}

fn dest(r: &DropRow) -> String {
    match (r.daddr.contains(':'), r.port) {
        (_, 0) => r.daddr.clone(),
        (false, p) => format!("{}:{p}", r.daddr),
        (true, p) => format!("[{}]:{p}", r.daddr),
    }
}

pub(super) fn cpus_text(m: &BTreeMap<u32, u64>) -> String {
    match m.len() {
        0 => "-".into(),
        1 => m.keys().next().map(u32::to_string).unwrap_or_default(),
        _ => m
            .iter()
            .map(|(c, n)| format!("{c}:{n}"))
            .collect::<Vec<_>>()
            .join(","),
    }
}

pub(super) fn rate(r: f64) -> String {
    format!("{r:.1}")
}

const NET_DROP: &[Field] = &[
    Field::key("reason_code"),
    Field::count("count", LowerIsBetter).export(
        "tracekit_net_rx_drops",
        "Received packets dropped, by reason.",
    ),
    Field::stat("rate_per_s"),
    Field::count("bytes", LowerIsBetter),
    Field::key("l3proto"),
    Field::key("port"),
    Field::key("ifindex"),
    Field::key("pid"),
];

/// Drops by reason and place.
pub const DROP_ROWS: Rows = Rows {
    kind: "drop",
    labels: &["reason", "proto"],
    fields: &[NET_DROP],
    dists: &[],
};

pub const DROPS: &[Column<DropRow>] = &[
    Column::left("REASON", |r, _| {
        if r.routine {
            format!("{} (routine)", r.reason)
        } else {
            r.reason.clone()
        }
    }),
    Column::right("COUNT", |r, _| r.count.to_string()),
    Column::right("RATE/s", |r, _| rate(r.rate_per_s)),
    Column::left("PROTO", |r, _| r.proto.clone()),
    Column::left("DEST", |r, _| dest(r)),
    Column::left("DEV", |r, _| dev_text(&r.dev, &r.dev_bytes)),
    Column::left("CPU", |r, _| cpus_text(&r.cpus)),
    Column::right("PID", |r, _| or_dash(r.owner.pid.as_ref())),
    Column::left("COMM", |r, _| r.owner.comm_text()),
    Column::left("WHERE", |r, _| r.location.clone()),
];

/// A device name for the terminal, from its exact bytes.
pub(super) fn dev_text(dev: &str, bytes: &Option<Vec<u8>>) -> String {
    sanitize::text(bytes.as_deref().unwrap_or(dev.as_bytes()))
}

/// A device name's two JSON fields (see `report::sanitize`).
pub(super) fn dev_fields(dev: &OsString) -> (String, Option<Vec<u8>>) {
    sanitize::name_fields(dev.as_bytes())
}

/// What a window's rows are named with.
pub struct Names<'a> {
    pub reasons: &'a Reasons,
    pub syms: Option<&'a Symbolizer>,
    pub ifnames: &'a BTreeMap<u32, OsString>,
    /// Protocol counter deltas of the window (causes on kernels without reasons).
    pub counters: &'a BTreeMap<String, i64>,
}

fn daddr(k: &DropKey) -> String {
    match k.family {
        4 => Ipv4Addr::new(k.daddr[0], k.daddr[1], k.daddr[2], k.daddr[3]).to_string(),
        6 => Ipv6Addr::from(k.daddr).to_string(),
        _ => String::new(),
    }
}

pub(super) fn per_cpu<V>(vals: &[V], f: impl Fn(&V) -> u64) -> BTreeMap<u32, u64> {
    vals.iter()
        .enumerate()
        .map(|(c, v)| (c as u32, f(v)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// Drop rows, most first, then the `[other]` row of drops that did not fit the map.
pub fn drop_rows(
    drops: &[(DropKey, Vec<DropVal>)],
    other: &[DropVal],
    n: &Names,
    secs: f64,
) -> Vec<DropRow> {
    let mut bound: BTreeMap<(String, u16), bool> = BTreeMap::new();
    let mut rows: Vec<DropRow> = drops
        .iter()
        .map(|(k, v)| {
            let count: u64 = v.iter().map(|x| x.count).sum();
            let proto = proto_name(k.l4proto);
            let function = n.syms.and_then(|s| s.function(k.location)).unwrap_or("");
            let (reason, reason_from) = if n.reasons.has_reason {
                (n.reasons.name(k.reason), None)
            } else {
                let bound = k.dport != 0 && !net::port_sockets(&proto, k.dport).is_empty();
                match reasons::infer(function, &proto, bound, n.counters) {
                    Some(r) => (r.to_string(), Some("location")),
                    None => ("unknown".to_string(), None),
                }
            };
            let (dev, dev_bytes) = match k.ifindex {
                0 => (String::new(), None),
                i => n
                    .ifnames
                    .get(&i)
                    .map_or_else(|| (format!("if{i}"), None), dev_fields),
            };
            let listened = reason == "NO_SOCKET"
                && k.dport != 0
                && *bound
                    .entry((proto.clone(), k.dport))
                    .or_insert_with(|| !net::port_sockets(&proto, k.dport).is_empty());
            let finding = (reason == "NO_SOCKET" && k.dport != 0 && !listened)
                .then(|| format!("nobody listens on {proto}/{}", k.dport));
            let routine = reasons::routine(&reason);
            DropRow {
                reason_code: n.reasons.has_reason.then_some(k.reason),
                note: routine.or((reason == "NOT_SPECIFIED").then_some(
                    "kfree_skb without a reason: a drop in code not annotated yet, or a normal free by a caller that should use consume_skb",
                )),
                routine: routine.is_some(),
                listened,
                reason,
                reason_from,
                count,
                rate_per_s: count as f64 / secs,
                bytes: v.iter().map(|x| x.bytes).sum(),
                proto,
                l3proto: k.l3proto,
                daddr: daddr(k),
                port: k.dport,
                dev,
                dev_bytes,
                ifindex: k.ifindex,
                cpus: per_cpu(v, |x| x.count),
                location: n
                    .syms
                    .and_then(|s| s.name(k.location))
                    .unwrap_or_else(|| format!("{:#x}", k.location)),
                finding,
                ..Default::default()
            }
        })
        .collect();
    rows.sort_by(|a, b| b.count.cmp(&a.count).then(a.reason.cmp(&b.reason)));
    let oc: u64 = other.iter().map(|x| x.count).sum();
    if oc > 0 {
        rows.push(DropRow {
            reason: "[other]".into(),
            count: oc,
            rate_per_s: oc as f64 / secs,
            bytes: other.iter().map(|x| x.bytes).sum(),
            cpus: per_cpu(other, |x| x.count),
            ..Default::default()
        });
    }
    rows
}

/// Socket-level drops of one socket and reason, with the owning processes.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SockRow {
    /// The owner (the first of `pids`), absent when no process holds the socket any more.
    #[serde(flatten)]
    pub owner: Owner,
    pub pids: Vec<u32>,
    pub proto: String,
    /// The socket's local port.
    pub port: u16,
    /// Socket inode (`socket:[INODE]` in /proc/PID/fd), 0 when unknown.
    pub ino: u64,
    pub reason: String,
    pub count: u64,
    pub rate_per_s: f64,
    /// `sk_rcvbuf` at the drops (bytes), and the bytes already queued (`sk_rmem_alloc`), mean
    /// and largest; from the socket itself (`found_by` `socket`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rcvbuf: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rmem_mean: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rmem_max: Option<u64>,
    /// Drops where the packet did not fit: queued + its size > rcvbuf.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub full: Option<u64>,
    /// Bytes waiting to be read and the socket's own drop counter, when the window ended
    /// (`/proc/net/udp`; `found_by` `port`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rx_queue: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sk_drops: Option<u64>,
    /// `socket`: the kernel passed the socket; `port`: found from the packets' destination port
    /// (kernels without `rx_sk`, or drops before the packet was given to the socket).
    pub found_by: &'static str,
    /// The sockets whose owners are listed: this one, or every socket bound to the port
    /// (SO_REUSEPORT groups).
    #[serde(skip)]
    pub(super) inodes: Vec<u64>,
}

impl crate::report::rows::Row for SockRow {
    fn container(&self) -> Option<&crate::report::who::InContainer> {
        Some(&self.owner.container)
    }
}

const NET_SOCKET: &[Field] = &[
    Field::key("pid"),
    Field::key("port"),
    Field::key("ino"),
    Field::count("count", LowerIsBetter),
    Field::stat("rate_per_s"),
    Field::key("rcvbuf"),
    Field::stat("rmem_mean"),
    Field::stat("rmem_max"),
    Field::count("full", Neutral),
    Field::count("rx_queue", LowerIsBetter),
    Field::count("sk_drops", LowerIsBetter),
];

/// Receiving sockets with drops, and their owners.
pub const SOCKET_ROWS: Rows = Rows {
    kind: "socket",
    labels: &[],
    fields: &[NET_SOCKET],
    dists: &[],
};

pub const SOCKETS: &[Column<SockRow>] = &[
    Column::right("PID", |r, _| or_dash(r.owner.pid.as_ref())),
    Column::left("COMM", |r, _| r.owner.comm_text()),
    Column::left("SOCKET", |r, _| format!("{}/{}", r.proto, r.port)),
    Column::left("REASON", |r, _| r.reason.clone()),
    Column::right("DROPS", |r, _| r.count.to_string()),
    Column::right("RATE/s", |r, _| rate(r.rate_per_s)),
    Column::right("RCVBUF", |r, _| r.rcvbuf.map_or("-".into(), fmt_bytes)),
    Column::right("QUEUED", |r, _| {
        match (r.rmem_mean, r.rmem_max, r.rx_queue) {
            (Some(m), Some(x), _) => format!("{}/{}", fmt_bytes(m), fmt_bytes(x)),
            (_, _, Some(q)) => fmt_bytes(q),
            _ => "-".into(),
        }
    }),
    Column::right("FULL%", |r, _| match r.full {
        Some(f) => format!("{:.0}", f as f64 * 100.0 / r.count.max(1) as f64),
        None => "-".into(),
    }),
    Column::left("FOUND-BY", |r, _| r.found_by.to_string()),
];

/// Socket rows: those the kernel reported, then, for socket-level drops it passed no socket
/// for, the sockets bound to the destination port now. Owners from /proc/*/fd.
pub fn sock_rows(
    socks: &[(SockKey, Vec<SockVal>)],
    drops: &[DropRow],
    n: &Names,
    secs: f64,
) -> Vec<SockRow> {
    let mut rows: Vec<SockRow> = socks
        .iter()
        .map(|(k, v)| (k, v, n.reasons.has_reason.then(|| n.reasons.name(k.reason))))
        // A socket's teardown is not a receiver losing data (see `reasons::routine`).
        .filter(|(_, _, r)| r.as_deref().and_then(reasons::routine).is_none())
        .map(|(k, v, reason)| {
            let count: u64 = v.iter().map(|x| x.count).sum();
            SockRow {
                proto: proto_name(k.proto as u8),
                port: k.lport,
                ino: k.ino,
                reason: reason.unwrap_or_else(|| "unknown".into()),
                count,
                rate_per_s: count as f64 / secs,
                rcvbuf: v.iter().map(|x| x.rcvbuf).max(),
                rmem_mean: Some(v.iter().map(|x| x.rmem_sum).sum::<u64>() / count.max(1)),
                rmem_max: v.iter().map(|x| x.rmem_max).max(),
                full: Some(v.iter().map(|x| x.full).sum()),
                found_by: "socket",
                inodes: vec![k.ino],
                ..Default::default()
            }
        })
        .collect();
    for d in drops {
        let known = rows
            .iter()
            .any(|s| s.port == d.port && s.reason == d.reason && s.proto == d.proto);
        if d.port == 0 || !reasons::at_socket(&d.reason) || known {
            continue;
        }
        let bound = net::port_sockets(&d.proto, d.port);
        let Some(first) = bound.first() else { continue };
        rows.push(SockRow {
            proto: d.proto.clone(),
            port: d.port,
            ino: first.inode,
            reason: d.reason.clone(),
            count: d.count,
            rate_per_s: d.rate_per_s,
            rx_queue: Some(bound.iter().map(|e| e.rx_queue).sum()),
            sk_drops: bound.iter().map(|e| e.drops).sum(),
            found_by: "port",
            inodes: bound.iter().map(|e| e.inode).collect(),
            ..Default::default()
        });
    }
    let inodes: Vec<u64> = rows
        .iter()
        .flat_map(|r| r.inodes.iter().copied())
        .filter(|i| *i != 0)
        .collect();
    let owners = net::socket_owners(&inodes);
    for r in &mut rows {
        let pids = net::holders(&owners, &r.inodes);
        r.owner = Owner::of(pids.first().copied());
        r.pids = pids;
    }
    rows.sort_by(|a, b| b.count.cmp(&a.count).then(a.port.cmp(&b.port)));
    rows
}

/// Socket rows whose socket nobody holds now get the owners learnt while it lived.
pub fn from_learnt(rows: &mut [SockRow], learnt: &super::owners::Learnt) {
    for r in rows.iter_mut().filter(|r| r.pids.is_empty()) {
        if let Some((pids, owner)) = r.inodes.iter().find_map(|i| learnt.get(*i)) {
            r.pids = pids.clone();
            r.owner = owner.clone();
        }
    }
}

/// Names the owner of each drop row's socket from the socket rows.
pub fn attribute(drops: &mut [DropRow], socks: &[SockRow]) {
    for d in drops.iter_mut().filter(|d| d.port != 0) {
        if let Some(s) = socks
            .iter()
            .find(|s| s.port == d.port && s.reason == d.reason && s.proto == d.proto)
        {
            d.owner = s.owner.clone();
        }
    }
}

/// One CPU's receive path in the window.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CpuRow {
    pub cpu: u32,
    /// NET_RX softirq time, runs, and the longest run since tracing started (softirq hooks).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub softirq_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub softirq_count: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub softirq_max_ns_since_start: Option<u64>,
    /// NET_RX time as a share of this CPU's time, and of all CPUs' NET_RX time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub softirq_pct: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub share_pct: Option<f64>,
    /// NAPI polls, packets they handled, and polls that used their whole budget (napi hook).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub polls: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub poll_work: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub squeezed: Option<u64>,
    /// `/proc/net/softnet_stat` deltas: packets processed, dropped because the backlog was full,
    /// NET_RX runs cut short (`time_squeeze`), packets steered here by RPS, flow-limit drops.
    pub processed: u64,
    pub backlog_drops: u64,
    pub time_squeeze: u64,
    pub received_rps: u64,
    pub flow_limit: u64,
    /// Drops (kfree_skb with a drop reason) on this CPU, and every kfree_skb event it ran.
    pub drops: u64,
    pub kfree: u64,
    /// Normal frees (`--consume`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consumed: Option<u64>,
}

impl crate::report::rows::Row for CpuRow {}

const NET_CPU: &[Field] = &[
    Field::id("cpu"),
    Field::count("softirq_ns", Neutral),
    Field::count("softirq_count", Neutral),
    Field::stat("softirq_max_ns_since_start"),
    Field::stat("softirq_pct"),
    Field::stat("share_pct"),
    Field::count("polls", Neutral),
    Field::count("poll_work", Neutral),
    Field::count("squeezed", LowerIsBetter),
    Field::count("processed", Neutral),
    Field::count("backlog_drops", LowerIsBetter),
    Field::count("time_squeeze", LowerIsBetter),
    Field::count("received_rps", Neutral),
    Field::count("flow_limit", Neutral),
    Field::count("drops", LowerIsBetter),
    Field::count("kfree", Neutral),
    Field::count("consumed", Neutral),
];

/// Receive work per CPU.
pub const CPU_ROWS: Rows = Rows {
    kind: "cpu",
    labels: &[],
    fields: &[NET_CPU],
    dists: &[],
};

pub const CPUS: &[Column<CpuRow>] = &[
    Column::right("CPU", |r, _| r.cpu.to_string()),
    Column::right("NET_RX", |r, _| r.softirq_ns.map_or("-".into(), fmt_ns)),
    Column::right("%CPU", |r, _| {
        r.softirq_pct.map_or("-".into(), |p| format!("{p:.1}"))
    }),
    Column::right("SHARE%", |r, _| {
        r.share_pct.map_or("-".into(), |p| format!("{p:.0}"))
    }),
    Column::right("RUNS", |r, _| or_dash(r.softirq_count.as_ref())),
    Column::right("POLLS", |r, _| or_dash(r.polls.as_ref())),
    Column::right("FULL-BUDGET", |r, _| or_dash(r.squeezed.as_ref())),
    Column::right("PROCESSED", |r, _| r.processed.to_string()),
    Column::right("BACKLOG-DROP", |r, _| r.backlog_drops.to_string()),
    Column::right("SQUEEZE", |r, _| r.time_squeeze.to_string()),
    Column::right("RPS", |r, _| r.received_rps.to_string()),
    Column::right("DROPS", |r, _| r.drops.to_string()),
];

/// Which hooks fed a CPU row.
pub struct CpuHooks {
    pub softirq: bool,
    pub napi: bool,
    pub consume: bool,
}

/// CPU rows for the CPUs that did anything in the window: `delta` per CPU from the programs,
/// softnet_stat deltas, drops per CPU.
pub fn cpu_rows(
    delta: &[CpuVal],
    softnet: &BTreeMap<u32, net::Softnet>,
    drops: &[DropRow],
    hooks: &CpuHooks,
    secs: f64,
) -> Vec<CpuRow> {
    let total_ns: u64 = delta.iter().map(|d| d.softirq_ns).sum();
    let ncpu = delta
        .len()
        .max(softnet.keys().max().map_or(0, |m| *m as usize + 1));
    (0..ncpu as u32)
        .map(|cpu| {
            let d = delta.get(cpu as usize).copied().unwrap_or_default();
            let s = softnet.get(&cpu).copied().unwrap_or_default();
            CpuRow {
                cpu,
                softirq_ns: hooks.softirq.then_some(d.softirq_ns),
                softirq_count: hooks.softirq.then_some(d.softirq_count),
                softirq_max_ns_since_start: hooks.softirq.then_some(d.softirq_max_ns),
                softirq_pct: hooks
                    .softirq
                    .then(|| d.softirq_ns as f64 / (secs * 1e9) * 100.0),
                share_pct: (hooks.softirq && total_ns > 0)
                    .then(|| d.softirq_ns as f64 * 100.0 / total_ns as f64),
                polls: hooks.napi.then_some(d.polls),
                poll_work: hooks.napi.then_some(d.poll_work),
                squeezed: hooks.napi.then_some(d.polls_full),
                processed: s.processed,
                backlog_drops: s.dropped,
                time_squeeze: s.time_squeeze,
                received_rps: s.received_rps,
                flow_limit: s.flow_limit,
                drops: drops.iter().filter_map(|r| r.cpus.get(&cpu)).sum(),
                kfree: d.kfree,
                consumed: hooks.consume.then_some(d.consumed),
            }
        })
        .filter(|r| {
            r.softirq_count.unwrap_or(0)
                + r.polls.unwrap_or(0)
                + r.processed
                + r.backlog_drops
                + r.drops
                > 0
        })
        .collect()
}
