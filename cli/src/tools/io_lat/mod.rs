//! `tracekit io-lat`: block I/O per device and issuing process, split into queue time
//! (insert → issue: in the I/O scheduler, waiting for a driver tag) and device time
//! (issue → complete), with sizes, errors and queue depth, matched against `/proc/diskstats`.
//!
//! Kernel side: `probes-ebpf/src/bin/io_lat.rs` (hooks, the request lifecycle, which struct
//! members are read and why). Requests are tracked by `struct request *` on BTF or raw
//! tracepoints, else (no kernel BTF, or `--attach tracepoint`) on the classic tracepoints keyed
//! by (dev, sector); the meta line says which (`attach`, `keyed_by`).
//!
//! Here: the attach plan and the globals it needs (struct offsets and prototype variants from
//! BTF, or field offsets from the format files), a 100 Hz sampler of the live queue depth
//! (time-weighted, against `nr_requests` and the hardware queue depth), and per window the
//! rows ([`rows`]) and findings ([`findings`]).

mod depth;
mod dirty;
mod findings;
mod names;
mod open;
mod rows;
mod slots;

use crate::report::findings::Cause;
use crate::report::links::{DiskIssuer, Link};
use std::{
    collections::BTreeMap,
    os::fd::{AsRawFd, OwnedFd, RawFd},
};

use aya::maps::{MapData, PerCpuArray, RingBuf};
use probes_common::io_lat::{
    DevKey, DevVal, DirtyKey, DirtyVal, IoKey, IoNew, IoVal, ANOM_NAMES, NANOM, STAT_ANOMALY,
    STAT_DIRECT, STAT_PARTIAL,
};

use crate::{
    host::{
        cgroup::IdResolver,
        disks::{self, DiskCounters},
        facts::Facts,
    },
    tools::prelude::*,
};

pub use open::{open, rq_offsets};

/// Period of the depth sampler's timer.
const SAMPLE_PERIOD_NS: i64 = 10_000_000;

pub const INFO: ToolInfo = ToolInfo {
    name: "io-lat",
    summary: "Block I/O per device and issuing process (writeback shown as the kworker, with the cgroup it is charged to): IOPS, bytes/s, queue time in the I/O scheduler vs device time (p50/p90/p99/p99.9/max), request sizes, errors, queue depth against `nr_requests`, counts matched to `/proc/diskstats`; who dirtied each disk's pages (what the flusher writes back for them); findings name the wrong scheduler, the too-shallow queue or the process saturating the device.",
    hooks: HOOKS,
    // Per request ≈ 0.45 µs (direct issue) to 0.7 µs (through a scheduler) in the kernel,
    // aggregated there: cheap next to the I/O itself, so triage runs it.
    triage: true,
    hidden: false,
    // The classic fallback (keyed by dev+sector) needs no struct offsets: runs without BTF.
    needs_btf: false,
    rows: &[&rows::SUMMARY_ROWS, &rows::DEVICE_ROWS, &dirty::DIRTY_ROWS],
    causes: &[IO_QUEUE, IO_LATENCY, IO_SCHEDULER],
    by_container: true,
    joins: &[],
};

// The causes this tool concludes (listed in INFO; see report::findings::Cause).
pub const IO_QUEUE: Cause = Cause::new(
    "io-queue",
    "Block requests wait longer in the queue (scheduler, depth) than in the device.",
);
pub const IO_LATENCY: Cause = Cause::new(
    "io-latency",
    "A device is slow to complete the requests a process waits for.",
);
pub const IO_SCHEDULER: Cause = Cause::new(
    "io-scheduler",
    "A device's I/O scheduler or queue depth does not suit the device.",
);

const OBJECT: Object = crate::object!("io_lat");

/// The event's programs, cheapest mode first. `raw` is the event's own name on purpose: it makes
/// the attach policy (and so `doctor`) accept raw_tp only where the kernel's BTF knows the
/// tracepoint, because the raw_tp programs, like tp_btf, need struct offsets from BTF.
/// One group: every hook attaches in one mode (the in-flight map is keyed by request address
/// or by (dev, sector)). Completion first, then requeue and merge, then issue and insert, so a
/// request seen starting is seen ending. Without insert there is no queue time; without
/// requeue and merge the depth counters may drift (each is counted as an anomaly).
pub const HOOKS: &[Hook] = &[
    crate::hook!(
        concat!("block:", "block_rq_complete"),
        "tk_io_complete",
        [TpBtf, RawTp, Tracepoint],
        raw: Some("block_rq_complete"),
        fields: &["dev", "sector", "error", "nr_sector", "rwbs"],
        optional: false,
        group: "block_rq",
    ),
    crate::hook!(
        concat!("block:", "block_rq_requeue"),
        "tk_io_requeue",
        [TpBtf, RawTp, Tracepoint],
        raw: Some("block_rq_requeue"),
        fields: &["dev", "sector"],
        optional: true,
        group: "block_rq",
    ),
    crate::hook!(
        concat!("block:", "block_rq_merge"),
        "tk_io_merge",
        [TpBtf, RawTp, Tracepoint],
        raw: Some("block_rq_merge"),
        fields: &["dev", "sector"],
        optional: true,
        group: "block_rq",
    ),
    crate::hook!(
        concat!("block:", "block_rq_issue"),
        "tk_io_issue",
        [TpBtf, RawTp, Tracepoint],
        raw: Some("block_rq_issue"),
        fields: &["dev", "sector", "bytes", "rwbs"],
        optional: false,
        group: "block_rq",
    ),
    crate::hook!(
        concat!("block:", "block_rq_insert"),
        "tk_io_insert",
        [TpBtf, RawTp, Tracepoint],
        raw: Some("block_rq_insert"),
        fields: &["dev", "sector", "bytes", "rwbs"],
        optional: true,
        group: "block_rq",
    ),
    // When each request's first bio was submitted, so the whole request's time starts where
    // the issuer's wait does (issue #33: fio's clat p50 155 µs against io-lat's 102 µs from
    // insert). Request-keyed modes only: the classic records have no bio to match. The raw
    // tracepoint first: the program reads nothing through the bio, and there its argument is
    // a number without a round trip through a map (the kernel's io_lat/bio.rs).
    crate::hook!(
        concat!("block:", "block_bio_queue"),
        "tk_io_bio",
        [RawTp, TpBtf],
        raw: Some("block_bio_queue"),
        optional: true,
        when: "timing each request from its first bio's submission, the default (`--from request` leaves it out)",
    ),
    // Who dirtied the pages the flusher writes (the kernel's dirty.rs): classic only, as the
    // record names the bdi; renamed in 6.0, so one of the two exists (open keeps that one).
    crate::hook!(
        concat!("writeback:", "writeback_dirty_folio"),
        "tk_io_dirty",
        [Tracepoint],
        fields: &["name"],
        optional: true,
    ),
    crate::hook!(
        concat!("writeback:", "writeback_dirty_page"),
        "tk_io_dirty",
        [Tracepoint],
        fields: &["name"],
        optional: true,
    ),
];

const EXAMPLES: &str =
    "  tracekit io-lat --duration 10s                    # who does I/O where, queue vs device time
  tracekit io-lat --dev nvme0n1 --duration 30s      # one disk (a partition means its disk)
  tracekit io-lat --duration 10m --interval 5s --json --output io.ndjson   # follow with tail -f";

const NEEDS: &str = "root, or exactly CAP_BPF and CAP_PERFMON on a kernel with BTF (CAP_SYS_ADMIN \
stands in for both). Without BTF it falls back to classic tracepoints, which read tracefs: add \
CAP_DAC_READ_SEARCH (tracefs is mode 0700), and CAP_SYS_ADMIN if tracefs must be mounted. \
The dirtied rows always read one tracefs format (writeback:writeback_dirty_folio): without \
tracefs they are skipped, with a note.";

#[derive(clap::Args, Debug)]
#[command(after_help = tools::help_footer(EXAMPLES, NEEDS))]
pub struct Args {
    #[command(flatten)]
    pub common: Common,

    /// Trace only this disk (vda, nvme0n1, loop3; a partition means its whole disk, as
    /// /proc/diskstats and the block tracepoints count requests).
    #[arg(long, value_name = "DISK")]
    pub dev: Option<String>,

    /// Attach mode (default: the cheapest this kernel allows, as `tracekit doctor` reports).
    #[arg(long, value_enum, value_name = "MODE")]
    /// (`tracepoint` keys requests by (dev, sector): no cgroup, no partial completions.)
    pub attach: Option<ForceMode>,

    /// Rows shown in the text table, most request time first (0: all). JSON has every row.
    #[arg(long, default_value_t = 25, value_name = "N")]
    pub rows: usize,

    /// Where a request's time starts: `submit`, its first bio's submission (what the issuer
    /// waited for: plugging, merge attempts and the wait for a tag included, shown apart as
    /// PRE); or `request`, where the block layer first holds it as a request (its insert, or
    /// its issue without a scheduler), as libbpf-tools `biolatency -Q` starts: one hook less
    /// per bio, for a device doing hundreds of thousands of requests a second.
    #[arg(long, value_enum, default_value_t = IoFrom::Submit, value_name = "EVENT")]
    pub from: IoFrom,
}

/// Where io-lat starts a request's time (`--from`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum IoFrom {
    /// `block:block_bio_queue`, the first bio's submission, in the issuer.
    #[default]
    Submit,
    /// `block:block_rq_insert`, else `block:block_rq_issue`: the request first seen.
    Request,
}

impl IoFrom {
    /// How the report names it (`from` in the meta line).
    pub fn as_str(self) -> &'static str {
        match self {
            IoFrom::Submit => "submit",
            IoFrom::Request => "request",
        }
    }
}

pub fn run(args: Args) -> Result<()> {
    tools::run_collector(INFO.name, &args.common, |ctx| open(&args, ctx))
}

/// The hooks with only `force`'s program each (or all of them): `--attach` is about the request
/// hooks; the dirtying hook has one mode.
fn hooks_for(force: Option<AttachMode>) -> Vec<Hook> {
    HOOKS
        .iter()
        .filter_map(|h| match force {
            // Classic records have no bio to match a submission with.
            Some(AttachMode::Tracepoint) if h.name() == BIO_EVENT => None,
            Some(m) if h.group == "block_rq" || h.name() == BIO_EVENT => Some(h.only(m)),
            _ => Some(*h),
        })
        .collect()
}

/// The bio submission event (see [`HOOKS`]).
pub(super) const BIO_EVENT: &str = "block_bio_queue";

struct IoLat {
    session: Session,
    agg: GenMap<IoKey, IoVal>,
    devs: GenMap<DevKey, DevVal>,
    /// Pages dirtied per (disk, process): whose pages writeback writes.
    dirtied: GenMap<DirtyKey, DirtyVal>,
    /// The kernel accounts task I/O (`ioac.write_bytes`): dirtied bytes are measured.
    dirty_bytes: bool,
    /// Device slots, the live counters and the event-weighted depth by slot.
    slots: slots::Slots,
    new: RingBuf<MapData>,
    timer: OwnedFd,
    sampler: depth::Sampler,
    facts: Facts,
    cgroups: IdResolver,
    disk_prev: BTreeMap<(u32, u32), (String, DiskCounters)>,
    names: names::Names,
    mode: AttachMode,
    /// `--dev`: (name, major, minor) of the whole disk.
    dev: Option<(String, u32, u32)>,
    scope: Scope,
    /// `--by container`.
    fold: crate::report::who::Folding,
    max_rows: usize,
    /// Where requests are timed from: `Submit` only when the bio hook is attached.
    from: IoFrom,
    misses_prev: u64,
    anom_prev: [u64; NANOM as usize],
}

impl IoLat {
    fn keyed_by(&self) -> &'static str {
        if self.mode == AttachMode::Tracepoint {
            "dev, sector"
        } else {
            "struct request *"
        }
    }

    /// `IO_ANOM` summed over CPUs, as deltas since the previous window, by name.
    fn anomalies(&mut self) -> serde_json::Map<String, serde_json::Value> {
        let mut now = [0u64; NANOM as usize];
        if let Some(a) = self
            .session
            .ebpf
            .map("IO_ANOM")
            .and_then(|m| PerCpuArray::<_, u64>::try_from(m).ok())
        {
            for (i, slot) in now.iter_mut().enumerate() {
                *slot = a.get(&(i as u32), 0).map(|v| v.iter().sum()).unwrap_or(0);
            }
        }
        let out = ANOM_NAMES
            .iter()
            .zip(now.iter().zip(&self.anom_prev))
            .map(|(n, (a, b))| (n.to_string(), a.wrapping_sub(*b).into()))
            .collect();
        self.anom_prev = now;
        out
    }

    /// One depth sample of every device with live counters (called at each timer tick).
    fn sample(&mut self) {
        let live = self.slots.live();
        self.sampler.sample(&live);
    }
}

impl Collector for IoLat {
    fn name(&self) -> &'static str {
        INFO.name
    }

    fn session(&mut self) -> Option<&mut Session> {
        Some(&mut self.session)
    }

    fn meta(&self) -> Meta {
        let what = match &self.dev {
            Some((n, ..)) => format!("block I/O requests on {n}"),
            None => "block I/O requests".to_string(),
        };
        Meta::of(
            INFO.name,
            format!("{what} (keyed by {})", self.keyed_by()),
            &self.scope,
            &self.session,
        )
        .with("attach", self.mode.as_str())
        .with("keyed_by", self.keyed_by())
        .with("from", self.from.as_str())
        .with("dev", self.dev.as_ref().map(|d| d.0.clone()))
        .with("depth_sample_period_ns", SAMPLE_PERIOD_NS)
    }

    fn event_fds(&self) -> Vec<RawFd> {
        vec![self.new.as_raw_fd(), self.timer.as_raw_fd()]
    }

    fn on_events(&mut self) -> Result<()> {
        let mut pids = Vec::new();
        while let Some(item) = self.new.next() {
            if item.len() >= std::mem::size_of::<IoNew>() {
                // SAFETY: the kernel wrote an IoNew (repr(C), plain integers) here; the length
                // was checked and read_unaligned tolerates any alignment.
                let e = unsafe { std::ptr::read_unaligned(item.as_ptr() as *const IoNew) };
                pids.push(e.tgid);
            }
        }
        for p in pids {
            self.facts.lock().learn(p);
        }
        let mut expirations = 0u64;
        // SAFETY: reads 8 bytes into a local from our non-blocking timerfd (EAGAIN: not yet).
        let n = unsafe {
            libc::read(
                self.timer.as_raw_fd(),
                (&raw mut expirations).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        if n == 8 && expirations > 0 {
            self.sample();
        }
        Ok(())
    }

    fn collect(&mut self, w: &Window) -> Result<Output> {
        let mut drained = self
            .agg
            .drain(self.session.drained())
            .context("reading IO_AGG")?;
        for v in drained
            .rows
            .iter_mut()
            .map(|(_, v)| v)
            .chain([&mut drained.other])
        {
            v.fill_hist_counts();
        }
        let mut devs = self
            .devs
            .drain(self.session.drained())
            .context("reading IO_DEV_VALS")?;
        self.slots
            .drain_depth(self.session.drained(), &mut devs.rows)?;
        let dirt = self
            .dirtied
            .drain(self.session.drained())
            .context("reading IO_DIRTY")?;
        let st = self.session.stats_delta()?;
        let disk_now = disks::diskstats().unwrap_or_default();
        self.slots.refresh(&disk_now)?;
        let disk_before = std::mem::replace(&mut self.disk_prev, disk_now);
        let depth = self.sampler.take();
        let secs = w.secs();
        let misses_total = self.session.recursion_misses();
        let misses = misses_total.wrapping_sub(self.misses_prev);
        self.misses_prev = misses_total;
        let anomalies = self.anomalies();

        // --by container: each container's processes under its representative.
        self.fold.end_window();
        let folded: Vec<(IoKey, IoVal)>;
        let agg: &[(IoKey, IoVal)] = if self.fold.on() {
            let mut m: BTreeMap<IoKey, IoVal> = BTreeMap::new();
            for (k, v) in &drained.rows {
                let key = IoKey {
                    tgid: self.fold.rep(k.tgid),
                    ..*k
                };
                m.entry(key).and_modify(|x| x.merge(v)).or_insert(*v);
            }
            folded = m.into_iter().collect();
            &folded
        } else {
            &drained.rows
        };
        let input = rows::Input {
            agg,
            other: &drained.other,
            devs: &devs.rows,
            depth: &depth,
            disk_before: &disk_before,
            disk_now: &self.disk_prev,
            only: self.dev.as_ref().map(|d| (d.1, d.2)),
            secs,
        };
        let (mut summary, devices) = rows::build(
            &input,
            &self.names,
            &mut self.facts.lock(),
            &mut self.cgroups,
        );
        for r in &mut summary {
            self.fold.relabel(&mut r.who);
        }
        let dirtied = dirty::build(
            &dirt.rows,
            &dirt.other,
            self.dirty_bytes,
            self.dev.as_ref().map(|d| (d.1, d.2)),
            &mut self.fold,
            &mut self.facts.lock(),
            secs,
        );
        let requests: u64 = summary.iter().map(|r| r.count).sum();
        let mut out = Output::default();
        let missed = out.note_missed(&st, "request", "");
        out.title = format!(
            "io-lat: {requests} requests on {} device(s) in {}; {}; keyed by {} ({}), timed from {}; missed {missed}",
            devices.len(),
            self.scope.describe(),
            w.span(),
            self.keyed_by(),
            self.mode.as_str(),
            match self.from {
                IoFrom::Submit => "bio submission",
                IoFrom::Request => "insert or issue",
            },
        );
        for d in devices.iter().filter(|d| d.unseen() != 0) {
            out.notes.push(format!(
                "{}: /proc/diskstats counted {} read(s) and {} write(s) more than the programs saw end (recursion misses this window: {misses}); see unseen_* in the device line",
                d.dev,
                d.unseen_reads.unwrap_or(0),
                d.unseen_writes.unwrap_or(0)
            ));
        }
        if self.slots.unslotted > 0 {
            out.notes.push(format!(
                "{} disk(s) beyond the {} device slots: their requests are timed, their queue depth is not sampled (no_dev_slot in the stats line)",
                self.slots.unslotted,
                self.slots.cap()
            ));
        }
        out.note_skipped(&self.session.skipped);
        if summary.is_empty() {
            out.notes.push("no block I/O requests completed".into());
        }
        let ctx = Ctx { secs };
        out.findings = findings::find(&summary, &devices, secs);
        out.links = summary
            .iter()
            .filter(|r| !r.other)
            .map(|r| {
                Link::Disk(DiskIssuer {
                    kdev: r.kdev,
                    disk: r.dev.clone(),
                    who: r.who.subject(),
                    kthread: r.kthread.unwrap_or(false),
                    cgroup: r.cgroup.clone(),
                    requests: r.count,
                    time_ns: r.lat.total.s.total_ns,
                    writeback: r.kthread == Some(true) && !r.sync && r.op == "write",
                    flush: r.op == "flush",
                })
            })
            .chain(dirty::links(&dirtied))
            .collect();
        out.sections.push(
            Section::build(
                &rows::SUMMARY_ROWS,
                &summary,
                rows::SUMMARY,
                &ctx,
                self.max_rows,
            )
            .with_dists(&summary, rows::SummaryRow::hist_label, |r| {
                vec![("device", r.device_hist), ("total", r.total_hist)]
            }),
        );
        out.sections.push(
            Section::build(&rows::DEVICE_ROWS, &devices, rows::DEVICES, &ctx, 0)
                .caption("Devices:"),
        );
        if !dirtied.is_empty() {
            out.sections.push(
                Section::build(
                    &dirty::DIRTY_ROWS,
                    &dirtied,
                    dirty::DIRTY,
                    &ctx,
                    self.max_rows,
                )
                .caption("Dirtied (whose pages writeback writes to each disk):"),
            );
        }
        out.footnotes
            .extend(rows::FOOTNOTES.iter().map(|s| s.to_string()));
        out.stats = Some(
            Stats::new(st)
                .with("requests", requests)
                .with("missed", missed)
                .with("partial", st[STAT_PARTIAL as usize])
                .with("direct", st[STAT_DIRECT as usize])
                .with("anomalies", st[STAT_ANOMALY as usize])
                .with("anomaly_kinds", serde_json::Value::Object(anomalies))
                .with("recursion_misses", misses),
        );
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The request hooks are one group in three modes; the dirtying hooks (one event, renamed
    /// in 6.0) are classic only, optional, and outside `--attach`.
    #[test]
    fn hooks_form_one_group_with_three_modes() {
        let (block, rest): (Vec<&Hook>, Vec<&Hook>) =
            HOOKS.iter().partition(|h| h.group == "block_rq");
        let (bio, dirty): (Vec<&Hook>, Vec<&Hook>) =
            rest.into_iter().partition(|h| h.name() == BIO_EVENT);
        // The bio hook: request-keyed modes only, optional.
        assert_eq!(bio.len(), 1);
        assert_eq!(bio[0].raw, Some(BIO_EVENT));
        assert!(bio[0].optional);
        assert_eq!(
            bio[0].modes().collect::<Vec<_>>(),
            [AttachMode::RawTp, AttachMode::TpBtf]
        );
        let dirty: Vec<(&str, &str, bool)> = dirty
            .iter()
            .map(|h| (h.name(), h.programs[0].1, h.optional))
            .collect();
        assert_eq!(
            dirty,
            [
                ("writeback_dirty_folio", "tk_io_dirty_tp", true),
                ("writeback_dirty_page", "tk_io_dirty_tp", true)
            ]
        );
        for h in block {
            assert_eq!(h.raw, Some(h.name()));
            let modes: Vec<AttachMode> = h.modes().collect();
            assert_eq!(
                modes,
                [AttachMode::TpBtf, AttachMode::RawTp, AttachMode::Tracepoint]
            );
        }
        let required: Vec<&str> = HOOKS
            .iter()
            .filter(|h| !h.optional)
            .map(|h| h.name())
            .collect();
        assert_eq!(required, ["block_rq_complete", "block_rq_issue"]);
        let forced = hooks_for(Some(AttachMode::Tracepoint));
        assert!(forced
            .iter()
            .all(|h| h.programs.len() == 1 && h.programs[0].1.ends_with("_tp")));
        assert!(forced.iter().all(|h| h.name() != BIO_EVENT));
        let btf = hooks_for(Some(AttachMode::TpBtf));
        assert!(btf.iter().all(|h| h.programs.len() == 1
            && h.name().starts_with("writeback_") == h.programs[0].1.ends_with("_tp")));
        assert!(btf.iter().any(|h| h.name() == BIO_EVENT));
        assert_eq!(hooks_for(None).len(), HOOKS.len());
    }

    #[test]
    fn default_args_parse() {
        let cmd = <Args as clap::Args>::augment_args(clap::Command::new("t"));
        let m = cmd.try_get_matches_from(["t", "--attach", "raw-tp", "--dev", "vda"]);
        let a = <Args as clap::FromArgMatches>::from_arg_matches(&m.unwrap()).unwrap();
        assert_eq!(a.attach, Some(ForceMode::RawTp));
        assert_eq!(a.dev.as_deref(), Some("vda"));
        assert_eq!(a.rows, 25);
    }

    /// Offsets on the running kernel, when its BTF is present: the chain every request-keyed
    /// program walks must resolve (5.15+: through request_queue.disk).
    #[test]
    fn request_offsets_resolve_on_this_kernel() {
        let Ok(btf) = crate::kernel::btf::vmlinux() else {
            return;
        };
        let o = rq_offsets(btf).unwrap();
        assert_ne!(o.rq_cmd_flags, 0);
        assert!(o.req_sync.is_power_of_two());
        assert_ne!(o.kn_id, 0, "blk-cgroup chain");
    }
}
