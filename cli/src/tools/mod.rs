//! The tool registry, and what every tool shares at the edge: preflight checks, the help
//! footer, opening collectors and running them through the engine.
//!
//! Adding a tool is its own files plus one line in `registry!` (see CONTRIBUTING.md): the
//! subcommand, `doctor`'s hook list, `triage`'s collectors, the README's tool table and the
//! test lists all come from here.

use crate::{
    engine::{self, Collector, RunOpts, Scope, Stream},
    error::Result,
    host::proc,
    kernel::hooks::{Env, Hook, Symbols},
    options::Common,
    report::{findings::Cause, output::Sink, schema::Rows},
};

pub mod bench_floor;
pub mod compare;
pub mod ctxsw;
pub mod doctor;
pub mod fsync_lat;
pub mod io_lat;
pub mod irq_lat;
pub mod memstall;
pub mod net_rx;
pub mod numa;
pub mod prelude;
pub mod profile;
pub mod record;
pub mod runq_lat;
pub mod sched;
pub mod serve;
pub mod triage;
pub mod why;

/// What the registry knows of a tool or command.
#[derive(Clone, Copy, Debug)]
pub struct ToolInfo {
    /// The subcommand (`fsync-lat`).
    pub name: &'static str,
    /// One sentence: what it answers (the README's tool table, `--help`).
    pub summary: &'static str,
    /// Kernel hooks, cheapest attach mode first (`doctor` checks them; the loader follows the
    /// same policy). Empty for commands that load nothing of their own. Tools that declare
    /// the same table load one object when they run together ([`composed_plan`]).
    pub hooks: &'static [Hook],
    /// A collector `triage` runs by default (cheap enough for every node).
    pub triage: bool,
    /// Hidden from `--help`, `doctor` and the README (benchmark controls).
    pub hidden: bool,
    /// Needs the kernel's BTF whatever the attach mode (struct offsets it reads, such as
    /// `task_struct`'s): on a kernel without BTF, doctor says it cannot run.
    pub needs_btf: bool,
    /// Every kind of row it emits, declared ([`Rows`]): what `serve` exports, `compare`
    /// compares and `record` checks.
    pub rows: &'static [&'static Rows],
    /// The causes its findings conclude.
    pub causes: &'static [Cause],
    /// Its rows fold per container with `--by container` (it keeps a `who::Folding`).
    pub by_container: bool,
    /// A shared hook table whose programs do this tool's work on the events both attach, when
    /// a tool declaring that table runs beside it (numa's node time in the `sched` object's
    /// `sched_switch` program); empty: its hooks are its own.
    pub joins: &'static [Hook],
}

impl ToolInfo {
    /// A command that loads nothing of its own (it drives the collectors, or reads files).
    pub const fn command(name: &'static str, summary: &'static str) -> ToolInfo {
        ToolInfo {
            name,
            summary,
            hooks: &[],
            triage: false,
            hidden: false,
            needs_btf: false,
            rows: &[],
            causes: &[],
            by_container: false,
            joins: &[],
        }
    }

    /// A command whose findings conclude `causes` of its own (triage's node checks).
    pub const fn with_causes(mut self, causes: &'static [Cause]) -> ToolInfo {
        self.causes = causes;
        self
    }

    /// The declaration of its rows of `kind`.
    pub fn rows_of(&self, kind: &str) -> Option<&'static Rows> {
        self.rows.iter().copied().find(|r| r.kind == kind)
    }
}

/// What opening a collector needs: the scope, the kernel facts shared by every collector
/// of the run (probed once), and the run's one cache of process facts.
pub struct OpenCtx {
    pub scope: Scope,
    pub opts: RunOpts,
    pub env: Env,
    pub symbols: Symbols,
    pub facts: crate::host::facts::Facts,
    /// The `sched` object the run's collectors share (ctxsw and runq-lat in `triage`).
    pub sched: sched::Pool,
}

impl OpenCtx {
    pub fn new(mut scope: Scope, opts: RunOpts) -> OpenCtx {
        scope.expand_children();
        OpenCtx {
            scope,
            opts,
            env: Env::detect(),
            symbols: Symbols::default(),
            facts: Default::default(),
            sched: Default::default(),
        }
    }
}

macro_rules! registry {
    (
        tools { $($(#[$tdoc:meta])* $tvariant:ident => $tmodule:ident),* $(,)? }
        commands { $($(#[$cdoc:meta])* $cvariant:ident => $cmodule:ident),* $(,)? }
    ) => {
        #[derive(clap::Subcommand, Debug)]
        pub enum Tool {
            $($(#[$tdoc])* $tvariant($tmodule::Args),)*
            $($(#[$cdoc])* $cvariant($cmodule::Args),)*
        }

        impl Tool {
            pub fn run(self) -> Result<()> {
                match self {
                    $(Tool::$tvariant(args) => $tmodule::run(args),)*
                    $(Tool::$cvariant(args) => $cmodule::run(args),)*
                }
            }
        }

        /// Every collector tool, in registry order.
        pub const TOOLS: &[ToolInfo] = &[$($tmodule::INFO,)*];
        /// Every command (tools that drive others, or load nothing of their own).
        pub const COMMANDS: &[ToolInfo] = &[$($cmodule::INFO,)*];

        /// Opens collector `name` with its default options, for `triage` and the exporter.
        pub fn open_default(name: &str, ctx: &OpenCtx) -> Option<Result<Box<dyn Collector>>> {
            open_with(name, &[], ctx)
        }

        /// Opens collector `name` with `flags` on top of its defaults, as on its command line
        /// (`why --detail` asks fsync-lat for `--by-file`).
        pub fn open_with(
            name: &str,
            flags: &[&str],
            ctx: &OpenCtx,
        ) -> Option<Result<Box<dyn Collector>>> {
            $(
                if name == $tmodule::INFO.name {
                    return Some(args_from::<$tmodule::Args>(flags).and_then(|a| $tmodule::open(&a, ctx)));
                }
            )*
            None
        }
    };
}

/// Modes of a tool that load programs of their own instead of the tool's (`profile
/// --off-cpu`): `doctor` lists each as its own entry, with the hooks that mode attaches, and the
/// VM checks check each (`pub fn vm_check_<mode>()` in the tool's root test file).
pub const MODES: &[ToolInfo] = &[profile::OFF_CPU];

registry! {
    tools {
        /// Latency of fsync, fdatasync, sync_file_range, msync, syncfs and sync, per process and syscall.
        FsyncLat => fsync_lat,
        /// Context switches per process or thread: voluntary vs involuntary, who preempts whom, who wakes whom; a live view with --top.
        Ctxsw => ctxsw,
        /// Run-queue latency per process or thread: waits after wakeups and preemptions, and who held the CPU.
        RunqLat => runq_lat,
        /// Time processes lose stalled in direct compaction, reclaim, memcg reclaim and THP collapse, with THP settings, vmstat, cgroup counters and OOM kills as evidence.
        Memstall => memstall,
        /// Block I/O per device and issuing process: queue time vs device time, depth, findings.
        IoLat => io_lat,
        /// Who loses received packets and why, and which CPU drowns in NET_RX softirq.
        NetRx => net_rx,
        /// Hard-IRQ and softirq time per CPU and IRQ or vector: all receive work on one CPU, interrupt storms.
        IrqLat => irq_lat,
        /// Processes running on one NUMA node while their memory sits on another.
        Numa => numa,
        /// Where the CPU goes per process: top functions by self and total samples, folded stacks and an SVG flame graph, without perf.
        Profile => profile,
        /// Where one process's wall-clock time goes: running, waiting for a CPU, storage, memory, locks, network, sleep, in parts that add up to 100 %, with the culprit behind each.
        Why => why,
        /// Benchmark control: the cheapest program on a hook (used by `cargo xtask bench`).
        #[command(hide = true)]
        BenchFloor => bench_floor,
    }
    commands {
        /// Run first on a sick node: every collector at once, findings ranked by harm.
        Triage => triage,
        /// What every tool will do on this kernel, and why (attach modes, fields, node facts).
        Doctor => doctor,
        /// Prometheus exporter: the low-cost collectors continuously, /metrics with histograms and counters per comm and container.
        Serve => serve,
        /// Record a run for a before/after comparison: rows, histograms, node series and settings, per interval, in one file.
        Record => record,
        /// Compare two recordings: settings that changed, then every metric with its verdict, largest changes first.
        Compare => compare,
    }
}

/// What `tools` attach to each event they share when they run together (triage, serve,
/// record): per event, the programs, each as the tools it serves. Tools declaring the same
/// hook table share one loaded object whose programs do the union of their work
/// ([`sched::open`]); any other tool on the event brings a program of its own.
pub fn composed_plan(tools: &[&ToolInfo]) -> Vec<(&'static str, Vec<Vec<&'static str>>)> {
    // Per event, each program as (the hook table it is from, the tools it serves).
    type Programs = Vec<(*const Hook, Vec<&'static str>)>;
    let mut plan: Vec<(&'static str, Programs)> = Vec::new();
    let loaded = |table: &[Hook]| tools.iter().any(|o| std::ptr::eq(o.hooks, table));
    for t in tools {
        for h in t.hooks {
            // Served by the joined table's program where that table is loaded and hooks the
            // same event.
            let table = if !t.joins.is_empty()
                && loaded(t.joins)
                && t.joins.iter().any(|j| j.event == h.event)
            {
                t.joins
            } else {
                t.hooks
            };
            let at = match plan.iter().position(|(e, _)| *e == h.event) {
                Some(i) => i,
                None => {
                    plan.push((h.event, Vec::new()));
                    plan.len() - 1
                }
            };
            let progs = &mut plan[at].1;
            match progs.iter_mut().find(|(tbl, _)| *tbl == table.as_ptr()) {
                Some((_, names)) => names.push(t.name),
                None => progs.push((table.as_ptr(), vec![t.name])),
            }
        }
    }
    plan.into_iter()
        .filter(|(_, progs)| progs.iter().map(|(_, n)| n.len()).sum::<usize>() > 1)
        .map(|(e, progs)| (e, progs.into_iter().map(|(_, n)| n).collect()))
        .collect()
}

/// Collectors opened for a command that runs several at once (`triage`, the exporter,
/// recordings), and the ones that could not run here with the reason.
#[derive(Default)]
pub struct Opened {
    pub collectors: Vec<Box<dyn Collector>>,
    pub ran: Vec<&'static str>,
    pub cannot: Vec<(&'static str, String)>,
    /// The process facts the collectors share.
    pub facts: crate::host::facts::Facts,
}

/// Opens, for a command that drives several tools (triage, serve, record), the collectors its
/// `--tools` names (every tool marked `triage` when none is named) with their default options
/// under `scope` and `opts`. A name the registry does not know is a usage error; a collector
/// that cannot run here is listed, not fatal.
pub fn open_many(names: &[String], scope: Scope, opts: &RunOpts) -> Result<Opened> {
    let ctx = &OpenCtx::new(scope, opts.clone());
    let (default, flag) = (|t: &ToolInfo| t.triage && !t.hidden, "--tools");
    if let Some(bad) = names
        .iter()
        .find(|n| !TOOLS.iter().any(|t| t.name == n.as_str()))
    {
        return Err(crate::error::Error::Usage(format!(
            "{flag}: no collector named {bad:?} (collectors: {})",
            TOOLS
                .iter()
                .filter(|t| !t.hidden)
                .map(|t| t.name)
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let mut o = Opened {
        facts: ctx.facts.clone(),
        ..Default::default()
    };
    for t in TOOLS.iter().filter(|t| {
        if names.is_empty() {
            default(t)
        } else {
            names.iter().any(|n| n == t.name)
        }
    }) {
        match open_default(t.name, ctx) {
            Some(Ok(c)) => {
                o.ran.push(t.name);
                o.collectors.push(c);
            }
            Some(Err(e)) => o.cannot.push((t.name, crate::error::one_line(&e))),
            None => {}
        }
    }
    Ok(o)
}

/// Runs the collectors a command opened with [`open_many`] through `emit` until the duration,
/// a signal or the reader ends it, then detaches them fast; returns why it stopped.
pub fn run_many(
    tool: &str,
    opened: &mut Opened,
    opts: &RunOpts,
    emit: &mut dyn engine::Emitter,
) -> Result<engine::Stop> {
    let collectors = &mut opened.collectors;
    let run = engine::run(collectors, opts, &opened.facts, emit);
    let stop = end_run(tool, collectors, run, emit)?;
    engine::detach_in_background(collectors.iter_mut().map(|c| c.slow_links()).sum());
    Ok(stop)
}

/// The end of every run, after [`engine::run`] returned `run`: a reader that stopped reading
/// (or an error mid-way) may hold tracekit a while longer, never the programs. Then
/// `collectors` are closed here and now (the maps were read with the last window), so they are
/// gone from the kernel before the output's grace ([`engine::Emitter::settle`]) starts and the
/// stall is reported; `collectors` is left empty. Otherwise they are left for
/// [`engine::detach_in_background`], once the output is complete.
pub fn end_run(
    tool: &str,
    collectors: &mut Vec<Box<dyn Collector>>,
    run: Result<engine::Stop>,
    emit: &mut dyn engine::Emitter,
) -> Result<engine::Stop> {
    let stop = match run {
        Ok(stop) => stop,
        Err(e) => {
            // What the run wrote before the error gets its grace after this, when the caller
            // drops the emitter (the sink's drop), as at the end of a run.
            collectors.clear();
            return Err(e);
        }
    };
    // Asked even when the reader went away: stdout's writer thread is joined there.
    let stalled = emit.stalled();
    if stop == engine::Stop::ReaderGone {
        return Ok(stop);
    }
    if stalled {
        collectors.clear();
        tracing::debug!("{tool}: detached; the output stalled, giving its reader a grace");
    }
    emit.settle()?;
    Ok(stop)
}

/// The collectors that could not run, as the reports' `could_not_run` JSON array.
pub fn could_not_run(cannot: &[(&'static str, String)]) -> Vec<serde_json::Value> {
    cannot
        .iter()
        .map(|(t, why)| serde_json::json!({"tool": t, "reason": why}))
        .collect()
}

/// A tool's options as `flags` and its defaults would give them on the command line (clap's
/// `default_value`s included), for collectors opened without one.
fn args_from<A: clap::Args + clap::FromArgMatches>(flags: &[&str]) -> Result<A> {
    let cmd = A::augment_args(clap::Command::new("tracekit"));
    cmd.try_get_matches_from(std::iter::once("tracekit").chain(flags.iter().copied()))
        .and_then(|m| A::from_arg_matches(&m))
        .map_err(|e| crate::error::Error::Usage(e.to_string()))
}

/// The visible tools and commands, for `doctor`, the README and the docs.
pub fn visible() -> impl Iterator<Item = &'static ToolInfo> {
    TOOLS.iter().chain(COMMANDS).filter(|t| !t.hidden)
}

/// The README's tool table, generated from the registry (`README.md` holds it between the
/// `tools:begin` and `tools:end` markers; a unit test fails when it is stale, and
/// `UPDATE_README=1 cargo test -p tracekit readme` rewrites it).
pub fn readme_table() -> String {
    let mut s = String::from("| tool | what it answers |\n|---|---|\n");
    for t in COMMANDS
        .iter()
        .filter(|t| !t.hidden && t.name == "triage")
        .chain(COMMANDS.iter().filter(|t| !t.hidden && t.name == "doctor"))
        .chain(TOOLS.iter().filter(|t| !t.hidden))
        .chain(
            COMMANDS
                .iter()
                .filter(|t| !t.hidden && t.name != "triage" && t.name != "doctor"),
        )
    {
        s.push_str(&format!("| `tracekit {}` | {} |\n", t.name, t.summary));
    }
    s
}

/// The README's list of what each tool loads into the kernel, generated from the hook tables
/// (`kernel:begin`/`kernel:end` markers; stale when a hook, mode or program changes).
pub fn readme_kernel_table() -> String {
    let mut s = String::from(
        "| tool | hook | attach modes, cheapest first (program) | |\n|---|---|---|---|\n",
    );
    for t in TOOLS.iter().chain(MODES).filter(|t| !t.hidden) {
        let name = format!("`{}`", t.name);
        for (i, h) in t.hooks.iter().enumerate() {
            let modes: Vec<String> = h
                .programs
                .iter()
                .map(|(m, p)| format!("{} (`{p}`)", m.as_str()))
                .collect();
            s.push_str(&format!(
                "| {} | `{}` | {} | {} |\n",
                if i == 0 { name.as_str() } else { "" },
                h.event,
                modes.join(", "),
                if h.optional { "optional" } else { "" }
            ));
        }
    }
    s
}

/// The README's table of the causes findings name (`cause` in JSON), generated from the tools'
/// declarations (`causes:begin`/`causes:end`).
pub fn readme_causes_table() -> String {
    let mut s = String::from("| cause | concluded by | what it means |\n|---|---|---|\n");
    for c in causes() {
        let by: Vec<String> = TOOLS
            .iter()
            .chain(MODES)
            .chain(COMMANDS)
            .filter(|t| t.causes.contains(&c))
            .map(|t| format!("`{}`", t.name))
            .collect();
        s.push_str(&format!(
            "| `{}` | {} | {} |\n",
            c.name,
            by.join(", "),
            c.means
        ));
    }
    s
}

/// The declaration of `tool`'s rows of `kind` (a tool's modes included); `None` for a tool
/// or kind this build does not know (a recording from another version).
pub fn rows_of(tool: &str, kind: &str) -> Option<&'static Rows> {
    TOOLS
        .iter()
        .chain(MODES)
        .filter(|t| t.name == tool)
        .find_map(|t| t.rows_of(kind))
}

/// Every cause the tools and commands conclude, each once, in registry order: the `cause`
/// values a `--json` reader can meet.
pub fn causes() -> Vec<Cause> {
    let mut out: Vec<Cause> = Vec::new();
    for c in TOOLS
        .iter()
        .chain(MODES)
        .chain(COMMANDS)
        .flat_map(|t| t.causes)
    {
        if !out.contains(c) {
            out.push(*c);
        }
    }
    out
}

/// Tools whose rows `--by container` folds ([`ToolInfo::by_container`]).
pub fn by_container() -> Vec<&'static str> {
    TOOLS
        .iter()
        .filter(|t| t.by_container)
        .map(|t| t.name)
        .collect()
}

/// Checks every tool makes before touching the kernel, in the order a user would fix them:
/// privileges, then the target processes, then the output (opened here, so a path that cannot
/// be written costs no data), then BTF that exists but is unusable (a corrupt file,
/// `TRACEKIT_BTF=/dev/zero`: an error with its reason, not a silent fall-back).
pub fn preflight(tool: &str, common: &Common) -> Result<Sink> {
    proc::check_privileges(tool)?;
    proc::check_pids(&common.pids)?;
    common.check_container()?;
    if common.by.is_some() && !by_container().contains(&tool) {
        return Err(crate::error::Error::Usage(format!(
            "--by container: {tool} cannot fold its rows per container yet (tools that can: {})",
            by_container().join(", ")
        )));
    }
    if crate::kernel::features::btf_present() {
        crate::kernel::btf::vmlinux()?;
    }
    Ok(Sink::open(
        common.output.as_deref(),
        common.interval.is_some(),
    )?)
}

/// The whole life of a single-collector tool: preflight, open (load and attach), run until the
/// duration, a signal or the reader ends it, and detach fast.
pub fn run_collector(
    tool: &str,
    common: &Common,
    open: impl FnOnce(&OpenCtx) -> Result<Box<dyn Collector>>,
) -> Result<()> {
    run_collector_with(tool, common, open, |sink, opts| {
        Box::new(Stream::new(sink, opts))
    })
}

/// [`run_collector`] with another emitter than the text/NDJSON stream (the live view), made
/// from the output sink once the collector is attached.
pub fn run_collector_with(
    tool: &str,
    common: &Common,
    open: impl FnOnce(&OpenCtx) -> Result<Box<dyn Collector>>,
    emitter: impl FnOnce(Sink, &RunOpts) -> Box<dyn engine::Emitter>,
) -> Result<()> {
    run_collectors_with(tool, common, |ctx| Ok(vec![open(ctx)?]), emitter)
}

/// [`run_collector`] for a tool that runs other tools' collectors beside its own in the same
/// windows (`why --detail`): one output, each collector's sections and findings in order.
pub fn run_collectors(
    tool: &str,
    common: &Common,
    open: impl FnOnce(&OpenCtx) -> Result<Vec<Box<dyn Collector>>>,
) -> Result<()> {
    run_collectors_with(tool, common, open, |sink, opts| {
        Box::new(Stream::new(sink, opts))
    })
}

fn run_collectors_with(
    tool: &str,
    common: &Common,
    open: impl FnOnce(&OpenCtx) -> Result<Vec<Box<dyn Collector>>>,
    emitter: impl FnOnce(Sink, &RunOpts) -> Box<dyn engine::Emitter>,
) -> Result<()> {
    tracing::debug!("{tool}: arguments parsed");
    let sink = preflight(tool, common)?;
    let ctx = OpenCtx::new(common.scope(), common.run_opts());
    tracing::debug!("{tool}: host facts read, opening");
    let mut collectors = open(&ctx)?;
    tracing::debug!("{tool}: attached");
    let mut emit = emitter(sink, &ctx.opts);
    let run = engine::run(&mut collectors, &ctx.opts, &ctx.facts, emit.as_mut());
    end_run(tool, &mut collectors, run, emit.as_mut())?;
    let slow = collectors.iter_mut().map(|c| c.slow_links()).sum();
    drop(emit);
    engine::detach_in_background(slow);
    Ok(())
}

/// What every tool's `--help` ends with: its examples, the privileges it needs, the exit codes.
pub fn help_footer(examples: &str, needs: &str) -> String {
    format!(
        "Examples:\n{examples}\n\nPrivileges: {needs}\n\n{}",
        crate::error::EXIT_CODES_HELP
    )
}

/// Name of a row's process or thread: from /proc while it lives (the process's own name, not
/// that of whichever thread created the key), else what the kernel recorded.
pub fn row_comm(id: u32, tgid: u32, threads: bool, kernel_comm: &[u8]) -> Vec<u8> {
    let live = if threads {
        crate::host::read_capped(
            &crate::host::proc_path(&format!("{tgid}/task/{id}/comm")),
            crate::host::SMALL_FILE,
        )
        .ok()
        .map(|mut b| {
            if b.last() == Some(&b'\n') {
                b.pop();
            }
            b
        })
    } else {
        proc::comm(id)
    };
    live.unwrap_or_else(|| crate::report::sanitize::comm_bytes(kernel_comm).to_vec())
}

#[cfg(test)]
mod tests;
