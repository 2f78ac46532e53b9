//! `tracekit irq-lat`: time in hard-IRQ handlers and softirqs per CPU and IRQ (number and name)
//! or softirq vector: all receive work on one CPU, an interrupt storm, a CPU drowning in
//! softirq work.
//!
//! Hooks (kernel side: `probes-ebpf/src/bin/irq_lat.rs`): `irq:irq_handler_entry/exit` and
//! `irq:softirq_entry/exit`, tp_btf first, then raw_tp, then the classic tracepoints. Every run
//! is timed in the kernel and aggregated per (CPU, kind, IRQ or vector) into a log-linear
//! histogram: nothing per event crosses to userspace. IRQ names come from `/proc/interrupts`
//! (read at start and again when an IRQ number appears that it did not list), softirq names
//! from the tracepoint's `__print_symbolic` table, else the kernel's fixed order.
//!
//! Local APIC interrupts (the timer `LOC`, IPIs such as `RES`, `CAL`, `TLB`) run no
//! `irq_handler_entry`: they are not hard IRQs here, though the softirqs they raise (TIMER,
//! SCHED, RCU) are.

use std::collections::BTreeMap;

use probes_common::irq_lat::{IrqKey, IrqVal, KIND_HARD, STAT_MISMATCH, STAT_UNFINISHED};
use probes_common::stats::NO_START;

use crate::{
    host::net::{self, Irq},
    kernel::proginfo,
    report::findings::Cause,
    tools::prelude::*,
};

mod findings;
mod rows;

use rows::*;

pub const INFO: ToolInfo = ToolInfo {
    name: "irq-lat",
    summary: "Hard-IRQ and softirq time per CPU and IRQ (number and name) or softirq vector: count, total, share of the CPU, p50/p99/max per run, handlers that returned IRQ_NONE; findings name the CPU that takes most of an IRQ's or vector's time (\"all RX on one CPU\") and the CPU drowning in interrupt work, with the fix (RSS, RPS, irqbalance, affinity).",
    hooks: HOOKS,
    triage: false,
    hidden: false,
    needs_btf: false,
    rows: &[&IRQ_ROWS, &CPU_ROWS],
    causes: &[IRQ_IMBALANCE, IRQ_STORM],
    by_container: false,
    joins: &[],
};

// The causes this tool concludes (listed in INFO; see report::findings::Cause).
pub const IRQ_IMBALANCE: Cause = Cause::new(
    "irq-imbalance",
    "One CPU takes most of an IRQ's or a softirq vector's time while other CPUs could share it.",
);
pub const IRQ_STORM: Cause = Cause::new(
    "irq-storm",
    "Hard-IRQ and softirq work takes a large share of a CPU's time.",
);

const OBJECT: Object = crate::object!("irq_lat");

/// Every hook, cheapest mode first; an entry and its exit attach in one mode (their group).
/// Exits attach before entries: a run whose entry was seen always has its exit seen too (a run
/// entered between an entry's attach and its exit's would count as unfinished).
pub const HOOKS: &[Hook] = &[
    crate::hook!("irq:irq_handler_exit", "tk_irq_hard_exit", [TpBtf, RawTp, Tracepoint], fields: &["irq", "ret"], group: "hardirq"),
    crate::hook!("irq:irq_handler_entry", "tk_irq_hard_entry", [TpBtf, RawTp, Tracepoint], fields: &["irq"], group: "hardirq"),
    crate::hook!("irq:softirq_exit", "tk_irq_soft_exit", [TpBtf, RawTp, Tracepoint], fields: &["vec"], group: "softirq"),
    crate::hook!("irq:softirq_entry", "tk_irq_soft_entry", [TpBtf, RawTp, Tracepoint], fields: &["vec"], group: "softirq"),
];

/// The kernel's softirq vectors in `enum` order (`softirq_to_name`, unchanged since 2.6.37;
/// used where the tracepoint's table cannot be read).
const SOFTIRQ_NAMES: [&str; 10] = [
    "HI", "TIMER", "NET_TX", "NET_RX", "BLOCK", "IRQ_POLL", "TASKLET", "SCHED", "HRTIMER", "RCU",
];

const EXAMPLES: &str = "  tracekit irq-lat --duration 10s                    # which IRQs and softirqs take which CPU's time
  tracekit irq-lat --duration 30s --interval 5s      # follow a storm window by window
  tracekit irq-lat --duration 10s --json --output irq.ndjson";

const NEEDS: &str = "root, or exactly CAP_BPF and CAP_PERFMON on a kernel with BTF (the tp_btf \
and raw_tp hooks need no tracefs; softirq names then come from the kernel's fixed table). Without \
BTF it uses the classic irq tracepoints, whose format files need CAP_DAC_READ_SEARCH (tracefs is \
mode 0700).";

#[derive(clap::Args, Debug)]
#[command(after_help = tools::help_footer(EXAMPLES, NEEDS))]
pub struct Args {
    #[command(flatten)]
    pub common: Common,

    /// Attach mode of every hook (default: the cheapest this kernel allows, tp_btf then raw_tp
    /// then tracepoint).
    #[arg(long, value_enum, value_name = "MODE")]
    pub attach: Option<ForceMode>,

    /// Rows shown in the IRQ table, most time first (0: all). JSON has every row.
    #[arg(long, default_value_t = 25, value_name = "N")]
    pub rows: usize,
}

pub fn run(args: Args) -> Result<()> {
    tools::run_collector(INFO.name, &args.common, |ctx| open(&args, ctx))
}

/// The hooks with only `--attach`'s mode, if given.
fn hooks_for(attach: Option<ForceMode>) -> Vec<Hook> {
    HOOKS
        .iter()
        .map(|h| attach.map_or(*h, |m| h.only(m.into())))
        .collect()
}

/// Loads and attaches irq-lat's programs as the attach policy chose on this kernel.
pub fn open(args: &Args, ctx: &OpenCtx) -> Result<Box<dyn Collector>> {
    let scope = &ctx.scope;
    if scope.threads || !scope.pids.is_empty() || scope.comm.is_some() || scope.by_container {
        return Err(Error::Usage(
            "irq-lat: --pid, --comm, --threads and --by do not apply (interrupts run on behalf of no process; rows are per CPU and IRQ)".into(),
        ));
    }
    let hooks = hooks_for(args.attach);
    let plan = loader::plan(&hooks, &ctx.env, &ctx.symbols)?;
    let classic = plan
        .iter()
        .any(|c| matches!(c.mode, Some((AttachMode::Tracepoint, _))));
    let tracefs = ctx.env.tracefs().as_ref().ok();
    let fmt = |name: &str| tracefs.and_then(|t| t.format("irq", name).ok());
    let soft_fmt = fmt("softirq_entry");
    let mut spec = LoadSpec::new();
    if classic {
        let off = |name: &str, field: &str| -> Result<u32> {
            let f = fmt(name).ok_or_else(|| {
                Error::KernelFeature(format!("irq:{name}: no format file in tracefs"))
            })?;
            Ok(f.offset_of(field, &[4])?)
        };
        spec = spec
            .global("IRQ_TP_ENTRY_IRQ", &off("irq_handler_entry", "irq")?)
            .global("IRQ_TP_EXIT_IRQ", &off("irq_handler_exit", "irq")?)
            .global("IRQ_TP_EXIT_RET", &off("irq_handler_exit", "ret")?)
            .global("IRQ_TP_SOFT_VEC", &off("softirq_entry", "vec")?)
            .global("IRQ_TP_SOFTX_VEC", &off("softirq_exit", "vec")?);
    }
    let vectors = softirq_names(soft_fmt.as_ref().map(|f| f.symbols("vec")));
    let irqs = net::interrupts();
    let ncpu = crate::host::proc::possible_cpus().max(1);
    // Every CPU may run every vector and IRQ in both generations; --max-keys caps it.
    let want = (ncpu as u32) * (SOFTIRQ_NAMES.len() as u32 + irqs.len() as u32 + 16) * 2;
    let cap = scope.max_keys.unwrap_or(want.clamp(1024, 65536));
    let spec = spec
        .max_entries("IRQ_AGG", cap)
        .tp_btf_planned(&hooks, &plan);
    let mut session = Session::load(OBJECT, loader::Filter::default(), spec)?;
    session.attach_planned(&hooks, &plan)?;
    let agg = GenMap::take(&mut session, "IRQ_AGG", Some("IRQ_OTHER"), IrqVal::ZERO)?;
    let misses_prev = proginfo::session_counters(&session).recursion_misses;
    Ok(Box::new(IrqLat {
        session,
        agg,
        vectors,
        irqs,
        ncpu,
        scope: scope.clone(),
        max_rows: args.rows,
        misses_prev,
    }))
}

/// Softirq names by vector: the tracepoint's table where readable, else the kernel's order.
fn softirq_names(table: Option<Vec<(i64, String)>>) -> BTreeMap<u32, String> {
    let mut m: BTreeMap<u32, String> = SOFTIRQ_NAMES
        .iter()
        .enumerate()
        .map(|(i, n)| (i as u32, n.to_string()))
        .collect();
    if let Some(t) = table.filter(|t| !t.is_empty()) {
        m = t
            .into_iter()
            .filter_map(|(v, n)| Some((u32::try_from(v).ok()?, n)))
            .collect();
    }
    m
}

struct IrqLat {
    session: Session,
    agg: GenMap<IrqKey, IrqVal>,
    vectors: BTreeMap<u32, String>,
    /// `/proc/interrupts` as last read: IRQ names and affinities.
    irqs: Vec<Irq>,
    ncpu: usize,
    scope: Scope,
    max_rows: usize,
    misses_prev: u64,
}

impl IrqLat {
    /// The name of `key`'s IRQ or vector.
    fn name_of(&mut self, kind: u32, num: u32) -> String {
        if kind != KIND_HARD {
            return self
                .vectors
                .get(&num)
                .cloned()
                .unwrap_or_else(|| format!("vec{num}"));
        }
        if !self.irqs.iter().any(|i| i.irq == num) {
            self.irqs = net::interrupts();
        }
        self.irqs
            .iter()
            .find(|i| i.irq == num)
            .map(|i| i.name.clone())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| format!("irq{num}"))
    }
}

impl Collector for IrqLat {
    fn name(&self) -> &'static str {
        INFO.name
    }

    fn meta(&self) -> Meta {
        let mut m = Meta::of(
            INFO.name,
            "hard-IRQ handlers and softirqs",
            &self.scope,
            &self.session,
        )
        .with("cpus", self.ncpu);
        // Interrupts run on behalf of no process: the scope is the CPUs, not "all processes".
        m.scope = format!("the node's {} CPUs", self.ncpu);
        m
    }

    fn session(&mut self) -> Option<&mut Session> {
        Some(&mut self.session)
    }

    fn collect(&mut self, w: &Window) -> Result<Output> {
        let drained = self
            .agg
            .drain(self.session.drained())
            .context("reading IRQ_AGG")?;
        let st = self.session.stats_delta()?;
        let misses = proginfo::session_counters(&self.session).recursion_misses;
        let secs = self.session.drained_secs();
        let mut rows: Vec<IrqRow> = Vec::with_capacity(drained.rows.len() + 1);
        for (k, v) in &drained.rows {
            let name = self.name_of(k.kind, k.num);
            rows.push(IrqRow::new(Some(k.cpu), k.kind, k.num, name, v, secs));
        }
        if drained.other.hist.count > 0 {
            rows.push(IrqRow::new(
                None,
                KIND_HARD,
                0,
                "[other]".into(),
                &drained.other,
                secs,
            ));
        }
        set_shares(&mut rows);
        rows.sort_by(|a, b| {
            b.total_ns
                .cmp(&a.total_ns)
                .then(a.cpu.cmp(&b.cpu))
                .then(a.num.cmp(&b.num))
        });
        let cpus = cpu_rows(&rows, secs);
        let runs: u64 = rows.iter().map(|r| r.count).sum();

        let mut out = Output::default();
        let missed_starts = out.note_missed(&st, "run", "");
        let (no_start, unfinished, mismatch) = (
            st[NO_START as usize],
            st[STAT_UNFINISHED as usize],
            st[STAT_MISMATCH as usize],
        );
        let skipped_runs = misses.wrapping_sub(self.misses_prev);
        self.misses_prev = misses;
        if no_start + unfinished + mismatch + skipped_runs > 0 {
            out.notes.push(format!(
                "not timed: {no_start} exit(s) without their entry, {unfinished} entry(ies) without their exit, {mismatch} exit(s) of another IRQ or vector than the entry, {skipped_runs} program run(s) the kernel skipped (recursion)"
            ));
        }
        out.title = format!(
            "irq-lat: {runs} hard-IRQ and softirq runs on {} CPUs; {}",
            self.ncpu,
            w.span()
        );
        out.note_skipped(&self.session.skipped);
        if rows.is_empty() {
            out.notes.push("no hard-IRQ or softirq runs seen".into());
        }
        out.findings = findings::findings(&rows, &cpus, &self.irqs, self.ncpu, secs);
        let ctx = Ctx { secs };
        out.sections.push(
            Section::build(&CPU_ROWS, &cpus, CPUS, &ctx, 0)
                .caption("Interrupt work per CPU:".to_string()),
        );
        out.sections.push(
            Section::build(&IRQ_ROWS, &rows, IRQS, &ctx, self.max_rows)
                .caption("Per CPU and IRQ or softirq vector, most time first:".to_string())
                .with_dists(
                    &rows,
                    |r| match r.cpu {
                        Some(c) => format!("cpu{c} {} {}", r.kind, r.name),
                        None => format!("[other] {}", r.kind),
                    },
                    |r| vec![("irq", r.hist)],
                ),
        );
        out.footnotes.push(
            "%CPU: share of that CPU's time in the window; SHARE%: that CPU's part of the IRQ's or vector's time on all CPUs.".into(),
        );
        out.stats = Some(
            Stats::new(st)
                .with("runs", runs)
                .with("missed", missed_starts + no_start + unfinished + mismatch)
                .with("no_start", no_start)
                .with("unfinished", unfinished)
                .with("mismatch", mismatch)
                .with("recursion_misses", skipped_runs),
        );
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
