//! `net-rx`: shared types for the receive-path hooks: `skb:kfree_skb` (drops by reason and
//! place, socket-level drops per socket), `skb:consume_skb` (optional: normal frees, counted
//! only), `irq:softirq_entry/exit` (NET_RX softirq time per CPU) and `napi:napi_poll` (polls
//! that used their whole budget).
//!
//! All aggregation is in the kernel, in per-CPU maps: no atomics, no per-packet ring-buffer
//! traffic, and the CPU of every drop comes for free (userspace reads one value per CPU).

/// Per-CPU stats slot: a `kfree_skb` whose reason is `SKB_CONSUMED` (a normal free reported
/// through the drop tracepoint; 6.x sends those to `consume_skb` instead).
pub const STAT_CONSUMED: u32 = 5;
/// A drop carried a socket (`rx_sk` or `skb->sk`) whose inode could not be read.
pub const STAT_NO_INODE: u32 = 6;
/// A socket-level drop did not fit the per-socket map.
pub const STAT_SOCK_MAP_FULL: u32 = 7;

/// `NET_RX_SOFTIRQ` in the kernel's `enum` of softirq vectors (stable since 2.6; the
/// `irq:softirq_entry` format names it in its `__print_symbolic` table).
pub const NET_RX_SOFTIRQ: u32 = 3;

/// Byte offsets into kernel structs, from the kernel's BTF, passed in as one read-only global.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SkbOffsets {
    /// `sk_buff.len` (unsigned int).
    pub skb_len: u32,
    /// `sk_buff.truesize` (unsigned int): what the packet charges to the receive buffer.
    pub skb_truesize: u32,
    /// `sk_buff.protocol` (__be16): the L3 ethertype.
    pub skb_protocol: u32,
    /// `sk_buff.network_header` (__u16, offset from `head`; 0xffff = unset).
    pub skb_network_header: u32,
    /// `sk_buff.transport_header` (__u16, offset from `head`; 0xffff = unset).
    pub skb_transport_header: u32,
    /// `sk_buff.head` (unsigned char *).
    pub skb_head: u32,
    /// `sk_buff.dev` (struct net_device *).
    pub skb_dev: u32,
    /// `sk_buff.sk` (struct sock *): the owner, when set (kernels without `rx_sk`).
    pub skb_sk: u32,
    /// `net_device.ifindex` (int).
    pub dev_ifindex: u32,
    /// `sock.__sk_common.skc_num` (__u16, host order): the local port.
    pub sk_num: u32,
    /// `sock.__sk_common.skc_family` (unsigned short).
    pub sk_family: u32,
    /// `sock.sk_protocol` (u16 on ≥ 5.6; older kernels have a bitfield: 0 here disables it).
    pub sk_protocol: u32,
    /// `sock.sk_rcvbuf` (int).
    pub sk_rcvbuf: u32,
    /// `sock.sk_backlog.rmem_alloc` (atomic_t): bytes queued for reading (`sk_rmem_alloc`).
    pub sk_rmem_alloc: u32,
    /// `sock.sk_socket` (struct socket *).
    pub sk_socket: u32,
    /// `socket.file` (struct file *).
    pub socket_file: u32,
    /// `file.f_inode` (struct inode *).
    pub file_inode: u32,
    /// `inode.i_ino` (unsigned long): matches `socket:[INODE]` in /proc/<pid>/fd.
    pub inode_ino: u32,
    /// `sock.__sk_common.skc_state` (unsigned char): time-wait and request socks are
    /// mini-sockets without the full `struct sock`, so nothing past `sock_common` is read.
    pub sk_state: u32,
    pub _pad: u32,
}

impl SkbOffsets {
    /// All zero: a program's offsets global before userspace patches it in.
    pub const ZERO: SkbOffsets = SkbOffsets {
        skb_len: 0,
        skb_truesize: 0,
        skb_protocol: 0,
        skb_network_header: 0,
        skb_transport_header: 0,
        skb_head: 0,
        skb_dev: 0,
        skb_sk: 0,
        dev_ifindex: 0,
        sk_num: 0,
        sk_family: 0,
        sk_protocol: 0,
        sk_rcvbuf: 0,
        sk_rmem_alloc: 0,
        sk_socket: 0,
        socket_file: 0,
        file_inode: 0,
        inode_ino: 0,
        sk_state: 0,
        _pad: 0,
    };
}

/// A drop's place. `daddr`/`dport` are the packet's destination (the local end for received
/// packets); zero when the packet has no such header or the header offsets are unset.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DropKey {
    /// Kernel text address of the free (`location`): names the dropping function through
    /// /proc/kallsyms. On kernels without `reason` (< 5.17) this is the only "why".
    pub location: u64,
    /// IPv4 address in the first 4 bytes, or IPv6; network order.
    pub daddr: [u8; 16],
    /// `enum skb_drop_reason` (0 where the kernel has no reason argument).
    pub reason: u32,
    /// `skb->dev->ifindex`, 0 without a device.
    pub ifindex: u32,
    /// Destination port, host order (TCP, UDP, UDP-Lite, SCTP, DCCP).
    pub dport: u16,
    /// `skb->protocol`, host order (0x0800 IPv4, 0x86dd IPv6, 0x0806 ARP…).
    pub l3proto: u16,
    /// IP protocol (6 TCP, 17 UDP, 1 ICMP…), 0 if not IP or unknown.
    pub l4proto: u8,
    /// 4 or 6 when `daddr` holds an address, else 0.
    pub family: u8,
    pub _pad: u16,
    /// Interval generation (see [`crate::stats::Control`]).
    pub gen: u32,
    /// Explicit tail padding, written as 0: verifiers before 5.11's uninitialized-stack
    /// allowance (Debian's 5.10) reject a map key with unwritten bytes.
    pub _tail: u32,
}

/// Per-CPU value of [`DropKey`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DropVal {
    pub count: u64,
    /// `skb->len` summed.
    pub bytes: u64,
}

/// A socket that dropped packets.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SockKey {
    /// Socket inode: userspace finds the owning processes through `/proc/<pid>/fd`.
    pub ino: u64,
    pub reason: u32,
    pub gen: u32,
    /// Local port (`skc_num`).
    pub lport: u16,
    /// `skc_family` (2 AF_INET, 10 AF_INET6…).
    pub family: u16,
    /// `sk_protocol` (6 TCP, 17 UDP…), 0 where unreadable.
    pub proto: u16,
    pub _pad: u16,
}

/// Per-CPU value of [`SockKey`]: the socket's receive buffer at each drop.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockVal {
    pub count: u64,
    /// `sk_rcvbuf` at the last drop on this CPU.
    pub rcvbuf: u64,
    /// `sk_rmem_alloc` summed over drops (mean = sum / count) and its maximum.
    pub rmem_sum: u64,
    pub rmem_max: u64,
    /// Drops where the packet did not fit: `sk_rmem_alloc + skb->truesize > sk_rcvbuf`, the
    /// test UDP (`__udp_enqueue_schedule_skb`) and TCP (`tcp_try_rmem_schedule`) apply.
    pub full: u64,
}

/// Per-CPU receive-path counters (`NR_CPU`, one slot; cumulative, userspace diffs them).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuVal {
    /// `softirq_entry` time of the NET_RX softirq running now on this CPU, 0 when none.
    pub start_ns: u64,
    /// NET_RX softirq runs and their total and largest duration.
    pub softirq_count: u64,
    pub softirq_ns: u64,
    pub softirq_max_ns: u64,
    /// `napi_poll` calls, packets they processed, and polls with `work >= budget` (the
    /// driver had more: the kernel's `time_squeeze` comes from these).
    pub polls: u64,
    pub poll_work: u64,
    pub polls_full: u64,
    /// `consume_skb` events (normal frees), when that hook is on.
    pub consumed: u64,
    /// `kfree_skb` events seen (before any filtering): the drop hook's own rate.
    pub kfree: u64,
}

crate::gen_keys!(DropKey, SockKey);
crate::impl_pod!(SkbOffsets, DropKey, DropVal, SockKey, SockVal, CpuVal);

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn layouts_have_no_implicit_padding() {
        assert_eq!(size_of::<SkbOffsets>(), 80);
        assert_eq!(size_of::<DropKey>(), 48);
        assert_eq!(size_of::<DropVal>(), 16);
        assert_eq!(size_of::<SockKey>(), 24);
        assert_eq!(size_of::<SockVal>(), 40);
        assert_eq!(size_of::<CpuVal>(), 72);
    }
}
