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

mod findings;
mod rows;

use std::{
    collections::BTreeMap,
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
};

use aya::maps::{HashMap, MapData, PerCpuArray, RingBuf};
use probes_common::io_lat::{
    DevKey, DevLive, DevVal, IoKey, IoNew, IoVal, RqOffsets, ANOM_NAMES, NANOM, OFF_NONE,
    STAT_ANOMALY, STAT_DIRECT, STAT_PARTIAL,
};
use probes_common::stats;

use crate::{
    engine::{Collector, Meta, Output, Scope, Stats, Window},
    error::{Context as _, Error, Result},
    host::{
        cgroup::{IdResolver, Layout},
        disks::{self, DiskCounters},
        facts::FactsCache,
        mountinfo,
    },
    kernel::{
        btf::Btf,
        hooks::{AttachMode, Hook},
        loader::{self, LoadSpec, Object, Session},
        maps::GenMap,
    },
    options::Common,
    report::rows::{Ctx, Section},
    tools::{self, OpenCtx, ToolInfo},
};

pub const INFO: ToolInfo = ToolInfo {
    name: "io-lat",
    summary: "Block I/O per device and issuing process (writeback shown as the kworker, with the cgroup it is charged to): IOPS, bytes/s, queue time in the I/O scheduler vs device time (p50/p90/p99/p99.9/max), request sizes, errors, queue depth against `nr_requests`, counts matched to `/proc/diskstats`; findings name the wrong scheduler, the too-shallow queue or the process saturating the device.",
    hooks: HOOKS,
    triage: true,
    hidden: false,
};

const OBJECT: Object = crate::object!("io_lat");

/// The event's programs, cheapest mode first. `raw` is the event's own name on purpose: it makes
/// the attach policy (and so `doctor`) accept raw_tp only where the kernel's BTF knows the
/// tracepoint, because the raw_tp programs, like tp_btf, need struct offsets from BTF.
macro_rules! block_hook {
    ($name:literal, $prog:literal, $fields:expr, $optional:expr) => {
        Hook {
            event: concat!("block:", $name),
            raw: Some($name),
            fields: $fields,
            programs: &[
                (AttachMode::TpBtf, $prog),
                (AttachMode::RawTp, concat!($prog, "_raw")),
                (AttachMode::Tracepoint, concat!($prog, "_tp")),
            ],
            optional: $optional,
            group: "block_rq",
        }
    };
}

/// One group: every hook attaches in one mode (the in-flight map is keyed by request address
/// or by (dev, sector)). Completion first, then requeue and merge, then issue and insert, so a
/// request seen starting is seen ending. Without insert there is no queue time; without
/// requeue and merge the depth counters may drift (each is counted as an anomaly).
pub const HOOKS: &[Hook] = &[
    block_hook!(
        "block_rq_complete",
        "tk_io_complete",
        &["dev", "sector", "error", "nr_sector", "rwbs"],
        false
    ),
    block_hook!(
        "block_rq_requeue",
        "tk_io_requeue",
        &["dev", "sector"],
        true
    ),
    block_hook!("block_rq_merge", "tk_io_merge", &["dev", "sector"], true),
    block_hook!(
        "block_rq_issue",
        "tk_io_issue",
        &["dev", "sector", "bytes", "rwbs"],
        false
    ),
    block_hook!(
        "block_rq_insert",
        "tk_io_insert",
        &["dev", "sector", "bytes", "rwbs"],
        true
    ),
];

const EXAMPLES: &str =
    "  tracekit io-lat --duration 10s                    # who does I/O where, queue vs device time
  tracekit io-lat --dev nvme0n1 --duration 30s      # one disk (a partition means its disk)
  tracekit io-lat --interval 5s --json --output io.ndjson   # follow with tail -f";

const NEEDS: &str = "root, or CAP_BPF, CAP_PERFMON and CAP_DAC_READ_SEARCH (kernel BTF for the \
request structs; tracefs for the classic fallback, mounted if needed with CAP_SYS_ADMIN).";

/// `--attach`: force the keying.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attach {
    /// BTF tracepoints, keyed by struct request * (cheapest).
    TpBtf,
    /// Raw tracepoints with probe reads, keyed by struct request *.
    RawTp,
    /// Classic tracepoints keyed by (dev, sector): no cgroup, no partial completions.
    Tracepoint,
}

impl Attach {
    fn mode(self) -> AttachMode {
        match self {
            Attach::TpBtf => AttachMode::TpBtf,
            Attach::RawTp => AttachMode::RawTp,
            Attach::Tracepoint => AttachMode::Tracepoint,
        }
    }
}

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
    pub attach: Option<Attach>,

    /// Rows shown in the text table, most request time first (0: all). JSON has every row.
    #[arg(long, default_value_t = 25, value_name = "N")]
    pub rows: usize,
}

pub fn run(args: Args) -> Result<()> {
    tools::run_collector(INFO.name, &args.common, |ctx| open(&args, ctx))
}

/// The hooks with only `force`'s program each (or all of them).
fn hooks_for(force: Option<AttachMode>) -> Vec<Hook> {
    HOOKS
        .iter()
        .map(|h| match force {
            None => *h,
            Some(m) => Hook {
                programs: match h.programs.iter().position(|p| p.0 == m) {
                    Some(i) => &h.programs[i..=i],
                    None => &[],
                },
                ..*h
            },
        })
        .collect()
}

/// `request`/`bio`/`gendisk`/`blkcg` member offsets from the running kernel's BTF.
pub fn rq_offsets(btf: &Btf) -> Result<RqOffsets> {
    let m = |s: &str, path: &str, size: u32| -> Result<u32> {
        let m = btf.member(s, path)?;
        if m.size != size {
            return Err(Error::KernelFeature(format!(
                "kernel BTF: {s}.{path} is {} bytes, expected {size}",
                m.size
            )));
        }
        Ok(m.offset)
    };
    // __REQ_SYNC moved between kernels (enum req_flag_bits follows enum req_op's bits).
    let sync_bit = btf.enum_value("__REQ_SYNC").ok_or_else(|| {
        Error::KernelFeature("kernel BTF has no enum req_flag_bits.__REQ_SYNC".into())
    })?;
    // blk-cgroup is optional (CONFIG_BLK_CGROUP): without it bio has no bi_blkg.
    let cg = (|| -> Result<[u32; 5]> {
        Ok([
            m("bio", "bi_blkg", 8)?,
            m("blkcg_gq", "blkcg", 8)?,
            m("blkcg", "css.cgroup", 8)?,
            m("cgroup", "kn", 8)?,
            m("kernfs_node", "id", 8)?,
        ])
    })()
    .unwrap_or([0; 5]);
    // The disk: rq->q->disk since 5.15, rq->rq_disk before.
    let (rq_q, q_disk) = match m("request", "rq_disk", 8) {
        Ok(d) => (d, OFF_NONE),
        Err(_) => (m("request", "q", 8)?, m("request_queue", "disk", 8)?),
    };
    Ok(RqOffsets {
        rq_q,
        rq_cmd_flags: m("request", "cmd_flags", 4)?,
        rq_data_len: m("request", "__data_len", 4)?,
        rq_bio: m("request", "bio", 8)?,
        q_disk,
        disk_major: m("gendisk", "major", 4)?,
        disk_first_minor: m("gendisk", "first_minor", 4)?,
        bio_blkg: cg[0],
        blkg_blkcg: cg[1],
        blkcg_cgroup: cg[2],
        cgroup_kn: cg[3],
        kn_id: cg[4],
        req_sync: 1u32 << (sync_bit as u32 & 31),
        _pad: 0,
    })
}

/// Globals of the request-keyed programs: struct offsets and the prototype variants of this
/// kernel (both from BTF). Returns whether `error` is an errno.
fn btf_globals(spec: LoadSpec) -> Result<(LoadSpec, bool)> {
    let btf = crate::kernel::btf::vmlinux()?;
    let offs = rq_offsets(btf).map_err(|e| {
        Error::KernelFeature(format!(
            "{e}: this kernel's struct request is not supported (try --attach tracepoint)"
        ))
    })?;
    // (q, rq) before 5.11, (rq) since.
    let q_arg = btf.proto_params("btf_trace_block_rq_issue") == Some(3);
    // `int error` (an errno) from 4.13 to 5.x, `blk_status_t` since.
    let errno = btf
        .proto_param_type("btf_trace_block_rq_complete", 2)
        .as_deref()
        == Some("int");
    Ok((
        spec.global("IO_OFFS", &offs)
            .global("IO_Q_ARG", &u8::from(q_arg))
            .global("IO_ERR_ERRNO", &u8::from(errno)),
        errno,
    ))
}

/// Globals of the classic programs: field offsets from the format files of the events that
/// attach. `dev` and `sector` must sit at one offset in all of them (one global each).
fn classic_globals(spec: LoadSpec, ctx: &OpenCtx, hooks: &[&Hook]) -> Result<LoadSpec> {
    let tracefs = ctx
        .env
        .tracefs()
        .as_ref()
        .map_err(|e| Error::KernelFeature(e.clone()))?;
    let fmt = |name: &str| tracefs.format("block", name);
    let cpl = fmt("block_rq_complete")?;
    let iss = fmt("block_rq_issue")?;
    let mut spec = spec;
    for (global, field, sizes) in [
        ("IO_TP_DEV", "dev", &[4u32][..]),
        ("IO_TP_SECTOR", "sector", &[8][..]),
    ] {
        let at = cpl.offset_of(field, sizes)?;
        for h in hooks {
            let f = fmt(h.name())?;
            if f.offset_of(field, sizes)? != at {
                return Err(Error::KernelFeature(format!(
                    "{}: `{field}` is not where block_rq_complete has it: unsupported layout",
                    h.event
                )));
            }
        }
        spec = spec.global(global, &at);
    }
    for (global, field, sizes) in [
        ("IO_TP_BYTES", "bytes", &[4u32][..]),
        ("IO_TP_RWBS", "rwbs", &[8, 10][..]),
    ] {
        let at = iss.offset_of(field, sizes)?;
        if hooks.iter().any(|h| h.name() == "block_rq_insert") {
            let ins = fmt("block_rq_insert")?;
            if ins.offset_of(field, sizes)? != at {
                return Err(Error::KernelFeature(format!(
                    "block_rq_insert and block_rq_issue disagree on `{field}`: unsupported layout"
                )));
            }
        }
        spec = spec.global(global, &at);
    }
    Ok(spec
        .global("IO_TP_ERROR", &cpl.offset_of("error", &[4])?)
        .global("IO_TP_CPL_NR_SECTOR", &cpl.offset_of("nr_sector", &[4])?)
        .global("IO_TP_CPL_RWBS", &cpl.offset_of("rwbs", &[8, 10])?))
}

/// Entries for the in-flight map: every request the disks can hold at once, twice (requests
/// live in preallocated tag sets, so this bounds the distinct addresses; the second half is for
/// sets a scheduler switch allocates during the run). A full map is counted, never silent.
fn inflight_cap() -> u32 {
    let per_disk: u64 = disks::whole_disks()
        .into_iter()
        .map(|(_, maj, min)| {
            let q = disks::QueueFacts::read(maj, min);
            let hwq = q.nr_hw_queues.unwrap_or(1).max(1);
            q.nr_requests.unwrap_or(128) * hwq + q.hw_queue_depth.unwrap_or(0) + hwq
        })
        .sum();
    (per_disk * 2).clamp(4096, 1 << 20) as u32
}

/// Where the cgroup ids the kernel records (the blkcg's, as `bio->bi_blkg` charges it) are
/// directories: the v1 blkio hierarchy on a v1 or hybrid host, else the v2 tree.
fn cgroup_resolver() -> IdResolver {
    let blkio = mountinfo::read()
        .unwrap_or_default()
        .into_iter()
        .find(|m| m.fs_type == "cgroup" && m.has_option("blkio"))
        .map(|m| m.mount_point);
    match blkio {
        Some(root) => IdResolver::new(&Layout {
            v2_root: Some(root),
            v1_memory: None,
        }),
        None => IdResolver::new(&Layout::detect()),
    }
}

/// Timer of the depth sampler.
const SAMPLE_PERIOD_NS: i64 = 10_000_000;

fn sample_timer() -> Result<OwnedFd> {
    let io = |what: &str| Error::Io {
        what: what.into(),
        source: std::io::Error::last_os_error(),
    };
    // SAFETY: plain syscalls; the fd is owned below, the itimerspec is a local.
    unsafe {
        let fd = libc::timerfd_create(
            libc::CLOCK_MONOTONIC,
            libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
        );
        if fd < 0 {
            return Err(io("creating the queue-depth sampling timer"));
        }
        let fd = OwnedFd::from_raw_fd(fd);
        let period = libc::timespec {
            tv_sec: 0,
            tv_nsec: SAMPLE_PERIOD_NS,
        };
        let spec = libc::itimerspec {
            it_interval: period,
            it_value: period,
        };
        if libc::timerfd_settime(fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) != 0 {
            return Err(io("starting the queue-depth sampling timer"));
        }
        Ok(fd)
    }
}

/// Loads and attaches io-lat's programs as the attach policy chose on this kernel.
pub fn open(args: &Args, ctx: &OpenCtx) -> Result<Box<dyn Collector>> {
    let scope = &ctx.scope;
    if scope.threads {
        return Err(Error::Usage(
            "io-lat: --threads is not supported (requests are attributed to the issuing process)"
                .into(),
        ));
    }
    let dev = match &args.dev {
        Some(d) => Some(disks::disk_of(d).ok_or_else(|| {
            Error::Usage(format!(
                "--dev {d}: no such block device (see /sys/class/block)"
            ))
        })?),
        None => None,
    };
    // Without BTF there are no struct offsets: only the classic tracepoints can work.
    let force = match args.attach {
        Some(a) => Some(a.mode()),
        None if !ctx.env.btf() => Some(AttachMode::Tracepoint),
        None => None,
    };
    let hooks = hooks_for(force);
    let plan = loader::plan(&hooks, &ctx.env, &ctx.symbols)?;
    let mode = plan
        .iter()
        .find_map(|c| c.mode.map(|m| m.0))
        .ok_or_else(|| Error::KernelFeature("no block tracepoint can attach".into()))?;
    let attached: Vec<&Hook> = hooks
        .iter()
        .zip(&plan)
        .filter(|(_, c)| c.mode.is_some())
        .map(|(h, _)| h)
        .collect();
    let cap = inflight_cap();
    let classic = mode == AttachMode::Tracepoint;
    let spec = LoadSpec::new()
        .global(
            "IO_DEV",
            &dev.as_ref().map(|d| disks::kdev(d.1, d.2)).unwrap_or(0),
        )
        .max_entries("IO_AGG", scope.key_cap())
        .max_entries("IO_START", if classic { 1 } else { cap })
        .max_entries("IO_START_TP", if classic { cap } else { 1 });
    let (spec, errno) = if classic {
        // The classic `error` field is always an errno (blk_status_to_errno).
        (classic_globals(spec, ctx, &attached)?, true)
    } else {
        let spec = if mode == AttachMode::TpBtf {
            spec.tp_btf(&attached.iter().map(|h| h.name()).collect::<Vec<_>>())
        } else {
            spec
        };
        btf_globals(spec)?
    };
    let mut session = Session::load(OBJECT, scope.filter(), spec)?;
    session.attach_planned(&hooks, &plan)?;
    let agg = GenMap::take(
        &mut session,
        "IO_AGG",
        Some("IO_OTHER"),
        |k: &IoKey| k.gen,
        IoVal::ZERO,
    )?;
    let devs = GenMap::take(
        &mut session,
        "IO_DEV_VALS",
        None,
        |k: &DevKey| k.gen,
        DevVal::ZERO,
    )?;
    let mut take = |m: &'static str| {
        session.ebpf.take_map(m).ok_or(loader::LoadError::NoMap {
            object: OBJECT.name,
            map: m.into(),
        })
    };
    let live = HashMap::try_from(take("IO_LIVE")?).context("IO_LIVE")?;
    let new = RingBuf::try_from(take("IO_NEW")?).context("IO_NEW")?;
    let names = rows::Names::new(errno);
    Ok(Box::new(IoLat {
        session,
        agg,
        devs,
        live,
        new,
        timer: sample_timer()?,
        sampler: rows::Sampler::default(),
        facts: FactsCache::new(),
        cgroups: cgroup_resolver(),
        disk_prev: disks::diskstats().unwrap_or_default(),
        names,
        mode,
        dev,
        scope: scope.clone(),
        max_rows: args.rows,
        gen: 0,
        misses_prev: 0,
        anom_prev: [0; NANOM as usize],
    }))
}

struct IoLat {
    session: Session,
    agg: GenMap<IoKey, IoVal>,
    devs: GenMap<DevKey, DevVal>,
    live: HashMap<MapData, u32, DevLive>,
    new: RingBuf<MapData>,
    timer: OwnedFd,
    sampler: rows::Sampler,
    facts: FactsCache,
    cgroups: IdResolver,
    disk_prev: BTreeMap<(u32, u32), (String, DiskCounters)>,
    names: rows::Names,
    mode: AttachMode,
    /// `--dev`: (name, major, minor) of the whole disk.
    dev: Option<(String, u32, u32)>,
    scope: Scope,
    max_rows: usize,
    /// The generation just flipped away from (the one to drain).
    gen: u32,
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
        let live: Vec<(u32, DevLive)> = self.live.iter().filter_map(|r| r.ok()).collect();
        self.sampler.sample(&live);
    }
}

impl Collector for IoLat {
    fn name(&self) -> &'static str {
        INFO.name
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
            self.facts.learn(p);
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

    fn flip(&mut self) -> Result<()> {
        self.gen = self.session.flip_generation()?;
        Ok(())
    }

    fn slow_links(&self) -> usize {
        self.session.slow_links()
    }

    fn collect(&mut self, w: &Window) -> Result<Output> {
        let drained = self.agg.drain(self.gen).context("reading IO_AGG")?;
        let devs = self.devs.drain(self.gen).context("reading IO_DEV_VALS")?;
        let st = self.session.stats_delta()?;
        let disk_now = disks::diskstats().unwrap_or_default();
        let disk_before = std::mem::replace(&mut self.disk_prev, disk_now);
        let depth = self.sampler.take();
        let secs = w.secs();
        let misses_total = self.session.recursion_misses();
        let misses = misses_total.wrapping_sub(self.misses_prev);
        self.misses_prev = misses_total;
        let anomalies = self.anomalies();

        let input = rows::Input {
            agg: &drained.rows,
            other: &drained.other,
            devs: &devs.rows,
            depth: &depth,
            disk_before: &disk_before,
            disk_now: &self.disk_prev,
            only: self.dev.as_ref().map(|d| (d.1, d.2)),
            secs,
        };
        let (summary, devices) =
            rows::build(&input, &self.names, &mut self.facts, &mut self.cgroups);
        let requests: u64 = summary.iter().map(|r| r.count).sum();
        let missed = st[stats::START_MAP_FULL as usize] + st[stats::RINGBUF_FULL as usize];
        let over_cap = st[stats::KEY_MAP_FULL as usize];
        let mut out = Output::default();
        let when = if w.interval {
            format!("interval {} ending {}, ", w.index + 1, w.end_json().0)
        } else {
            String::new()
        };
        out.title = format!(
            "io-lat: {requests} requests on {} device(s) in {}; {when}{secs:.2}s ({}); keyed by {} ({}); missed {missed}",
            devices.len(),
            self.scope.describe(),
            w.stop.as_str(),
            self.keyed_by(),
            self.mode.as_str(),
        );
        if missed > 0 || over_cap > 0 {
            out.notes.push(format!(
                "missed: in-flight map full {}, ring buffer full {}; {over_cap} request(s) over the --max-keys cap are counted in the [other] row",
                st[stats::START_MAP_FULL as usize],
                st[stats::RINGBUF_FULL as usize],
            ));
        }
        for d in devices.iter().filter(|d| d.unseen() != 0) {
            out.notes.push(format!(
                "{}: /proc/diskstats counted {} read(s) and {} write(s) more than the programs saw end (recursion misses this window: {misses}); see unseen_* in the device line",
                d.dev, d.unseen_reads, d.unseen_writes
            ));
        }
        for (n, r) in &self.session.skipped {
            out.notes.push(format!("skipped {n}: {r}"));
        }
        if summary.is_empty() {
            out.notes.push("no block I/O requests completed".into());
        }
        let ctx = Ctx { secs };
        for r in summary.iter().take(if self.max_rows == 0 {
            summary.len()
        } else {
            self.max_rows
        }) {
            out.hists.push((r.hist_label(), r.device_hist));
        }
        out.findings = findings::find(&summary, &devices, secs);
        out.sections.push(Section::build(
            "summary",
            &summary,
            rows::SUMMARY,
            &ctx,
            self.max_rows,
        ));
        out.sections
            .push(Section::build("device", &devices, rows::DEVICES, &ctx, 0).caption("Devices:"));
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
        self.facts.end_window();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hooks_form_one_group_with_three_modes() {
        for h in HOOKS {
            assert_eq!(h.group, "block_rq");
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
        assert_eq!(hooks_for(None).len(), HOOKS.len());
    }

    #[test]
    fn default_args_parse() {
        let cmd = <Args as clap::Args>::augment_args(clap::Command::new("t"));
        let m = cmd.try_get_matches_from(["t", "--attach", "raw-tp", "--dev", "vda"]);
        let a = <Args as clap::FromArgMatches>::from_arg_matches(&m.unwrap()).unwrap();
        assert_eq!(a.attach, Some(Attach::RawTp));
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
