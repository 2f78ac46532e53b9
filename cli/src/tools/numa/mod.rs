//! `tracekit numa`: processes running on one NUMA node while their memory sits on another.
//!
//! Per process (or thread): on-CPU time per node over the window, from the scheduler (where its
//! threads actually ran: `se.sum_exec_runtime` at each `sched_switch`, on the switching CPU's
//! node); resident memory per node from `/proc/<pid>/numa_maps`, read at the end of each window
//! for the busiest processes only (reading it walks page tables; the report says how many and
//! how long it took); the share of CPU time spent away from the node holding most of its memory;
//! its cpuset and memory policy; and what NUMA balancing did to it (hinting faults where a
//! fentry/kprobe on `task_numa_fault` can attach, pages migrated, task moves and swaps). For the
//! node: `/proc/vmstat` numa_* deltas, per-node numastat, `kernel.numa_balancing`, free memory
//! and distances. Kernel side: `probes-ebpf/src/bin/numa.rs`.
//!
//! On a single-node host there is nothing to misplace: the tool says so in one line and loads
//! nothing.

use crate::report::findings::Cause;
use std::{collections::BTreeMap, time::Instant};

use probes_common::numa::{
    NumaKey, NumaOffsets, NumaVal, PairKey, MAX_NODES, PAIR_MOVE, PAIR_SWAP, STAT_NO_BASELINE,
    STAT_NO_NODE, STAT_PAIR_FULL,
};
use serde_json::{json, Value};

use crate::{
    host::{
        facts::Facts,
        numa::{self as hnuma, Topology},
        vmstat::Vmstat,
    },
    report::who::{Id, Title},
    tools::{
        doctor::node::cpu_ranges,
        prelude::*,
        sched::{self, SchedSession},
    },
};

mod one_node;
pub mod pairs;
pub mod report;

use one_node::{one_node_now, OneNode};

use report::{NodeRow, ProcNuma, SummaryRow};

pub const INFO: ToolInfo = ToolInfo {
    name: "numa",
    summary: "Which processes run on one NUMA node while their memory sits on another: CPU time per node (where their threads ran), resident memory per node, the share of run time away from the memory, cpuset and memory policy, and what NUMA balancing did (hinting faults, pages migrated, task moves); findings say how to bind it. One line and nothing loaded on a single-node host.",
    hooks: HOOKS,
    triage: true,
    hidden: false,
    needs_btf: true,
    rows: &[&report::SUMMARY_ROWS, &report::NODE_ROWS],
    causes: &[NUMA_MISPLACED, NUMA_MIGRATION],
    by_container: false,
    joins: crate::tools::sched::HOOKS,
};

// The causes this tool concludes (listed in INFO; see report::findings::Cause).
pub const NUMA_MISPLACED: Cause = Cause::new(
    "numa-misplaced",
    "A process runs on one NUMA node while its memory sits on another.",
);
pub const NUMA_MIGRATION: Cause = Cause::new(
    "numa-migration",
    "NUMA balancing migrates a process's pages or moves its tasks between nodes.",
);

const OBJECT: Object = crate::object!("numa");

const FAULT_FN: &str = "task_numa_fault";
const SWITCH: &str = "sched:sched_switch";

/// `sched_switch` is required; the NUMA balancing events and the hinting-fault hook are
/// optional (the report says what was skipped). Beside ctxsw or runq-lat (`triage`, `serve`,
/// `record`), the shared `sched` object's switch program records the node time instead
/// (`INFO.joins`), and this object attaches the rest.
pub const HOOKS: &[Hook] = &[
    crate::hook!(SWITCH, "tk_numa_switch", [TpBtf, RawTp], optional: false),
    crate::hook!("sched:sched_move_numa", "tk_numa_move", [TpBtf, RawTp], optional: true),
    crate::hook!("sched:sched_swap_numa", "tk_numa_swap", [TpBtf, RawTp], optional: true),
    crate::hook!("sched:sched_stick_numa", "tk_numa_stick", [TpBtf, RawTp], optional: true),
    crate::hook!("migrate:mm_migrate_pages", "tk_numa_migrate", [TpBtf, RawTp], optional: true),
    crate::hook!(FAULT_FN, "tk_numa_fault", [Fentry, Kprobe], optional: true),
];

const EXAMPLES: &str = "  tracekit numa --duration 10s                      # who runs away from its memory, and what balancing does
  tracekit numa --pid 4711 --duration 30s --threads # one process, thread by thread
  tracekit numa --duration 1m --interval 10s --json --output numa.ndjson";

const NEEDS: &str = "root, or exactly CAP_BPF and CAP_PERFMON (CAP_SYS_ADMIN stands in for both); \
it reads the kernel's BTF, never tracefs. Reading other users' /proc/<pid>/numa_maps needs \
CAP_SYS_PTRACE (without it their memory shows as `-`). On a single-node host it loads nothing.";

#[derive(clap::Args, Debug)]
#[command(after_help = tools::help_footer(EXAMPLES, NEEDS))]
pub struct Args {
    #[command(flatten)]
    pub common: Common,

    /// Rows shown in the text table, most CPU time first (0: all). JSON has every row.
    #[arg(long, default_value_t = 25, value_name = "N")]
    pub rows: usize,

    /// Read /proc/<pid>/numa_maps (where the memory is) for the N processes with the most CPU
    /// time in each window (reading it walks the process's page tables; 0: none).
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub maps: usize,

    /// Trace even on a single-node host (tests and cost measurements; `TRACEKIT_NUMA_FORCE=1`
    /// does the same for the numa collector of `triage`, `serve` and `record`).
    #[arg(long, hide = true)]
    pub force: bool,
}

impl Args {
    fn force(&self) -> bool {
        self.force || std::env::var_os("TRACEKIT_NUMA_FORCE").is_some_and(|v| v == "1")
    }
}

pub fn run(args: Args) -> Result<()> {
    let c = &args.common;
    if !args.force() && c.duration.is_none() && c.interval.is_none() {
        let topo = Topology::read();
        if topo.len() < 2 {
            return one_node_now(c, &topo);
        }
    }
    tools::run_collector(INFO.name, c, |ctx| open(&args, ctx))
}

/// Loads and attaches as the attach policy chose; on a single-node host (without `--force`),
/// a collector that loads nothing.
pub fn open(args: &Args, ctx: &OpenCtx) -> Result<Box<dyn Collector>> {
    let topo = Topology::read();
    if topo.len() < 2 && !args.force() {
        return Ok(Box::new(OneNode {
            scope: ctx.scope.clone(),
            topo,
        }));
    }
    if let Some(n) = topo.nodes.iter().find(|n| n.id as usize >= MAX_NODES) {
        return Err(Error::KernelFeature(format!(
            "node id {} is beyond the {MAX_NODES} nodes this tool supports",
            n.id
        )));
    }
    // Beside a collector that loaded the `sched` object, its switch program records the node
    // time and numa's own stays out.
    let node = sched::join_node_time(ctx)?;
    let hooks: Vec<Hook> = HOOKS
        .iter()
        .filter(|h| node.is_none() || h.event != SWITCH)
        .cloned()
        .collect();
    let plan = loader::plan(&hooks, &ctx.env, &ctx.symbols)?;
    let btf = crate::kernel::btf::vmlinux().map_err(|e| {
        Error::KernelFeature(format!(
            "numa needs the kernel's BTF to find task_struct fields: {e}"
        ))
    })?;
    let m = |path: &str, size: u32| btf.member_offset("task_struct", path, size);
    let offs = NumaOffsets {
        pid: m("pid", 4)?,
        tgid: m("tgid", 4)?,
        comm: m("comm", 16)?,
        run: sched::run_offsets(btf)?,
    };
    // `mm_migrate_pages` gained `large_folio_split` in 6.9: the reason is then the 8th argument
    // (the prototype's first parameter is the probe's data pointer).
    let wide = btf
        .proto_param_sizes("btf_trace_mm_migrate_pages")
        .is_some_and(|p| p.len() >= 9);
    let misplaced = btf.enum_value("MR_NUMA_MISPLACED").unwrap_or(-1) as i32;
    let scope = &ctx.scope;
    let ncpus = crate::host::proc::possible_cpus();
    let width = topo
        .nodes
        .iter()
        .map(|n| n.id as usize + 1)
        .max()
        .unwrap_or(1);
    let spec = LoadSpec::new()
        .global("NUMA_OFFS", &offs)
        .global("NUMA_PER_THREAD", &u8::from(scope.threads))
        .global("NUMA_START_NS", &crate::host::proc::mono_ns())
        .global("NUMA_MR_MISPLACED", &misplaced)
        .global("NUMA_MIG_WIDE", &u8::from(wide))
        .max_entries("NUMA_AGG", scope.key_cap())
        .max_entries("CPU_NODE", ncpus as u32)
        // Two kinds, every ordered pair, two generations.
        .max_entries("NUMA_PAIRS", (4 * width * width).max(16) as u32)
        .tp_btf_planned(&hooks, &plan);
    let mut session = Session::load(OBJECT, scope.filter(), spec)?;
    sched::fill_cpu_node(&mut session, &topo)?;
    session.attach_planned(&hooks, &plan)?;
    // The kernel's counters at the start of generation 0, as close to the attach as possible.
    let vmstat = Vmstat::read().ok();
    let numastat = node_stats(&topo);
    let agg = GenMap::take(&mut session, "NUMA_AGG", Some("NUMA_OTHER"), NumaVal::ZERO)?;
    let pairs = GenMap::take(&mut session, "NUMA_PAIRS", None, 0u64)?;
    let hint_hook = hooks
        .iter()
        .zip(&plan)
        .find(|(h, _)| h.event == FAULT_FN)
        .and_then(|(_, c)| c.mode.map(|m| m.0));
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Ok(Box::new(Numa {
        session,
        node,
        agg,
        pairs,
        scope: scope.clone(),
        topo,
        width,
        hint_hook,
        maps_top: args.maps,
        max_rows: args.rows,
        vmstat,
        numastat,
        edge: None,
        facts: ctx.facts.clone(),
        page_kib: (page.max(4096) / 1024) as u64,
    }))
}

struct Numa {
    session: Session,
    /// The shared `sched` object recording the node time, when another collector of this run
    /// loaded it (numa's own object then has no `sched_switch` program).
    node: Option<SchedSession>,
    agg: GenMap<NumaKey, NumaVal>,
    /// System-wide scheduler moves and swaps by node pair.
    pairs: GenMap<PairKey, u64>,
    scope: Scope,
    topo: Topology,
    /// Highest node id + 1: the length of every per-node array.
    width: usize,
    /// How `task_numa_fault` is hooked, if at all.
    hint_hook: Option<AttachMode>,
    maps_top: usize,
    max_rows: usize,
    /// /proc/vmstat and per-node numastat at the start of the window being collected.
    vmstat: Option<Vmstat>,
    numastat: NodeStats,
    /// The same read at the flip that ended it, so the deltas cover exactly the events of the
    /// generation drained (read after the drain, they would include later ones).
    edge: Option<Edge>,
    facts: Facts,
    page_kib: u64,
}

type NodeStats = BTreeMap<u32, BTreeMap<String, u64>>;
/// The kernel's counters read at a flip.
type Edge = (Option<Vmstat>, NodeStats);

fn node_stats(t: &Topology) -> NodeStats {
    t.nodes
        .iter()
        .map(|n| (n.id, hnuma::numastat(n.id)))
        .collect()
}

/// The /proc/vmstat counters the system line carries (those this kernel has).
const VMSTAT_KEYS: &[&str] = &[
    "numa_hit",
    "numa_miss",
    "numa_foreign",
    "numa_interleave",
    "numa_local",
    "numa_other",
    "numa_pte_updates",
    "numa_huge_pte_updates",
    "numa_hint_faults",
    "numa_hint_faults_local",
    "numa_pages_migrated",
    "pgmigrate_success",
    "pgmigrate_fail",
    "pgpromote_success",
];

impl Numa {
    fn row(&mut self, id: u32, v: &NumaVal) -> SummaryRow {
        let threads = self.scope.threads;
        let (comm, title) = if id == 0 {
            (b"[other]".to_vec(), Title::default())
        } else {
            let learnt = self.facts.lock().get(v.tgid).map(|f| f.cmdline.clone());
            (
                row_comm(id, v.tgid, threads, &v.comm),
                Title::of_or(v.tgid, learnt.as_deref().unwrap_or(&[])),
            )
        };
        let hook = self.hint_hook.is_some();
        SummaryRow {
            who: match id {
                0 => Id::named(&comm),
                _ => Id::new(id, v.tgid, threads, comm, title),
            },
            cpu_ns: v.cpu_ns.iter().sum(),
            cpu_ns_by_node: v.cpu_ns[..self.width].to_vec(),
            hint_faults: hook.then_some(v.hint_faults),
            hint_faults_local: hook.then_some(v.hint_faults_local),
            hint_pages_migrated: hook.then_some(v.hint_pages_migrated),
            pages_migrated_by_node: hook.then(|| v.migrated_to[..self.width].to_vec()),
            pages_migrated: v.pages_migrated,
            pages_migrate_failed: v.pages_failed,
            task_moves: v.moves,
            task_swaps: v.swaps,
            task_sticks: v.sticks,
            id,
            ..Default::default()
        }
    }

    /// numa_maps, allowed lists and balancing state of the busiest user processes (by CPU time,
    /// `rows` sorted), plus every `--pid`.
    fn read_procs(&mut self, rows: &[SummaryRow]) -> BTreeMap<u32, ProcNuma> {
        let mut want: Vec<u32> = Vec::new();
        for r in rows.iter().filter(|r| r.id != 0) {
            if want.len() >= self.maps_top {
                break;
            }
            if !want.contains(&r.who.pid)
                && !self.facts.lock().get(r.who.pid).is_some_and(|f| f.kthread)
            {
                want.push(r.who.pid);
            }
        }
        for p in &self.scope.pids {
            if !want.contains(p) {
                want.push(*p);
            }
        }
        want.into_iter()
            .filter_map(|pid| {
                let placement = hnuma::placement_of(pid).ok()?;
                Some((
                    pid,
                    ProcNuma {
                        placement,
                        allowed: hnuma::allowed_of(pid).ok(),
                        task: hnuma::task_numa_of(pid, pid),
                    },
                ))
            })
            .collect()
    }

    /// Node rows: facts, everyone's CPU time there, numastat deltas since the last window.
    fn node_rows(&mut self, rows: &[SummaryRow], mut edge: NodeStats) -> Vec<NodeRow> {
        let now = Topology::read();
        let into = pairs::pages_by_node(rows, self.width);
        let mut out = Vec::new();
        for n in &now.nodes {
            let st = edge.remove(&n.id).unwrap_or_else(|| hnuma::numastat(n.id));
            let before = self.numastat.insert(n.id, st.clone()).unwrap_or_default();
            let d = |k: &str| {
                st.get(k)
                    .copied()
                    .unwrap_or(0)
                    .saturating_sub(before.get(k).copied().unwrap_or(0))
            };
            out.push(NodeRow {
                node: n.id,
                cpus: cpu_ranges(&n.cpus),
                mem_total_kib: n.mem_total_kib,
                mem_free_kib: n.mem_free_kib,
                distance: n.distance.clone(),
                cpu_ns: rows
                    .iter()
                    .filter_map(|r| r.cpu_ns_by_node.get(n.id as usize))
                    .sum(),
                pages_migrated_in: self.hint_hook.map(|_| {
                    into.as_ref()
                        .and_then(|v| v.get(n.id as usize))
                        .map_or(0, |x| *x)
                }),
                numa_hit: d("numa_hit"),
                numa_miss: d("numa_miss"),
                numa_foreign: d("numa_foreign"),
                interleave_hit: d("interleave_hit"),
                local_node: d("local_node"),
                other_node: d("other_node"),
            });
        }
        self.topo = now;
        out
    }
}

impl Collector for Numa {
    fn name(&self) -> &'static str {
        INFO.name
    }

    fn meta(&self) -> Meta {
        Meta::of(
            INFO.name,
            format!(
                "on-CPU time per NUMA node ({} nodes) and NUMA balancing",
                self.topo.len()
            ),
            &self.scope,
            &self.session,
        )
        .with("nodes", self.topo.len())
        .with("hint_hook", self.hint_hook.map(|m| m.as_str()))
        .with(
            "node_time_by",
            if self.node.is_some() { "sched" } else { "numa" },
        )
    }

    fn flip(&mut self) -> Result<()> {
        self.session.flip_generation()?;
        if let Some(n) = self.node.as_mut() {
            n.flip()?;
        }
        self.edge = Some((Vmstat::read().ok(), node_stats(&self.topo)));
        Ok(())
    }

    fn session(&mut self) -> Option<&mut crate::kernel::loader::Session> {
        Some(&mut self.session)
    }

    fn collect(&mut self, w: &Window) -> Result<Output> {
        let drained = self
            .agg
            .drain(self.session.drained())
            .context("reading NUMA_AGG")?;
        let by_pair = self
            .pairs
            .drain(self.session.drained())
            .context("reading NUMA_PAIRS")?;
        let moves = pairs::node_pairs(&by_pair.rows, PAIR_MOVE);
        let swaps = pairs::node_pairs(&by_pair.rows, PAIR_SWAP);
        let (vm_now, node_edge) = self
            .edge
            .take()
            .unwrap_or_else(|| (Vmstat::read().ok(), node_stats(&self.topo)));
        let mut st = self.session.stats_delta()?;
        let (mut by_id, mut other) = (BTreeMap::new(), drained.other);
        if let Some(n) = self.node.as_mut() {
            // Run time from the shared object, NUMA balancing from numa's own: one row each.
            let nd = n
                .drain_node()
                .context("reading the sched object's NUMA_AGG")?;
            for (k, v) in nd.rows {
                by_id.insert(k.id, v);
            }
            other.add(&nd.other);
            for i in [STAT_NO_BASELINE, STAT_NO_NODE] {
                st[i as usize] += nd.stats[i as usize];
            }
        }
        for (k, v) in drained.rows {
            by_id
                .entry(k.id)
                .and_modify(|x: &mut NumaVal| x.add(&v))
                .or_insert(v);
        }
        let secs = w.secs();
        let mut rows: Vec<SummaryRow> = by_id.iter().map(|(id, v)| self.row(*id, v)).collect();
        if other != NumaVal::ZERO {
            rows.push(self.row(0, &other));
        }
        rows.sort_by(|a, b| b.cpu_ns.cmp(&a.cpu_ns).then(a.id.cmp(&b.id)));
        let t = Instant::now();
        let procs = self.read_procs(&rows);
        let maps_ns = t.elapsed().as_nanos() as u64;
        let width = self.width;
        let threads = self.scope.threads;
        let rows: Vec<SummaryRow> = rows
            .into_iter()
            .map(|r| {
                let mut p = procs.get(&r.who.pid).cloned();
                if let (true, Some(p), Some(tid)) = (threads, p.as_mut(), r.who.tid) {
                    p.task = hnuma::task_numa_of(r.who.pid, tid);
                }
                r.with_proc(p.as_ref(), width)
            })
            .collect();
        let nodes = self.node_rows(&rows, node_edge);
        let vm = match (&vm_now, &self.vmstat) {
            (Some(a), Some(b)) => a.since(b).select(VMSTAT_KEYS),
            _ => Vmstat::default(),
        };
        self.vmstat = vm_now;
        let balancing = hnuma::numa_balancing();
        let node_cpus: Vec<(u32, String)> =
            nodes.iter().map(|n| (n.node, n.cpus.clone())).collect();
        let c = report::Context {
            secs,
            balancing,
            node_cpus: &node_cpus,
            page_kib: self.page_kib,
        };
        let mut out = Output {
            findings: report::findings(&rows, &c),
            ..Default::default()
        };
        let sum = |f: fn(&SummaryRow) -> Option<u64>| -> Option<u64> {
            self.hint_hook.map(|_| rows.iter().filter_map(f).sum())
        };
        let no_base = st[STAT_NO_BASELINE as usize];
        out.title = format!(
            "numa: {} nodes, {}; {} {} ran in {}; numa_maps of {} read in {:.1} ms",
            self.topo.len(),
            match balancing {
                Some(0) => "numa_balancing off".to_string(),
                Some(b) => format!("numa_balancing {b}"),
                None => "no NUMA balancing".to_string(),
            },
            rows.len(),
            if threads { "threads" } else { "processes" },
            w.span(),
            procs.len(),
            maps_ns as f64 / 1e6,
        );
        out.notes.push(format!(
            "vmstat: {}, {} ({}), {}, {}; {}, {}, {}, {}, {}",
            vm.cite("numa_pte_updates"),
            vm.cite("numa_hint_faults"),
            vm.cite("numa_hint_faults_local"),
            vm.cite("numa_pages_migrated"),
            vm.cite("pgmigrate_success"),
            vm.cite("numa_hit"),
            vm.cite("numa_miss"),
            vm.cite("numa_foreign"),
            vm.cite("numa_local"),
            vm.cite("numa_other"),
        ));
        // Pages by destination: with the hook, every row has its (zero) vector, so no row
        // means none; without it, unknown.
        let pages_to = self
            .hint_hook
            .map(|_| pairs::pages_by_node(&rows, width).unwrap_or_else(|| vec![0; width]));
        out.notes
            .push(pairs::migration_note(pages_to.as_deref(), &moves, &swaps));
        out.note_skipped(&self.session.skipped);
        if rows.is_empty() {
            out.notes.push("no process ran".into());
        }
        let ctx = Ctx { secs };
        let cols = id_columns(report::SUMMARY, threads);
        out.sections.push(Section::build(
            &report::SUMMARY_ROWS,
            &rows,
            &cols,
            &ctx,
            self.max_rows,
        ));
        out.sections.push(
            Section::build(&report::NODE_ROWS, &nodes, report::NODES, &ctx, 0).caption("Nodes:"),
        );
        out.footnotes.push(format!(
            "CPU%/NODE, MEM%/NODE: shares by node {}; REMOTE%: CPU time away from the node holding most of the memory (numa_maps read for the {} busiest processes).",
            nodes.iter().map(|n| n.node.to_string()).collect::<Vec<_>>().join("/"),
            self.maps_top,
        ));
        let vm_json: serde_json::Map<String, Value> =
            vm.0.iter().map(|(k, v)| (k.clone(), (*v).into())).collect();
        out.extra_json.push(json!({
            "type": "system",
            "nodes": self.topo.len(),
            "node_ids": nodes.iter().map(|n| n.node).collect::<Vec<_>>(),
            "numa_balancing": balancing,
            "hint_hook": self.hint_hook.map(|m| m.as_str()),
            "vmstat": vm_json,
            "cpu_ns_by_node": (0..width).map(|i| rows.iter().map(|r| r.cpu_ns_by_node[i]).sum::<u64>()).collect::<Vec<_>>(),
            "hint_faults": sum(|r| r.hint_faults),
            "hint_faults_local": sum(|r| r.hint_faults_local),
            "pages_migrated": rows.iter().map(|r| r.pages_migrated).sum::<u64>(),
            "pages_migrated_by_node": pages_to,
            "task_moves_by_pair": moves,
            "task_swaps_by_pair": swaps,
            "numa_maps_read": procs.len(),
            "numa_maps_ns": maps_ns,
            "page_kib": self.page_kib,
        }));
        out.stats = Some(
            Stats::new(st)
                .with("runs_without_baseline", no_base)
                .with("cpus_without_node", st[STAT_NO_NODE as usize])
                .with("node_pairs_not_counted", st[STAT_PAIR_FULL as usize])
                .with("numa_maps_read", procs.len())
                .with("numa_maps_ns", maps_ns),
        );
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hooks_switch_required_rest_optional() {
        assert!(!HOOKS[0].optional);
        assert_eq!(HOOKS[0].programs[0], (AttachMode::TpBtf, "tk_numa_switch"));
        assert!(HOOKS[1..].iter().all(|h| h.optional));
        assert_eq!(HOOKS[5].attach_target(AttachMode::Kprobe), FAULT_FN);
    }

    #[test]
    fn the_one_node_line() {
        let t = Topology::read_from(std::path::Path::new("/nonexistent"), 2);
        let l = one_node::one_node_line(&t);
        assert!(l.contains("nothing to misplace"), "{l}");
        assert!(
            l.contains("numa_maps") && l.contains("NUMA balancing"),
            "{l}"
        );
        assert!(!l.contains('\n'));
        assert_eq!(one_node::one_node_json(&t)["nodes"], 1);
    }
}
