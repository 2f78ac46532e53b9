//! `tracekit memstall`: time processes lose stalled in direct compaction (per allocation, as
//! `/proc/vmstat compact_stall` counts them), direct reclaim, memory-cgroup reclaim, THP
//! collapse and (where the kernel lets it be timed) whole THP faults, per process, with the THP
//! settings, `/proc/vmstat` counters, cgroup limit counters and OOM kills that explain it, and
//! findings that cite their evidence.
//!
//! Hooks (kernel side: `probes-ebpf/src/bin/memstall.rs`), each group attached whole:
//! - `compaction`: `compaction:mm_compaction_try_to_compact_pages`, `_deferred`,
//!   `_defer_reset`, `_begin`, `_end` (`status`);
//! - `reclaim` / `memcg_reclaim`: `vmscan:mm_vmscan_{direct,memcg}_reclaim_begin/end`
//!   (`nr_reclaimed`);
//! - `thp_collapse`: `huge_memory:mm_khugepaged_scan_pmd`, `mm_collapse_huge_page_isolate`,
//!   `mm_collapse_huge_page` (`status`);
//! - `madvise_collapse_time`: the classic `syscalls:sys_enter_madvise` (`behavior`) /
//!   `sys_exit_madvise` (`ret`), which fire for madvise only; where tracefs cannot be read, BTF
//!   tracepoints on the raw `sys_enter` / `sys_exit` that filter by syscall number (they cost
//!   every syscall of the node a comparison, which is why they come second);
//! - `oom`: `oom:mark_victim`; `lifetime`: `sched:sched_process_exit`;
//! - whole THP faults: fentry/fexit on `do_huge_pmd_anonymous_page`, else kprobe/kretprobe.
//!
//! The rare events prefer BTF tracepoints (their links detach at once; a classic tracepoint's
//! close waits for an RCU grace period).

use crate::report::findings::Cause;
use std::os::fd::{AsRawFd, RawFd};

use aya::maps::{HashMap, MapData, RingBuf};
use probes_common::memstall::{MsKey, MsLife, MsNew, MsOom, MsVal};

use crate::{
    host::{facts::Facts, thp::ThpSettings, vmstat::Vmstat},
    tools::prelude::*,
};

mod findings;
mod memcg;
mod report;
mod setup;

pub const INFO: ToolInfo = ToolInfo {
    name: "memstall",
    summary: "Who stalls in direct compaction (per allocation, as /proc/vmstat compact_stall counts), direct or memory-cgroup reclaim, THP collapse and (with fentry or kprobes) whole THP faults, for how much of the time it was alive; with THP settings, vmstat deltas, cgroup limit counters and OOM kills as evidence, and findings that say what to change.",
    hooks: HOOKS,
    triage: true,
    hidden: false,
    // Struct offsets (the cgroup chain, task start times, OOM victims' tgids) come from BTF
    // where there is one; without it memstall runs on classic tracepoints, reads v1 cgroups from
    // /proc while each process lives and says so.
    needs_btf: false,
    rows: &[&report::SUMMARY_ROWS, &memcg::CGROUP_ROWS, &memcg::OOM_ROWS],
    causes: &[THP_COMPACTION, THP_COLLAPSE, THP_FAULT, RECLAIM, MEMCG_LIMIT, OOM_KILL],
    by_container: true,
    joins: &[],
};

// The causes this tool concludes (listed in INFO; see report::findings::Cause).
pub const THP_COMPACTION: Cause = Cause::new(
    "thp-compaction",
    "A process stalls in direct compaction, the kernel building a huge page (or another high-order block) in its time.",
);
pub const THP_COLLAPSE: Cause = Cause::new(
    "thp-collapse",
    "khugepaged or MADV_COLLAPSE collapses a process's pages into huge pages, stalling it or burning CPU.",
);
pub const THP_FAULT: Cause = Cause::new(
    "thp-fault",
    "A process's page faults allocate and clear huge pages in its own time.",
);
pub const RECLAIM: Cause = Cause::new(
    "reclaim",
    "A process stalls in direct reclaim: the node is short of free memory.",
);
pub const MEMCG_LIMIT: Cause = Cause::new(
    "memcg-limit",
    "A memory cgroup is at its limit: its processes reclaim on every allocation over it.",
);
pub const OOM_KILL: Cause = Cause::new("oom-kill", "The OOM killer ended a process.");

const OBJECT: Object = crate::object!("memstall");

/// The groups that trace stalls (the tool needs at least one).
pub const GROUPS: &[&str] = &["compaction", "reclaim", "memcg_reclaim", "thp_collapse"];

/// Every hook is optional: the tool traces whichever groups the kernel has and names the rest.
pub const HOOKS: &[Hook] = &[
    crate::hook!(
        "compaction:mm_compaction_try_to_compact_pages",
        "tk_ms_compact_try",
        [TpBtf, Tracepoint],
        fields: &[],
        optional: true,
        group: "compaction",
    ),
    crate::hook!(
        "compaction:mm_compaction_deferred",
        "tk_ms_compact_deferred",
        [TpBtf, Tracepoint],
        fields: &[],
        optional: true,
        group: "compaction",
    ),
    crate::hook!(
        "compaction:mm_compaction_defer_reset",
        "tk_ms_compact_reset",
        [TpBtf, Tracepoint],
        fields: &[],
        optional: true,
        group: "compaction",
    ),
    crate::hook!(
        "compaction:mm_compaction_begin",
        "tk_ms_compact_begin",
        [TpBtf, Tracepoint],
        fields: &[],
        optional: true,
        group: "compaction",
    ),
    crate::hook!(
        "compaction:mm_compaction_end",
        "tk_ms_compact_end",
        [TpBtf, Tracepoint],
        fields: &["status"],
        optional: true,
        group: "compaction",
    ),
    crate::hook!(
        "vmscan:mm_vmscan_direct_reclaim_begin",
        "tk_ms_reclaim_begin",
        [TpBtf, Tracepoint],
        fields: &[],
        optional: true,
        group: "reclaim",
    ),
    crate::hook!(
        "vmscan:mm_vmscan_direct_reclaim_end",
        "tk_ms_reclaim_end",
        [TpBtf, Tracepoint],
        fields: &["nr_reclaimed"],
        optional: true,
        group: "reclaim",
    ),
    crate::hook!(
        "vmscan:mm_vmscan_memcg_reclaim_begin",
        "tk_ms_memcg_begin",
        [TpBtf, Tracepoint],
        fields: &[],
        optional: true,
        group: "memcg_reclaim",
    ),
    crate::hook!(
        "vmscan:mm_vmscan_memcg_reclaim_end",
        "tk_ms_memcg_end",
        [TpBtf, Tracepoint],
        fields: &["nr_reclaimed"],
        optional: true,
        group: "memcg_reclaim",
    ),
    crate::hook!(
        "huge_memory:mm_khugepaged_scan_pmd",
        "tk_ms_thp_scan",
        [TpBtf, Tracepoint],
        fields: &[],
        optional: true,
        group: "thp_collapse",
    ),
    crate::hook!(
        "huge_memory:mm_collapse_huge_page_isolate",
        "tk_ms_thp_isolate",
        [TpBtf, Tracepoint],
        fields: &[],
        optional: true,
        group: "thp_collapse",
    ),
    crate::hook!(
        "huge_memory:mm_collapse_huge_page",
        "tk_ms_thp_collapse",
        [TpBtf, Tracepoint],
        fields: &["status"],
        optional: true,
        group: "thp_collapse",
    ),
    crate::hook!(
        "syscalls:sys_enter_madvise",
        "tk_ms_madv_enter",
        [Tracepoint, TpBtf],
        raw: Some("sys_enter"),
        fields: &["behavior"],
        optional: true,
        group: "madvise_collapse_time",
    ),
    crate::hook!(
        "syscalls:sys_exit_madvise",
        "tk_ms_madv_exit",
        [Tracepoint, TpBtf],
        raw: Some("sys_exit"),
        fields: &["ret"],
        optional: true,
        group: "madvise_collapse_time",
    ),
    crate::hook!(
        "oom:mark_victim",
        "tk_ms_oom",
        [TpBtf, Tracepoint],
        fields: &["pid"],
        optional: true,
        group: "oom",
    ),
    crate::hook!(
        "sched:sched_process_exit",
        "tk_ms_exit",
        [TpBtf, Tracepoint],
        fields: &[],
        optional: true,
        group: "lifetime",
    ),
    crate::hook!(
        "do_huge_pmd_anonymous_page",
        "tk_ms_fault_entry",
        [Fentry, Kprobe],
        optional: true,
    ),
    // The return of the same function, named as perf names a kretprobe (`func%return`) so
    // doctor and `attach_policy` tell the two hooks apart; `raw` is where it attaches.
    crate::hook!(
        "do_huge_pmd_anonymous_page%return",
        "tk_ms_fault_exit",
        [Fexit, Kretprobe],
        raw: Some("do_huge_pmd_anonymous_page"),
        optional: true,
    ),
];

const EXAMPLES: &str = "  tracekit memstall --duration 10s                    # who stalls in compaction, reclaim, THP collapse
  tracekit memstall --duration 1m --interval 10s      # one report (and findings) per 10 s
  tracekit memstall --duration 30s --comm postgres --json   # one program, as NDJSON";

const NEEDS: &str = "root, or exactly CAP_BPF and CAP_PERFMON on kernels with BTF (CAP_SYS_ADMIN \
stands in for both) plus CAP_DAC_READ_SEARCH to read tracefs (mode 0700) for the madvise events; \
without it MADV_COLLAPSE is timed from the raw sys_enter/sys_exit tracepoints, which cost every \
syscall of the node a comparison while it runs. Without BTF it falls back to classic tracepoints \
and CAP_SYS_ADMIN mounts tracefs if it is not mounted. THP_KB of other users' processes is shown \
only with CAP_SYS_PTRACE (else `-`). Kernel memory: memstall's maps are preallocated, so creating \
a key never allocates inside a traced stall: --max-keys defaults to 2048 here (about 5.5 MiB).";

#[derive(clap::Args, Debug)]
#[command(after_help = tools::help_footer(EXAMPLES, NEEDS))]
pub struct Args {
    #[command(flatten)]
    pub common: Common,

    /// Rows shown per table, largest total stall first (0: all). JSON has every row.
    #[arg(long, default_value_t = 25, value_name = "N")]
    pub rows: usize,
}

pub fn run(args: Args) -> Result<()> {
    tools::run_collector(INFO.name, &args.common, |ctx| open(&args, ctx))
}

/// memstall's collector.
pub struct Memstall {
    session: Session,
    hist: GenMap<MsKey, MsVal>,
    news: RingBuf<MapData>,
    ooms: RingBuf<MapData>,
    life: HashMap<MapData, u32, MsLife>,
    facts: Facts,
    cgroups: memcg::Cgroups,
    /// `AnonHugePages` (KiB) per process, last read while it lived.
    thp_kb: std::collections::HashMap<u32, u64>,
    /// `--by container`.
    fold: crate::report::who::Folding,
    /// OOM kills streamed in the current window.
    oom_kills: Vec<MsOom>,
    /// Groups traced, in declared order.
    traced: Vec<&'static str>,
    setup_notes: Vec<String>,
    outcome_names: std::collections::BTreeMap<usize, String>,
    thp_start: ThpSettings,
    vm_start: Vmstat,
    vm_prev: Vmstat,
    scope: Scope,
    max_rows: usize,
    /// Monotonic ns at the start of the current window and at the last flip.
    win_start_ns: u64,
    flip_ns: u64,
    madv_collapse: bool,
    /// Whole THP faults are timed (fentry/fexit or kprobes attached).
    fault_timed: bool,
    /// Direct compaction is counted per allocation (the try_to_compact_pages hook attached).
    per_allocation: bool,
}

/// Loads and attaches memstall's programs as the attach policy chose on this kernel.
pub fn open(args: &Args, ctx: &OpenCtx) -> Result<Box<dyn Collector>> {
    let s = setup::plan(ctx)?;
    let mut session = Session::load(OBJECT, ctx.scope.filter(), s.spec)?;
    session.attach_planned(&s.hooks, &s.plan)?;
    let modes = setup::group_modes(&s.hooks, &s.plan);
    let traced: Vec<&'static str> = GROUPS
        .iter()
        .chain(&["madvise_collapse_time", "oom", "lifetime"])
        .copied()
        .filter(|g| modes.get(g).copied().flatten().is_some())
        .collect();
    let attached = |p: &str| {
        session
            .attached
            .iter()
            .filter(|a| a.program.starts_with(p))
            .count()
    };
    // Both the entry and the return of the fault handler, in whichever mode.
    let fault_timed = attached("tk_ms_fault_") == 2;
    let per_allocation = attached("tk_ms_compact_try") == 1;
    let mut setup_notes = Vec::new();
    if !s.madv_collapse {
        setup_notes.push(memcg::NO_MADV_COLLAPSE.to_string());
    }
    if !s.cgroup_in_kernel {
        setup_notes.push("cgroups: no kernel BTF offsets to read a task's v1 memory cgroup in the kernel, so cgroups are read from /proc while each process lives (a process that exits at once shows `?`).".into());
    }
    let news = RingBuf::try_from(session.take_map("MS_NEW")?).context("MS_NEW")?;
    let ooms = RingBuf::try_from(session.take_map("MS_OOM")?).context("MS_OOM")?;
    let life = HashMap::try_from(session.take_map("MS_LIFE")?).context("MS_LIFE")?;
    let hist = GenMap::take(&mut session, "MS_HIST", Some("MS_OTHER"), MsVal::ZERO)?;
    let vm_start = Vmstat::read().unwrap_or_default();
    let now = crate::host::proc::mono_ns();
    Ok(Box::new(Memstall {
        session,
        hist,
        news,
        ooms,
        life,
        facts: ctx.facts.clone(),
        cgroups: memcg::Cgroups::new(!s.cgroup_in_kernel),
        thp_kb: Default::default(),
        fold: crate::report::who::Folding::new(ctx.scope.by_container),
        oom_kills: Vec::new(),
        traced,
        setup_notes,
        outcome_names: s.outcome_names,
        thp_start: ThpSettings::read(),
        vm_prev: vm_start.clone(),
        vm_start,
        scope: ctx.scope.clone(),
        max_rows: args.rows,
        win_start_ns: now,
        flip_ns: now,
        madv_collapse: s.madv_collapse,
        fault_timed,
        per_allocation,
    }))
}

impl Memstall {
    fn read_rings(&mut self) {
        while let Some(item) = self.news.next() {
            if item.len() >= std::mem::size_of::<MsNew>() {
                // SAFETY: the kernel wrote an MsNew (repr(C), plain integers) here; the length
                // was checked and read_unaligned tolerates any alignment.
                let e = unsafe { std::ptr::read_unaligned(item.as_ptr() as *const MsNew) };
                self.facts.lock().learn(e.tgid);
                self.cgroups.learn(&e.cgroup);
                if let Some(kb) = crate::host::proc::anon_huge_kb(e.tgid) {
                    self.thp_kb.insert(e.tgid, kb);
                }
            }
        }
        while let Some(item) = self.ooms.next() {
            if item.len() >= std::mem::size_of::<MsOom>() {
                // SAFETY: as above, for an MsOom.
                let e = unsafe { std::ptr::read_unaligned(item.as_ptr() as *const MsOom) };
                self.facts.lock().learn(e.victim_pid);
                self.cgroups.learn(&e.cgroup);
                self.oom_kills.push(e);
            }
        }
    }
}

impl Collector for Memstall {
    fn name(&self) -> &'static str {
        INFO.name
    }

    fn meta(&self) -> Meta {
        let mut m = Meta::of(
            INFO.name,
            format!("memory stalls ({})", self.traced.join(", ")),
            &self.scope,
            &self.session,
        )
        .with("traced", self.traced.clone())
        .with("cgroup_memory", self.cgroups.hierarchy())
        .with(
            "thp",
            serde_json::to_value(&self.thp_start).unwrap_or_default(),
        )
        .with(
            "vmstat",
            serde_json::to_value(&self.vm_start.0).unwrap_or_default(),
        )
        .with("madv_collapse", self.madv_collapse)
        .with("thp_fault_timed", self.fault_timed)
        .with("compaction_per_allocation", self.per_allocation);
        if !self.setup_notes.is_empty() {
            m = m.with("notes", self.setup_notes.clone());
        }
        m
    }

    fn event_fds(&self) -> Vec<RawFd> {
        vec![self.news.as_raw_fd(), self.ooms.as_raw_fd()]
    }

    fn on_events(&mut self) -> Result<()> {
        self.read_rings();
        Ok(())
    }

    /// New keys are streamed without a wakeup (see `MS_NEW`): learn them every 10 ms.
    fn poll_interval(&self) -> Option<std::time::Duration> {
        Some(std::time::Duration::from_millis(10))
    }

    fn flip(&mut self) -> Result<()> {
        self.session.flip_generation()?;
        self.flip_ns = crate::host::proc::mono_ns();
        Ok(())
    }

    fn session(&mut self) -> Option<&mut crate::kernel::loader::Session> {
        Some(&mut self.session)
    }

    fn collect(&mut self, w: &Window) -> Result<Output> {
        let out = self.report(w)?;
        self.win_start_ns = self.flip_ns;
        Ok(out)
    }
}
