//! io-lat's rows: one per (device, issuing process, cgroup, op) and one per device, each a
//! typed row (JSON keys and text columns from one struct).

use std::collections::{BTreeMap, BTreeSet};

use crate::report::{
    schema::{Direction::*, Dist, Field, Rows},
    who::ID_FIELDS,
};
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
        render::fmt_ns,
        rows::Column,
        sanitize,
        units::{or_dash, per_s},
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
            before: Keyed::of("before_", before, LAT_STATS),
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

fn mbps(bytes_per_s: f64) -> String {
    format!("{:.2}", bytes_per_s / 1e6)
}

/// `512`, `4K`, `1M`.
fn size_label(n: u64) -> String {
    match n {
        0..1024 => n.to_string(),
        1024..0x10_0000 => format!("{}K", n >> 10),
        _ => format!("{}M", n >> 20),
    }
}

/// The one or two commonest request sizes and their shares: `4K`, `4K 60%,128K 40%`.
fn sizes_text(sizes: &[u64; NSIZES]) -> String {
    let total: u64 = sizes.iter().sum();
    let mut v: Vec<(usize, u64)> = sizes
        .iter()
        .copied()
        .enumerate()
        .filter(|x| x.1 > 0)
        .collect();
    v.sort_by_key(|x| std::cmp::Reverse(x.1));
    let label = |b: usize| size_label(if b == 0 { 0 } else { 1 << (b - 1) });
    match v.as_slice() {
        [] => "-".into(),
        [(b, c), ..] if *c == total => label(*b),
        v => v
            .iter()
            .take(2)
            .map(|(b, c)| format!("{} {:.0}%", label(*b), *c as f64 * 100.0 / total as f64))
            .collect::<Vec<_>>()
            .join(","),
    }
}

fn op_text(r: &SummaryRow) -> String {
    if r.sync || r.other {
        r.op.clone()
    } else {
        format!("{} async", r.op)
    }
}

/// The fields of one latency group of [`Lats`] with key prefix `$p`, in [`LAT_STATS`]'s order
/// (totals are time waited; the statistics come from the distributions).
macro_rules! lat_fields {
    ($p:literal) => {
        &[
            Field::stat(concat!($p, "p50_ns")),
            Field::stat(concat!($p, "p90_ns")),
            Field::stat(concat!($p, "p99_ns")),
            Field::stat(concat!($p, "p999_ns")),
            Field::stat(concat!($p, "max_ns")),
            Field::stat(concat!($p, "mean_ns")),
            Field::count(concat!($p, "total_ns"), LowerIsBetter),
        ]
    };
}

/// The numbers of a row's [`Lats`]: queue, device, whole-request and before-queue latencies.
const QUEUE_FIELDS: &[Field] = lat_fields!("queue_");
const DEVICE_FIELDS: &[Field] = lat_fields!("device_");
const TOTAL_FIELDS: &[Field] = lat_fields!("");
const BEFORE_FIELDS: &[Field] = lat_fields!("before_");

const IO_SUMMARY: &[Field] = &[
    Field::id("major"),
    Field::id("minor"),
    Field::key("cgroup_id"),
    Field::count("count", Neutral).export("tracekit_io_requests", "Block I/O requests completed."),
    Field::count("iops", Neutral),
    Field::count("bytes", Neutral).export("tracekit_io_bytes", "Bytes of block I/O completed."),
    Field::stat("bytes_per_s"),
    Field::count("direct", Neutral),
    // Requests that went through the I/O scheduler's queue: with no scheduler (`none`) none do,
    // so fewer is an accounting change, not an improvement (issue #33: "queued/s 4662 → 0,
    // better" was compare's top line after switching the scheduler off).
    Field::count("queued", Neutral),
    Field::count("submitted", Neutral),
];

/// The summary rows: per device, issuing process, cgroup and op.
pub const SUMMARY_ROWS: Rows = Rows {
    kind: "summary",
    labels: &["dev", "op"],
    fields: &[
        ID_FIELDS,
        IO_SUMMARY,
        QUEUE_FIELDS,
        DEVICE_FIELDS,
        TOTAL_FIELDS,
        BEFORE_FIELDS,
    ],
    // `total` is what the issuer felt (from its bio's submission), so `compare` ranks a
    // scheduler that makes requests wait before the device by it; `device` alone hides that.
    dists: &[
        Dist::exported(
            "device",
            "tracekit_io_device_latency_seconds",
            "Block I/O time in the device.",
        ),
        Dist::exported(
            "total",
            "tracekit_io_latency_seconds",
            "Block I/O time from the bio's submission (else from insert or issue) to completion: what the issuer waited for.",
        ),
    ],
};

pub const SUMMARY: &[Column<SummaryRow>] = &[
    Column::left("DEV", |r, _| r.dev.clone()),
    Column::right("PID", |r, _| r.who.id_text()),
    Column::left("COMM", |r, _| r.who.comm_text()),
    Column::left("OP", |r, _| op_text(r)),
    Column::right("COUNT", |r, _| r.count.to_string()),
    Column::right("IOPS", |r, _| format!("{:.0}", r.iops)),
    Column::right("MB/s", |r, _| mbps(r.bytes_per_s)),
    Column::right("SIZE", |r, _| sizes_text(&r.sizes_raw)),
    Column::right("PRE P99", |r, _| fmt_ns(r.lat.before.s.p99_ns)),
    Column::right("Q P50", |r, _| fmt_ns(r.lat.queue.s.p50_ns)),
    Column::right("Q P99", |r, _| fmt_ns(r.lat.queue.s.p99_ns)),
    Column::right("D P50", |r, _| fmt_ns(r.lat.device.s.p50_ns)),
    Column::right("D P99", |r, _| fmt_ns(r.lat.device.s.p99_ns)),
    Column::right("P99", |r, _| fmt_ns(r.lat.total.s.p99_ns)),
    Column::right("P99.9", |r, _| fmt_ns(r.lat.total.s.p999_ns)),
    Column::right("MAX", |r, _| fmt_ns(r.lat.total.s.max_ns)),
    Column::right("ERR", |r, _| r.error_count().to_string()),
    Column::left("CGROUP", |r, _| {
        if r.cgroup_raw.is_empty() {
            "-".into()
        } else {
            sanitize::text(&r.cgroup_raw)
        }
    }),
];

fn mean_max(mean: Option<f64>, max: Option<u64>) -> String {
    match (mean, max) {
        (Some(m), Some(x)) => format!("{m:.1}/{x}"),
        _ => "-".into(),
    }
}

const IO_DEVICE: &[Field] = &[
    Field::id("major"),
    Field::id("minor"),
    Field::key("nr_requests"),
    Field::key("nr_hw_queues"),
    Field::key("hw_queue_depth"),
    Field::key("read_ahead_kb"),
    Field::key("wbt_lat_usec"),
    Field::key("max_sectors_kb"),
    Field::key("queue_limit"),
    Field::count("count", Neutral),
    Field::count("iops", Neutral),
    Field::count("bytes", Neutral),
    Field::stat("bytes_per_s"),
    Field::count("reads", Neutral),
    Field::count("writes", Neutral),
    Field::count("discards", Neutral),
    Field::count("diskstats_reads", Neutral),
    Field::count("diskstats_writes", Neutral),
    Field::count("diskstats_discards", Neutral),
    Field::count("diskstats_flushes", Neutral),
    Field::count("untracked_reads", Neutral),
    Field::count("untracked_writes", Neutral),
    Field::count("unseen_reads", Neutral),
    Field::count("unseen_writes", Neutral),
    Field::stat("util_pct"),
    Field::stat("aqu_sz"),
    Field::count("sync_time_ns", LowerIsBetter),
    Field::stat("queue_share_pct"),
    Field::count("depth_samples", Neutral),
    Field::stat("inflight_mean"),
    Field::stat("inflight_max"),
    Field::stat("queued_mean"),
    Field::stat("queued_max"),
    Field::stat("full_pct"),
    Field::stat("hw_full_pct"),
    Field::stat("inflight_at_issue_mean"),
    Field::stat("inflight_at_issue_max"),
    Field::stat("queued_at_insert_mean"),
    Field::stat("queued_at_insert_max"),
];

/// Per device: the queue, the kernel's own counts, the depth.
pub const DEVICE_ROWS: Rows = Rows {
    kind: "device",
    labels: &[],
    fields: &[
        IO_DEVICE,
        QUEUE_FIELDS,
        DEVICE_FIELDS,
        TOTAL_FIELDS,
        BEFORE_FIELDS,
    ],
    dists: &[],
};

pub const DEVICES: &[Column<DeviceRow>] = &[
    Column::left("DEV", |r, _| r.dev.clone()),
    Column::left("SCHED", |r, _| or_dash(r.facts.scheduler.clone())),
    Column::left("ROT", |r, _| match r.facts.rotational {
        Some(true) => "yes".into(),
        Some(false) => "no".into(),
        None => "-".into(),
    }),
    Column::right("NR_REQ", |r, _| or_dash(r.facts.nr_requests)),
    Column::right("HW DEPTH", |r, _| or_dash(r.facts.hw_queue_depth)),
    Column::right("IOPS", |r, _| format!("{:.0}", r.iops)),
    Column::right("MB/s", |r, _| mbps(r.bytes_per_s)),
    Column::right("UTIL%", |r, _| format!("{:.0}", r.util_pct)),
    Column::right("AQU", |r, _| format!("{:.1}", r.aqu_sz)),
    Column::right("INFLIGHT", |r, _| {
        mean_max(r.depth.inflight_mean, r.depth.inflight_max)
    }),
    Column::right("QUEUED", |r, _| {
        mean_max(r.depth.queued_mean, r.depth.queued_max)
    }),
    Column::right("FULL%", |r, _| {
        r.depth
            .full_pct
            .map(|p| format!("{p:.0}"))
            .unwrap_or("-".into())
    }),
    Column::right("Q SHARE%", |r, _| format!("{:.0}", r.queue_share_pct)),
    Column::right("Q P99", |r, _| fmt_ns(r.lat.queue.s.p99_ns)),
    Column::right("D P99", |r, _| fmt_ns(r.lat.device.s.p99_ns)),
    Column::right("DISKSTATS R/W", |r, _| {
        let n = |v: Option<u64>| v.map_or("-".into(), |v| v.to_string());
        format!("{}/{}", n(r.diskstats_reads), n(r.diskstats_writes))
    }),
    Column::right("UNSEEN", |r, _| r.unseen().to_string()),
];

pub const FOOTNOTES: &[&str] = &[
    "PRE: before the request was queued (its first bio's submission -> insert or issue: plugging, merge attempts, the wait for a tag); Q: queue time (insert -> issue: in the I/O scheduler, waiting for a driver tag); D: device time (issue -> complete); P99/MAX: the whole request, from its submission where seen.",
    "INFLIGHT/QUEUED: requests at the driver / in the queue, mean/max sampled every 10 ms; FULL%: share of the window at nr_requests; UNSEEN: diskstats - counted - untracked.",
    "Dirtied: page cache each process made dirty per disk, which the flusher (kworker) writes back; FOLIOS: dirtying events (a large folio is one), DIRTIED: their bytes (each thread's last folio in the window is not counted).",
];

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

#[cfg(test)]
mod tests;
