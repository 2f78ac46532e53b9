//! Listening sockets whose accept queue overflowed: the kernel's own count (`TcpExt`
//! `ListenOverflows`, `ListenDrops`, `SyncookiesSent`), the listeners that were full
//! (`sock_diag`: queued and backlog), who holds them, and the drops to their ports.
//!
//! The drops alone cannot tell it: at a full accept queue the kernel drops the handshake's last
//! ACK with `TCP_LISTEN_OVERFLOW` only sometimes; an ACK that carries a SYN cookie and meets a
//! full queue is dropped as `NO_SOCKET` by `cookie_v4_check`'s caller, others as
//! `NOT_SPECIFIED` at `tcp_v4_rcv` (nginx with somaxconn 16 under `ab -c 1000`: 579
//! `TCP_LISTEN_OVERFLOW` drops against `ListenOverflows` +14,664, issue #33). So the counters
//! say how many, and the listeners say where.

use crate::report::units::or_dash;
use std::collections::BTreeMap;

use serde::Serialize;

use super::rows::DropRow;
use crate::{
    host::{listeners::Listener, net, proc},
    report::{
        rows::Column,
        schema::{Direction::*, Field, Rows},
        who::Owner,
    },
};

/// The window's accept-queue counters (`/proc/net/netstat` deltas).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Accept {
    /// `TcpExt:ListenOverflows`: handshakes completed into a full accept queue.
    pub overflows: u64,
    /// `TcpExt:ListenDrops`: every connection a listener dropped (overflows included).
    pub drops: u64,
    /// `TcpExt:SyncookiesSent`: SYNs answered with a cookie because the SYN queue was full.
    pub cookies_sent: u64,
    /// `Tcp:PassiveOpens`: connections listeners took in.
    pub passive_opens: u64,
}

impl Accept {
    pub fn of(counters: &BTreeMap<String, i64>) -> Accept {
        let c = |k: &str| counters.get(k).copied().unwrap_or(0).max(0) as u64;
        Accept {
            overflows: c("TcpExt:ListenOverflows"),
            drops: c("TcpExt:ListenDrops"),
            cookies_sent: c("TcpExt:SyncookiesSent"),
            passive_opens: c("Tcp:PassiveOpens"),
        }
    }

    /// Connections lost at listeners: `ListenDrops` counts every overflow and more.
    pub fn lost(&self) -> u64 {
        self.drops.max(self.overflows)
    }
}

/// A listening TCP port whose accept queue overflowed in the window.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ListenRow {
    /// The process that accepts on it: a child holding the socket whose parent holds it too
    /// (nginx's workers, not its master), else the first holder.
    #[serde(flatten)]
    pub owner: Owner,
    /// Every process holding one of the port's listening sockets.
    pub pids: Vec<u32>,
    pub port: u16,
    /// The accept queue's limit in force (the largest of the port's listeners).
    pub backlog: u64,
    /// Connections waiting to be accepted when the window ended (all its listeners).
    pub queued: u64,
    /// TCP drops to this port in the window (any reason but routine ones).
    pub drops: u64,
    /// Those drops by the kernel's reason, most first: `NO_SOCKET 5000, TCP_LISTEN_OVERFLOW 579`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub drop_reasons: String,
    #[serde(skip)]
    pub(super) inodes: Vec<u64>,
}

impl crate::report::rows::Row for ListenRow {
    fn container(&self) -> Option<&crate::report::who::InContainer> {
        Some(&self.owner.container)
    }
}

const NET_LISTEN: &[Field] = &[
    Field::key("pid"),
    Field::key("port"),
    Field::key("backlog"),
    Field::level("queued", LowerIsBetter),
    Field::count("drops", LowerIsBetter),
];

/// Listening ports whose accept queue overflowed.
pub const LISTEN_ROWS: Rows = Rows {
    kind: "listen",
    labels: &[],
    fields: &[NET_LISTEN],
    dists: &[],
};

pub const LISTENS: &[Column<ListenRow>] = &[
    Column::right("PORT", |r, _| r.port.to_string()),
    Column::right("PID", |r, _| or_dash(r.owner.pid.as_ref())),
    Column::left("COMM", |r, _| r.owner.comm_text()),
    Column::right("HOLDERS", |r, _| r.pids.len().to_string()),
    Column::right("QUEUED", |r, _| r.queued.to_string()),
    Column::right("BACKLOG", |r, _| r.backlog.to_string()),
    Column::right("DROPS", |r, _| r.drops.to_string()),
    Column::left("REASONS", |r, _| r.drop_reasons.clone()),
];

/// The ports worth a row: drops to them in the window, or a queue full at its end. Pure: the
/// listeners and the drop rows are given.
pub fn pick(listeners: &[Listener], drops: &[DropRow]) -> Vec<ListenRow> {
    let mut by_port: BTreeMap<u16, ListenRow> = BTreeMap::new();
    for l in listeners {
        let r = by_port.entry(l.port).or_insert_with(|| ListenRow {
            port: l.port,
            ..Default::default()
        });
        r.backlog = r.backlog.max(u64::from(l.backlog));
        r.queued += u64::from(l.queued);
        r.inodes.push(u64::from(l.inode));
    }
    let mut out = Vec::new();
    for (port, mut r) in by_port {
        let mut reasons: Vec<(u64, &str)> = Vec::new();
        for d in drops
            .iter()
            .filter(|d| d.proto == "tcp" && d.port == port && !d.routine)
        {
            r.drops += d.count;
            match reasons.iter_mut().find(|(_, n)| *n == d.reason) {
                Some(x) => x.0 += d.count,
                None => reasons.push((d.count, &d.reason)),
            }
        }
        reasons.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
        r.drop_reasons = reasons
            .iter()
            .map(|(n, w)| format!("{w} {n}"))
            .collect::<Vec<_>>()
            .join(", ");
        if r.drops > 0 || (r.backlog > 0 && r.queued >= r.backlog) {
            out.push(r);
        }
    }
    out.sort_by(|a, b| b.drops.cmp(&a.drops).then(a.port.cmp(&b.port)));
    out
}

/// The window's overflowed listeners with their holders, when the kernel counted an overflow
/// or a listen drop (no netlink dump otherwise); `Err` names why the listeners are unknown.
pub fn rows(accept: &Accept, drops: &[DropRow]) -> Result<Vec<ListenRow>, String> {
    if accept.lost() == 0 {
        return Ok(Vec::new());
    }
    let listeners = crate::host::listeners::tcp_listeners().map_err(|e| e.to_string())?;
    let mut rows = pick(&listeners, drops);
    let inodes: Vec<u64> = rows.iter().flat_map(|r| r.inodes.iter().copied()).collect();
    let owners = net::socket_owners(&inodes);
    for r in &mut rows {
        let pids = net::holders(&owners, &r.inodes);
        let acceptor = pids
            .iter()
            .copied()
            .find(|p| proc::ppid(*p).is_some_and(|pp| pids.contains(&pp)))
            .or(pids.first().copied());
        r.owner = Owner::of(acceptor);
        r.pids = pids;
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drop(reason: &str, port: u16, count: u64) -> DropRow {
        DropRow {
            reason: reason.into(),
            routine: super::super::reasons::routine(reason).is_some(),
            count,
            proto: "tcp".into(),
            port,
            ..Default::default()
        }
    }

    #[test]
    fn overflowed_ports_are_those_with_drops_or_a_full_queue() {
        let l = |port, queued, backlog, inode| Listener {
            port,
            family: 4,
            queued,
            backlog,
            inode,
        };
        let listeners = [
            l(8080, 16, 16, 10),
            l(8080, 0, 16, 11),
            l(5432, 0, 244, 12),
            l(6379, 3, 511, 13),
            l(9000, 4, 4, 14),
        ];
        let drops = [
            drop("NO_SOCKET", 8080, 5_000),
            drop("TCP_LISTEN_OVERFLOW", 8080, 579),
            drop("SOCKET_CLOSE", 6379, 40),
            drop("NO_SOCKET", 7777, 9),
        ];
        let rows = pick(&listeners, &drops);
        let ports: Vec<u16> = rows.iter().map(|r| r.port).collect();
        // 6379's only drops are routine and its queue has room; 5432 is quiet; 9000 is full.
        assert_eq!(ports, vec![8080, 9000]);
        let r = &rows[0];
        assert_eq!((r.drops, r.queued, r.backlog), (5_579, 16, 16));
        assert_eq!(r.drop_reasons, "NO_SOCKET 5000, TCP_LISTEN_OVERFLOW 579");
        assert_eq!(r.inodes, vec![10, 11]);
        assert_eq!((rows[1].drops, rows[1].queued), (0, 4));
    }

    #[test]
    fn counters_name_the_loss() {
        let c: BTreeMap<String, i64> = [
            ("TcpExt:ListenOverflows", 14_664),
            ("TcpExt:ListenDrops", 14_670),
            ("TcpExt:SyncookiesSent", 300),
            ("Tcp:PassiveOpens", 9_000),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let a = Accept::of(&c);
        assert_eq!(a.lost(), 14_670);
        assert_eq!(a.cookies_sent, 300);
        assert_eq!(Accept::of(&BTreeMap::new()).lost(), 0);
        assert_eq!(rows(&Accept::default(), &[]).unwrap().len(), 0);
    }
}
