//! fsync-lat's rows: per process and syscall, and per file (`--by-file`), with their text columns.

use super::*;
use crate::report::hist::{Keyed, Stat};
use crate::report::{
    schema::{Direction::*, Dist, Field, Rows},
    who::ID_FIELDS,
};

/// What the kernel counts beside a key's histogram, summed over the keys of one row.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Counted {
    pub(super) errors: u64,
    pub(super) in_window_ns: u64,
}

/// One process (or thread) and syscall in one window.
#[derive(Serialize)]
pub(super) struct SummaryRow {
    #[serde(flatten)]
    pub(super) who: Id,
    pub(super) syscall: String,
    /// `count`, `mean_ns`, `p50_ns` … `max_ns`, `stddev_ns`, and `total_ns`: the calls'
    /// latencies summed (a call begun in an earlier window counts whole).
    #[serde(flatten)]
    pub(super) lat: Keyed,
    pub(super) errors: u64,
    pub(super) rate_per_s: f64,
    pub(super) cv_pct: u64,
    /// The calls' time inside this window (a call begun before it counts from the window's
    /// start): what `time_ppm` and the findings' shares are of.
    pub(super) in_window_ns: u64,
    /// Share of the window spent in these calls, parts per million (summed over threads).
    pub(super) time_ppm: u64,
    /// The kernel's key: tid with `--threads`, else the process; 0 for `[other]`.
    #[serde(skip)]
    pub(super) id: u32,
    #[serde(skip)]
    pub(super) cv: f64,
    #[serde(skip)]
    pub(super) hist: LatHist,
}

impl crate::report::rows::Row for SummaryRow {
    fn container(&self) -> Option<&crate::report::who::InContainer> {
        Some(&self.who.container)
    }
}

/// The statistics of a summary row.
pub(super) const SUMMARY_STATS: &[Stat] = &[
    Stat::Count,
    Stat::MeanNs,
    Stat::P50Ns,
    Stat::P90Ns,
    Stat::P99Ns,
    Stat::P999Ns,
    Stat::MaxNs,
    Stat::StddevNs,
    Stat::TotalNs,
];

/// The statistics of a `--by-file` row.
pub(super) const FILE_STATS: &[Stat] = &[
    Stat::Count,
    Stat::P50Ns,
    Stat::P99Ns,
    Stat::MaxNs,
    Stat::TotalNs,
];

impl SummaryRow {
    /// Sets every statistic from `hist` over a window of `secs`.
    fn set_stats(&mut self, secs: f64) {
        let s: LatStats = hist::stats(&self.hist);
        self.rate_per_s = crate::report::units::per_s(s.count, secs);
        self.cv_pct = (s.cv * 100.0).round() as u64;
        self.cv = s.cv;
        self.lat = Keyed::new("", s, SUMMARY_STATS);
        self.time_ppm = crate::report::units::window_ppm(self.in_window_ns, secs);
    }
}

pub(super) const SUMMARY: &[Column<SummaryRow>] = &[
    Column::right("PID", |r, _| r.who.id_text()),
    Column::left("COMM", |r, _| r.who.comm_text()),
    Column::left("SYSCALL", |r, _| r.syscall.clone()),
    Column::right("COUNT", |r, _| r.lat.s.count.to_string()),
    Column::right("RATE/s", |r, c| {
        format!("{:.1}", r.lat.s.count as f64 / c.secs)
    }),
    Column::right("ERR", |r, _| r.errors.to_string()),
    Column::right("MEAN", |r, _| fmt_ns(r.lat.s.mean_ns)),
    Column::right("P50", |r, _| fmt_ns(r.lat.s.p50_ns)),
    Column::right("P90", |r, _| fmt_ns(r.lat.s.p90_ns)),
    Column::right("P99", |r, _| fmt_ns(r.lat.s.p99_ns)),
    Column::right("P99.9", |r, _| fmt_ns(r.lat.s.p999_ns)),
    Column::right("MAX", |r, _| fmt_ns(r.lat.s.max_ns)),
    Column::right("STDDEV", |r, _| fmt_ns(r.lat.s.stddev_ns)),
    Column::right("CV", |r, _| {
        if r.cv > 1.0 {
            format!("{:.2}!", r.cv)
        } else {
            format!("{:.2}", r.cv)
        }
    }),
    Column::right("TOTAL", |r, _| fmt_ns(r.lat.s.total_ns)),
    Column::right("%TIME", |r, _| {
        format!("{:.1}", r.time_ppm as f64 / 10_000.0)
    }),
];

const FSYNC_SUMMARY: &[Field] = &[
    Field::count("count", Neutral).export("tracekit_fsync_calls", "Sync-family calls completed."),
    Field::count("errors", LowerIsBetter).export(
        "tracekit_fsync_errors",
        "Sync-family calls that returned an error.",
    ),
    Field::stat("rate_per_s"),
    Field::stat("mean_ns"),
    Field::stat("p50_ns"),
    Field::stat("p90_ns"),
    Field::stat("p99_ns"),
    Field::stat("p999_ns"),
    Field::stat("max_ns"),
    Field::stat("stddev_ns"),
    Field::stat("cv_pct"),
    Field::count("total_ns", LowerIsBetter),
    Field::count("in_window_ns", LowerIsBetter),
    Field::level("time_ppm", LowerIsBetter),
];

/// The summary rows: per process (or thread) and syscall.
pub const SUMMARY_ROWS: Rows = Rows {
    kind: "summary",
    labels: &["syscall"],
    fields: &[ID_FIELDS, FSYNC_SUMMARY],
    dists: &[Dist::exported(
        "fsync",
        "tracekit_fsync_latency_seconds",
        "Latency of sync-family calls.",
    )],
};

/// One file of a process in one window (`--by-file`).
#[derive(Serialize)]
pub(super) struct FileRow {
    #[serde(flatten)]
    pub(super) who: Id,
    pub(super) fd: i32,
    /// `major:minor` of the file's device.
    pub(super) dev: String,
    pub(super) inode: u64,
    /// The inode's generation: file systems reuse inode numbers, (inode, generation) does not
    /// repeat.
    pub(super) inode_generation: u32,
    /// `open`, `deleted` (unlinked while open), `renamed` (its name now names another file, or
    /// nothing), `closed` (closed before its directory could be read: `…/name` from the kernel),
    /// or `unknown`.
    pub(super) file_state: &'static str,
    pub(super) file: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) file_bytes: Option<Vec<u8>>,
    /// `count`, `p50_ns`, `p99_ns`, `max_ns`, `total_ns`.
    #[serde(flatten)]
    pub(super) lat: Keyed,
    #[serde(skip)]
    pub(super) file_raw: Vec<u8>,
}

impl crate::report::rows::Row for FileRow {
    fn container(&self) -> Option<&crate::report::who::InContainer> {
        Some(&self.who.container)
    }
}

const FSYNC_FILE: &[Field] = &[
    Field::key("fd"),
    Field::key("inode"),
    Field::key("inode_generation"),
    Field::count("count", Neutral),
    Field::stat("p50_ns"),
    Field::stat("p99_ns"),
    Field::stat("max_ns"),
    Field::count("total_ns", LowerIsBetter),
];

/// `--by-file` rows: per process (or thread) and file.
pub const FILE_ROWS: Rows = Rows {
    kind: "file",
    labels: &[],
    fields: &[ID_FIELDS, FSYNC_FILE],
    dists: &[],
};

pub(super) const FILES: &[Column<FileRow>] = &[
    Column::right("PID", |r, _| r.who.id_text()),
    Column::left("COMM", |r, _| r.who.comm_text()),
    Column::right("COUNT", |r, _| r.lat.s.count.to_string()),
    Column::right("P50", |r, _| fmt_ns(r.lat.s.p50_ns)),
    Column::right("P99", |r, _| fmt_ns(r.lat.s.p99_ns)),
    Column::right("MAX", |r, _| fmt_ns(r.lat.s.max_ns)),
    Column::right("TOTAL", |r, _| fmt_ns(r.lat.s.total_ns)),
    Column::left("FILE", |r, _| {
        format!("{} (fd {})", sanitize::text(&r.file_raw), r.fd)
    }),
];

impl FsyncLat {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn summary_row(
        &self,
        id: u32,
        tgid: u32,
        comm: Vec<u8>,
        title: Title,
        syscall: String,
        counted: Counted,
        h: &LatHist,
        secs: f64,
    ) -> SummaryRow {
        let mut r = SummaryRow {
            who: Id::new(id, tgid, self.scope.threads, comm, title),
            syscall,
            lat: Keyed::new("", LatStats::default(), SUMMARY_STATS),
            errors: counted.errors,
            rate_per_s: 0.0,
            cv_pct: 0,
            in_window_ns: counted.in_window_ns,
            time_ppm: 0,
            id,
            cv: 0.0,
            hist: *h,
        };
        r.set_stats(secs);
        r
    }
}
