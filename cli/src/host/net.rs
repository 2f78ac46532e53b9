//! The receive path as the kernel counts it: `/proc/net/softnet_stat` (per CPU),
//! `/proc/net/snmp` and `/proc/net/netstat` (protocol counters), `/sys/class/net/*/statistics`
//! (per device), conntrack fill, and which CPUs a device's interrupts land on
//! (`/proc/interrupts`, `/proc/irq/*/smp_affinity_list`).
//!
//! `/proc/net/snmp` is parsed here rather than with `procfs::net::Snmp`, which fails as a whole
//! when a kernel lacks one of the fields it expects, and does not cover `/proc/net/netstat`.

use std::collections::BTreeMap;

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

/// `/proc/net/snmp` and `/proc/net/netstat` together (`Udp:NoPorts`, `TcpExt:ListenDrops`, …).
pub fn protocol_counters() -> Result<BTreeMap<String, i64>, HostError> {
    let mut m = parse_counter_pairs(&read_text(&proc_path("net/snmp"))?);
    if let Ok(t) = read_text(&proc_path("net/netstat")) {
        m.extend(parse_counter_pairs(&t));
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
pub fn device_counters() -> BTreeMap<String, BTreeMap<&'static str, u64>> {
    let dir = sys_path("class/net");
    let mut out = BTreeMap::new();
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return out;
    };
    for e in rd.filter_map(Result::ok) {
        let name = e.file_name().to_string_lossy().into_owned();
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
    let Ok(text) = read_text(&proc_path("interrupts")) else {
        return Vec::new();
    };
    parse_interrupts(&text)
        .into_iter()
        .filter(|i| i.name.contains(dev))
        .map(|mut i| {
            i.affinity = read_trim(&proc_path(&format!("irq/{}/smp_affinity_list", i.irq)))
                .and_then(|s| parse_cpu_list(&s));
            i
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn softnet_new_and_old_layouts() {
        let new = "\
0000000b 00000002 00000001 00000000 00000000 00000000 00000000 00000000 00000000 00000005 00000000 00000000 00000000 00000000 00000000
0000210d 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000003 00000000 00000000
";
        let s = parse_softnet(new);
        assert_eq!(s.len(), 2);
        assert_eq!(
            (s[0].cpu, s[0].processed, s[0].dropped, s[0].time_squeeze),
            (0, 11, 2, 1)
        );
        assert_eq!(s[0].received_rps, 5);
        assert_eq!((s[1].cpu, s[1].processed), (3, 0x210d));
        let old = "00000010 00000000 00000001 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000\n";
        assert_eq!(parse_softnet(old)[0].cpu, 0);
        assert!(parse_softnet("zz\n").is_empty());
        let a = Softnet {
            processed: 0xffff_fff0,
            ..Default::default()
        };
        let b = Softnet {
            processed: 0x10,
            ..Default::default()
        };
        assert_eq!(b.since(&a).processed, 0x20, "32-bit counters wrap");
    }

    #[test]
    fn snmp_pairs() {
        let t = "\
Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors
Udp: 10 1300000 5 9 1360000
Tcp: RtoAlgorithm MaxConn
Tcp: 1 -1
Broken: a b
";
        let m = parse_counter_pairs(t);
        assert_eq!(m["Udp:NoPorts"], 1_300_000);
        assert_eq!(m["Udp:RcvbufErrors"], 1_360_000);
        assert_eq!(m["Tcp:MaxConn"], -1);
        assert!(!m.keys().any(|k| k.starts_with("Broken")));
    }

    #[test]
    fn conntrack_columns_summed() {
        let t = "entries  clashres found drop insert_failed\n0000000a 00000001 00000000 00000002 00000003\n0000000a 00000001 00000000 00000004 00000000\n";
        let m = parse_conntrack_stat(t);
        assert_eq!(m["drop"], 6);
        assert_eq!(m["insert_failed"], 3);
        assert!(!m.contains_key("entries"));
    }

    #[test]
    fn interrupts_per_cpu_and_names() {
        let t = "           CPU0       CPU1\n 24:          1          0  IO-APIC   5-edge      ACPI:Ged\n 30:       900         12  PCI-MSIX-0000:00:03.0   1-edge      virtio0-input.0\nNMI:          0          0   Non-maskable interrupts\n";
        let v = parse_interrupts(t);
        assert_eq!(v.len(), 2);
        assert_eq!(v[1].irq, 30);
        assert_eq!(v[1].per_cpu, [900, 12]);
        assert_eq!(v[1].name, "virtio0-input.0");
    }

    #[test]
    fn reads_this_machine() {
        assert!(!softnet().unwrap().is_empty());
        let c = protocol_counters().unwrap();
        assert!(c.contains_key("Udp:NoPorts"), "{c:?}");
        assert!(device_counters().contains_key("lo"));
    }
}
