//! irq-lat's rows: per (CPU, kind, IRQ or vector), and per CPU, with their text columns.

use crate::report::units::{ppm, window_ppm};
use std::collections::BTreeMap;

use probes_common::{
    hist::LatHist,
    irq_lat::{IrqVal, KIND_HARD},
};
use serde::Serialize;

use crate::report::{
    hist,
    render::fmt_ns,
    rows::Column,
    sanitize,
    schema::{Direction::*, Dist, Field, Rows},
};

/// The statistics of a row's runs in its JSON (`count` and `total_ns` are fields of their own).
const RUN_STATS: &[hist::Stat] = &[
    hist::Stat::MeanNs,
    hist::Stat::P50Ns,
    hist::Stat::P99Ns,
    hist::Stat::MaxNs,
];

/// One CPU's runs of one IRQ or softirq vector in one window.
#[derive(Clone, Debug, Serialize)]
pub struct IrqRow {
    /// `None` for the `[other]` row (keys over the cap, every CPU).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<u32>,
    /// `hard` (an IRQ handler) or `soft` (a softirq vector).
    pub kind: &'static str,
    /// The IRQ number or the softirq vector.
    pub num: u32,
    /// `/proc/interrupts`' name of the IRQ, or the vector's (`NET_RX`).
    pub name: String,
    pub count: u64,
    /// Hard IRQs: runs whose handler returned `IRQ_NONE` (not its device's interrupt).
    pub unhandled: u64,
    pub total_ns: u64,
    /// Share of the CPU's time in the window, parts per million.
    pub cpu_ppm: u64,
    /// This CPU's part of the IRQ's (vector's) time on all CPUs, parts per million.
    pub share_ppm: u64,
    /// `mean_ns`, `p50_ns`, `p99_ns`, `max_ns` of the runs.
    #[serde(flatten)]
    pub lat: hist::Keyed,
    #[serde(skip)]
    pub hist: LatHist,
}

impl crate::report::rows::Row for IrqRow {}

impl IrqRow {
    pub fn new(
        cpu: Option<u32>,
        kind: u32,
        num: u32,
        name: String,
        v: &IrqVal,
        secs: f64,
    ) -> IrqRow {
        let s = hist::stats(&v.hist);
        IrqRow {
            cpu,
            kind: if kind == KIND_HARD { "hard" } else { "soft" },
            num,
            name,
            count: s.count,
            unhandled: v.unhandled,
            total_ns: s.total_ns,
            cpu_ppm: window_ppm(s.total_ns, secs),
            share_ppm: 0,
            lat: hist::Keyed::new("", s, RUN_STATS),
            hist: v.hist,
        }
    }

    /// `NET_RX softirq`, `IRQ 36 virtio1-req.0`.
    pub fn what(&self) -> String {
        let name = sanitize::text(self.name.as_bytes());
        if self.kind == "hard" {
            format!("IRQ {} {name}", self.num)
        } else {
            format!("{name} softirq")
        }
    }
}

/// Each row's part of its IRQ's (vector's) time summed over CPUs.
pub fn set_shares(rows: &mut [IrqRow]) {
    let mut totals: BTreeMap<(&'static str, u32), u64> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.cpu.is_some()) {
        *totals.entry((r.kind, r.num)).or_default() += r.total_ns;
    }
    for r in rows.iter_mut().filter(|r| r.cpu.is_some()) {
        let t = totals[&(r.kind, r.num)];
        r.share_ppm = if t == 0 { 0 } else { ppm(r.total_ns, t as f64) };
    }
}

const IRQ_FIELDS: &[Field] = &[
    Field::id("cpu"),
    Field::id("num"),
    Field::count("count", Neutral).export(
        "tracekit_irq_events",
        "Hard-IRQ handler and softirq runs, per kind, name and CPU.",
    ),
    Field::count("unhandled", LowerIsBetter).export(
        "tracekit_irq_unhandled",
        "Hard-IRQ handler runs that returned IRQ_NONE.",
    ),
    Field::count("total_ns", LowerIsBetter).export(
        "tracekit_irq_time_seconds",
        "Time in hard-IRQ handlers and softirqs, per kind, name and CPU.",
    ),
    Field::level("cpu_ppm", LowerIsBetter),
    Field::level("share_ppm", Neutral),
    Field::stat("mean_ns"),
    Field::stat("p50_ns"),
    Field::stat("p99_ns"),
    Field::stat("max_ns"),
];

/// Per CPU and IRQ or softirq vector.
pub const IRQ_ROWS: Rows = Rows {
    kind: "irq",
    labels: &["kind", "name", "cpu"],
    fields: &[IRQ_FIELDS],
    dists: &[Dist::exported(
        "irq",
        "tracekit_irq_seconds",
        "Duration of each hard-IRQ handler or softirq run.",
    )],
};

pub const IRQS: &[Column<IrqRow>] = &[
    Column::right("CPU", |r, _| r.cpu.map_or("*".into(), |c| c.to_string())),
    Column::left("KIND", |r, _| r.kind.to_string()),
    Column::right("IRQ/VEC", |r, _| r.num.to_string()),
    Column::left("NAME", |r, _| sanitize::text(r.name.as_bytes())),
    Column::right("COUNT", |r, _| r.count.to_string()),
    Column::right("RATE/s", |r, c| format!("{:.0}", r.count as f64 / c.secs)),
    Column::right("TOTAL", |r, _| fmt_ns(r.total_ns)),
    Column::right("%CPU", |r, _| format!("{:.2}", r.cpu_ppm as f64 / 1e4)),
    Column::right("SHARE%", |r, _| {
        if r.cpu.is_some() {
            format!("{:.0}", r.share_ppm as f64 / 1e4)
        } else {
            "-".into()
        }
    }),
    Column::right("MEAN", |r, _| fmt_ns(r.lat.s.mean_ns)),
    Column::right("P50", |r, _| fmt_ns(r.lat.s.p50_ns)),
    Column::right("P99", |r, _| fmt_ns(r.lat.s.p99_ns)),
    Column::right("MAX", |r, _| fmt_ns(r.lat.s.max_ns)),
    Column::right("UNHANDLED", |r, _| r.unhandled.to_string()),
];

/// One CPU's interrupt work in the window.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CpuRow {
    pub cpu: u32,
    pub hard_count: u64,
    pub hard_ns: u64,
    pub soft_count: u64,
    pub soft_ns: u64,
    /// Hard-IRQ plus softirq time as a share of the CPU, parts per million.
    pub irq_ppm: u64,
    /// The IRQ or vector with the most time on this CPU (`NET_RX softirq`).
    pub top: String,
    pub top_ns: u64,
}

impl crate::report::rows::Row for CpuRow {}

const CPU_FIELDS: &[Field] = &[
    Field::id("cpu"),
    Field::count("hard_count", Neutral),
    Field::count("hard_ns", LowerIsBetter),
    Field::count("soft_count", Neutral),
    Field::count("soft_ns", LowerIsBetter),
    Field::level("irq_ppm", LowerIsBetter),
    Field::count("top_ns", LowerIsBetter),
];

/// Interrupt work per CPU.
pub const CPU_ROWS: Rows = Rows {
    kind: "cpu",
    labels: &[],
    fields: &[CPU_FIELDS],
    dists: &[],
};

pub const CPUS: &[Column<CpuRow>] = &[
    Column::right("CPU", |r, _| r.cpu.to_string()),
    Column::right("HARDIRQ", |r, _| fmt_ns(r.hard_ns)),
    Column::right("RUNS", |r, _| r.hard_count.to_string()),
    Column::right("SOFTIRQ", |r, _| fmt_ns(r.soft_ns)),
    Column::right("RUNS", |r, _| r.soft_count.to_string()),
    Column::right("%CPU", |r, _| format!("{:.2}", r.irq_ppm as f64 / 1e4)),
    Column::left("MOST TIME", |r, _| r.top.clone()),
];

/// Per-CPU sums of `rows` (the `[other]` row has no CPU and is left out).
pub fn cpu_rows(rows: &[IrqRow], secs: f64) -> Vec<CpuRow> {
    let mut m: BTreeMap<u32, CpuRow> = BTreeMap::new();
    for r in rows {
        let Some(cpu) = r.cpu else { continue };
        let c = m.entry(cpu).or_insert_with(|| CpuRow {
            cpu,
            ..Default::default()
        });
        if r.kind == "hard" {
            c.hard_count += r.count;
            c.hard_ns += r.total_ns;
        } else {
            c.soft_count += r.count;
            c.soft_ns += r.total_ns;
        }
        if r.total_ns > c.top_ns {
            c.top_ns = r.total_ns;
            c.top = r.what();
        }
    }
    let mut out: Vec<CpuRow> = m.into_values().collect();
    for c in &mut out {
        c.irq_ppm = window_ppm(c.hard_ns + c.soft_ns, secs);
    }
    out
}
