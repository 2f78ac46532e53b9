//! Drop reasons: their names on this kernel, which of them a socket's owner can act on, what to
//! do about each, and the cause of a drop on kernels that pass no reason (before 5.17).
//!
//! Names come from the `skb:kfree_skb` format's `__print_symbolic(REC->reason, …)` table,
//! completed by the kernel's BTF `enum skb_drop_reason` (prefix removed, as the tracepoint prints
//! them). Both are needed: on 6.18 the table starts at NOT_SPECIFIED (2) and lacks CONSUMED
//! (1), which only the enum names. The numbers differ between kernels (SOCKET_RCVBUFF is 6 on
//! 6.18 and 16 on 6.1), so nothing here is a number. A value in neither (a newer kernel's, or
//! a subsystem's in the high bits, `SKB_DROP_REASON_SUBSYS_MASK`) is shown as `reason N`, never
//! dropped.

use std::collections::BTreeMap;

/// Reason names of this kernel, by value.
#[derive(Clone, Debug, Default)]
pub struct Reasons {
    names: BTreeMap<u32, String>,
    /// The drop hook passes a reason (5.17+); without one every drop has reason 0.
    pub has_reason: bool,
}

impl Reasons {
    /// From the format's table (`EventFormat::symbols("reason")`) and the BTF enum's
    /// enumerators (`Btf::enum_named("skb_drop_reason")`); the table wins where both name a
    /// value.
    pub fn new(table: &[(i64, String)], btf_enum: &[(String, i64)], has_reason: bool) -> Reasons {
        let mut names = BTreeMap::new();
        for (v, n) in table {
            if let Ok(v) = u32::try_from(*v) {
                names.insert(v, n.clone());
            }
        }
        for (n, v) in btf_enum {
            let Ok(v) = u32::try_from(*v) else { continue };
            let n = n
                .strip_prefix("SKB_DROP_REASON_")
                .or_else(|| n.strip_prefix("SKB_"))
                .unwrap_or(n);
            names.entry(v).or_insert_with(|| n.to_string());
        }
        Reasons { names, has_reason }
    }

    /// The name of reason `code`: `NO_SOCKET`, or `reason 123` for a value this kernel does
    /// not name.
    pub fn name(&self, code: u32) -> String {
        self.names
            .get(&code)
            .cloned()
            .unwrap_or_else(|| format!("reason {code}"))
    }

    /// The value of reason `name` on this kernel.
    pub fn code(&self, name: &str) -> Option<u32> {
        self.names.iter().find(|(_, n)| *n == name).map(|(v, _)| *v)
    }

    /// `SKB_CONSUMED` (a normal free, not a drop), or `u32::MAX` where the kernel has none.
    pub fn consumed(&self) -> u32 {
        if !self.has_reason {
            return u32::MAX;
        }
        self.code("CONSUMED").unwrap_or(u32::MAX)
    }
}

/// Reasons decided at a socket: its owner can act on them, and where the kernel passed no socket
/// (no `rx_sk` before 6.12, `skb->sk` not yet set) the socket is found from the destination port.
pub fn at_socket(reason: &str) -> bool {
    matches!(
        reason,
        "SOCKET_RCVBUFF"
            | "SOCKET_BACKLOG"
            | "SOCKET_FILTER"
            | "SOCKET_CLOSE"
            | "PROTO_MEM"
            | "XFRM_POLICY"
            | "TCP_ZEROWINDOW"
            | "TCP_OFO_DROP"
            | "TCP_OFO_QUEUE_PRUNE"
            | "TCP_LISTEN_OVERFLOW"
    )
}

/// What the kernel means by a reason that is routine teardown or a duplicate, not a packet a
/// receiver wanted and lost: such drops are counted and shown (with this meaning as their note)
/// but never become a finding. `None` for a loss. The meanings are the kernel's own, from the
/// reason's comment in `include/net/dropreason-core.h`.
///
/// Seen with real software (issue #33): `QUEUE_PURGE` at ~6,300/s from ordinary connection
/// closes, `TCP_OLD_DATA` on Redis, `SOCKET_CLOSE` on unix sockets, one-packet
/// `TCP_OLD_SEQUENCE` rows by the thousand.
pub fn routine(reason: &str) -> Option<&'static str> {
    Some(match reason {
        "QUEUE_PURGE" => "bulk free of a queue (a socket's, device's or qdisc's queue emptied as it is torn down)",
        "SOCKET_CLOSE" => "socket is close()d: data its reader never read, freed with it",
        "SOCKET_RCV_SHUTDOWN" => "socket is shut down for receive (shutdown(SHUT_RD)): data after it is discarded",
        "TCP_CLOSE" => "a segment for a TCP socket in CLOSE state (the connection is gone)",
        "TCP_ABORT_ON_DATA" => "data for a TCP socket its application already closed (LINUX_MIB_TCPABORTONDATA): answered with a reset",
        "TCP_OLD_DATA" => "TCP data the receiver already had (a spurious or duplicate retransmission, LINUX_MIB_DELAYEDACKLOST)",
        "TCP_OLD_SEQUENCE" => "an old sequence number: a duplicate packet",
        "TCP_OLD_ACK" => "a TCP ACK that is old but in window",
        "TCP_TOO_OLD_ACK" => "a TCP ACK that is too old",
        "TCP_OFOMERGE" => "data already in the out-of-order queue (LINUX_MIB_TCPOFOMERGE)",
        "TCP_RFC7323_PAWS" | "TCP_RFC7323_PAWS_ACK" => "an old duplicate rejected by TCP's timestamp check (PAWS, LINUX_MIB_PAWSESTABREJECTED)",
        "DUP_FRAG" => "a duplicate IP fragment",
        _ => return None,
    })
}

/// The cause of a drop on a kernel that passes no reason, from the dropping function (kallsyms),
/// whether anything listens on the destination port now, and the kernel's own counters
/// (`/proc/net/snmp` deltas of this window). `None` when neither tells.
pub fn infer(
    function: &str,
    proto: &str,
    port_bound: bool,
    counters: &BTreeMap<String, i64>,
) -> Option<&'static str> {
    let delta = |k: &str| counters.get(k).copied().unwrap_or(0);
    match proto {
        "udp" | "udplite"
            if matches!(
                function,
                "__udp4_lib_rcv" | "__udp6_lib_rcv" | "udp_rcv" | "udpv6_rcv"
            ) =>
        {
            (!port_bound).then_some("NO_SOCKET")
        }
        "udp" | "udplite" if function.contains("udp") && function.contains("queue_rcv") => {
            (port_bound && delta("Udp:RcvbufErrors") + delta("UdpLite:RcvbufErrors") > 0)
                .then_some("SOCKET_RCVBUFF")
        }
        "tcp" if matches!(function, "tcp_v4_rcv" | "tcp_v6_rcv") => {
            (!port_bound).then_some("NO_SOCKET")
        }
        _ => None,
    }
}

/// What to do about drops with reason `r`, for reasons without a finding of their own.
pub fn advice(r: &str) -> &'static str {
    match r {
        "NETFILTER_DROP" => "a firewall rule drops these packets: find it with `nft list ruleset` or `iptables -L -v -n` (the rule's counter grows with these drops); nothing to do if it is meant to",
        "TCP_CSUM" | "UDP_CSUM" | "IP_CSUM" | "SKB_CSUM" | "ICMP_CSUM" => "packets arrive corrupted (bad checksum): check the link (`ethtool -S` error counters, cable, switch port) and the NIC's checksum offload (`ethtool -k`)",
        "OTHERHOST" => "packets addressed to another host's MAC reach this one: a NIC in promiscuous mode, or a switch flooding unknown unicast",
        "SOCKET_BACKLOG" => "the socket's backlog overflowed while the application held the socket lock: read faster, or raise its receive buffer (SO_RCVBUF, net.core.rmem_max)",
        "PROTO_MEM" => "the protocol's memory limit is reached (net.ipv4.udp_mem / tcp_mem): raise it, or find the sockets holding unread data (`ss -tuamp`)",
        "TCP_LISTEN_OVERFLOW" => "a listener's accept queue is full: accept faster, or raise the listen() backlog and net.core.somaxconn",
        "CPU_BACKLOG" => "a CPU's input backlog is full: raise net.core.netdev_max_backlog, or spread the load with RPS",
        "IP_NOPROTO" | "UNHANDLED_PROTO" => "packets of a protocol nothing on this host handles (harmless unless a service expects them)",
        "XFRM_POLICY" => "packets refused by an IPsec (xfrm) policy: check `ip xfrm policy`",
        "NOT_SPECIFIED" => "kfree_skb() without a reason: a real drop in code not yet annotated with a reason, or a normal free by a caller that should use consume_skb(); WHERE names the function",
        _ => "WHERE names the dropping kernel function; the reason is documented in the kernel's include/net/dropreason-core.h",
    }
}

/// Name of IP protocol number `p` as `/etc/protocols` spells it (`ip17` when unknown; empty
/// when the packet had no IP header).
pub fn proto_name(p: u8) -> String {
    match p {
        0 => String::new(),
        1 => "icmp".into(),
        6 => "tcp".into(),
        17 => "udp".into(),
        33 => "dccp".into(),
        58 => "icmpv6".into(),
        132 => "sctp".into(),
        136 => "udplite".into(),
        n => format!("ip{n}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::tracefs::parse_format;

    fn fixture(name: &str) -> String {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/formats")
            .join(name);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    /// Hostile input: a reason number the kernel's table lacks is shown as `reason N`.
    #[test]
    fn unknown_reasons_are_named_by_number() {
        let f = parse_format(&fixture("kfree_skb.6_1"), "skb/kfree_skb/format").unwrap();
        let btf = [
            ("SKB_NOT_DROPPED_YET".to_string(), 0),
            ("SKB_CONSUMED".to_string(), 1),
            ("SKB_DROP_REASON_NOT_SPECIFIED".to_string(), 2),
            ("SKB_DROP_REASON_MAX".to_string(), 69),
        ];
        let r = Reasons::new(&f.symbols("reason"), &btf, true);
        assert_eq!(r.name(3), "NO_SOCKET");
        // 6.1 numbers, not 6.18's: names come from the kernel's own table.
        assert_eq!(r.name(16), "SOCKET_RCVBUFF");
        assert_eq!(r.code("NETFILTER_DROP"), Some(8));
        assert_eq!(r.name(1), "CONSUMED", "completed from BTF");
        assert_eq!(r.consumed(), 1);
        assert_eq!(r.name(123), "reason 123");
        assert_eq!(r.name(0x1_0002), "reason 65538");
        assert_eq!(r.name(u32::MAX), "reason 4294967295");
        // The 6.18 table names 123; a kernel with neither table nor enum names nothing.
        let k = parse_format(&fixture("kfree_skb.x86_64"), "skb/kfree_skb/format").unwrap();
        let new = Reasons::new(&k.symbols("reason"), &[], true);
        assert_eq!(new.name(6), "SOCKET_RCVBUFF");
        assert_eq!(
            new.consumed(),
            u32::MAX,
            "the 6.18 table alone lacks CONSUMED"
        );
        assert_eq!(Reasons::new(&[], &[], false).consumed(), u32::MAX);
        assert_eq!(Reasons::new(&[], &[], true).name(3), "reason 3");
    }

    /// Issue #33: teardown and duplicates are routine, what a receiver wanted and lost is not.
    #[test]
    fn routine_reasons_are_teardown_and_duplicates() {
        for r in [
            "QUEUE_PURGE",
            "SOCKET_CLOSE",
            "TCP_OLD_DATA",
            "TCP_OLD_SEQUENCE",
            "TCP_CLOSE",
            "DUP_FRAG",
        ] {
            assert!(routine(r).is_some_and(|m| !m.is_empty()), "{r}");
        }
        for r in [
            "SOCKET_RCVBUFF",
            "SOCKET_BACKLOG",
            "NO_SOCKET",
            "TCP_LISTEN_OVERFLOW",
            "NETFILTER_DROP",
            "CPU_BACKLOG",
            "NOT_SPECIFIED",
            "TCP_ZEROWINDOW",
            "PROTO_MEM",
            "reason 123",
            "unknown",
        ] {
            assert_eq!(routine(r), None, "{r} is a loss");
        }
    }

    #[test]
    fn causes_without_reasons_come_from_place_and_counters() {
        let none = BTreeMap::new();
        assert_eq!(
            infer("__udp4_lib_rcv", "udp", false, &none),
            Some("NO_SOCKET")
        );
        assert_eq!(infer("__udp4_lib_rcv", "udp", true, &none), None);
        let mut c = BTreeMap::new();
        c.insert("Udp:RcvbufErrors".to_string(), 19_999);
        assert_eq!(
            infer("udp_queue_rcv_one_skb", "udp", true, &c),
            Some("SOCKET_RCVBUFF")
        );
        assert_eq!(infer("__udp_queue_rcv_skb", "udp", true, &none), None);
        assert_eq!(infer("tcp_v4_rcv", "tcp", false, &none), Some("NO_SOCKET"));
        assert_eq!(infer("ip_rcv_finish", "tcp", false, &none), None);
        assert!(at_socket("SOCKET_RCVBUFF") && !at_socket("NO_SOCKET"));
        assert_eq!(proto_name(17), "udp");
        assert_eq!(proto_name(99), "ip99");
    }
}
