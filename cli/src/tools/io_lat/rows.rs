//! io-lat's rows: one per (device, issuing process, cgroup, op) and one per device, each a
//! typed row (JSON keys and text columns from one struct).

use std::collections::{BTreeMap, BTreeSet};

use probes_common::{
    hist::LatHist,
    io_lat::{
        op_group, DevKey, DevVal, IoKey, IoVal, GROUP_DISCARD, GROUP_READ, GROUP_WRITE, NGROUPS,
        NSIZES, OP_SYNC,
    },
};
use serde::Serialize;

use super::{
    depth::{limits_of, round2, Depth, DepthRow},
    names::Names,
};
use crate::{
    host::{
        cgroup::IdResolver,
        disks::{self, DiskCounters, QueueFacts},
        facts::FactsCache,
    },
    report::{
        hist::{Keyed, Stat},
        sanitize,
        units::per_s,
        who::{Id, Title},
    },
};

/// The statistics of each of a row's latency groups (`queue_p50_ns`, …; no prefix for the
/// whole request).
const LAT_STATS: &[Stat] = &[
    Stat::P50Ns,
    Stat::P90Ns,
    Stat::P99Ns,
    Stat::P999Ns,
    Stat::MaxNs,
    Stat::MeanNs,
    Stat::TotalNs,
];

/// One latency group of a row.
pub type Lat = Keyed;

/// A row's latencies: queue (insert → issue), device (issue → complete), the whole request
/// (from its first bio's submission where seen, else from insert or issue), and before it was
/// inserted or issued (submission → insert: plugging, merge attempts, the wait for a tag).
#[derive(Serialize)]
pub struct Lats {
    #[serde(flatten)]
    pub queue: Lat,
    #[serde(flatten)]
    pub device: Lat,
    #[serde(flatten)]
    pub total: Lat,
    #[serde(flatten)]
    pub before: Lat,
}

impl Lats {
    pub(super) fn of(queue: &LatHist, device: &LatHist, total: &LatHist, before: &LatHist) -> Lats {
        Lats {
            queue: Keyed::of("queue_", queue, LAT_STATS),
            device: Keyed::of("device_", device, LAT_STATS),
            total: Keyed::of("", total, LAT_STATS),
            // No request of the row was seen submitted (`--from request`, classic
            // tracepoints, or all in flight at attach): the time before is not measured,
            // which is not 0 ns.
            before: match before.count {
                0 => Keyed::of("before_", before, LAT_STATS).unmeasured(),
                _ => Keyed::of("before_", before, LAT_STATS),
            },
        }
    }
}

#[derive(Serialize)]
pub struct SizeCount {
    pub min_bytes: u64,
    pub count: u64,
}

/// One (device, issuing process, cgroup, op) in one window.
#[derive(Serialize)]
pub struct SummaryRow {
    pub dev: String,
    pub major: u32,
    pub minor: u32,
    /// The issuing process: pid, comm, title (read while it lived), container.
    #[serde(flatten)]
    pub who: Id,
    /// A kernel thread (writeback kworker, jbd2, kblockd); `null` when it exited unseen.
    pub kthread: Option<bool>,
    pub cgroup_id: u64,
    /// The cgroup the I/O is charged to (writeback: the one that dirtied the pages).
    pub cgroup: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup_bytes: Option<Vec<u8>>,
    pub op: String,
    pub sync: bool,
    pub count: u64,
    pub iops: f64,
    pub bytes: u64,
    pub bytes_per_s: f64,
    /// Requests that never waited in a queue (issued directly).
    pub direct: u64,
    /// Requests with queue time (inserted, or requeued).
    pub queued: u64,
    /// Requests timed from their first bio's submission (the rest from insert or issue: no
    /// bio hook, or submitted before tracing began).
    pub submitted: u64,
    pub errors: BTreeMap<String, u64>,
    pub sizes: Vec<SizeCount>,
    #[serde(flatten)]
    pub lat: Lats,
    #[serde(skip)]
    pub other: bool,
    #[serde(skip)]
    pub cgroup_raw: Vec<u8>,
    #[serde(skip)]
    pub kdev: u32,
    #[serde(skip)]
    pub sizes_raw: [u64; NSIZES],
    #[serde(skip)]
    pub device_hist: LatHist,
    /// The whole request's histogram (`total`): what the issuer waited.
    #[serde(skip)]
    pub total_hist: LatHist,
}

impl crate::report::rows::Row for SummaryRow {
    fn container(&self) -> Option<&crate::report::who::InContainer> {
        Some(&self.who.container)
    }
}

impl SummaryRow {
    pub fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }

    pub fn hist_label(&self) -> String {
        format!(
            "{} {} {} {}",
            self.dev,
            self.op,
            self.who.pid,
            sanitize::text(&self.who.comm_raw)
        )
    }
}

/// One device in one window: sysfs facts, what was counted, `/proc/diskstats` deltas and the
/// queue depth.
#[derive(Serialize)]
pub struct DeviceRow {
    pub dev: String,
    pub major: u32,
    pub minor: u32,
    #[serde(flatten)]
    pub facts: QueueFacts,
    /// `nr_requests` × hardware queues: requests the block layer lets wait or run at once.
    pub queue_limit: Option<u64>,
    pub count: u64,
    pub iops: f64,
    pub bytes: u64,
    pub bytes_per_s: f64,
    /// Completed requests counted, by diskstats group.
    pub reads: u64,
    pub writes: u64,
    pub discards: u64,
    /// `None` when /proc/diskstats gave no count for the window (not read, or the disk gone).
    pub diskstats_reads: Option<u64>,
    pub diskstats_writes: Option<u64>,
    pub diskstats_discards: Option<u64>,
    pub diskstats_flushes: Option<u64>,
    /// Completions the programs saw without a start (in flight at attach, `--pid`/`--comm`
    /// filtered out, ended before issue).
    pub untracked_reads: u64,
    pub untracked_writes: u64,
    /// diskstats − counted − untracked: completions the kernel accounted but never ran the
    /// programs for (0 when every completion was seen; a request still in flight at a window
    /// edge may shift one to the next window).
    pub unseen_reads: Option<i64>,
    pub unseen_writes: Option<i64>,
    /// Busy time (diskstats `io_ticks`) per window, %.
    pub util_pct: f64,
    /// Average requests in flight by diskstats (`weighted time` / window: iostat's aqu-sz).
    pub aqu_sz: f64,
    /// Request time summed over requests where a process waits (sync).
    pub sync_time_ns: u64,
    /// Queue time as a share of request time, %.
    pub queue_share_pct: f64,
    #[serde(flatten)]
    pub lat: Lats,
    #[serde(flatten)]
    pub depth: DepthRow,
    #[serde(skip)]
    pub kdev: u32,
    /// Per op (read, write, …): the split findings cite.
    #[serde(skip)]
    pub by_op: BTreeMap<String, OpLat>,
}

impl crate::report::rows::Row for DeviceRow {}

/// One op's requests on one device.
#[derive(Clone, Debug)]
pub struct OpLat {
    pub count: u64,
    pub queue: LatHist,
    pub device: LatHist,
    pub total: LatHist,
    /// Queue time of requests a process waited for (sync).
    pub sync_queue_ns: u64,
}

impl DeviceRow {
    pub fn unseen(&self) -> i64 {
        self.unseen_reads.unwrap_or(0).abs() + self.unseen_writes.unwrap_or(0).abs()
    }
}

/// What one window's rows are built from.
pub struct Input<'a> {
    pub agg: &'a [(IoKey, IoVal)],
    pub other: &'a IoVal,
    pub devs: &'a [(DevKey, DevVal)],
    pub depth: &'a Depth,
    pub disk_before: &'a BTreeMap<(u32, u32), (String, DiskCounters)>,
    pub disk_now: &'a BTreeMap<(u32, u32), (String, DiskCounters)>,
    /// `--dev` (major, minor).
    pub only: Option<(u32, u32)>,
    pub secs: f64,
}

fn summary_row(
    key: &IoKey,
    v: &IoVal,
    names: &Names,
    facts: &mut FactsCache,
    cgroups: &mut IdResolver,
    secs: f64,
) -> SummaryRow {
    let (major, minor) = disks::split_kdev(key.dev);
    let pf = facts.get(key.tgid).cloned();
    let kcomm = sanitize::comm_bytes(&v.comm).to_vec();
    // A kernel thread's /proc name carries its current work item (kworker/u8:3-events):
    // the comm captured at issue is the one that did this I/O.
    let comm = match &pf {
        Some(p) if !p.kthread => p.comm.clone(),
        _ => kcomm,
    };
    let cg = if key.cgroup_id == 0 {
        Vec::new()
    } else {
        cgroups.path(key.cgroup_id).unwrap_or_default()
    };
    let title = match &pf {
        Some(p) if !p.kthread => Title::of_or(key.tgid, &p.cmdline),
        _ => Title::default(),
    };
    let (g, gb) = sanitize::name_fields(&cg);
    let errors = v
        .errors
        .iter()
        .enumerate()
        .filter(|(_, c)| **c > 0)
        .map(|(s, c)| (names.error(s), *c))
        .collect();
    let sizes = v
        .sizes
        .iter()
        .enumerate()
        .filter(|(_, c)| **c > 0)
        .map(|(b, c)| SizeCount {
            min_bytes: if b == 0 { 0 } else { 1 << (b - 1) },
            count: *c,
        })
        .collect();
    SummaryRow {
        dev: disks::name(major, minor),
        major,
        minor,
        who: Id::new(key.tgid, key.tgid, false, comm, title),
        kthread: pf.map(|p| p.kthread),
        cgroup_id: key.cgroup_id,
        cgroup: (!cg.is_empty()).then_some(g),
        cgroup_bytes: gb,
        op: names.op(key.op),
        sync: key.op & OP_SYNC != 0,
        count: v.count,
        iops: per_s(v.count, secs),
        bytes: v.bytes,
        bytes_per_s: per_s(v.bytes, secs),
        direct: v.direct,
        queued: v.queue.count,
        submitted: v.submitted,
        errors,
        sizes,
        lat: Lats::of(&v.queue, &v.device, &v.total, &v.before),
        other: false,
        cgroup_raw: cg,
        kdev: key.dev,
        sizes_raw: v.sizes,
        device_hist: v.device,
        total_hist: v.total,
    }
}

/// The summary rows (most request time first, `[other]` last) and the device rows.
pub fn build(
    input: &Input,
    names: &Names,
    facts: &mut FactsCache,
    cgroups: &mut IdResolver,
) -> (Vec<SummaryRow>, Vec<DeviceRow>) {
    let secs = input.secs;
    let mut rows: Vec<SummaryRow> = input
        .agg
        .iter()
        .map(|(k, v)| summary_row(k, v, names, facts, cgroups, secs))
        .collect();
    rows.sort_by(|a, b| {
        b.lat
            .total
            .s
            .total_ns
            .cmp(&a.lat.total.s.total_ns)
            .then(b.count.cmp(&a.count))
            .then(a.who.pid.cmp(&b.who.pid))
    });
    if input.other.count > 0 {
        let mut o = summary_row(&IoKey::default(), input.other, names, facts, cgroups, secs);
        o.other = true;
        o.dev = "[other]".into();
        o.op = "all".into();
        o.who = Id::named(b"[other]");
        o.kthread = None;
        rows.push(o);
    }
    let devices = device_rows(input, names, &rows);
    (rows, devices)
}

fn device_rows(input: &Input, names: &Names, rows: &[SummaryRow]) -> Vec<DeviceRow> {
    let mut kdevs: BTreeSet<u32> = rows.iter().filter(|r| !r.other).map(|r| r.kdev).collect();
    kdevs.extend(input.devs.iter().map(|(k, _)| k.dev));
    kdevs.extend(input.depth.per_dev.keys());
    // Request-based disks that did I/O the programs never saw at all (bio-based devices such
    // as zram, dm, md have no requests: their I/O shows on the disks below them).
    let whole: BTreeSet<(u32, u32)> = disks::whole_disks()
        .into_iter()
        .map(|(_, maj, min)| (maj, min))
        .collect();
    for d in input.disk_now.keys() {
        let Some(delta) = window_delta(input, *d) else {
            continue;
        };
        if whole.contains(d)
            && delta.reads + delta.writes > 0
            && disks::QueueFacts::read(d.0, d.1).nr_hw_queues.is_some()
        {
            kdevs.insert(disks::kdev(d.0, d.1));
        }
    }
    if let Some((maj, min)) = input.only {
        kdevs.retain(|&k| k == disks::kdev(maj, min));
        kdevs.insert(disks::kdev(maj, min));
    }
    kdevs
        .into_iter()
        .map(|kdev| device_row(input, names, rows, kdev))
        .collect()
}

/// `/proc/diskstats`' counts of disk `d` over the window, `None` when not measured (the
/// snapshots were not read, or the disk is gone).
fn window_delta(input: &Input, d: (u32, u32)) -> Option<DiskCounters> {
    let (_, now) = input.disk_now.get(&d)?;
    match input.disk_before.get(&d) {
        Some((_, before)) => Some(now.since(before)),
        // Missing from the window's first snapshot (one that was read): the disk was added
        // during the window, and a new disk's counters start at zero, so all of them are this
        // window's. Counting none showed a loop device attached mid-window as diskstats 0,
        // unseen -96 (CI, 12-06).
        None if !input.disk_before.is_empty() => Some(now.since(&now.zero())),
        None => None,
    }
}

fn device_row(input: &Input, names: &Names, rows: &[SummaryRow], kdev: u32) -> DeviceRow {
    let secs = input.secs;
    let (major, minor) = disks::split_kdev(kdev);
    let facts = QueueFacts::read(major, minor);
    let mine: Vec<&SummaryRow> = rows.iter().filter(|r| !r.other && r.kdev == kdev).collect();
    let mut by_group = [0u64; NGROUPS];
    let (mut queue, mut device, mut total) = (LatHist::ZERO, LatHist::ZERO, LatHist::ZERO);
    let mut before = LatHist::ZERO;
    let mut sync_time = 0;
    let mut by_op: BTreeMap<String, OpLat> = BTreeMap::new();
    for (k, v) in input.agg.iter().filter(|(k, _)| k.dev == kdev) {
        let o = by_op.entry(names.op(k.op)).or_insert(OpLat {
            count: 0,
            queue: LatHist::ZERO,
            device: LatHist::ZERO,
            total: LatHist::ZERO,
            sync_queue_ns: 0,
        });
        o.count += v.count;
        o.queue.merge(&v.queue);
        o.device.merge(&v.device);
        o.total.merge(&v.total);
        if k.op & OP_SYNC != 0 {
            o.sync_queue_ns += v.queue.sum;
        }
        by_group[op_group(k.op)] += v.count;
        queue.merge(&v.queue);
        device.merge(&v.device);
        total.merge(&v.total);
        before.merge(&v.before);
        if k.op & OP_SYNC != 0 {
            sync_time += v.total.sum;
        }
    }
    let mut dv = DevVal::ZERO;
    for (_, v) in input.devs.iter().filter(|(k, _)| k.dev == kdev) {
        dv.inflight.merge(&v.inflight);
        dv.queued.merge(&v.queued);
        for (a, b) in dv.untracked.iter_mut().zip(v.untracked) {
            *a += b;
        }
    }
    let measured = window_delta(input, (major, minor));
    let delta = measured.unwrap_or_default();
    let ms = secs * 1000.0;
    let count: u64 = mine.iter().map(|r| r.count).sum();
    let bytes: u64 = mine.iter().map(|r| r.bytes).sum();
    let unseen = |ds: u64, g: usize| ds as i64 - by_group[g] as i64 - dv.untracked[g] as i64;
    let ds = |f: fn(&DiskCounters) -> u64| measured.as_ref().map(f);
    let (queue_limit, _) = limits_of(&facts);
    DeviceRow {
        dev: disks::name(major, minor),
        major,
        minor,
        queue_limit,
        facts,
        count,
        iops: per_s(count, secs),
        bytes,
        bytes_per_s: per_s(bytes, secs),
        reads: by_group[GROUP_READ],
        writes: by_group[GROUP_WRITE],
        discards: by_group[GROUP_DISCARD],
        diskstats_reads: ds(|d| d.reads),
        diskstats_writes: ds(|d| d.writes),
        diskstats_discards: delta.discards,
        diskstats_flushes: delta.flushes,
        untracked_reads: dv.untracked[GROUP_READ],
        untracked_writes: dv.untracked[GROUP_WRITE],
        unseen_reads: ds(|d| d.reads).map(|n| unseen(n, GROUP_READ)),
        unseen_writes: ds(|d| d.writes).map(|n| unseen(n, GROUP_WRITE)),
        util_pct: round2((delta.io_ms as f64 / ms * 100.0).min(100.0)),
        aqu_sz: round2(delta.weighted_ms as f64 / ms),
        sync_time_ns: sync_time,
        queue_share_pct: if total.sum == 0 {
            0.0
        } else {
            round2(queue.sum as f64 * 100.0 / total.sum as f64)
        },
        lat: Lats::of(&queue, &device, &total, &before),
        depth: DepthRow::of(input.depth.per_dev.get(&kdev), input.depth.ticks, &dv),
        kdev,
        by_op,
    }
}

mod schema;
pub use schema::{DEVICES, DEVICE_ROWS, FOOTNOTES, SUMMARY, SUMMARY_ROWS};

#[cfg(test)]
mod tests;
