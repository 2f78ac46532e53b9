//! `net-rx` kernel programs: packet drops by reason and place, socket-level drops per socket
//! (with the receive buffer at the drop), NET_RX softirq time and NAPI budget exhaustion per CPU.
//!
//! Hooks (BTF prototypes on 6.18, `btf_trace_<event>`):
//! - `skb:kfree_skb(struct sk_buff *skb, void *location, enum skb_drop_reason reason,
//!   struct sock *rx_sk)`. `reason` appeared in 5.17 and `rx_sk` in 6.12 (Debian's 6.1 passes
//!   `skb, location, reason`; 5.10 only `skb, location`). Attached as tp_btf, else raw_tp, else
//!   the classic tracepoint, whose fields (`skbaddr`, `location`, `reason`, `rx_sk`) are read at
//!   offsets from its format file. The first test drops `SKB_CONSUMED` (a normal free; 6.x
//!   reports those on `consume_skb` instead, older kernels through here), before any other
//!   work: the hook fires at line rate.
//! - `skb:consume_skb(struct sk_buff *skb, void *location)` (optional, off by default: it fires
//!   for every packet delivered): a per-CPU count of normal frees, nothing else.
//! - `irq:softirq_entry/exit(unsigned int vec_nr)`: NET_RX (vec 3) time per CPU. Softirqs do not
//!   nest on a CPU, so one start slot per CPU is exact.
//! - `napi:napi_poll(struct napi_struct *napi, int work, int budget)`: polls, packets, and polls
//!   with `work >= budget`.
//!
//! Nothing is filtered by the current task: drops happen in softirq context, where the current
//! task is whoever was interrupted. The owner of a socket is found from the socket itself.
//!
//! Struct members read (offsets from /sys/kernel/btf/vmlinux, [`SkbOffsets`]):
//! `sk_buff.{len,truesize,protocol,network_header,transport_header,head,dev,sk}`,
//! `net_device.ifindex`, `sock.__sk_common.{skc_num,skc_family,skc_state}`, `sock.{sk_protocol,
//! sk_rcvbuf,sk_backlog.rmem_alloc,sk_socket}`, `socket.file`, `file.f_inode`, `inode.i_ino`;
//! packet bytes (IPv4/IPv6 destination address and protocol, TCP/UDP destination port) at
//! `head + network_header` / `head + transport_header` with `bpf_probe_read_kernel`.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, BPF_NOEXIST},
    helpers::bpf_ktime_get_ns,
    macros::{btf_tracepoint, map, raw_tracepoint},
    maps::{PerCpuArray, PerCpuHashMap},
    programs::{BtfTracePointContext, RawTracePointContext},
};
use probes_common::{
    net_rx::{
        CpuVal, DropKey, DropVal, SkbOffsets, SockKey, SockVal, STAT_CONSUMED, STAT_NO_INODE,
        STAT_SOCK_MAP_FULL,
    },
    stats,
};
use probes_ebpf::{
    generation,
    kread::{probe, Direct, Kread, Probe},
    ro, stat,
};

#[no_mangle]
static NR_OFFS: SkbOffsets = SkbOffsets::ZERO;
/// `SKB_CONSUMED` in this kernel's `enum skb_drop_reason` (u32::MAX: the kernel has none).
#[no_mangle]
static NR_CONSUMED: u32 = 1;
/// The drop hook passes `reason` (5.17+).
#[no_mangle]
static NR_HAS_REASON: u8 = 1;
/// The drop hook passes `rx_sk` (6.12+; not on Debian's 6.1).
#[no_mangle]
static NR_HAS_RX_SK: u8 = 1;
/// NET_RX's softirq vector (from the `irq:softirq_entry` format's table).
#[no_mangle]
static NR_NET_RX_VEC: u32 = 3;
/// Classic `skb:kfree_skb` field offsets from its format file (0 = absent).
#[no_mangle]
static NR_TP_SKBADDR: u32 = 8;
#[no_mangle]
static NR_TP_LOCATION: u32 = 16;
#[no_mangle]
static NR_TP_RX_SK: u32 = 24;
#[no_mangle]
static NR_TP_REASON: u32 = 36;

/// Drops by place and generation; per-CPU values, so the CPU of each drop is known and the
/// counts need no atomics. Sized by userspace (`--max-keys` × 2).
#[map]
static NR_DROPS: PerCpuHashMap<DropKey, DropVal> =
    PerCpuHashMap::with_max_entries(8192, BPF_F_NO_PREALLOC);

/// Drops that did not fit `NR_DROPS`, per generation: the `[other]` row.
#[map]
static NR_DROP_OTHER: PerCpuArray<DropVal> = PerCpuArray::with_max_entries(2, 0);

/// Socket-level drops by socket, reason and generation.
#[map]
static NR_SOCKS: PerCpuHashMap<SockKey, SockVal> =
    PerCpuHashMap::with_max_entries(4096, BPF_F_NO_PREALLOC);

/// Per-CPU receive-path counters (cumulative).
#[map]
static NR_CPU: PerCpuArray<CpuVal> = PerCpuArray::with_max_entries(1, 0);

const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const HDR_UNSET: u16 = 0xffff;
const TCP_TIME_WAIT: u8 = 6;
const TCP_NEW_SYN_RECV: u8 = 12;
/// `sock_common.skc_family` of IPv4 and IPv6 sockets.
const AF_INET: u16 = 2;
const AF_INET6: u16 = 10;

#[inline(always)]
fn cpu() -> Option<&'static mut CpuVal> {
    // SAFETY: per-CPU slot; the programs writing it do not nest on one CPU (the kernel's
    // per-program recursion guard), so plain read-modify-write is exact.
    NR_CPU.get_ptr_mut(0).map(|p| unsafe { &mut *p })
}

/// This CPU's value of `key` in the per-CPU hash `map`, created zeroed when absent; `None` when
/// the map is full.
#[inline(always)]
fn percpu_slot<K, V: Default>(map: &PerCpuHashMap<K, V>, key: &K) -> Option<&'static mut V> {
    if let Some(p) = map.get_ptr_mut(key) {
        // SAFETY: this CPU's copy of a live entry; programs on one CPU do not nest.
        return Some(unsafe { &mut *p });
    }
    // NOEXIST: when another CPU created the key meanwhile, its insert stands and ours fails;
    // the lookup below then finds this CPU's copy, which the kernel zeroed.
    let _ = map.insert(key, V::default(), BPF_NOEXIST as u64);
    // SAFETY: as above.
    map.get_ptr_mut(key).map(|p| unsafe { &mut *p })
}

/// Fills the packet's place into `key` from its headers.
#[inline(always)]
fn packet_place<R: Kread>(skb: u64, key: &mut DropKey) {
    key.l3proto = u16::from_be(R::u16(skb, ro(&NR_OFFS.skb_protocol)));
    key.ifindex = R::u32(R::u64(skb, ro(&NR_OFFS.skb_dev)), ro(&NR_OFFS.dev_ifindex));
    let head = R::u64(skb, ro(&NR_OFFS.skb_head));
    let nh = R::u16(skb, ro(&NR_OFFS.skb_network_header));
    if head == 0 || nh == HDR_UNSET {
        return;
    }
    let th = R::u16(skb, ro(&NR_OFFS.skb_transport_header));
    let l3 = head + nh as u64;
    let l4;
    if key.l3proto == ETH_P_IP {
        // struct iphdr: version/ihl @0, protocol @9, daddr @16.
        let h: [u8; 20] = probe(l3);
        if h[0] >> 4 != 4 {
            return;
        }
        key.family = 4;
        key.l4proto = h[9];
        key.daddr[0] = h[16];
        key.daddr[1] = h[17];
        key.daddr[2] = h[18];
        key.daddr[3] = h[19];
        l4 = if th != HDR_UNSET && th > nh {
            head + th as u64
        } else {
            l3 + ((h[0] & 0xf) as u64) * 4
        };
    } else if key.l3proto == ETH_P_IPV6 {
        // struct ipv6hdr: nexthdr @6, daddr @24 (extension headers are not walked: the
        // transport header offset, when set, already points past them).
        let h: [u8; 8] = probe(l3);
        if h[0] >> 4 != 6 {
            return;
        }
        key.family = 6;
        key.l4proto = h[6];
        key.daddr = probe(l3 + 24);
        l4 = if th != HDR_UNSET && th > nh {
            head + th as u64
        } else {
            l3 + 40
        };
    } else {
        return;
    }
    // TCP, UDP, DCCP, SCTP, UDP-Lite: the destination port is the second 16-bit word.
    if matches!(key.l4proto, 6 | 17 | 33 | 132 | 136) {
        key.dport = u16::from_be(probe::<u16>(l4 + 2));
    }
}

/// Records a drop against its socket: inode (to find the owner), port, buffer state.
#[inline(always)]
fn sock_drop<R: Kread>(sk: u64, truesize: u64, reason: u32, gen: u32) {
    // Receivers with a port only: a unix socket closed with data unread drops it as
    // SOCKET_CLOSE (`unix_release_sock`), one socket per drop, which would fill the map with
    // rows naming no port and no owner (seen: 16,000 rows from 20,000 socketpair closes).
    let family = R::u16(sk, ro(&NR_OFFS.sk_family));
    if family != AF_INET && family != AF_INET6 {
        return;
    }
    let state = R::u8(sk, ro(&NR_OFFS.sk_state));
    let mut key = SockKey {
        ino: 0,
        reason,
        gen,
        lport: R::u16(sk, ro(&NR_OFFS.sk_num)),
        family,
        proto: 0,
        _pad: 0,
    };
    let mut rcvbuf = 0u64;
    let mut rmem = 0u64;
    // Mini-sockets (time-wait, request socks) end after sock_common.
    if state != TCP_TIME_WAIT && state != TCP_NEW_SYN_RECV {
        let po = ro(&NR_OFFS.sk_protocol);
        if po != 0 {
            key.proto = R::u16(sk, po);
        }
        rcvbuf = R::u32(sk, ro(&NR_OFFS.sk_rcvbuf)) as i32 as u64;
        rmem = R::u32(sk, ro(&NR_OFFS.sk_rmem_alloc)) as i32 as u64;
        let file = R::u64(R::u64(sk, ro(&NR_OFFS.sk_socket)), ro(&NR_OFFS.socket_file));
        key.ino = R::u64(R::u64(file, ro(&NR_OFFS.file_inode)), ro(&NR_OFFS.inode_ino));
    }
    if key.ino == 0 {
        stat(STAT_NO_INODE);
    }
    let Some(v) = percpu_slot(&NR_SOCKS, &key) else {
        stat(STAT_SOCK_MAP_FULL);
        return;
    };
    v.count += 1;
    v.rcvbuf = rcvbuf;
    v.rmem_sum += rmem;
    if rmem > v.rmem_max {
        v.rmem_max = rmem;
    }
    // The test UDP (`__udp_enqueue_schedule_skb`) and TCP apply: the packet did not fit.
    if rcvbuf != 0 && rmem + truesize > rcvbuf {
        v.full += 1;
    }
}

/// `kfree_skb(skb, location, reason, rx_sk)`. `S` reads the socket, `R` the skb (they differ
/// only on the classic tracepoint, where both are untyped: then both are [`Probe`]).
#[inline(always)]
fn on_drop<R: Kread, S: Kread>(skb: u64, location: u64, reason: u32, rx_sk: u64) {
    if let Some(c) = cpu() {
        c.kfree += 1;
    }
    if reason == ro(&NR_CONSUMED) {
        stat(STAT_CONSUMED);
        return;
    }
    stat(stats::EVENTS);
    let gen = generation();
    let mut key = DropKey {
        location,
        daddr: [0; 16],
        reason,
        ifindex: 0,
        dport: 0,
        l3proto: 0,
        l4proto: 0,
        family: 0,
        _pad: 0,
        gen,
        _tail: 0,
    };
    packet_place::<R>(skb, &mut key);
    let len = R::u32(skb, ro(&NR_OFFS.skb_len)) as u64;
    let v = match percpu_slot(&NR_DROPS, &key) {
        Some(v) => Some(v),
        None => {
            stat(stats::KEY_MAP_FULL);
            // SAFETY: this CPU's slot of the `[other]` row.
            NR_DROP_OTHER.get_ptr_mut(gen).map(|p| unsafe { &mut *p })
        }
    };
    if let Some(v) = v {
        v.count += 1;
        v.bytes += len;
    }
    // The owning socket: `rx_sk` where the kernel passes it (6.12+), else the skb's owner
    // (set once queued to a socket; NULL for most early receive drops, where userspace maps
    // the destination port to a socket instead).
    let truesize = R::u32(skb, ro(&NR_OFFS.skb_truesize)) as u64;
    if rx_sk != 0 {
        sock_drop::<S>(rx_sk, truesize, reason, gen);
    } else {
        let sk = R::u64(skb, ro(&NR_OFFS.skb_sk));
        if sk != 0 {
            sock_drop::<R>(sk, truesize, reason, gen);
        }
    }
}

/// `reason` and `rx_sk` of a BTF or raw tracepoint, where this kernel passes them.
#[inline(always)]
fn reason_and_sk(arg: impl Fn(usize) -> u64) -> (u32, u64) {
    let reason = if ro(&NR_HAS_REASON) != 0 {
        arg(2) as u32
    } else {
        0
    };
    let rx_sk = if ro(&NR_HAS_RX_SK) != 0 { arg(3) } else { 0 };
    (reason, rx_sk)
}

#[btf_tracepoint(function = "kfree_skb")]
pub fn tk_nr_drop(ctx: BtfTracePointContext) -> i32 {
    let (reason, rx_sk) = reason_and_sk(|i| ctx.arg::<u64>(i));
    on_drop::<Direct, Direct>(ctx.arg(0), ctx.arg(1), reason, rx_sk);
    0
}

#[raw_tracepoint(tracepoint = "kfree_skb")]
pub fn tk_nr_drop_raw(ctx: RawTracePointContext) -> i32 {
    let (reason, rx_sk) = reason_and_sk(|i| ctx.arg::<u64>(i));
    on_drop::<Probe, Probe>(ctx.arg(0), ctx.arg(1), reason, rx_sk);
    0
}

probes_ebpf::passing! {
    pub fn tk_nr_drop_tp(ctx: TracePointContext) -> u32 {
        let rd = |off: u32| -> u64 {
            if off == 0 {
                0
            } else {
                // SAFETY: offsets from skb:kfree_skb's format file; read_at goes through the
                // helper.
                unsafe { ctx.read_at::<u64>(off as usize) }.unwrap_or(0)
            }
        };
        let reason_off = ro(&NR_TP_REASON);
        let reason = if reason_off == 0 {
            0
        } else {
            // SAFETY: as above (`reason` is a 4-byte enum).
            unsafe { ctx.read_at::<u32>(reason_off as usize) }.unwrap_or(0)
        };
        on_drop::<Probe, Probe>(
            rd(ro(&NR_TP_SKBADDR)),
            rd(ro(&NR_TP_LOCATION)),
            reason,
            rd(ro(&NR_TP_RX_SK)),
        );
        0
    }
}

#[inline(always)]
fn on_consume() {
    if let Some(c) = cpu() {
        c.consumed += 1;
    }
}

#[btf_tracepoint(function = "consume_skb")]
pub fn tk_nr_consume(_ctx: BtfTracePointContext) -> i32 {
    on_consume();
    0
}

#[raw_tracepoint(tracepoint = "consume_skb")]
pub fn tk_nr_consume_raw(_ctx: RawTracePointContext) -> i32 {
    on_consume();
    0
}

#[inline(always)]
fn on_softirq(vec: u32, entry: bool) {
    if vec != ro(&NR_NET_RX_VEC) {
        return;
    }
    let Some(c) = cpu() else { return };
    // SAFETY: plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    if entry {
        c.start_ns = now;
    } else if c.start_ns != 0 {
        let d = now.saturating_sub(c.start_ns);
        c.start_ns = 0;
        c.softirq_count += 1;
        c.softirq_ns += d;
        if d > c.softirq_max_ns {
            c.softirq_max_ns = d;
        }
    }
}

#[btf_tracepoint(function = "softirq_entry")]
pub fn tk_nr_softirq_entry(ctx: BtfTracePointContext) -> i32 {
    on_softirq(ctx.arg::<u64>(0) as u32, true);
    0
}

#[btf_tracepoint(function = "softirq_exit")]
pub fn tk_nr_softirq_exit(ctx: BtfTracePointContext) -> i32 {
    on_softirq(ctx.arg::<u64>(0) as u32, false);
    0
}

#[raw_tracepoint(tracepoint = "softirq_entry")]
pub fn tk_nr_softirq_entry_raw(ctx: RawTracePointContext) -> i32 {
    on_softirq(ctx.arg::<u64>(0) as u32, true);
    0
}

#[raw_tracepoint(tracepoint = "softirq_exit")]
pub fn tk_nr_softirq_exit_raw(ctx: RawTracePointContext) -> i32 {
    on_softirq(ctx.arg::<u64>(0) as u32, false);
    0
}

#[inline(always)]
fn on_napi(work: i32, budget: i32) {
    let Some(c) = cpu() else { return };
    c.polls += 1;
    if work > 0 {
        c.poll_work += work as u64;
    }
    if budget > 0 && work >= budget {
        c.polls_full += 1;
    }
}

#[btf_tracepoint(function = "napi_poll")]
pub fn tk_nr_napi(ctx: BtfTracePointContext) -> i32 {
    on_napi(ctx.arg::<u64>(1) as i32, ctx.arg::<u64>(2) as i32);
    0
}

#[raw_tracepoint(tracepoint = "napi_poll")]
pub fn tk_nr_napi_raw(ctx: RawTracePointContext) -> i32 {
    on_napi(ctx.arg::<u64>(1) as i32, ctx.arg::<u64>(2) as i32);
    0
}
