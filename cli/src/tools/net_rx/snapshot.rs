//! What the kernel itself counts about the receive path, read at each window boundary and
//! differenced: softnet_stat per CPU, the protocol counters, device statistics, conntrack, and
//! interrupts per CPU. All parsing is in `crate::host::net`.

use std::{collections::BTreeMap, ffi::OsString};

use crate::host::net::{self, Conntrack, Irq, Softnet};

/// One reading of the host's counters.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    softnet: Vec<Softnet>,
    counters: BTreeMap<String, i64>,
    devices: BTreeMap<OsString, BTreeMap<&'static str, u64>>,
    conntrack: Option<Conntrack>,
    irqs: Vec<Irq>,
}

/// What changed between two snapshots (a window).
#[derive(Clone, Debug, Default)]
pub struct Delta {
    /// softnet_stat deltas by CPU.
    pub softnet: BTreeMap<u32, Softnet>,
    /// Protocol counters that changed (`Udp:NoPorts` → +3000).
    pub counters: BTreeMap<String, i64>,
    /// Device counters that changed, by device (devices that saw nothing are left out).
    pub devices: BTreeMap<OsString, BTreeMap<&'static str, u64>>,
    /// The conntrack table now, and its statistics' deltas (`drop`, `insert_failed`, …);
    /// `None` when the module is not loaded.
    pub conntrack: Option<(Conntrack, BTreeMap<String, u64>)>,
    /// Interrupts per CPU in the window, by IRQ number, with the IRQ's name and affinity now.
    pub irqs: Vec<(Irq, Vec<u64>)>,
}

impl Snapshot {
    pub fn take() -> Snapshot {
        Snapshot {
            softnet: net::softnet().unwrap_or_default(),
            counters: net::protocol_counters().unwrap_or_default(),
            devices: net::device_counters(),
            conntrack: net::conntrack(),
            irqs: net::interrupts(),
        }
    }

    /// The change from `prev` to `self`.
    pub fn since(&self, prev: &Snapshot) -> Delta {
        let softnet = self
            .softnet
            .iter()
            .map(|now| {
                let before = prev
                    .softnet
                    .iter()
                    .find(|b| b.cpu == now.cpu)
                    .copied()
                    .unwrap_or(Softnet {
                        cpu: now.cpu,
                        ..*now
                    });
                (now.cpu, now.since(&before))
            })
            .collect();
        let counters = self
            .counters
            .iter()
            .filter_map(|(k, v)| {
                let d = v.wrapping_sub(*prev.counters.get(k).unwrap_or(v));
                (d != 0).then(|| (k.clone(), d))
            })
            .collect();
        let devices = self
            .devices
            .iter()
            .filter_map(|(dev, m)| {
                let before = prev.devices.get(dev);
                let d: BTreeMap<&'static str, u64> = m
                    .iter()
                    .map(|(k, v)| {
                        let b = before.and_then(|b| b.get(k)).copied().unwrap_or(*v);
                        (*k, v.wrapping_sub(b))
                    })
                    .collect();
                d.values().any(|v| *v != 0).then(|| (dev.clone(), d))
            })
            .collect();
        let conntrack = self.conntrack.as_ref().map(|now| {
            let stats = now
                .stats
                .iter()
                .map(|(k, v)| {
                    let b = prev
                        .conntrack
                        .as_ref()
                        .and_then(|p| p.stats.get(k))
                        .copied()
                        .unwrap_or(*v);
                    (k.clone(), v.wrapping_sub(b))
                })
                .collect();
            (now.clone(), stats)
        });
        let irqs = self
            .irqs
            .iter()
            .map(|now| {
                let before = prev.irqs.iter().find(|b| b.irq == now.irq);
                let per_cpu = now
                    .per_cpu
                    .iter()
                    .enumerate()
                    .map(|(c, v)| {
                        let b = before.and_then(|b| b.per_cpu.get(c)).copied().unwrap_or(*v);
                        v.wrapping_sub(b)
                    })
                    .collect();
                (now.clone(), per_cpu)
            })
            .collect();
        Delta {
            softnet,
            counters,
            devices,
            conntrack,
            irqs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas_of_each_counter_family() {
        let mut a = Snapshot::default();
        a.softnet.push(Softnet {
            cpu: 1,
            processed: 10,
            dropped: 1,
            ..Default::default()
        });
        a.counters.insert("Udp:NoPorts".into(), 5);
        a.counters.insert("Udp:InErrors".into(), 7);
        a.devices.insert(
            "eth0".into(),
            [("rx_packets", 100u64)].into_iter().collect(),
        );
        a.devices
            .insert("lo".into(), [("rx_packets", 3u64)].into_iter().collect());
        a.irqs.push(Irq {
            irq: 38,
            per_cpu: vec![0, 10],
            name: "virtio2-input.0".into(),
            affinity: Some(vec![1]),
        });
        let mut b = a.clone();
        b.softnet[0].processed = 25;
        b.softnet[0].dropped = 4;
        b.counters.insert("Udp:NoPorts".into(), 3005);
        b.devices
            .get_mut(std::ffi::OsStr::new("eth0"))
            .unwrap()
            .insert("rx_packets", 160);
        b.irqs[0].per_cpu = vec![0, 70];
        b.softnet.push(Softnet {
            cpu: 2,
            processed: 9,
            ..Default::default()
        });
        let d = b.since(&a);
        assert_eq!(d.softnet[&1].processed, 15);
        assert_eq!(d.softnet[&1].dropped, 3);
        assert_eq!(
            d.softnet[&2].processed, 0,
            "a CPU first seen now counts from now"
        );
        assert_eq!(d.counters.len(), 1);
        assert_eq!(d.counters["Udp:NoPorts"], 3000);
        assert_eq!(d.devices.len(), 1, "lo saw nothing");
        assert_eq!(d.devices[std::ffi::OsStr::new("eth0")]["rx_packets"], 60);
        assert_eq!(d.irqs[0].1, [0, 60]);
        assert!(d.conntrack.is_none(), "module not loaded");
    }
}
