//! How io-lat's rows are exported and shown: the fields of each row kind (JSON keys, metrics,
//! what `compare` compares), the text columns, and the notes under the tables.

use crate::report::{
    hist::Stat,
    render::fmt_ns,
    rows::Column,
    sanitize,
    schema::{Direction::*, Dist, Field, Rows},
    units::or_dash,
    who::ID_FIELDS,
};
use probes_common::io_lat::NSIZES;

use super::{DeviceRow, SummaryRow};

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
pub(super) fn sizes_text(sizes: &[u64; NSIZES]) -> String {
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
    Column::right("PRE P99", |r, _| {
        or_dash(r.lat.before.get(Stat::P99Ns).map(fmt_ns))
    }),
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
