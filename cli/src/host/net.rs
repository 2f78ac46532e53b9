//! The receive path as the kernel counts it: `/proc/net/softnet_stat` (per CPU),
//! `/proc/net/snmp` and `/proc/net/netstat` (protocol counters), `/sys/class/net/*/statistics`
//! (per device), ring sizes and channel counts (the ethtool ioctl), RPS masks, conntrack fill,
//! which CPUs a device's interrupts land on (`/proc/interrupts`,
//! `/proc/irq/*/smp_affinity_list`), and which process owns a socket (`/proc/net/{udp,tcp}*`,
//! `/proc/<pid>/fd`).
//!
//! Device names are kept as the kernel's bytes (`OsString`): a name may hold any byte but `/`,
//! `:` and whitespace, including escapes and bytes that are not UTF-8, and a lossy copy would
//! name no device in `/sys/class/net` or the ethtool ioctl.
//!
//! `/proc/net/snmp` is parsed here rather than with `procfs::net::Snmp`, which fails as a whole
//! when a kernel lacks one of the fields it expects, and does not cover `/proc/net/netstat`.

use std::{
    collections::BTreeMap,
    ffi::{OsStr, OsString},
    os::unix::ffi::OsStrExt,
};

use serde::Serialize;

use super::{parse_cpu_list, proc_path, read_text, read_trim, read_u64, sys_path, HostError};

/// One CPU's row of `/proc/net/softnet_stat`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Softnet {
    pub cpu: u32,
    /// Packets taken off the backlog / processed by NAPI on this CPU.
    pub processed: u64,
    /// Packets dropped because the backlog queue was full (`netdev_max_backlog`).
    pub dropped: u64,
    /// NET_RX runs that ended with work left (budget or time exhausted).
    pub time_squeeze: u64,
    pub received_rps: u64,
    pub flow_limit: u64,
}

impl Softnet {
    pub fn since(&self, b: &Softnet) -> Softnet {
        Softnet {
            cpu: self.cpu,
            processed: self.processed.wrapping_sub(b.processed) & 0xffff_ffff,
            dropped: self.dropped.wrapping_sub(b.dropped) & 0xffff_ffff,
            time_squeeze: self.time_squeeze.wrapping_sub(b.time_squeeze) & 0xffff_ffff,
            received_rps: self.received_rps.wrapping_sub(b.received_rps) & 0xffff_ffff,
            flow_limit: self.flow_limit.wrapping_sub(b.flow_limit) & 0xffff_ffff,
        }
    }
}

/// Parses softnet_stat: hex columns processed, dropped, time_squeeze, 6 unused, received_rps,
/// flow_limit_count, then (5.10+) backlog length and the CPU number. Without the CPU column
/// (older kernels) rows are in online-CPU order, which is assumed to be 0, 1, 2, … .
pub fn parse_softnet(text: &str) -> Vec<Softnet> {
    text.lines()
        .enumerate()
        .filter_map(|(i, l)| {
            let c: Vec<u64> = l
                .split_whitespace()
                .map(|w| u64::from_str_radix(w, 16))
                .collect::<Result<_, _>>()
                .ok()?;
            if c.len() < 3 {
                return None;
            }
            let at = |k: usize| c.get(k).copied().unwrap_or(0);
            Some(Softnet {
                cpu: if c.len() >= 13 {
                    at(12) as u32
                } else {
                    i as u32
                },
                processed: at(0),
                dropped: at(1),
                time_squeeze: at(2),
                received_rps: at(9),
                flow_limit: at(10),
            })
        })
        .collect()
}

pub fn softnet() -> Result<Vec<Softnet>, HostError> {
    Ok(parse_softnet(&read_text(&proc_path("net/softnet_stat"))?))
}

/// `Proto: names…` / `Proto: values…` line pairs (`/proc/net/snmp`, `/proc/net/netstat`) as
/// `Proto:Name` → value.
pub fn parse_counter_pairs(text: &str) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    let lines: Vec<&str> = text.lines().collect();
    for pair in lines.chunks(2) {
        let [names, values] = pair else { continue };
        let (Some((p1, n)), Some((p2, v))) = (names.split_once(':'), values.split_once(':')) else {
            continue;
        };
        if p1 != p2 {
            continue;
        }
        for (name, value) in n.split_whitespace().zip(v.split_whitespace()) {
            if let Ok(v) = value.parse() {
                out.insert(format!("{p1}:{name}"), v);
            }
        }
    }
    out
}

/// `/proc/net/snmp6`: one `Udp6InDatagrams 123` per line, keyed as `/proc/net/snmp`'s are
/// (`Udp6:InDatagrams`); names of no known protocol are kept whole.
pub fn parse_snmp6(text: &str) -> BTreeMap<String, i64> {
    // Longest first: `UdpLite6` before `Udp6`.
    const PROTOS: [&str; 5] = ["UdpLite6", "Udp6", "Icmp6", "Ip6", "Tcp6"];
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let (Some(name), Some(v), None) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let Ok(v) = v.parse() else { continue };
        let key = match PROTOS
            .iter()
            .find(|p| name.len() > p.len() && name.starts_with(*p))
        {
            Some(p) => format!("{p}:{}", &name[p.len()..]),
            None => name.to_string(),
        };
        out.insert(key, v);
    }
    out
}

/// `/proc/net/snmp`, `/proc/net/netstat` and `/proc/net/snmp6` together (`Udp:NoPorts`,
/// `TcpExt:ListenDrops`, `Udp6:InDatagrams`, …); the last two only where the kernel has them.
pub fn protocol_counters() -> Result<BTreeMap<String, i64>, HostError> {
    let mut m = parse_counter_pairs(&read_text(&proc_path("net/snmp"))?);
    if let Ok(t) = read_text(&proc_path("net/netstat")) {
        m.extend(parse_counter_pairs(&t));
    }
    if let Ok(t) = read_text(&proc_path("net/snmp6")) {
        m.extend(parse_snmp6(&t));
    }
    Ok(m)
}

/// Receive-side counters of one device from `/sys/class/net/<dev>/statistics`.
pub const DEVICE_COUNTERS: &[&str] = &[
    "rx_packets",
    "rx_bytes",
    "rx_dropped",
    "rx_missed_errors",
    "rx_fifo_errors",
    "rx_over_errors",
    "rx_errors",
];

/// Devices under `/sys/class/net` with the counters of [`DEVICE_COUNTERS`] they expose.
pub fn device_counters() -> BTreeMap<OsString, BTreeMap<&'static str, u64>> {
    let dir = sys_path("class/net");
    let mut out = BTreeMap::new();
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return out;
    };
    for e in rd.filter_map(Result::ok) {
        let name = e.file_name();
        let stats = e.path().join("statistics");
        let m: BTreeMap<&'static str, u64> = DEVICE_COUNTERS
            .iter()
            .filter_map(|k| read_u64(&stats.join(k)).map(|v| (*k, v)))
            .collect();
        out.insert(name, m);
    }
    out
}

/// Conntrack table fill, or `None` when the module is not loaded (not an error).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Conntrack {
    pub count: u64,
    pub max: u64,
    /// Column sums of `/proc/net/stat/nf_conntrack` (per-CPU hex table): `drop`,
    /// `insert_failed`, `early_drop`, `search_restart`, … as the kernel names them.
    pub stats: BTreeMap<String, u64>,
}

pub fn parse_conntrack_stat(text: &str) -> BTreeMap<String, u64> {
    let mut lines = text.lines();
    let Some(header) = lines.next() else {
        return BTreeMap::new();
    };
    let names: Vec<&str> = header.split_whitespace().collect();
    let mut sums = vec![0u64; names.len()];
    for l in lines {
        for (i, w) in l.split_whitespace().enumerate().take(names.len()) {
            if let Ok(v) = u64::from_str_radix(w, 16) {
                sums[i] = sums[i].wrapping_add(v);
            }
        }
    }
    names
        .into_iter()
        .zip(sums)
        .filter(|(n, _)| *n != "entries")
        .map(|(n, v)| (n.to_string(), v))
        .collect()
}

pub fn conntrack() -> Option<Conntrack> {
    let count = read_u64(&proc_path("sys/net/netfilter/nf_conntrack_count"))?;
    let max = read_u64(&proc_path("sys/net/netfilter/nf_conntrack_max"))?;
    Some(Conntrack {
        count,
        max,
        stats: read_text(&proc_path("net/stat/nf_conntrack"))
            .map(|t| parse_conntrack_stat(&t))
            .unwrap_or_default(),
    })
}

/// One interrupt line of `/proc/interrupts`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Irq {
    /// The IRQ number (numeric lines only: `NMI`, `LOC`, … are not device queues).
    pub irq: u32,
    /// Count per CPU, by CPU column.
    pub per_cpu: Vec<u64>,
    /// The last column: the device or queue name (`virtio0-input.0`, `eth0-rx-3`).
    pub name: String,
    /// CPUs allowed by `/proc/irq/<n>/smp_affinity_list`, when readable.
    pub affinity: Option<Vec<u32>>,
}

pub fn parse_interrupts(text: &str) -> Vec<Irq> {
    let mut lines = text.lines();
    let ncpu = lines
        .next()
        .map(|h| h.split_whitespace().count())
        .unwrap_or(0);
    lines
        .filter_map(|l| {
            let (num, rest) = l.trim_start().split_once(':')?;
            let irq: u32 = num.parse().ok()?;
            let words: Vec<&str> = rest.split_whitespace().collect();
            let per_cpu: Vec<u64> = words
                .iter()
                .take(ncpu)
                .map(|w| w.parse().unwrap_or(0))
                .collect();
            let name = words.get(ncpu..).and_then(|w| w.last()).unwrap_or(&"");
            Some(Irq {
                irq,
                per_cpu,
                name: name.to_string(),
                affinity: None,
            })
        })
        .collect()
}

/// Interrupts whose name mentions `dev` (a NIC's queues), with their CPU affinity.
pub fn device_irqs(dev: &str) -> Vec<Irq> {
    interrupts()
        .into_iter()
        .filter(|i| i.name.contains(dev))
        .collect()
}

/// All of `/proc/interrupts`, each numeric line with its CPU affinity.
pub fn interrupts() -> Vec<Irq> {
    let Ok(text) = read_text(&proc_path("interrupts")) else {
        return Vec::new();
    };
    parse_interrupts(&text)
        .into_iter()
        .map(|mut i| {
            i.affinity = read_trim(&proc_path(&format!("irq/{}/smp_affinity_list", i.irq)))
                .and_then(|s| parse_cpu_list(&s));
            i
        })
        .collect()
}

/// Whether interrupt `name` belongs to network device `dev`, whose bus device (the basename of
/// `/sys/class/net/<dev>/device`, e.g. `virtio2` or `0000:03:00.0`) is `bus`: drivers name
/// queue interrupts after either (`eth0-rx-3`, `virtio2-input.0`, `mlx5_comp3@pci:0000:03:00.0`).
pub fn irq_is_device(name: &str, dev: &str, bus: Option<&str>) -> bool {
    let by = |n: &str| {
        name == n
            || name.starts_with(&format!("{n}-"))
            || name.starts_with(&format!("{n}_"))
            || name.contains(&format!("@{n}"))
            || name.contains(&format!("@pci:{n}"))
    };
    by(dev) || bus.is_some_and(by)
}

/// The bus device name of network device `dev` (`virtio2`, `0000:03:00.0`); `None` for virtual
/// devices (`lo`, veths, bridges).
pub fn bus_device(dev: impl AsRef<OsStr>) -> Option<String> {
    std::fs::read_link(dev_path(dev.as_ref()).join("device"))
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
}

/// Network devices by ifindex (`/sys/class/net/*/ifindex`), as the kernel's drop records name
/// them. Only this network namespace's devices.
pub fn interfaces() -> BTreeMap<u32, OsString> {
    let mut out = BTreeMap::new();
    let Ok(rd) = std::fs::read_dir(sys_path("class/net")) else {
        return out;
    };
    for e in rd.filter_map(Result::ok) {
        let name = e.file_name();
        if let Some(i) = read_u64(&e.path().join("ifindex")) {
            out.insert(i as u32, name);
        }
    }
    out
}

/// A hex CPU mask as sysfs prints it (`rps_cpus`, `smp_affinity`: `00000000,0000000f`, 32-bit
/// groups, most significant first) as CPU numbers; `None` when malformed.
pub fn parse_cpu_mask(s: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    let groups: Vec<&str> = s.trim().split(',').collect();
    for (i, g) in groups.iter().rev().enumerate() {
        let v = u32::from_str_radix(g, 16).ok()?;
        for bit in 0..32 {
            if v & (1 << bit) != 0 {
                out.push(i as u32 * 32 + bit);
            }
        }
    }
    out.sort_unstable();
    Some(out)
}

/// RPS CPUs of each receive queue of `dev` (`queues/rx-N/rps_cpus`; empty: RPS off), by queue.
pub fn rps_cpus(dev: impl AsRef<OsStr>) -> BTreeMap<String, Vec<u32>> {
    let mut out = BTreeMap::new();
    let Ok(rd) = std::fs::read_dir(dev_path(dev.as_ref()).join("queues")) else {
        return out;
    };
    for e in rd.filter_map(Result::ok) {
        let q = e.file_name().to_string_lossy().into_owned();
        if !q.starts_with("rx-") {
            continue;
        }
        if let Some(cpus) = read_trim(&e.path().join("rps_cpus")).and_then(|m| parse_cpu_mask(&m)) {
            out.insert(q, cpus);
        }
    }
    out
}

/// `/sys/class/net/<dev>`, the name as its bytes.
fn dev_path(dev: &OsStr) -> std::path::PathBuf {
    sys_path("class/net").join(dev)
}

/// Receive ring of a device, as `ethtool -g` shows it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Ring {
    pub rx: u32,
    pub rx_max: u32,
}

/// Queue counts of a device, as `ethtool -l` shows them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Channels {
    pub rx: u32,
    pub combined: u32,
    pub max_rx: u32,
    pub max_combined: u32,
}

const SIOCETHTOOL: libc::c_ulong = 0x8946;
const ETHTOOL_GRINGPARAM: u32 = 0x10;
const ETHTOOL_GCHANNELS: u32 = 0x3c;

/// `struct ifreq` with the `ifr_data` member of its union (40 bytes on 64-bit).
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    data: *mut libc::c_void,
    _pad: [u8; 16],
}

/// Runs ethtool command `T` (a `struct ethtool_*` whose first `u32` is the command) on `dev`;
/// `None` when the driver does not implement it (EOPNOTSUPP) or `dev` is not in this namespace.
fn ethtool<T: Copy>(dev: &OsStr, mut cmd: T) -> Option<T> {
    let dev = dev.as_bytes();
    if dev.is_empty() || dev.len() >= libc::IFNAMSIZ {
        return None;
    }
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        data: (&raw mut cmd).cast(),
        _pad: [0; 16],
    };
    req.name[..dev.len()].copy_from_slice(dev);
    // SAFETY: a plain socket for the ioctl, closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: SIOCETHTOOL reads the NUL-terminated name in `req` and reads/writes the command
    // struct `req.data` points to, whose size matches the command (`T` is the kernel's struct
    // for it, declared below); both outlive the call.
    let rc = unsafe { libc::ioctl(fd, SIOCETHTOOL as _, &raw mut req) };
    // SAFETY: closing the socket made above.
    unsafe { libc::close(fd) };
    (rc == 0).then_some(cmd)
}

/// `struct ethtool_ringparam`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RingParam {
    cmd: u32,
    rx_max_pending: u32,
    rx_mini_max_pending: u32,
    rx_jumbo_max_pending: u32,
    tx_max_pending: u32,
    rx_pending: u32,
    rx_mini_pending: u32,
    rx_jumbo_pending: u32,
    tx_pending: u32,
}

/// `struct ethtool_channels`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct ChannelsParam {
    cmd: u32,
    max_rx: u32,
    max_tx: u32,
    max_other: u32,
    max_combined: u32,
    rx_count: u32,
    tx_count: u32,
    other_count: u32,
    combined_count: u32,
}

/// The receive ring of `dev` (`ETHTOOL_GRINGPARAM`), where the driver exposes it.
pub fn ring(dev: impl AsRef<OsStr>) -> Option<Ring> {
    let r = ethtool(
        dev.as_ref(),
        RingParam {
            cmd: ETHTOOL_GRINGPARAM,
            ..Default::default()
        },
    )?;
    Some(Ring {
        rx: r.rx_pending,
        rx_max: r.rx_max_pending,
    })
}

/// The queue counts of `dev` (`ETHTOOL_GCHANNELS`), where the driver exposes them.
pub fn channels(dev: impl AsRef<OsStr>) -> Option<Channels> {
    let c = ethtool(
        dev.as_ref(),
        ChannelsParam {
            cmd: ETHTOOL_GCHANNELS,
            ..Default::default()
        },
    )?;
    Some(Channels {
        rx: c.rx_count,
        combined: c.combined_count,
        max_rx: c.max_rx,
        max_combined: c.max_combined,
    })
}

/// One socket of `/proc/net/{udp,tcp,udplite}{,6}`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockEntry {
    pub port: u16,
    /// `st`: TCP state (0x0A listen), 0x07 for unconnected UDP.
    pub state: u8,
    /// Bytes waiting to be read.
    pub rx_queue: u64,
    pub inode: u64,
    /// The socket's own drop counter (`sk_drops`; UDP tables only).
    pub drops: Option<u64>,
}

/// Parses a `/proc/net/{udp,tcp}*` table (the same columns for IPv4 and IPv6).
pub fn parse_socket_table(text: &str) -> Vec<SockEntry> {
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let c: Vec<&str> = l.split_whitespace().collect();
            if c.len() < 10 {
                return None;
            }
            let port = u16::from_str_radix(c[1].rsplit_once(':')?.1, 16).ok()?;
            let rx_queue = u64::from_str_radix(c[4].split_once(':')?.1, 16).ok()?;
            Some(SockEntry {
                port,
                state: u8::from_str_radix(c[3], 16).ok()?,
                rx_queue,
                inode: c[9].parse().ok()?,
                drops: c.get(12).and_then(|d| d.parse().ok()),
            })
        })
        .collect()
}

/// Sockets of protocol `proto` (`udp`, `tcp`, `udplite`) bound to local `port`, IPv4 and IPv6,
/// in this network namespace. TCP: listening sockets only (the receiver of new connections).
pub fn port_sockets(proto: &str, port: u16) -> Vec<SockEntry> {
    let mut out = Vec::new();
    for f in [proto.to_string(), format!("{proto}6")] {
        let Ok(text) = read_text(&proc_path(&format!("net/{f}"))) else {
            continue;
        };
        out.extend(
            parse_socket_table(&text)
                .into_iter()
                .filter(|e| e.port == port && e.inode != 0 && (proto != "tcp" || e.state == 0x0a)),
        );
    }
    out
}

/// The processes holding any of `inodes` (from [`socket_owners`]'s answer), sorted, once each.
pub fn holders(owners: &BTreeMap<u64, Vec<u32>>, inodes: &[u64]) -> Vec<u32> {
    let mut pids: Vec<u32> = inodes
        .iter()
        .flat_map(|i| owners.get(i).into_iter().flatten().copied())
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// The processes holding each socket inode of `inodes` open (`socket:[INODE]` in
/// `/proc/<pid>/fd`), by inode.
pub fn socket_owners(inodes: &[u64]) -> BTreeMap<u64, Vec<u32>> {
    let mut out: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    if inodes.is_empty() {
        return out;
    }
    let Ok(procs) = std::fs::read_dir(proc_path("")) else {
        return out;
    };
    for p in procs.filter_map(Result::ok) {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        for fd in fds.filter_map(Result::ok) {
            let Ok(t) = std::fs::read_link(fd.path()) else {
                continue;
            };
            let ino = t
                .to_str()
                .and_then(|t| t.strip_prefix("socket:["))
                .and_then(|t| t.strip_suffix(']'))
                .and_then(|t| t.parse::<u64>().ok());
            if let Some(ino) = ino.filter(|i| inodes.contains(i)) {
                let e = out.entry(ino).or_default();
                if !e.contains(&pid) {
                    e.push(pid);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
