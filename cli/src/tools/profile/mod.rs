//! `tracekit profile`: where the CPU goes, per process, as a table of functions, folded stacks
//! and an SVG flame graph, without perf on the node.
//!
//! Kernel side (`probes-ebpf/src/bin/profile.rs`): a perf_event program on the software CPU
//! clock of every online CPU at `--freq` Hz takes kernel and user stacks (frame pointers, via
//! `bpf_get_stackid`) and counts samples per (process, thread, user stack, kernel stack) in the
//! kernel. Userspace resolves user stacks while the window runs (so processes that exit are
//! still named) and kernel stacks through kallsyms (`symbols.rs`), then aggregates
//! (`stacks.rs`) and reports (`rows.rs`).
//!
//! User stacks: `--unwind fp` walks frame pointers in the kernel (`bpf_get_stackid`, counted in
//! the kernel: the fast path, but code built without them — most distribution binaries and
//! interpreters — shows one or two frames per sample). `--unwind dwarf` streams each sample's
//! user registers and 8 KiB of its user stack through a ring buffer and unwinds them here with
//! the binaries' `.eh_frame` CFI (`unwind.rs`, as `perf --call-graph dwarf` does), counting per
//! (process, thread, stack) in userspace: one record per sample, so meant for one process or a
//! few (at most `--freq` × CPUs records a second). `auto` (the default) is DWARF when `--pid`
//! or `--comm` narrows the scope and frame pointers otherwise. The stack map is not reset
//! between `--interval` windows.

use crate::report::findings::Cause;
use std::{collections::HashMap, path::PathBuf, time::Duration};

use aya::maps::{MapData, RingBuf};
use probes_common::{
    profile::{
        DwarfSample, ProfileKey, ProfileVal, STAT_IDLE, STAT_STACK_COLLIDED, STAT_USTACK_FAILED,
    },
    stats,
};

use crate::tools::prelude::*;

mod captured;
mod offcpu;
mod offcpu_rows;
mod perf_map;
mod pprof;
mod python;
mod rows;
mod run;
pub(crate) mod stacks;
mod symbols;
mod unwind;

use rows::*;
use run::StackRun;
use stacks::*;
use symbols::Resolver;

pub const INFO: ToolInfo = ToolInfo {
    name: "profile",
    summary: "Where the CPU goes, per process: samples every CPU on the CPU clock with kernel and user stacks, names the top functions by self and total time, writes folded stacks (`--folded`), an SVG flame graph (`--svg`) and a pprof profile for `go tool pprof`, Pyroscope or Grafana (`--pprof`) without perf on the node; `--unwind dwarf` gives full stacks of code built without frame pointers (Python, most distribution binaries); CPython 3.10–3.13 processes get their Python frames (function, file, line) read in the kernel and spliced into the native stack; findings name a busy process's hot function, for Python the application's function and the library call under it. `--off-cpu`: where threads wait instead — blocked time by stack from `sched_switch`, so an fsync or a lock wait shows with its call path.",
    hooks: HOOKS,
    triage: false,
    hidden: false,
    needs_btf: false,
    rows: &[&rows::PROCESS_ROWS, &rows::FUNCTION_ROWS, &rows::FUNCTION_TOTAL_ROWS, &rows::STACK_ROWS],
    causes: &[CPU_HOT],
    by_container: false,
    joins: &[],
};

// The causes this tool concludes (listed in INFO; see report::findings::Cause).
pub const CPU_HOT: Cause = Cause::new("cpu-hot", "A process spends its CPU in a few functions.");
pub const OFF_CPU_WAIT: Cause = Cause::new(
    "off-cpu",
    "Threads block off the CPU on a lock or another wait.",
);

/// `profile --off-cpu`, for doctor: its own hooks (sched_switch, sched_waking), and the BTF it
/// needs for `task_struct.pid` whatever the attach mode.
pub const OFF_CPU: ToolInfo = ToolInfo {
    name: "profile --off-cpu",
    summary: "Where threads wait instead of running: blocked time by stack, from sched_switch to the wakeup.",
    hooks: offcpu::HOOKS,
    triage: false,
    hidden: false,
    needs_btf: true,
    rows: &[&rows::PROCESS_ROWS, &rows::FUNCTION_TOTAL_ROWS, &rows::STACK_ROWS],
    causes: &[OFF_CPU_WAIT],
    by_container: false,
    joins: &[],
};

const OBJECT: Object = crate::object!("profile");
const PROGRAM: &str = "tk_profile";
/// DWARF mode's program (Linux 5.15+).
const PROGRAM_DWARF: &str = "tk_profile_dwarf";

/// The software CPU clock, one perf event per online CPU (`attach_cpu_clock`).
pub const HOOKS: &[Hook] = &[Hook {
    programs: &[(AttachMode::PerfEvent, PROGRAM)],
    ..Hook::event("cpu-clock")
}];

const EXAMPLES: &str = "  tracekit profile --duration 10s --svg cpu.svg         # top functions of the busiest processes, and a flame graph
  tracekit profile --pid 812 --duration 30s --folded cpu.folded   # one process, full stacks (--pid: DWARF unwinding), folded for inferno
  tracekit profile --off-cpu --duration 10s --svg offcpu.svg     # where threads wait instead: blocked time by stack";

const NEEDS: &str = "root, or exactly CAP_BPF and CAP_PERFMON (CAP_SYS_ADMIN stands in for \
both) to sample every CPU; resolving the stacks of other users' processes reads \
/proc/<pid>/map_files, which needs CAP_SYS_ADMIN (without it their user frames stay addresses).";

#[derive(clap::Args, Debug)]
#[command(after_help = tools::help_footer(EXAMPLES, NEEDS))]
pub struct Args {
    #[command(flatten)]
    pub common: Common,

    /// Samples per second and CPU (perf's -F; 99 avoids lockstep with timers at 100 Hz).
    #[arg(long, short = 'F', default_value_t = 99, value_name = "HZ",
          value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub freq: u64,

    /// Write the folded stacks of the whole run to FILE (`comm-pid;outer;…;leaf count`; kernel
    /// frames end in `_[k]`), for flamegraph.pl or inferno-flamegraph.
    #[arg(long, value_name = "FILE")]
    pub folded: Option<PathBuf>,

    /// Write an SVG flame graph of the whole run to FILE.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,

    /// Write the whole run as a gzip-compressed pprof profile (`profile.proto`) to FILE, for
    /// `go tool pprof`, Pyroscope or Grafana: samples and CPU time on-CPU, blocked ns with
    /// `--off-cpu`, labelled with pid and comm (and tid with `--threads`).
    #[arg(long, value_name = "FILE")]
    pub pprof: Option<PathBuf>,

    /// Processes shown in the text tables, most samples first (0: all). JSON has every process.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub rows: usize,

    /// Functions shown per process, by self and by total samples.
    #[arg(long, default_value_t = 5, value_name = "N")]
    pub top: usize,

    /// How user stacks are walked: `fp` (frame pointers, in the kernel: cheap, but short for
    /// code built without them), `dwarf` (a copy of each sample's user stack unwound here with
    /// the binaries' CFI: complete, one record per sample), `auto` (dwarf with --pid or
    /// --comm, fp otherwise).
    #[arg(long, value_enum, default_value_t = Unwind::Auto)]
    pub unwind: Unwind,

    /// Leave CPython's frames out: no interpreter state is read (each sample of a Python
    /// process then shows only the native stack, `_PyEval_EvalFrameDefault` where Python ran).
    #[arg(long)]
    pub no_python: bool,

    /// Off-CPU instead of on-CPU: where threads wait — blocked time by stack (kernel stack and
    /// frame-pointer user stack at the switch-out, from `sched_switch` to the wakeup), so an
    /// fsync or a lock wait shows with the call path that led to it. --freq does not apply.
    #[arg(long)]
    pub off_cpu: bool,

    /// With --off-cpu: blocks shorter than this are not recorded (humantime: 1ms, 50us; 0:
    /// all). 1 ms keeps disk, lock and sleep waits that matter and drops the µs-long waits of
    /// pipe and socket ping-pong, which would otherwise fill the tables.
    #[arg(long, value_name = "DURATION", default_value = "1ms",
          value_parser = offcpu::parse_min_block, requires = "off_cpu")]
    pub min_block: Duration,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unwind {
    Auto,
    Fp,
    Dwarf,
}

pub fn run(args: Args) -> Result<()> {
    tools::run_collector(INFO.name, &args.common, |ctx| open(&args, ctx))
}

const ZERO: ProfileVal = ProfileVal {
    comm: [0; 16],
    samples: 0,
};

/// Loads the sampling program and attaches it to every online CPU's clock.
pub fn open(args: &Args, ctx: &OpenCtx) -> Result<Box<dyn Collector>> {
    if args.off_cpu {
        return offcpu::open(args, ctx);
    }
    StackRun::check_files(args)?;
    let plan = loader::plan(HOOKS, &ctx.env, &ctx.symbols)?;
    let scope = &ctx.scope;
    let dwarf = match args.unwind {
        Unwind::Dwarf => true,
        Unwind::Fp => false,
        Unwind::Auto => !scope.pids.is_empty() || scope.comm.is_some(),
    };
    let spec = LoadSpec::new()
        .max_entries("PROFILE_COUNTS", scope.key_cap())
        .max_entries("PROFILE_STACKS", 16384)
        .max_entries(python::STACKS_MAP, python::STACKS_CAP);
    let mut session = Session::load(OBJECT, scope.filter(), spec)?;
    let mut fallback = None;
    let tried = dwarf.then(|| session.attach_cpu_clock(PROGRAM_DWARF, args.freq));
    let dwarf = match tried {
        None => false,
        Some(Ok(())) => true,
        // bpf_task_pt_regs (the user registers of a sample taken in the kernel) is 5.15+.
        Some(Err(e)) if args.unwind == Unwind::Dwarf => {
            return Err(Error::KernelFeature(format!(
                "--unwind dwarf: {PROGRAM_DWARF} does not load on this kernel (it needs bpf_task_pt_regs, Linux 5.15+): {}",
                crate::error::one_line(&e.into())
            )))
        }
        Some(Err(e)) => {
            fallback = Some(format!(
                "DWARF unwinding needs Linux 5.15+; {PROGRAM_DWARF}: {}",
                crate::error::one_line(&e.into())
            ));
            false
        }
    };
    if !dwarf {
        session.attach_cpu_clock(PROGRAM, args.freq)?;
    }
    session.choices.extend(plan);
    let counts = GenMap::take(&mut session, "PROFILE_COUNTS", Some("PROFILE_OTHER"), ZERO)?;
    let run = StackRun::new(
        &mut session,
        "PROFILE_STACKS",
        args,
        "samples",
        ctx.facts.clone(),
        scope,
        !args.no_python,
    )?;
    let samples = match dwarf {
        true => {
            let m = session.take_map("PROFILE_SAMPLES")?;
            Some(RingBuf::try_from(m).context("PROFILE_SAMPLES")?)
        }
        false => None,
    };
    let ncpu = aya::util::online_cpus()
        .map(|c| c.len())
        .unwrap_or(1)
        .max(1);
    Ok(Box::new(Profile {
        session,
        counts,
        run,
        dwarf: samples.map(|ring| Dwarf {
            ring,
            unwinder: unwind::Unwinder::default(),
            ids: HashMap::new(),
            next_id: 0,
            counts: HashMap::new(),
            unwound: 0,
            frames: 0,
        }),
        scope: scope.clone(),
        freq: args.freq,
        ncpu,
        pmu: crate::host::pmu::hardware_pmu(),
        rows: args.rows,
        top: args.top,
        fallback,
    }))
}

/// DWARF mode: the sample stream, the unwinder, and the counts kept here instead of the kernel.
struct Dwarf {
    ring: RingBuf<MapData>,
    unwinder: unwind::Unwinder,
    /// Unwound stacks by (tgid, addresses), with the id they have in the resolver (ids are never
    /// reused, so the resolver's cache stays right when this table is cleared).
    ids: HashMap<(u32, Vec<u64>), i32>,
    next_id: i32,
    /// Samples this window per key (`user_stack`: an id from `ids`).
    counts: HashMap<ProfileKey, ProfileVal>,
    /// Samples unwound this window, and their frames in all.
    unwound: u64,
    frames: u64,
}

impl Dwarf {
    /// Unwinds one streamed sample and counts it; its stack is resolved now (the process may
    /// exit before the window ends).
    fn take(&mut self, s: &DwarfSample, resolver: &mut Resolver) {
        let ips = self.unwinder.unwind(s);
        self.unwound += 1;
        self.frames += ips.len() as u64;
        let user_stack = if ips.is_empty() {
            probes_common::profile::NO_STACK
        } else {
            if self.ids.len() >= symbols::MAX_STACKS {
                self.ids.clear();
            }
            let next = &mut self.next_id;
            let id = *self.ids.entry((s.tgid, ips.clone())).or_insert_with(|| {
                *next = next.wrapping_add(1) & i32::MAX;
                *next
            });
            if !resolver.has_user(s.tgid, id) {
                resolver.resolve_user(s.tgid, id, &ips);
            }
            id
        };
        let key = ProfileKey {
            tgid: s.tgid,
            pid: s.pid,
            user_stack,
            kernel_stack: s.kernel_stack,
            gen: 0,
            py_stack: s.py_stack,
        };
        let v = self.counts.entry(key).or_insert(ProfileVal {
            comm: s.comm,
            samples: 0,
        });
        v.samples += 1;
    }
}

struct Profile {
    session: Session,
    dwarf: Option<Dwarf>,
    /// Why DWARF mode was asked for (`auto`) but frame pointers are used.
    fallback: Option<String>,
    counts: GenMap<ProfileKey, ProfileVal>,
    /// The stack map, the resolver, titles, and the run's folded stacks (in samples).
    run: StackRun,
    scope: crate::engine::Scope,
    freq: u64,
    ncpu: usize,
    pmu: Option<&'static str>,
    rows: usize,
    top: usize,
}

impl Profile {
    /// The frames of one key, outermost first: user frames, then kernel frames.
    fn frames(&mut self, k: &ProfileKey) -> Vec<symbols::Frame> {
        let user = match self.dwarf {
            // DWARF mode: unwound and resolved as the samples arrived (or none).
            Some(_) => Some(
                self.run
                    .resolver
                    .user_frames(k.tgid, k.user_stack)
                    .unwrap_or_else(|| std::rc::Rc::from(Vec::new())),
            ),
            None => None,
        };
        self.run.frames(k, user)
    }

    fn clock(&self) -> String {
        match self.pmu {
            Some(p) => format!("cpu-clock (software; the hardware PMU `{p}` is not used, so results compare across machines)"),
            None => "cpu-clock (software; this machine has no hardware PMU)".into(),
        }
    }
}

impl Collector for Profile {
    fn name(&self) -> &'static str {
        INFO.name
    }

    fn meta(&self) -> Meta {
        Meta::of(
            INFO.name,
            format!("CPU samples at {} Hz on {}", self.freq, self.clock()),
            &self.scope,
            &self.session,
        )
        .with("freq_hz", self.freq)
        .with("clock", "cpu-clock")
        .with("hardware_pmu", self.pmu)
        .with("unwind", if self.dwarf.is_some() { "dwarf" } else { "fp" })
    }

    fn poll_interval(&self) -> Option<Duration> {
        // DWARF mode: the ring buffer (4 MiB) holds about 2.5 s of 8 KiB samples at 99 Hz on
        // two CPUs; read it well before.
        Some(Duration::from_millis(if self.dwarf.is_some() {
            200
        } else {
            1000
        }))
    }

    /// Resolves the user stacks of processes seen since the last poll while they still run
    /// (DWARF mode: unwinds and counts the streamed samples).
    fn on_events(&mut self) -> Result<()> {
        let Some(d) = &mut self.dwarf else {
            self.run.poll(&self.counts.keys());
            return Ok(());
        };
        self.run.resolver.begin_poll();
        let mut py = std::collections::HashSet::new();
        {
            d.unwinder.begin_poll();
            loop {
                let s: DwarfSample = match d.ring.next() {
                    None => break,
                    Some(item) if item.len() < std::mem::size_of::<DwarfSample>() => continue,
                    // SAFETY: the record is a DwarfSample (plain integers), read unaligned.
                    Some(item) => unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) },
                };
                self.run.see(s.tgid);
                d.take(&s, &mut self.run.resolver);
                if s.py_stack != 0 {
                    py.insert((s.tgid, s.py_stack));
                }
            }
        }
        self.run.python.poll(py);
        Ok(())
    }

    fn session(&mut self) -> Option<&mut crate::kernel::loader::Session> {
        Some(&mut self.session)
    }

    fn collect(&mut self, w: &Window) -> Result<Output> {
        let mut drained = self
            .counts
            .drain(self.session.drained())
            .context("reading PROFILE_COUNTS")?;
        let mut unwound = None;
        let mut not_unwound = Vec::new();
        if let Some(d) = &mut self.dwarf {
            not_unwound = unwind::skipped_notes(d.unwinder.skipped());
            drained.rows.extend(d.counts.drain());
            unwound = Some((
                std::mem::take(&mut d.unwound),
                std::mem::take(&mut d.frames),
            ));
            d.unwinder.retain(crate::host::proc::exists);
        }
        let st = self.session.stats_delta()?;
        let secs = w.secs();
        let threads = self.scope.threads;
        let mut samples = Vec::with_capacity(drained.rows.len() + 1);
        for (k, v) in &drained.rows {
            let frames = self.frames(k);
            let id = if threads { k.pid } else { k.tgid };
            samples.push(Sample {
                id,
                tgid: k.tgid,
                comm: row_comm(id, k.tgid, threads, &v.comm),
                frames,
                count: v.samples,
            });
        }
        if drained.other.samples > 0 {
            samples.push(Sample {
                id: 0,
                tgid: 0,
                comm: b"[other]".to_vec(),
                frames: vec![marker("[other]", "[unknown]")],
                count: drained.other.samples,
            });
        }
        self.run.fold(&samples);
        let aggs = aggregate(&samples);
        let one_cpu = self.freq as f64 * secs;
        let all = one_cpu * self.ncpu as f64;
        let mut order: Vec<(&u32, &ProcAgg)> = aggs.iter().collect();
        order.sort_by(|a, b| b.1.samples.cmp(&a.1.samples).then(a.0.cmp(b.0)));
        let procs: Vec<ProcRow> = order
            .iter()
            .map(|(id, p)| {
                proc_row(
                    p,
                    **id,
                    threads,
                    one_cpu,
                    all,
                    crate::report::who::Title::cached(&mut self.run.facts.lock(), p.tgid),
                )
            })
            .collect();
        let shown = crate::report::rows::shown(self.rows, order.len());
        let (mut by_self, mut by_total) = (Vec::new(), Vec::new());
        for (id, p) in &order[..shown] {
            by_self.extend(fn_rows(p, **id, threads, self.top, all, false));
            by_total.extend(fn_rows(p, **id, threads, self.top, all, true));
        }
        let total: u64 = samples.iter().map(|s| s.count).sum();
        let idle = st[STAT_IDLE as usize];
        let collided = st[STAT_STACK_COLLIDED as usize];
        let mut user_proc: std::collections::HashMap<u32, bool> = Default::default();
        let no_user = samples
            .iter()
            .filter(|s| {
                *user_proc.entry(s.tgid).or_insert_with(|| {
                    crate::host::facts::ProcFacts::read(s.tgid).is_some_and(|f| !f.kthread)
                })
            })
            .filter(|s| {
                s.frames
                    .iter()
                    .all(|f| &*f.module == "kernel" || f.function.starts_with('['))
            })
            .map(|s| s.count)
            .sum::<u64>();

        let mut out = Output::default();
        let missed = out.note_missed(&st, "sample", "");
        out.title = format!(
            "profile: {total} samples of {} at {} Hz on {} CPUs ({idle} idle); {}; stacks lost to collisions {collided}",
            self.scope.describe(),
            self.freq,
            self.ncpu,
            w.span(),
        );
        out.notes.push(match unwound {
            Some((n, f)) => format!(
                "clock: {}; user stacks unwound with DWARF CFI: {n} samples, {:.1} frames each on average; {} lost to a full ring buffer",
                self.clock(),
                f as f64 / n.max(1) as f64,
                st[stats::RINGBUF_FULL as usize]
            ),
            None => format!(
                "clock: {}; user stacks by frame pointers{}",
                self.clock(),
                self.fallback
                    .as_deref()
                    .map_or(String::new(), |why| format!(" ({why})"))
            ),
        });
        out.notes.extend(not_unwound);
        out.notes.extend(self.run.python.notes());
        out.notes.extend(self.run.resolver.refused_notes());
        if no_user > 0 {
            out.notes.push(format!(
                "{no_user} samples of user processes have no user stack (code without frame pointers, or a failed walk: {} failed)",
                st[STAT_USTACK_FAILED as usize]
            ));
        }
        out.note_skipped(&self.session.skipped);
        if samples.is_empty() {
            out.notes.push("no samples: nothing ran in scope".into());
        }
        let ctx = Ctx { secs };
        let found: Vec<(u32, &ProcAgg, crate::report::who::Title)> = order
            .iter()
            .map(|(id, p)| {
                (
                    **id,
                    *p,
                    crate::report::who::Title::cached(&mut self.run.facts.lock(), p.tgid),
                )
            })
            .collect();
        out.findings = findings(INFO.name, &found, self.freq, secs);
        out.sections.push(
            Section::build(
                &rows::PROCESS_ROWS,
                &procs,
                &id_columns(PROCS, threads),
                &ctx,
                self.rows,
            )
            .caption("CPU by process (%CPU: of one CPU; %ALL: of all CPUs):"),
        );
        out.sections.push(
            Section::build(
                &rows::FUNCTION_ROWS,
                &by_self,
                &id_columns(FUNCS, threads),
                &ctx,
                0,
            )
            .caption(format!(
                "Top {} functions per process by self samples (the function was running):",
                self.top
            )),
        );
        out.sections.push(
            Section::build(&rows::FUNCTION_TOTAL_ROWS, &by_total, &id_columns(FUNCS, threads), &ctx, 0)
                .caption(format!("Top {} functions per process by total samples (on the stack: the function or its callees):", self.top)),
        );
        out.footnotes.push("SELF%/TOTAL%: of the process's samples; %ALL: self samples as a share of all CPUs' time.".into());
        self.run.write_files(&format!(
            "CPU samples at {} Hz, {}",
            self.freq,
            self.scope.describe()
        ))?;
        out.stats = Some(
            Stats::new(st)
                .with("samples", total)
                .with("idle_samples", idle)
                .with("stack_collisions", collided)
                .with("events", st[stats::EVENTS as usize])
                .with("ringbuf_full", st[stats::RINGBUF_FULL as usize])
                .with("missed", missed),
        );
        self.run.end_window();
        Ok(out)
    }
}
