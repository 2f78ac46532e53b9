//! `tracekit profile --off-cpu`: where threads wait instead of running — blocked time by stack,
//! so an fsync or a lock wait shows up with the call path that led to it.
//!
//! Kernel side (`probes-ebpf/src/bin/offcpu.rs`): at `sched_switch` a blocking task's kernel
//! and frame-pointer user stacks and the time are kept by tid; its wakeup (`sched_waking`) ends
//! the block, and its switch-in adds the blocked time (run-queue time after the wakeup is not
//! part of it) to an aggregate per (process, thread, user stack, kernel stack) when it lasted
//! at least `--min-block`. Userspace resolves the stacks with profile's resolver and reports
//! blocked time per process, per function on the stack, and per stack, with folded stacks and
//! an SVG flame graph in ns of blocked time.
//!
//! User stacks are frame-pointer stacks (DWARF unwinding is for on-CPU samples only): the
//! kernel stack is what names the wait. A wait still in progress when a window ends is counted
//! in the window where it ends.

use std::time::Duration;

use probes_common::{
    profile::{OffCpuVal, ProfileKey, STAT_RUNNABLE, STAT_STACK_COLLIDED, STAT_USTACK_FAILED},
    stats,
};

use super::{
    offcpu_rows::*,
    run::StackRun,
    stacks::{aggregate, marker, Sample},
    Args,
};
use crate::tools::prelude::*;

const OBJECT: Object = crate::object!("offcpu");

/// The wakeup hook first, so no block is seen before its wakeups are; each tp_btf where the
/// kernel allows it, else raw_tp.
pub const HOOKS: &[Hook] = &[
    crate::hook!(
        "sched:sched_waking",
        "tk_offcpu_waking",
        [TpBtf, RawTp],
        optional: true,
    ),
    crate::hook!("sched:sched_switch", "tk_offcpu_switch", [TpBtf, RawTp]),
];

/// `--min-block`: a duration (humantime), 0 to keep every block, at most an hour.
pub fn parse_min_block(s: &str) -> std::result::Result<Duration, String> {
    let d = humantime::parse_duration(s)
        .map_err(|e| format!("invalid --min-block '{s}': {e} (examples: 1ms, 50us, 0)"))?;
    if d > Duration::from_secs(3600) {
        return Err(format!("invalid --min-block '{s}': longer than an hour"));
    }
    Ok(d)
}

const ZERO: OffCpuVal = OffCpuVal {
    comm: [0; 16],
    ns: 0,
    blocks: 0,
};

/// Loads the off-CPU programs and attaches them as the attach policy chose on this kernel.
pub fn open(args: &Args, ctx: &OpenCtx) -> Result<Box<dyn Collector>> {
    if args.unwind == super::Unwind::Dwarf {
        return Err(Error::Usage(
            "--off-cpu takes frame-pointer user stacks only (--unwind dwarf is for on-CPU samples)"
                .into(),
        ));
    }
    StackRun::check_files(args)?;
    let plan = loader::plan(HOOKS, &ctx.env, &ctx.symbols)?;
    let btf = crate::kernel::btf::vmlinux().map_err(|e| {
        Error::KernelFeature(format!(
            "profile --off-cpu needs the kernel's BTF to find task_struct.pid ({}, or TRACEKIT_BTF): {e}",
            crate::kernel::btf::vmlinux_path().display()
        ))
    })?;
    let pid_off = btf.member("task_struct", "pid")?.offset;
    // prev_state is sched_switch's 5th BTF parameter from 5.18 on (see tools::sched).
    let has_state = btf
        .proto_params("btf_trace_sched_switch")
        .is_none_or(|n| n >= 5);
    let scope = &ctx.scope;
    let min_ns = args.min_block.as_nanos().min(u64::MAX as u128) as u64;
    let spec = LoadSpec::new()
        .global("OFFCPU_MIN_NS", &min_ns)
        .global("OFFCPU_PID_OFF", &pid_off)
        .global("OFFCPU_HAS_STATE", &u8::from(has_state))
        .max_entries("OFFCPU_START", crate::tools::sched::task_cap())
        .max_entries("OFFCPU_COUNTS", scope.key_cap())
        .max_entries("OFFCPU_STACKS", 16384)
        .max_entries(super::python::STACKS_MAP, super::python::STACKS_CAP)
        .tp_btf_planned(HOOKS, &plan);
    let mut session = Session::load(OBJECT, scope.filter(), spec)?;
    session.attach_planned(HOOKS, &plan)?;
    let counts = GenMap::take(&mut session, "OFFCPU_COUNTS", Some("OFFCPU_OTHER"), ZERO)?;
    let run = StackRun::new(
        &mut session,
        "OFFCPU_STACKS",
        args,
        "ns",
        ctx.facts.clone(),
        scope,
        !args.no_python,
    )?;
    Ok(Box::new(OffCpu {
        session,
        counts,
        run,
        scope: scope.clone(),
        min_ns,
        has_state,
        rows: args.rows,
        top: args.top,
    }))
}

/// A kernel frame of the tracepoint and BPF machinery that took the stack, not of the wait.
fn tracing_frame(f: &super::symbols::Frame) -> bool {
    &*f.module == "kernel"
        && ["bpf_prog_", "bpf_trace_run", "__traceiter_", "__bpf_trace_"]
            .iter()
            .any(|p| f.function.starts_with(p))
}

struct OffCpu {
    session: Session,
    counts: GenMap<ProfileKey, OffCpuVal>,
    /// The stack map, the resolver, titles, and the run's folded stacks (in ns blocked).
    run: StackRun,
    scope: crate::engine::Scope,
    min_ns: u64,
    /// The kernel passes `prev_state` (else every switch-out that is not a preemption counts).
    has_state: bool,
    rows: usize,
    top: usize,
}

impl Collector for OffCpu {
    fn name(&self) -> &'static str {
        super::INFO.name
    }

    fn meta(&self) -> Meta {
        Meta::of(
            super::INFO.name,
            format!(
                "off-CPU: blocked time by stack, blocks of {} or more (user stacks by frame pointers)",
                fmt_ns(self.min_ns)
            ),
            &self.scope,
            &self.session,
        )
        .with("mode", "off-cpu")
        .with("min_block_ns", self.min_ns)
        .with("unwind", "fp")
    }

    /// Often enough to resolve the user stacks of short-lived processes before they exit (a
    /// key appears at the end of the first block of a process, and only then can its stack be
    /// resolved).
    fn poll_interval(&self) -> Option<Duration> {
        Some(Duration::from_millis(200))
    }

    /// Resolves the user stacks of processes seen since the last poll while they still run.
    fn on_events(&mut self) -> Result<()> {
        self.run.poll(&self.counts.keys());
        Ok(())
    }

    fn session(&mut self) -> Option<&mut crate::kernel::loader::Session> {
        Some(&mut self.session)
    }

    fn collect(&mut self, w: &Window) -> Result<Output> {
        let drained = self
            .counts
            .drain(self.session.drained())
            .context("reading OFFCPU_COUNTS")?;
        let st = self.session.stats_delta()?;
        let secs = w.secs();
        let threads = self.scope.threads;
        let (mut by_ns, mut by_blocks) = (Vec::new(), Vec::new());
        for (k, v) in &drained.rows {
            let mut frames = self.run.frames(k, None);
            // The tracing machinery's own frames (the program, bpf_trace_run, the tracepoint).
            frames.retain(|f| !tracing_frame(f));
            let id = if threads { k.pid } else { k.tgid };
            let comm = crate::tools::row_comm(id, k.tgid, threads, &v.comm);
            by_blocks.push(Sample {
                id,
                tgid: k.tgid,
                comm: comm.clone(),
                frames: frames.clone(),
                count: v.blocks,
            });
            by_ns.push(Sample {
                id,
                tgid: k.tgid,
                comm,
                frames,
                count: v.ns,
            });
        }
        if drained.other.blocks > 0 {
            for (list, n) in [
                (&mut by_ns, drained.other.ns),
                (&mut by_blocks, drained.other.blocks),
            ] {
                list.push(Sample {
                    id: 0,
                    tgid: 0,
                    comm: b"[other]".to_vec(),
                    frames: vec![marker("[other]", "[unknown]")],
                    count: n,
                });
            }
        }
        self.run.fold(&by_ns);
        let ns_agg = aggregate(&by_ns);
        let blk_agg = aggregate(&by_blocks);
        let mut order: Vec<(&u32, &super::stacks::ProcAgg)> = ns_agg.iter().collect();
        order.sort_by(|a, b| b.1.samples.cmp(&a.1.samples).then(a.0.cmp(b.0)));
        let procs: Vec<OffProcRow> = order
            .iter()
            .map(|(id, p)| {
                let blocks = blk_agg.get(id).map_or(0, |b| b.samples);
                off_proc_row(
                    p,
                    **id,
                    threads,
                    blocks,
                    secs,
                    crate::report::who::Title::cached(&mut self.run.facts.lock(), p.tgid),
                )
            })
            .collect();
        let shown = crate::report::rows::shown(self.rows, order.len());
        let (mut fns, mut stacks) = (Vec::new(), Vec::new());
        for (id, p) in &order[..shown] {
            fns.extend(off_fn_rows(p, blk_agg.get(id), **id, threads, self.top));
            stacks.extend(off_stack_rows(
                &by_ns, &by_blocks, p, **id, threads, self.top,
            ));
        }
        let total: u64 = by_ns.iter().map(|s| s.count).sum();
        let blocks: u64 = by_blocks.iter().map(|s| s.count).sum();
        let mut out = Output::default();
        let missed = out.note_missed(&st, "block", "");
        out.title = format!(
            "profile --off-cpu: {} blocked in {blocks} blocks of {} or more, {}; {}",
            fmt_ns(total),
            fmt_ns(self.min_ns),
            self.scope.describe(),
            w.span(),
        );
        out.notes.push(format!(
            "blocked time: switch-out to wakeup (run-queue time after the wakeup is not counted); switch-outs of runnable tasks (preemptions, yields) skipped: {}{}",
            st[STAT_RUNNABLE as usize],
            if self.has_state { "" } else { " (this kernel does not pass prev_state: every switch-out that is not a preemption counts as a block)" }
        ));
        out.notes.push(format!(
            "user stacks by frame pointers (DWARF unwinding is for on-CPU samples); stacks lost to collisions {}, user stacks not walked {}",
            st[STAT_STACK_COLLIDED as usize], st[STAT_USTACK_FAILED as usize]
        ));
        out.notes.extend(self.run.python.notes());
        out.note_skipped(&self.session.skipped);
        if by_ns.is_empty() {
            out.notes.push(format!(
                "no blocks of {} or more in scope",
                fmt_ns(self.min_ns)
            ));
        }
        let ctx = Ctx { secs };
        let found: Vec<(u32, &super::stacks::ProcAgg, crate::report::who::Title)> = order
            .iter()
            .map(|(id, p)| {
                (
                    **id,
                    *p,
                    crate::report::who::Title::cached(&mut self.run.facts.lock(), p.tgid),
                )
            })
            .collect();
        out.findings = off_findings(super::INFO.name, &found, &by_ns, &by_blocks, secs);
        out.sections.push(
            Section::build(
                &super::rows::PROCESS_ROWS,
                &procs,
                &id_columns(OFF_PROCS, threads),
                &ctx,
                self.rows,
            )
            .caption("Blocked time by process (%WALL: of one thread's wall time; over 100 with several threads blocked at once):"),
        );
        out.sections.push(
            Section::build(&super::rows::FUNCTION_TOTAL_ROWS, &fns, &id_columns(OFF_FUNCS, threads), &ctx, 0)
                .caption(format!(
                    "Top {} functions per process by blocked time (on the stack when the thread blocked; the scheduler's and the system-call entry's frames left out):",
                    self.top
                )),
        );
        out.sections.push(
            Section::build(&super::rows::STACK_ROWS, &stacks, &id_columns(OFF_STACKS, threads), &ctx, 0)
                .caption(format!(
                    "Top {} blocking stacks per process (WAIT: the kernel function it waited in; innermost first):",
                    self.top
                )),
        );
        self.run.write_files(&format!(
            "Off-CPU time (ns blocked, blocks of {} or more), {}",
            fmt_ns(self.min_ns),
            self.scope.describe()
        ))?;
        out.stats = Some(
            Stats::new(st)
                .with("blocked_ns", total)
                .with("blocks", blocks)
                .with("runnable_switches", st[STAT_RUNNABLE as usize])
                .with("stack_collisions", st[STAT_STACK_COLLIDED as usize])
                .with("events", st[stats::EVENTS as usize])
                .with("missed", missed),
        );
        self.run.end_window();
        Ok(out)
    }
}
