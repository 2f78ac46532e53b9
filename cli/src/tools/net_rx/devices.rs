//! net-rx's rows about the node rather than a flow: devices (counters, rings, interrupts,
//! RPS) and the conntrack table.

use crate::report::units::or_dash;
use std::{collections::BTreeMap, ffi::OsString};

use crate::report::schema::{Direction::*, Field, Rows};
use serde::Serialize;

use super::rows::*;
use crate::{host::net, report::rows::Column};

/// One interrupt of a device: where it may run and where it ran in the window.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DevIrq {
    pub irq: u32,
    pub name: String,
    /// CPUs allowed (`/proc/irq/N/smp_affinity_list`).
    pub affinity: Option<Vec<u32>>,
    /// Interrupts per CPU in the window (non-zero only).
    pub per_cpu: BTreeMap<u32, u64>,
}

/// A device that received packets or dropped some in the window.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DeviceRow {
    /// The device (lossy where its name is not UTF-8; then `dev_bytes` holds the exact bytes).
    pub dev: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dev_bytes: Option<Vec<u8>>,
    /// `/sys/class/net/DEV/statistics` deltas.
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub rx_dropped: u64,
    pub rx_missed_errors: u64,
    pub rx_fifo_errors: u64,
    pub rx_over_errors: u64,
    pub rx_errors: u64,
    /// The receive ring (`ethtool -g`) and queues (`ethtool -l`: rx + combined), where the
    /// driver exposes them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ring: Option<net::Ring>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub channels: Option<net::Channels>,
    /// CPUs RPS may steer each receive queue's packets to (empty: RPS off).
    pub rps_cpus: BTreeMap<String, Vec<u32>>,
    pub irqs: Vec<DevIrq>,
}

impl crate::report::rows::Row for DeviceRow {}

impl DeviceRow {
    /// Drops the NIC or its driver counted: ring full, FIFO overrun, missed.
    pub fn ring_drops(&self) -> u64 {
        self.rx_missed_errors + self.rx_fifo_errors + self.rx_over_errors
    }
}

fn irqs_text(r: &DeviceRow) -> String {
    if r.irqs.is_empty() {
        return "-".into();
    }
    r.irqs
        .iter()
        .map(|i| match &i.affinity {
            Some(a) => format!("{}->{}", i.irq, crate::tools::doctor::node::cpu_ranges(a)),
            None => i.irq.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

const NET_DEVICE: &[Field] = &[
    Field::count("rx_packets", Neutral),
    Field::count("rx_bytes", Neutral),
    Field::count("rx_dropped", LowerIsBetter),
    Field::count("rx_missed_errors", LowerIsBetter),
    Field::count("rx_fifo_errors", LowerIsBetter),
    Field::count("rx_over_errors", LowerIsBetter),
    Field::count("rx_errors", LowerIsBetter),
];

/// Devices that received or dropped packets.
pub const DEVICE_ROWS: Rows = Rows {
    kind: "device",
    labels: &[],
    fields: &[NET_DEVICE],
    dists: &[],
};

pub const DEVICES: &[Column<DeviceRow>] = &[
    Column::left("DEV", |r, _| dev_text(&r.dev, &r.dev_bytes)),
    Column::right("RX-PKTS", |r, _| r.rx_packets.to_string()),
    Column::right("RX/s", |r, c| rate(r.rx_packets as f64 / c.secs)),
    Column::right("DROPPED", |r, _| r.rx_dropped.to_string()),
    Column::right("MISSED", |r, _| r.rx_missed_errors.to_string()),
    Column::right("FIFO", |r, _| r.rx_fifo_errors.to_string()),
    Column::right("OVER", |r, _| r.rx_over_errors.to_string()),
    Column::right("RING", |r, _| {
        r.ring
            .map_or("-".into(), |g| format!("{}/{}", g.rx, g.rx_max))
    }),
    Column::right("QUEUES", |r, _| {
        r.channels
            .map_or("-".into(), |c| (c.rx + c.combined).to_string())
    }),
    Column::left("RPS", |r, _| {
        if r.rps_cpus.values().all(Vec::is_empty) {
            "off".into()
        } else {
            "on".into()
        }
    }),
    Column::left("IRQ->CPU", |r, _| irqs_text(r)),
];

/// Device rows: devices with counter changes in the window (`delta`), with ring, queue, RPS and
/// interrupt facts.
pub fn device_rows(
    delta: &BTreeMap<OsString, BTreeMap<&'static str, u64>>,
    irqs: &[(net::Irq, Vec<u64>)],
) -> Vec<DeviceRow> {
    let mut rows: Vec<DeviceRow> = delta
        .iter()
        .map(|(dev, m)| {
            let g = |k: &str| m.get(k).copied().unwrap_or(0);
            let bus = net::bus_device(dev);
            let (name, dev_bytes) = dev_fields(dev);
            DeviceRow {
                irqs: irqs
                    .iter()
                    .filter(|(i, _)| net::irq_is_device(&i.name, &name, bus.as_deref()))
                    .map(|(i, d)| DevIrq {
                        irq: i.irq,
                        name: i.name.clone(),
                        affinity: i.affinity.clone(),
                        per_cpu: per_cpu(d, |x| *x),
                    })
                    .collect(),
                dev: name,
                dev_bytes,
                rx_packets: g("rx_packets"),
                rx_bytes: g("rx_bytes"),
                rx_dropped: g("rx_dropped"),
                rx_missed_errors: g("rx_missed_errors"),
                rx_fifo_errors: g("rx_fifo_errors"),
                rx_over_errors: g("rx_over_errors"),
                rx_errors: g("rx_errors"),
                ring: net::ring(dev),
                channels: net::channels(dev),
                rps_cpus: net::rps_cpus(dev),
            }
        })
        .collect();
    rows.sort_by(|a, b| {
        (b.ring_drops() + b.rx_dropped)
            .cmp(&(a.ring_drops() + a.rx_dropped))
            .then(b.rx_packets.cmp(&a.rx_packets))
    });
    rows
}

/// The connection-tracking table.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ConntrackRow {
    /// False: the nf_conntrack module is not loaded (nothing is tracked; not an error).
    pub loaded: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fill_pct: Option<f64>,
    /// `/proc/net/stat/nf_conntrack` deltas: new connections dropped because the table was
    /// full, entries evicted early to make room, inserts that failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drop: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub early_drop: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub insert_failed: Option<u64>,
}

impl crate::report::rows::Row for ConntrackRow {}

const NET_CONNTRACK: &[Field] = &[
    Field::level("count", Neutral),
    Field::stat("max"),
    Field::stat("fill_pct"),
    Field::count("drop", LowerIsBetter),
    Field::count("early_drop", LowerIsBetter),
    Field::count("insert_failed", LowerIsBetter),
];

/// The conntrack table.
pub const CONNTRACK_ROWS: Rows = Rows {
    kind: "conntrack",
    labels: &[],
    fields: &[NET_CONNTRACK],
    dists: &[],
};

pub const CONNTRACK: &[Column<ConntrackRow>] = &[
    Column::left("CONNTRACK", |r, _| match (r.loaded, r.count, r.max) {
        (false, ..) => "not loaded".into(),
        (true, Some(c), Some(m)) => format!("{c} of {m} entries"),
        _ => "-".into(),
    }),
    Column::right("FILL%", |r, _| {
        r.fill_pct.map_or("-".into(), |p| format!("{p:.1}"))
    }),
    Column::right("DROP", |r, _| or_dash(r.drop.as_ref())),
    Column::right("EARLY-DROP", |r, _| or_dash(r.early_drop.as_ref())),
    Column::right("INSERT-FAILED", |r, _| or_dash(r.insert_failed.as_ref())),
];

pub fn conntrack_row(c: &Option<(net::Conntrack, BTreeMap<String, u64>)>) -> ConntrackRow {
    match c {
        None => ConntrackRow::default(),
        Some((t, d)) => ConntrackRow {
            loaded: true,
            count: Some(t.count),
            max: Some(t.max),
            fill_pct: (t.max > 0).then(|| t.count as f64 * 100.0 / t.max as f64),
            drop: d.get("drop").copied(),
            early_drop: d.get("early_drop").copied(),
            insert_failed: d.get("insert_failed").copied(),
        },
    }
}
