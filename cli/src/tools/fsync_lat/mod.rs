//! `tracekit fsync-lat`: latency of the sync family per process and syscall, optionally per file.
//!
//! Events: the enter and exit of `fsync`, `fdatasync`, `sync_file_range`, `msync`, `syncfs`,
//! `sync`. Preferred: the classic `syscalls:sys_enter_*` / `sys_exit_*` events (fields
//! `__syscall_nr`, the first argument `fd` or `start`, and `ret`), which fire only for these
//! syscalls. Fallback where tracefs cannot be read (CAP_BPF + CAP_PERFMON only, no
//! CAP_DAC_READ_SEARCH): BTF tracepoints on the raw `sys_enter` / `sys_exit` tracepoints that
//! filter by syscall number — they cost every syscall of the node ~50 ns each way, which is why
//! they come second. Kernel side: `probes-ebpf/src/bin/fsync_lat.rs`.

use crate::report::harm::MIN_FSYNC_NS_PER_S;
use std::{
    collections::{BTreeMap, HashMap as StdHashMap},
    os::fd::{AsRawFd, RawFd},
};

use aya::maps::{HashMap as BpfHashMap, MapData, RingBuf};
use probes_common::{
    fsync::{FileEvent, FileOffsets, FsyncKey, FsyncStart, FsyncVal},
    hist::LatHist,
};
use serde::Serialize;

use crate::{
    report::{
        findings::{Cause, Finding, Score},
        hist::{self, LatStats},
        render::fmt_ns,
        sanitize,
        who::{Folding, Id, Title},
    },
    tools::prelude::*,
};

mod files;
mod rows;

use files::*;
use rows::*;

pub const INFO: ToolInfo = ToolInfo {
    name: "fsync-lat",
    summary: "Who waits in `fsync`, `fdatasync`, `sync_file_range`, `msync`, `syncfs`, `sync`, how long (count, rate, mean, p50/p90/p99/p99.9, max, stddev, CV, total, share of the time), and with `--by-file`, on which files (\"is it the WAL?\"); findings name the process that loses the most time and say what to do.",
    hooks: HOOKS,
    triage: true,
    hidden: false,
    needs_btf: false,
    rows: &[&SUMMARY_ROWS, &FILE_ROWS],
    causes: &[FSYNC],
    by_container: true,
    joins: &[],
};

/// Evidence keys of fsync-lat's findings that other parts of tracekit read (`triage`'s links).
pub mod ev {
    use crate::report::findings::Ev;
    /// The p99 latency of the process's busiest sync call (the victim's felt tail).
    pub const P99_NS: Ev = Ev("p99_ns");
}

// The causes this tool concludes (listed in INFO; see report::findings::Cause).
pub const FSYNC: Cause = Cause::new(
    "fsync",
    "A process loses time waiting in fsync, fdatasync or another call of the sync family.",
)
.summing(&["calls", "total_ns", "latency_total_ns"]);

const OBJECT: Object = crate::object!("fsync_lat");

/// The sync family, with x86_64/aarch64 syscall numbers from libc.
const FAMILY: [(&str, i64); 6] = [
    ("fsync", libc::SYS_fsync),
    ("fdatasync", libc::SYS_fdatasync),
    ("sync_file_range", libc::SYS_sync_file_range),
    ("msync", libc::SYS_msync),
    ("syncfs", libc::SYS_syncfs),
    ("sync", libc::SYS_sync),
];

/// Each syscall is optional (the tool traces whichever of the family the kernel has); all use
/// one attach mode.
pub const HOOKS: &[Hook] = crate::syscall_hooks!(
    "tk_fsync_enter",
    "tk_fsync_exit",
    "sync",
    [
        "fsync",
        "fdatasync",
        "sync_file_range",
        "msync",
        "syncfs",
        "sync"
    ]
);

const EXAMPLES: &str = "  tracekit fsync-lat --duration 10s                  # who waits in the sync family, how long
  tracekit fsync-lat --duration 30s --by-file        # and on which files (is it the WAL?)
  tracekit fsync-lat --duration 1m --interval 10s --json --output fsync.ndjson   # follow with tail -f";

const NEEDS: &str = "root, or exactly CAP_BPF and CAP_PERFMON on a kernel with BTF (CAP_SYS_ADMIN \
stands in for both): then it runs on the raw sys_enter/sys_exit tracepoints, which cost every \
syscall of the node ~100 ns while it runs. Add CAP_DAC_READ_SEARCH (tracefs is mode 0700) and it \
uses the per-syscall tracepoints instead, which cost other syscalls nothing; CAP_SYS_ADMIN mounts \
tracefs if it is not mounted. With --by-file, the files of other users' processes are shown only \
with CAP_SYS_PTRACE (else `[no access]`).";

#[derive(clap::Args, Debug)]
#[command(after_help = tools::help_footer(EXAMPLES, NEEDS))]
pub struct Args {
    #[command(flatten)]
    pub common: Common,

    /// Show the files behind the time: the top files by total sync time per process. Each call's
    /// file is identified in the kernel (device and inode behind the fd at the call), so a
    /// reused descriptor is never mistaken for its earlier file; names are resolved while the
    /// process lives, and renamed or deleted files are shown as such.
    #[arg(long)]
    pub by_file: bool,

    /// Rows shown in the text table, largest total time first (0: all). JSON has every row.
    #[arg(long, default_value_t = 25, value_name = "N")]
    pub rows: usize,

    /// Files shown per process with --by-file.
    #[arg(long, default_value_t = 5, value_name = "N")]
    pub top_files: usize,
}

pub fn run(args: Args) -> Result<()> {
    tools::run_collector(INFO.name, &args.common, |ctx| open(&args, ctx))
}

const ZERO: FsyncVal = FsyncVal {
    comm: [0; 16],
    tgid: 0,
    _pad: 0,
    errors: 0,
    in_window_ns: 0,
    hist: LatHist::ZERO,
};

/// Loads and attaches fsync-lat's programs as the attach policy chose on this kernel.
pub fn open(args: &Args, ctx: &OpenCtx) -> Result<Box<dyn Collector>> {
    let plan = loader::plan(HOOKS, &ctx.env, &ctx.symbols).map_err(|e| match e {
        // Neither the per-syscall events nor BTF for the raw sys_enter tracepoint: name the
        // kernel option, the fix a user can act on.
        loader::LoadError::NoMode {
            permission: false, ..
        } => Error::KernelFeature(format!("{e}; this kernel lacks CONFIG_FTRACE_SYSCALLS")),
        e => e.into(),
    })?;
    let mode_of = |event: String| {
        HOOKS
            .iter()
            .zip(&plan)
            .find(|(h, _)| h.event == event)
            .and_then(|(_, c)| c.mode)
            .map(|m| m.0)
    };
    let traced: Vec<(&'static str, i64)> = FAMILY
        .iter()
        .copied()
        .filter(|(n, _)| {
            mode_of(format!("syscalls:sys_enter_{n}")).is_some()
                && mode_of(format!("syscalls:sys_exit_{n}")).is_some()
        })
        .collect();
    let Some(mode) = traced
        .first()
        .and_then(|(n, _)| mode_of(format!("syscalls:sys_enter_{n}")))
    else {
        return Err(Error::KernelFeature(
            "no sync-family syscall tracepoints (syscalls:sys_enter_fsync …) and no kernel BTF for the raw sys_enter tracepoint: this kernel lacks CONFIG_FTRACE_SYSCALLS".into(),
        ));
    };
    let scope = &ctx.scope;
    let mut spec = LoadSpec::new()
        .global("FS_NR_MSYNC", &(libc::SYS_msync as u32))
        .global("FS_NR_SYNC", &(libc::SYS_sync as u32))
        .global("FS_PER_THREAD", &u8::from(scope.threads))
        .global("FS_BY_FILE", &u8::from(args.by_file))
        .max_entries("FSYNC_HIST", scope.key_cap())
        .max_entries("FSYNC_START", scope.inflight_cap());
    spec = match mode {
        AttachMode::TpBtf => btf_globals(spec, &traced)?,
        _ => classic_globals(spec, ctx, &traced)?,
    };
    if args.by_file {
        spec = spec.global("FS_FILE_OFFS", &file_offsets()?);
    }
    let spec = spec.tp_btf_planned(HOOKS, &plan);
    let mut session = Session::load(OBJECT, scope.filter(), spec)?;
    session.attach_planned(HOOKS, &plan)?;
    let hist = GenMap::take(&mut session, "FSYNC_HIST", Some("FSYNC_OTHER"), ZERO)?;
    let start = BpfHashMap::try_from(session.take_map("FSYNC_START")?).context("FSYNC_START")?;
    let files = if args.by_file {
        let m = session.take_map("FSYNC_FILES")?;
        Some(RingBuf::try_from(m).context("FSYNC_FILES")?)
    } else {
        None
    };
    Ok(Box::new(FsyncLat {
        session,
        hist,
        start,
        swept: std::time::Instant::now(),
        files,
        paths: StdHashMap::new(),
        names: FAMILY.iter().map(|(n, nr)| (*nr as u32, *n)).collect(),
        traced: traced.iter().map(|(n, _)| *n).collect(),
        scope: scope.clone(),
        by_file: args.by_file,
        top_files: args.top_files,
        max_rows: args.rows,
        facts: ctx.facts.clone(),
        fold: Folding::new(scope.by_container),
    }))
}

/// Classic tracepoints: where the fields are in each traced event's format (they must agree:
/// one program serves all six events).
fn classic_globals(spec: LoadSpec, ctx: &OpenCtx, traced: &[(&str, i64)]) -> Result<LoadSpec> {
    let tracefs = ctx
        .env
        .tracefs()
        .as_ref()
        .map_err(|e| Error::KernelFeature(e.clone()))?;
    let (mut nr_off, mut arg0_off, mut ret_off) = (None, None, None);
    for (name, _) in traced {
        let enter = format!("sys_enter_{name}");
        let ef = tracefs.format("syscalls", &enter)?;
        let xf = tracefs.format("syscalls", &format!("sys_exit_{name}"))?;
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
            match (slot.as_ref(), v) {
                (None, Some(v)) => *slot = Some(v),
                (Some(prev), Some(v)) if *prev != v => {
                    return Err(Error::KernelFeature(format!(
                        "syscalls:{enter}: {what} at offset {v}, other sync syscalls have it at {prev}; this layout is not supported"
                    )))
                }
                _ => {}
            }
        }
    }
    Ok(spec
        .global("FS_NR_OFF", &nr_off.unwrap_or(8))
        .global("FS_ARG0_OFF", &arg0_off.unwrap_or(16))
        .global("FS_RET_OFF", &ret_off.unwrap_or(16)))
}

/// Where the file behind an fd is, from the current task (`--by-file`): offsets from the
/// kernel's BTF of `task_struct.files`, `files_struct.fdt`, `fdtable.max_fds`, `fdtable.fd`,
/// `file.f_inode`, `inode.i_ino`, `inode.i_sb`, `super_block.s_dev`.
fn file_offsets() -> Result<FileOffsets> {
    let btf = crate::kernel::btf::vmlinux().map_err(|e| {
        Error::KernelFeature(format!(
            "--by-file identifies each call's file through the kernel's BTF: {e}"
        ))
    })?;
    let at = |s: &str, m: &str| -> Result<u32> {
        Ok(btf
            .member(s, m)
            .map_err(|e| Error::KernelFeature(format!("--by-file: {e}")))?
            .offset)
    };
    Ok(FileOffsets {
        task_files: at("task_struct", "files")?,
        files_fdt: at("files_struct", "fdt")?,
        fdt_max_fds: at("fdtable", "max_fds")?,
        fdt_fd: at("fdtable", "fd")?,
        file_inode: at("file", "f_inode")?,
        inode_ino: at("inode", "i_ino")?,
        inode_sb: at("inode", "i_sb")?,
        sb_dev: at("super_block", "s_dev")?,
        inode_generation: at("inode", "i_generation")?,
        file_dentry: at("file", "f_path.dentry")?,
        dentry_name: at("dentry", "d_name.name")?,
        _pad: 0,
    })
}

/// BTF tracepoints on `sys_enter` / `sys_exit`: the syscall numbers to keep, and where the
/// first argument and the syscall number are in `struct pt_regs` (x86_64: `di`, and `orig_ax`,
/// which keeps the number for the exit path).
fn btf_globals(spec: LoadSpec, traced: &[(&str, i64)]) -> Result<LoadSpec> {
    let btf = crate::kernel::btf::vmlinux()?;
    let reg = |m: &str| -> Result<u32> {
        let mem = btf.member("pt_regs", m)?;
        if mem.size != 8 {
            return Err(Error::KernelFeature(format!(
                "kernel BTF: pt_regs.{m} is {} bytes, expected 8",
                mem.size
            )));
        }
        Ok(mem.offset)
    };
    let (arg0, nr) = (reg("di")?, reg("orig_ax")?);
    for tp in ["btf_trace_sys_enter", "btf_trace_sys_exit"] {
        match btf.proto_param_sizes(tp) {
            Some(p) if p.len() == 3 && p[2] == 8 => {}
            other => {
                return Err(Error::KernelFeature(format!(
                    "kernel BTF: unexpected {tp} prototype {other:?}"
                )))
            }
        }
    }
    let mut nrs = [u32::MAX; 6];
    for (slot, (_, n)) in nrs.iter_mut().zip(traced) {
        *slot = *n as u32;
    }
    Ok(spec
        .global("FS_NRS", &nrs)
        .global("FS_REGS_ARG0_OFF", &arg0)
        .global("FS_REGS_NR_OFF", &nr))
}

struct FsyncLat {
    session: Session,
    hist: GenMap<FsyncKey, FsyncVal>,
    /// In-flight calls by tid; each thread's entry stays between its calls (see `sweep`).
    start: BpfHashMap<MapData, u32, FsyncStart>,
    /// When `sweep` last ran.
    swept: std::time::Instant,
    files: Option<RingBuf<MapData>>,
    /// (id, device, inode) → the file's name, resolved when the kernel announced the key.
    paths: StdHashMap<(u32, u32, u64, u32), FileName>,
    names: StdHashMap<u32, &'static str>,
    traced: Vec<&'static str>,
    scope: crate::engine::Scope,
    by_file: bool,
    top_files: usize,
    max_rows: usize,
    facts: crate::host::facts::Facts,
    /// `--by container`.
    fold: Folding,
}

/// How often exited threads' `FSYNC_START` entries are removed, whatever the window: a run
/// with one long window (`--duration 10m`, no `--interval`) on a node that forks thousands of
/// short-lived writers a second must not fill the map before its only window ends.
const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

impl FsyncLat {
    /// Removes `FSYNC_START`'s entries of threads that have exited. The kernel side keeps a
    /// thread's entry after each call for its next one (`begin_kept`, no map update per call),
    /// so without this every thread that ever called would hold one until the map is full (a
    /// thread killed in a call leaves one too). A tid reused between the check and the delete
    /// loses its first call's start (its end then finds no entry and is not timed). Returns
    /// how many went.
    fn sweep(&mut self) -> usize {
        self.swept = std::time::Instant::now();
        let gone: Vec<u32> = self
            .start
            .keys()
            .filter_map(|r| r.ok())
            .filter(|tid| !crate::host::proc::exists(*tid))
            .collect();
        gone.iter().filter(|t| self.start.remove(t).is_ok()).count()
    }
}

impl Collector for FsyncLat {
    fn name(&self) -> &'static str {
        INFO.name
    }

    fn meta(&self) -> Meta {
        Meta::of(
            INFO.name,
            self.traced.join(", "),
            &self.scope,
            &self.session,
        )
        .with("traced", self.traced.clone())
        .with("by_file", self.by_file)
    }

    fn event_fds(&self) -> Vec<RawFd> {
        self.files.iter().map(|f| f.as_raw_fd()).collect()
    }

    fn on_events(&mut self) -> Result<()> {
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
            self.resolve(&e);
        }
        if self.swept.elapsed() >= SWEEP_EVERY {
            self.sweep();
        }
        Ok(())
    }

    fn poll_interval(&self) -> Option<std::time::Duration> {
        Some(SWEEP_EVERY)
    }

    fn session(&mut self) -> Option<&mut crate::kernel::loader::Session> {
        Some(&mut self.session)
    }

    fn collect(&mut self, w: &Window) -> Result<Output> {
        let drained = self
            .hist
            .drain(self.session.drained())
            .context("reading FSYNC_HIST")?;
        let st = self.session.stats_delta()?;
        self.sweep();
        let secs = self.session.drained_secs();
        let threads = self.scope.threads;

        // Rows per (id, syscall), merging files; files per (id, device, inode).
        type Acc = (u32, [u8; 16], Counted, LatHist);
        let mut per_call: BTreeMap<(u32, u32), Acc> = BTreeMap::new();
        let mut per_file: BTreeMap<FileKey, (u32, [u8; 16], LatHist)> = BTreeMap::new();
        for (k, v) in &drained.rows {
            // Per process (or thread), or per container's representative with --by container.
            let tgid = self.fold.rep(v.tgid);
            let id = if self.fold.on() { tgid } else { k.id };
            let e = per_call.entry((id, k.nr)).or_insert((
                tgid,
                v.comm,
                Counted::default(),
                LatHist::ZERO,
            ));
            e.2.errors += v.errors;
            e.2.in_window_ns += v.in_window_ns;
            e.3.merge(&v.hist);
            if k.ino != 0 {
                per_file
                    .entry((k.id, k.dev, k.ino, k.igen))
                    .or_insert((v.tgid, v.comm, LatHist::ZERO))
                    .2
                    .merge(&v.hist);
            }
        }
        let mut rows: Vec<SummaryRow> = Vec::with_capacity(per_call.len() + 1);
        for ((id, nr), (tgid, comm, counted, h)) in per_call {
            let name = self
                .names
                .get(&nr)
                .map(|s| s.to_string())
                .unwrap_or_else(|| format!("syscall_{nr}"));
            let comm = row_comm(id, tgid, threads, &comm);
            let title = Title::cached(&mut self.facts.lock(), tgid);
            let mut r = self.summary_row(id, tgid, comm, title, name, counted, &h, secs);
            self.fold.relabel(&mut r.who);
            rows.push(r);
        }
        if drained.other.hist.count > 0 {
            let o = drained.other;
            rows.push(self.summary_row(
                0,
                0,
                b"[other]".to_vec(),
                Title::default(),
                "all".into(),
                Counted {
                    errors: o.errors,
                    in_window_ns: o.in_window_ns,
                },
                &o.hist,
                secs,
            ));
        }
        rows.sort_by(|a, b| {
            b.lat
                .s
                .total_ns
                .cmp(&a.lat.s.total_ns)
                .then(a.id.cmp(&b.id))
        });

        let calls: u64 = rows.iter().map(|r| r.lat.s.count).sum();
        let mut out = Output::default();
        let missed = out.note_missed(&st, "call", "");
        out.title = format!(
            "fsync-lat: {calls} calls of {} in {}; {}; missed {missed}",
            self.traced.join(", "),
            self.scope.describe(),
            w.span(),
        );
        out.note_skipped(&self.session.skipped);
        if rows.is_empty() {
            out.notes.push("no sync-family calls seen".into());
        }
        let ctx = Ctx { secs };
        if rows.iter().any(|r| r.cv > 1.0) {
            out.footnotes.push(
                "! CV > 1: the latency is skewed, so the mean misleads; trust P50 and P99.".into(),
            );
        }
        out.findings = self.findings(&rows, &busiest_files(&per_file), secs);
        out.sections.push(
            Section::build(
                &SUMMARY_ROWS,
                &rows,
                &id_columns(SUMMARY, threads),
                &ctx,
                self.max_rows,
            )
            .with_dists(
                &rows,
                |r| format!("{} {} {}", r.syscall, r.who.id_text(), r.who.comm),
                |r| vec![("fsync", r.hist)],
            ),
        );
        if self.by_file {
            let files = self.file_rows(per_file);
            let no_access = files.iter().any(|f| f.file_raw == b"[no access]");
            out.sections.push(
                Section::build(&FILE_ROWS, &files, &id_columns(FILES, threads), &ctx, 0).caption(
                    format!(
                        "Top {} files per process by total sync time:",
                        self.top_files
                    ),
                ),
            );
            if no_access {
                out.footnotes.push(
                    "[no access]: the file of another user's process; resolving it needs CAP_SYS_PTRACE.".into(),
                );
            }
        }
        out.footnotes.push(
            "%TIME: share of the window spent in these calls (summed over the process's threads)."
                .into(),
        );
        out.stats = Some(Stats::new(st).with("calls", calls).with("missed", missed));
        self.fold.end_window();
        Ok(out)
    }
}

/// Each row id's file with the most sync time in the window (ties: the first in key order).
fn busiest_files(per_file: &BTreeMap<FileKey, (u32, [u8; 16], LatHist)>) -> BTreeMap<u32, FileKey> {
    let mut best: BTreeMap<u32, (FileKey, u64)> = BTreeMap::new();
    for (k, (_, _, h)) in per_file {
        let e = best.entry(k.0).or_insert((*k, h.sum));
        if h.sum > e.1 {
            *e = (*k, h.sum);
        }
    }
    best.into_iter().map(|(id, (k, _))| (id, k)).collect()
}

impl FsyncLat {
    /// One finding per process that lost a share of the window worth acting on, most first;
    /// `busiest`: each row id's file with the most sync time (`--by-file`).
    fn findings(
        &self,
        rows: &[SummaryRow],
        busiest: &BTreeMap<u32, FileKey>,
        secs: f64,
    ) -> Vec<Finding> {
        let me = std::process::id();
        let mut per_pid: BTreeMap<u32, Vec<&SummaryRow>> = BTreeMap::new();
        for r in rows
            .iter()
            .filter(|r| r.who.pid != 0 && r.who.pid != me && r.who.processes.is_none())
        {
            per_pid.entry(r.who.pid).or_default().push(r);
        }
        let mut out = Vec::new();
        // Too small alone, but counted with their service when it has a finding (triage tells
        // a service once: report::group).
        let mut below = Vec::new();
        for (pid, rs) in per_pid {
            // The time inside the window (a call begun before it counts from its start): one
            // thread's share never exceeds the whole.
            let total: u64 = rs.iter().map(|r| r.in_window_ns).sum();
            let count: u64 = rs.iter().map(|r| r.lat.s.count).sum();
            let ns_per_s = (total as f64 / secs) as u64;
            let small = ns_per_s < MIN_FSYNC_NS_PER_S;
            let top = rs
                .iter()
                .max_by_key(|r| r.lat.s.total_ns)
                .copied()
                .unwrap_or(rs[0]);
            let syscalls: Vec<&str> = rs.iter().map(|r| r.syscall.as_str()).collect();
            let subject = top.who.subject();
            let who = subject.text();
            let file = busiest
                .get(&top.id)
                .and_then(|k| self.paths.get(k))
                .map(|n| sanitize::text(&n.path));
            let on = file.map(|f| format!(" on {f}")).unwrap_or_default();
            let rate_s = count as f64 / secs;
            let (advice, next) = if top.lat.s.p50_ns < 2_000_000 && rate_s >= 50.0 {
                (
                    "many short syncs: batch them (group commit, e.g. PostgreSQL commit_delay or synchronous_commit=off for data that may be lost, fewer fsync calls in the application), or give the file a device with a power-safe write cache",
                    format!("tracekit fsync-lat --pid {pid} --by-file --duration 30s"),
                )
            } else {
                (
                    "each sync is slow: the storage under the file is the bottleneck; look at queue time versus device time and at the other writers sharing the device",
                    "tracekit io-lat --duration 10s".to_string(),
                )
            };
            let f = Finding {
                tool: INFO.name,
                cause: FSYNC,
                subject,
                culprit: None,
                score: Score::NsPerS(ns_per_s),
                summary: format!(
                    "{who} spent {} of {} in {} ({:.1} % of the time): {count} calls, p50 {}, p99 {}, max {}{on}.",
                    fmt_ns(total),
                    fmt_ns((secs * 1e9) as u64),
                    syscalls.join("/"),
                    total as f64 / secs / 1e7,
                    fmt_ns(top.lat.s.p50_ns),
                    fmt_ns(top.lat.s.p99_ns),
                    fmt_ns(top.lat.s.max_ns),
                ),
                evidence: vec![],
                advice: advice.into(),
                next: Some(next),
                fold: None,
                members: Vec::new(),
            }
            .evidence("total_ns", total)
            .evidence("latency_total_ns", rs.iter().map(|r| r.lat.s.total_ns).sum::<u64>())
            .evidence("calls", count)
            .evidence("p50_ns", top.lat.s.p50_ns)
            .evidence(ev::P99_NS, top.lat.s.p99_ns)
            .evidence("max_ns", top.lat.s.max_ns)
            .evidence(crate::report::findings::WINDOW_NS, (secs * 1e9) as u64);
            if small {
                below.push(f);
            } else {
                out.push(f);
            }
        }
        crate::report::group::with_service(&mut out, below);
        crate::report::group::group(&mut out);
        crate::report::findings::rank(&mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    /// Issue #32: the finding said "on {file}" of the first file in the process's map, not
    /// the one it spent its sync time on (a WAL fsynced 50 times beside a config file synced
    /// once was reported as the config file).
    #[test]
    fn the_finding_names_the_file_with_the_most_sync_time() {
        let mut per_file = BTreeMap::new();
        let hist = |calls: u64, ns: u64| {
            let mut h = LatHist::ZERO;
            for _ in 0..calls {
                h.record(ns);
            }
            h
        };
        // Key order puts the config file (inode 10) first.
        per_file.insert((7, 1, 10, 0), (7, [0u8; 16], hist(1, 1_000)));
        per_file.insert((7, 1, 99, 0), (7, [0u8; 16], hist(50, 2_000_000)));
        per_file.insert((8, 1, 5, 0), (8, [0u8; 16], hist(2, 10)));
        let b = super::busiest_files(&per_file);
        assert_eq!(b[&7], (7, 1, 99, 0));
        assert_eq!(b[&8], (8, 1, 5, 0));
    }

    use super::*;

    #[test]
    fn hooks_share_one_group_and_both_modes() {
        assert_eq!(HOOKS.len(), 12);
        for h in HOOKS {
            assert_eq!(h.group, "sync");
            assert!(h.optional);
            assert_eq!(h.programs[0].0, AttachMode::Tracepoint, "{}", h.event);
        }
    }
}
