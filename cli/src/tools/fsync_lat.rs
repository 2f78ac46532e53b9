//! `tracekit fsync-lat`: latency of the sync family per process and syscall, optionally per file.
//!
//! Events: the enter and exit of `fsync`, `fdatasync`, `sync_file_range`, `msync`, `syncfs`,
//! `sync`. Preferred: two BTF tracepoints on the raw `sys_enter` / `sys_exit` tracepoints that
//! filter by syscall number (fast to detach, see `probes-ebpf/src/fsync_lat.rs`); on kernels
//! without BTF, the classic `syscalls:sys_enter_*` / `sys_exit_*` events (fields
//! `__syscall_nr`, the first argument `fd` or `start`, and `ret`).

use std::{
    collections::{BTreeMap, HashMap as StdHashMap},
    os::fd::{AsRawFd, RawFd},
};

use anyhow::Context as _;
use aya::maps::{Array, HashMap, MapData, RingBuf};
use probes_common::{
    fsync::{FileEvent, FsyncKey, FsyncVal},
    hist::LatHist,
    stats,
};
use serde_json::json;

use crate::{
    engine::{self, Collector, Window},
    error::UserError,
    kernel::loader::AttachMode,
    kernel::loader::{self, LoadSpec, Session},
    kernel::tracefs::Tracefs,
    options::Common,
    report::hist::{self, LatStats},
    report::output::Sink,
    report::render::{fmt_ns, Align, Report, Table},
    report::sanitize,
    tools::{self, row_comm, Hook},
};

/// The sync family, with x86_64/aarch64 syscall numbers from libc.
const FAMILY: [(&str, i64); 6] = [
    ("fsync", libc::SYS_fsync),
    ("fdatasync", libc::SYS_fdatasync),
    ("sync_file_range", libc::SYS_sync_file_range),
    ("msync", libc::SYS_msync),
    ("syncfs", libc::SYS_syncfs),
    ("sync", libc::SYS_sync),
];

pub const NAME: &str = "fsync-lat";
pub const REQUIRES_BTF: bool = false;

const BTF_OR_TP: &[AttachMode] = &[AttachMode::TpBtf, AttachMode::Tracepoint];

macro_rules! sync_hooks {
    ($($name:literal),*) => {
        &[$(
            Hook { event: concat!("syscalls:sys_enter_", $name), raw: Some("sys_enter"), fields: &["__syscall_nr"], modes: BTF_OR_TP, optional: true },
            Hook { event: concat!("syscalls:sys_exit_", $name), raw: Some("sys_exit"), fields: &["ret"], modes: BTF_OR_TP, optional: true },
        )*]
    };
}

/// Each syscall is optional: the tool traces whichever of the family the kernel has.
pub const HOOKS: &[Hook] = sync_hooks!(
    "fsync",
    "fdatasync",
    "sync_file_range",
    "msync",
    "syncfs",
    "sync"
);

const EXAMPLES: &str = "  tracekit fsync-lat --duration 10s                  # who waits in the sync family, how long
  tracekit fsync-lat --duration 30s --by-file        # and on which files (is it the WAL?)
  tracekit fsync-lat --duration 1m --interval 10s --json --output fsync.ndjson   # follow with tail -f";

const NEEDS: &str = "root, or exactly CAP_BPF and CAP_PERFMON on kernels with BTF (CAP_SYS_ADMIN \
stands in for both). Without BTF it falls back to classic tracepoints and then also needs \
CAP_DAC_READ_SEARCH to read tracefs (mode 0700), and CAP_SYS_ADMIN to mount tracefs if it is not \
mounted. With --by-file, the files of other users' processes are shown only with CAP_SYS_PTRACE \
(else `[no access]`).";

#[derive(clap::Args, Debug)]
#[command(after_help = tools::help_footer(EXAMPLES, NEEDS))]
pub struct Args {
    #[command(flatten)]
    pub common: Common,

    /// Show the files behind the time: the top files by total sync time per process (fds are
    /// resolved to paths while the process lives).
    #[arg(long)]
    pub by_file: bool,

    /// Rows shown in the text table, largest total time first (0: all). JSON has every row.
    #[arg(long, default_value_t = 25, value_name = "N")]
    pub rows: usize,

    /// Files shown per process with --by-file.
    #[arg(long, default_value_t = 5, value_name = "N")]
    pub top_files: usize,
}

struct FsyncLat {
    session: Session,
    hist: HashMap<MapData, FsyncKey, FsyncVal>,
    other: Array<MapData, FsyncVal>,
    files: Option<RingBuf<MapData>>,
    /// (id, fd) → path, resolved when the ring buffer reported the pair.
    paths: StdHashMap<(u32, i32), Vec<u8>>,
    names: StdHashMap<u32, &'static str>,
    traced: Vec<&'static str>,
    skipped: Vec<(&'static str, String)>,
    common: Common,
    by_file: bool,
    top_files: usize,
    max_rows: usize,
}

/// Shared settings of both attach modes.
fn base_spec(common: &Common, by_file: bool) -> LoadSpec {
    LoadSpec::new()
        .global("FS_NR_MSYNC", &(libc::SYS_msync as u32))
        .global("FS_NR_SYNC", &(libc::SYS_sync as u32))
        .global("FS_PER_THREAD", &u8::from(common.threads))
        .global("FS_BY_FILE", &u8::from(by_file))
        .max_entries("FSYNC_HIST", tools::key_cap(common))
        .max_entries("FSYNC_START", tools::inflight_cap())
}

/// BTF tracepoints on `sys_enter` / `sys_exit`, filtering by syscall number: every syscall of
/// the family on this architecture is traced. `Err` says why this kernel cannot.
fn attach_btf(common: &Common, by_file: bool) -> Result<Session, String> {
    if !crate::kernel::features::btf_present() {
        return Err(format!(
            "no kernel BTF ({})",
            crate::kernel::btf::vmlinux_path().display()
        ));
    }
    let btf = crate::kernel::btf::vmlinux().map_err(|e| e.to_string())?;
    let reg = |m: &str| {
        btf.member("pt_regs", m)
            .map_err(|e| e.to_string())
            .and_then(|m| {
                if m.size == 8 {
                    Ok(m.offset)
                } else {
                    Err(format!("pt_regs member is {} bytes", m.size))
                }
            })
    };
    // x86_64: the first syscall argument is in di; the number stays in orig_ax for the exit.
    let (arg0, nr) = (reg("di")?, reg("orig_ax")?);
    for (tp, n) in [("btf_trace_sys_enter", 3), ("btf_trace_sys_exit", 3)] {
        match btf.proto_param_sizes(tp) {
            Some(p) if p.len() == n && p[2] == 8 => {}
            other => return Err(format!("unexpected {tp} prototype {other:?}")),
        }
    }
    let mut nrs = [u32::MAX; 6];
    for (slot, (_, n)) in nrs.iter_mut().zip(FAMILY) {
        *slot = n as u32;
    }
    let spec = base_spec(common, by_file)
        .global("FS_NRS", &nrs)
        .global("FS_REGS_ARG0_OFF", &arg0)
        .global("FS_REGS_NR_OFF", &nr);
    let mut session =
        Session::load(loader::FSYNC_LAT, common, spec).map_err(|e| format!("{e:#}"))?;
    session.attach_tp_btf("tk_fsync_sys_enter", "sys_enter")?;
    session.attach_tp_btf("tk_fsync_sys_exit", "sys_exit")?;
    Ok(session)
}

/// An attached session, the syscalls it traces, and those skipped with the reason.
type Attached = (Session, Vec<&'static str>, Vec<(&'static str, String)>);

/// Classic tracepoints on the per-syscall events, for kernels without BTF: which of the family
/// this kernel can trace, and where their fields are.
fn attach_classic(common: &Common, by_file: bool) -> anyhow::Result<Attached> {
    let tracefs = Tracefs::open()?;
    let mut traced = Vec::new();
    let mut skipped = Vec::new();
    let mut nr_off = None;
    let mut arg0_off = None;
    let mut ret_off = None;
    for (name, _) in FAMILY {
        let (enter, exit) = (format!("sys_enter_{name}"), format!("sys_exit_{name}"));
        if !tracefs.has_event("syscalls", &enter)? || !tracefs.has_event("syscalls", &exit)? {
            skipped.push((name, format!("no tracepoint syscalls:{enter}")));
            continue;
        }
        let ef = tracefs.format("syscalls", &enter)?;
        let xf = tracefs.format("syscalls", &exit)?;
        let nr = ef.offset_of("__syscall_nr", &[4])?;
        let ret = xf.offset_of("ret", &[4, 8])?;
        // The first argument's slot; only its low 32 bits (the fd) are read.
        let arg0 = ef
            .fields
            .iter()
            .find(|f| f.offset > nr && !f.name.starts_with("common_"))
            .map(|f| f.offset);
        for (slot, v, what) in [
            (&mut nr_off, Some(nr), "__syscall_nr"),
            (&mut ret_off, Some(ret), "ret"),
            (&mut arg0_off, arg0, "first argument"),
        ] {
            if let Some(v) = v {
                match slot {
                    None => *slot = Some(v),
                    Some(prev) if *prev != v => anyhow::bail!(
                        "syscalls:{enter}: {what} at offset {v}, other sync syscalls have it at {prev}; this layout is not supported"
                    ),
                    _ => {}
                }
            }
        }
        traced.push(name);
    }
    if traced.is_empty() {
        return Err(UserError::KernelFeature(
            "no sync-family syscall tracepoints (syscalls:sys_enter_fsync …) and no kernel BTF for the raw sys_enter tracepoint: this kernel lacks CONFIG_FTRACE_SYSCALLS".into(),
        )
        .into());
    }
    let spec = base_spec(common, by_file)
        .global("FS_NR_OFF", &nr_off.unwrap_or(8))
        .global("FS_ARG0_OFF", &arg0_off.unwrap_or(16))
        .global("FS_RET_OFF", &ret_off.unwrap_or(16));
    let mut session = Session::load(loader::FSYNC_LAT, common, spec)?;
    for name in &traced {
        session.attach_tracepoint("tk_fsync_enter", "syscalls", &format!("sys_enter_{name}"))?;
        session.attach_tracepoint("tk_fsync_exit", "syscalls", &format!("sys_exit_{name}"))?;
    }
    Ok((session, traced, skipped))
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let common = args.common;
    let sink: Sink = tools::preflight(NAME, &common)?;
    let (mut session, traced, skipped) = match attach_btf(&common, args.by_file) {
        Ok(s) => (s, FAMILY.iter().map(|(n, _)| *n).collect(), Vec::new()),
        Err(why) => {
            tracing::info!("BTF tracepoints on sys_enter/sys_exit unavailable ({why}); using the classic syscalls:* tracepoints");
            attach_classic(&common, args.by_file)?
        }
    };
    let take = |s: &mut Session, m: &str| {
        s.ebpf.take_map(m).ok_or_else(|| loader::LoadError::NoMap {
            object: s.object,
            map: m.into(),
        })
    };
    let hist = HashMap::try_from(take(&mut session, "FSYNC_HIST")?).context("FSYNC_HIST")?;
    let other = Array::try_from(take(&mut session, "FSYNC_OTHER")?).context("FSYNC_OTHER")?;
    let files = if args.by_file {
        Some(RingBuf::try_from(take(&mut session, "FSYNC_FILES")?).context("FSYNC_FILES")?)
    } else {
        None
    };
    let names = FAMILY.iter().map(|(n, nr)| (*nr as u32, *n)).collect();
    tools::announce(&traced.join(", "), &common, &session, &skipped);
    let mut tool = FsyncLat {
        session,
        hist,
        other,
        files,
        paths: StdHashMap::new(),
        names,
        traced,
        skipped,
        common: common.clone(),
        by_file: args.by_file,
        top_files: args.top_files,
        max_rows: args.rows,
    };
    engine::drive(&common, sink, &mut tool)?;
    Ok(())
}

/// Calls per second for JSON: a float (one call in 2 s is 0.5, not 0), to the millihertz.
pub fn rate(count: u64, secs: f64) -> f64 {
    (count as f64 / secs * 1000.0).round() / 1000.0
}

/// One report row: a process (or thread) and syscall.
struct Row {
    id: u32,
    tgid: u32,
    comm: Vec<u8>,
    syscall: String,
    errors: u64,
    hist: LatHist,
}

impl FsyncLat {
    fn resolve(&mut self, id: u32, tgid: u32, tid: u32, fd: i32) {
        self.paths
            .entry((id, fd))
            .or_insert_with(|| crate::host::proc::fd_path(tgid, tid, fd));
    }
}

impl Collector for FsyncLat {
    fn event_fd(&self) -> Option<RawFd> {
        self.files.as_ref().map(|f| f.as_raw_fd())
    }

    fn on_events(&mut self) -> anyhow::Result<()> {
        let mut evs = Vec::new();
        if let Some(rb) = self.files.as_mut() {
            while let Some(item) = rb.next() {
                if item.len() >= std::mem::size_of::<FileEvent>() {
                    // SAFETY: the kernel wrote a FileEvent (repr(C), plain integers) here; the
                    // length was checked and read_unaligned tolerates any alignment.
                    evs.push(unsafe {
                        std::ptr::read_unaligned(item.as_ptr() as *const FileEvent)
                    });
                }
            }
        }
        for e in evs {
            // A new interval may reuse the fd for another file: resolve afresh.
            self.paths.remove(&(e.id, e.fd));
            self.resolve(e.id, e.tgid, e.tid, e.fd);
        }
        Ok(())
    }

    fn preamble(&self) -> Option<Report> {
        let skipped: Vec<_> = self
            .skipped
            .iter()
            .map(|(n, r)| json!({"syscall": n, "reason": r}))
            .collect();
        tools::meta_report(
            NAME,
            &self.common,
            &self.session,
            json!({"traced": self.traced, "skipped": skipped}),
        )
    }

    fn collect(&mut self, w: &Window) -> anyhow::Result<Report> {
        let gen = self.session.flip_generation()?;
        let drained = loader::drain_generation(&mut self.hist, gen, |k| k.gen)
            .context("reading FSYNC_HIST")?;
        let other = self.other.get(&gen, 0).context("reading FSYNC_OTHER")?;
        // The kernel writes the other generation now, so the reset races with nothing.
        let zero = FsyncVal {
            comm: [0; 16],
            tgid: 0,
            _pad: 0,
            errors: 0,
            hist: LatHist::ZERO,
        };
        self.other
            .set(gen, zero, 0)
            .context("resetting FSYNC_OTHER")?;
        let st = self.session.stats_delta()?;

        // Rows per (id, syscall), merging fds; files per (id, fd).
        let names = &self.names;
        let mut rows: BTreeMap<(u32, u32), Row> = BTreeMap::new();
        let mut files: BTreeMap<(u32, i32), (LatHist, u32, [u8; 16])> = BTreeMap::new();
        for (k, v) in &drained {
            let row = rows.entry((k.id, k.nr)).or_insert_with(|| Row {
                id: k.id,
                tgid: v.tgid,
                comm: v.comm.to_vec(),
                syscall: names
                    .get(&k.nr)
                    .map(|s| s.to_string())
                    .unwrap_or_else(|| format!("syscall_{}", k.nr)),
                errors: 0,
                hist: LatHist::ZERO,
            });
            row.errors += v.errors;
            row.hist.merge(&v.hist);
            if k.fd >= 0 {
                let f = files
                    .entry((k.id, k.fd))
                    .or_insert((LatHist::ZERO, v.tgid, v.comm));
                f.0.merge(&v.hist);
            }
        }
        let threads = self.common.threads;
        let mut rows: Vec<Row> = rows
            .into_values()
            .map(|mut r| {
                r.comm = row_comm(r.id, r.tgid, threads, &r.comm);
                r
            })
            .collect();
        if other.hist.count > 0 {
            rows.push(Row {
                id: 0,
                tgid: 0,
                comm: b"[other]".to_vec(),
                syscall: "all".into(),
                errors: other.errors,
                hist: other.hist,
            });
        }
        let stats: Vec<LatStats> = rows.iter().map(|r| hist::stats(&r.hist)).collect();
        let mut order: Vec<usize> = (0..rows.len()).collect();
        order.sort_by(|&a, &b| {
            stats[b]
                .total_ns
                .cmp(&stats[a].total_ns)
                .then(rows[a].id.cmp(&rows[b].id))
        });

        let secs = w.secs();
        let calls: u64 = stats.iter().map(|s| s.count).sum();
        let missed = st[stats::START_MAP_FULL as usize] + st[stats::RINGBUF_FULL as usize];
        let mut report = Report::default();
        let when = if w.interval {
            let (end, _) = w.end_json();
            format!("interval {} ending {end}, ", w.index + 1)
        } else {
            String::new()
        };
        let over_cap = st[stats::KEY_MAP_FULL as usize];
        report.title = format!(
            "fsync-lat: {calls} calls of {} in {}; {when}{secs:.2}s ({}); missed {missed}",
            self.traced.join(", "),
            tools::scope(&self.common),
            w.stop.as_str(),
        );
        if missed > 0 || over_cap > 0 {
            report.notes.push(format!(
                "missed: in-flight map full {}, ring buffer full {}; {over_cap} call(s) over the --max-keys cap are counted in the [other] row",
                st[stats::START_MAP_FULL as usize],
                st[stats::RINGBUF_FULL as usize],
            ));
        }
        for (n, r) in &self.skipped {
            report.notes.push(format!("skipped {n}: {r}"));
        }
        let id_col = if self.common.threads { "TID" } else { "PID" };
        let mut t = Table::new(&[
            (id_col, Align::Right),
            ("COMM", Align::Left),
            ("SYSCALL", Align::Left),
            ("COUNT", Align::Right),
            ("RATE/s", Align::Right),
            ("ERR", Align::Right),
            ("MEAN", Align::Right),
            ("P50", Align::Right),
            ("P90", Align::Right),
            ("P99", Align::Right),
            ("P99.9", Align::Right),
            ("MAX", Align::Right),
            ("STDDEV", Align::Right),
            ("CV", Align::Right),
            ("TOTAL", Align::Right),
        ]);
        let (end_text, end_ns) = w.end_json();
        let mut flagged = false;
        let shown = if self.max_rows == 0 {
            order.len()
        } else {
            self.max_rows.min(order.len())
        };
        for (pos, &i) in order.iter().enumerate() {
            let (r, s) = (&rows[i], &stats[i]);
            if pos == shown {
                report.footnotes.push(format!(
                    "{} more row(s) with less total time not shown (--rows 0 shows all)",
                    order.len() - shown
                ));
            }
            let cv = if s.cv > 1.0 {
                flagged = true;
                format!("{:.2}!", s.cv)
            } else {
                format!("{:.2}", s.cv)
            };
            if pos < shown {
                t.push(vec![
                    r.id.to_string(),
                    sanitize::text(&r.comm),
                    r.syscall.clone(),
                    s.count.to_string(),
                    format!("{:.1}", s.count as f64 / secs),
                    r.errors.to_string(),
                    fmt_ns(s.mean_ns),
                    fmt_ns(s.p50_ns),
                    fmt_ns(s.p90_ns),
                    fmt_ns(s.p99_ns),
                    fmt_ns(s.p999_ns),
                    fmt_ns(s.max_ns),
                    fmt_ns(s.stddev_ns),
                    cv,
                    fmt_ns(s.total_ns),
                ]);
                report.hists.push((
                    format!("{}[{} {}]", r.syscall, r.id, sanitize::text(&r.comm)),
                    r.hist,
                ));
            }
            let mut line = json!({
                "tool": "fsync-lat",
                "type": "summary",
                "pid": if self.common.threads { r.tgid } else { r.id },
                "syscall": r.syscall,
                "count": s.count,
                "errors": r.errors,
                "rate_per_s": rate(s.count, secs),
                "mean_ns": s.mean_ns,
                "p50_ns": s.p50_ns,
                "p90_ns": s.p90_ns,
                "p99_ns": s.p99_ns,
                "p999_ns": s.p999_ns,
                "max_ns": s.max_ns,
                "stddev_ns": s.stddev_ns,
                "cv_pct": (s.cv * 100.0).round() as u64,
                "total_ns": s.total_ns,
                "interval_ns": w.elapsed.as_nanos() as u64,
                "interval_end": end_text,
                "interval_end_ns": end_ns,
            });
            sanitize::put_json(&mut line, "comm", &r.comm);
            if self.common.threads {
                line["tid"] = json!(r.id);
            }
            report.json.push(line);
        }
        if rows.is_empty() {
            report.notes.push("no sync-family calls seen".into());
        }
        report.tables.push(t);
        if flagged {
            report.footnotes.push(
                "! CV > 1: the latency is skewed, so the mean misleads; trust P50 and P99.".into(),
            );
        }

        if self.by_file {
            let mut ft = Table::new(&[
                (id_col, Align::Right),
                ("COMM", Align::Left),
                ("COUNT", Align::Right),
                ("P50", Align::Right),
                ("P99", Align::Right),
                ("MAX", Align::Right),
                ("TOTAL", Align::Right),
                ("FILE", Align::Left),
            ]);
            ft.caption = Some(format!(
                "Top {} files per process by total sync time:",
                self.top_files
            ));
            let mut no_access = false;
            type FileRow = (i32, LatStats, u32, [u8; 16]);
            let mut per_id: BTreeMap<u32, Vec<FileRow>> = BTreeMap::new();
            for ((id, fd), (h, tgid, comm)) in &files {
                per_id
                    .entry(*id)
                    .or_default()
                    .push((*fd, hist::stats(h), *tgid, *comm));
            }
            let mut ids: Vec<(u32, u64)> = per_id
                .iter()
                .map(|(id, v)| (*id, v.iter().map(|x| x.1.total_ns).sum()))
                .collect();
            ids.sort_by_key(|x| std::cmp::Reverse(x.1));
            for (id, _) in ids {
                let mut v = per_id.remove(&id).unwrap_or_default();
                v.sort_by_key(|x| std::cmp::Reverse(x.1.total_ns));
                for (fd, s, tgid, kcomm) in v.into_iter().take(self.top_files) {
                    let path = match self.paths.get(&(id, fd)) {
                        Some(p) => p.clone(),
                        None => {
                            self.resolve(id, tgid, id, fd);
                            self.paths.get(&(id, fd)).cloned().unwrap_or_default()
                        }
                    };
                    no_access |= path == b"[no access]";
                    let comm = row_comm(id, tgid, self.common.threads, &kcomm);
                    ft.push(vec![
                        id.to_string(),
                        sanitize::text(&comm),
                        s.count.to_string(),
                        fmt_ns(s.p50_ns),
                        fmt_ns(s.p99_ns),
                        fmt_ns(s.max_ns),
                        fmt_ns(s.total_ns),
                        format!("{} (fd {fd})", sanitize::text(&path)),
                    ]);
                    let mut line = json!({
                        "tool": "fsync-lat",
                        "type": "file",
                        "pid": if self.common.threads { tgid } else { id },
                        "fd": fd,
                        "count": s.count,
                        "p50_ns": s.p50_ns,
                        "p99_ns": s.p99_ns,
                        "max_ns": s.max_ns,
                        "total_ns": s.total_ns,
                        "interval_end": end_text,
                        "interval_end_ns": end_ns,
                    });
                    sanitize::put_json(&mut line, "comm", &comm);
                    sanitize::put_json(&mut line, "file", &path);
                    report.json.push(line);
                }
            }
            report.tables.push(ft);
            if no_access {
                report.footnotes.push(
                    "[no access]: the file of another user's process; resolving it needs CAP_SYS_PTRACE.".into(),
                );
            }
            if w.interval {
                self.paths.clear();
            }
        }

        report.json.push(engine::stats_line(
            NAME,
            w,
            &st,
            json!({"calls": calls, "missed": missed}),
        ));
        Ok(report)
    }
}
