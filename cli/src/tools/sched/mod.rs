//! What `ctxsw` and `runq-lat` share: their hooks, loading the one `sched` object with
//! `task_struct` offsets from the kernel's BTF, and draining one window of per-process
//! aggregates and task pairs (preemptors, the tasks waits after a wakeup were spent behind,
//! wakers).
//!
//! Kernel side and cost argument: `probes-ebpf/src/bin/sched.rs`.

use std::collections::BTreeMap;

use probes_common::{
    hist::LatHist,
    numa::RunOffsets,
    sched::{
        SchedVal, TaskOffsets, STAT_IDLE_SWITCHES, STAT_NO_BASELINE, STAT_PAIR_MAP_FULL, STEAL_ID,
    },
    stats::{self, NSTATS},
};
use serde::Serialize;

use crate::{
    engine::{Meta, Scope, Stats},
    error::Result,
    kernel::{btf::Btf, hooks::Hook, loader::Object},
    report::{
        sanitize,
        who::{Id, Title},
    },
};

mod session;

pub use session::{join_node_time, open, Interval, NodeDrain, Pool, SchedSession};

const OBJECT: Object = crate::object!("sched");

/// The hooks of both tools, in attach order: the free and exec hooks and the wakeup hooks
/// before `sched_switch`, so no task is seen switching before its cleanup and its wakeups are.
pub const HOOKS: &[Hook] = &[
    crate::hook!("sched:sched_process_free", "tk_sched_free", [TpBtf, RawTp], optional: true),
    crate::hook!("sched:sched_process_exec", "tk_sched_exec", [TpBtf, RawTp], optional: true),
    crate::hook!("sched:sched_process_exit", "tk_sched_exit", [TpBtf, RawTp], optional: true),
    crate::hook!("sched:sched_waking", "tk_sched_waking", [TpBtf, RawTp], optional: true),
    crate::hook!("sched:sched_wakeup_new", "tk_sched_wakeup_new", [TpBtf, RawTp], optional: true),
    crate::hook!("sched:sched_wakeup", "tk_sched_wakeup", [TpBtf, RawTp], optional: true,
        when: "runq-lat --from wakeup (waits start there), or runq-lat on a node with CPU steal (a guest): each wait's steal is read from its run queue's steal clock"),
    crate::hook!("sched:sched_switch", "tk_sched_switch", [TpBtf, RawTp], optional: false),
];

/// The hook only a guest's culprit charging and `--from wakeup` need (see [`steal_offsets`]):
/// every other run leaves it out, so a wakeup costs one program, not two.
const STEAL_HOOK: &str = "sched:sched_wakeup";

/// The hooks a run attaches: [`STEAL_HOOK`] only when it charges steal or waits start there.
fn hooks_for(steal: bool, from: WakeFrom) -> Vec<Hook> {
    HOOKS
        .iter()
        .filter(|h| steal || from == WakeFrom::Wakeup || h.event != STEAL_HOOK)
        .cloned()
        .collect()
}

/// Where a wait after a wakeup starts (runq-lat `--from`). The two differ by the wakeup path
/// (`select_task_rq`, the enqueue) and, for a task woken onto another CPU through its wake
/// list, the IPI and that CPU's idle exit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum WakeFrom {
    /// `sched_waking`, in the waker when it issues the wakeup (the wakeup path and any IPI
    /// to an idle CPU included).
    #[default]
    Waking,
    /// `sched_wakeup` (and `sched_wakeup_new`), the task on its run queue: where libbpf-tools
    /// runqlat and `perf sched` start.
    Wakeup,
}

impl WakeFrom {
    /// The event the waits are timed from.
    pub fn event(self) -> &'static str {
        match self {
            WakeFrom::Waking => "sched_waking",
            WakeFrom::Wakeup => "sched_wakeup",
        }
    }

    /// How a run timed its waits after a wakeup, for the text report's title; `wall_clock`
    /// false: no wakeup hook attached, the waits are the kernel's run_delay.
    pub fn definition(self, wall_clock: bool) -> &'static str {
        match (wall_clock, self) {
            (false, _) => "waits after a wakeup are the kernel's run_delay (no wakeup hook)",
            (true, WakeFrom::Waking) => {
                "waits after a wakeup timed from sched_waking (the wakeup path and any IPI included)"
            }
            (true, WakeFrom::Wakeup) => {
                "waits after a wakeup timed from sched_wakeup (the task enqueued), as runqlat and perf sched time them"
            }
        }
    }

    /// The meta line's keys for it: `wake_wait_clock` (`wall` or `run_delay`) and
    /// `wake_from`, the event (null when the waits are run_delay's).
    pub fn meta(self, meta: Meta, wall_clock: bool) -> Meta {
        meta.with(
            "wake_wait_clock",
            if wall_clock { "wall" } else { "run_delay" },
        )
        .with("wake_from", wall_clock.then_some(self.event()))
    }
}

/// The privileges of both tools (`--help`).
pub const NEEDS: &str =
    "root, or exactly CAP_BPF and CAP_PERFMON (CAP_SYS_ADMIN stands in for both). \
They never read tracefs: they need the kernel's BTF (/sys/kernel/btf/vmlinux, or TRACEKIT_BTF), \
readable by anyone.";

/// Waits after a wakeup shorter than this are not charged to the tasks that held the CPU. A
/// wakeup that preempts costs the wakee the rest of the waker's path to its next preemption
/// point (about 1 µs here on a pinned pipe ping-pong, p99 2-20 µs on a busy machine); from
/// 20 µs on, another task kept the CPU for real (a timeslice is 0.75-3 ms). Charging every
/// wait would add a hash update to every switch of a storm; the shorter waits are still in
/// every histogram and total.
pub const CULPRIT_MIN_NS: u64 = 20_000;

/// What the programs record besides the per-task aggregates.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Record {
    /// Who preempted whom (involuntary switches by pair).
    pub preemptors: bool,
    /// Who held the CPU during each wait after a wakeup (waits of `CULPRIT_MIN_NS` or more),
    /// and during the long ones (`harm::LATE_FLOOR_NS` or more) apart.
    pub culprits: bool,
    /// Who woke whom (wakeups by pair).
    pub wakers: bool,
    /// Where waits after a wakeup start.
    pub wake_from: WakeFrom,
    /// On-CPU time per NUMA node (for `numa` beside ctxsw or runq-lat, see
    /// [`session::join_node_time`]).
    pub node_time: bool,
}

impl Record {
    /// What one object records for two collectors (same `wake_from`, see [`open`]).
    pub fn union(self, o: Record) -> Record {
        Record {
            preemptors: self.preemptors || o.preemptors,
            culprits: self.culprits || o.culprits,
            wakers: self.wakers || o.wakers,
            wake_from: self.wake_from,
            node_time: self.node_time || o.node_time,
        }
    }
}

/// Rows a window resolves in full by default: a storm of short-lived processes (3,000 forks/s)
/// leaves 15,000+ tasks in a 6 s window, each ~5 KiB of histograms before its name, title,
/// peers and JSON; past this many, the tasks with the least to show are summed in `[other]`.
pub const ROW_CAP: usize = 1024;

/// Which tasks of a window get a row of their own (see [`SchedSession::drain`]).
pub struct Cap {
    /// At least this many, the largest by `rank`.
    pub rows: usize,
    pub rank: fn(&SchedVal) -> u64,
    /// Tasks kept beyond `rows` whatever their rank (those a finding could name).
    pub keep: Box<dyn Fn(&SchedVal) -> bool>,
}

impl Cap {
    /// [`ROW_CAP`] rows, or more when the text table shows more (`--rows`, 0: every row) or
    /// `--max-keys` asks for more keys.
    pub fn new(
        scope: &Scope,
        max_rows: usize,
        rank: fn(&SchedVal) -> u64,
        keep: Box<dyn Fn(&SchedVal) -> bool>,
    ) -> Cap {
        let rows = if max_rows == 0 {
            usize::MAX
        } else {
            ROW_CAP
                .max(max_rows)
                .max(scope.max_keys.unwrap_or(0) as usize)
        };
        Cap { rows, rank, keep }
    }
}

/// The pairs of a window by their `a` task, each list in the order drained (most first):
/// grouped once, so naming every row's peers is linear in the pairs, not rows × pairs.
pub struct ByA<'a>(std::collections::HashMap<u32, Vec<&'a Pair>>);

impl<'a> ByA<'a> {
    pub fn of(pairs: &'a [Pair]) -> ByA<'a> {
        let mut m: std::collections::HashMap<u32, Vec<&'a Pair>> = Default::default();
        for p in pairs {
            m.entry(p.a).or_default().push(p);
        }
        ByA(m)
    }

    /// The pairs with `a == id`, as peers, most first.
    pub fn peers(&self, id: u32, names: &Names, threads: bool, with_ns: bool) -> Vec<Peer> {
        self.0.get(&id).map_or_else(Vec::new, |v| {
            v.iter()
                .map(|p| Peer::b_of(p, names, threads, with_ns))
                .collect()
        })
    }
}

/// `task_struct` member offsets the programs read, from the running kernel's BTF.
pub fn task_offsets(btf: &Btf) -> Result<TaskOffsets> {
    let m = |path: &str, size: u32| btf.member_offset("task_struct", path, size);
    Ok(TaskOffsets {
        pid: m("pid", 4)?,
        tgid: m("tgid", 4)?,
        nvcsw: m("nvcsw", 8)?,
        nivcsw: m("nivcsw", 8)?,
        run_delay: m("sched_info.run_delay", 8)?,
        nr_migrations: m("se.nr_migrations", 8)?,
        start_time: m("start_time", 8)?,
        group_leader: m("group_leader", 8)?,
        signal: m("signal", 8)?,
        // atomic_t: a struct of one int.
        signal_live: btf.member_offset("signal_struct", "live", 4)?,
        se_cfs_rq: 0,
        cfs_rq_rq: 0,
        rq_steal: 0,
        run: run_offsets(btf)?,
    })
}

/// Fills `CPU_NODE` of a loaded object (numa's, or the shared `sched` one recording node
/// time) from `topo` (sysfs, read once by the caller): a CPU of no node counts as node 0.
pub fn fill_cpu_node(
    session: &mut crate::kernel::loader::Session,
    topo: &crate::host::numa::Topology,
) -> Result<()> {
    use crate::error::Context as _;
    let ncpus = crate::host::proc::possible_cpus();
    let mut map: aya::maps::Array<_, u32> =
        aya::maps::Array::try_from(session.map_mut("CPU_NODE")?)?;
    for (cpu, &node) in topo.cpu_to_node().iter().enumerate().take(ncpus) {
        map.set(cpu as u32, if node == u32::MAX { 0 } else { node }, 0)
            .context("filling CPU_NODE")?;
    }
    Ok(())
}

/// The members a run's length is read from (numa's node time, in either object).
pub fn run_offsets(btf: &Btf) -> Result<RunOffsets> {
    let m = |path: &str, size: u32| btf.member_offset("task_struct", path, size);
    Ok(RunOffsets {
        sum_exec_runtime: m("se.sum_exec_runtime", 8)?,
        prev_sum_exec_runtime: m("se.prev_sum_exec_runtime", 8)?,
        prio: m("prio", 4)?,
    })
}

/// The members a run queue's steal clock is read through, when the kernel has them all:
/// `task_struct.se.cfs_rq` and `cfs_rq.rq` (CONFIG_FAIR_GROUP_SCHED), `rq.prev_steal_time_rq`
/// (CONFIG_PARAVIRT_TIME_ACCOUNTING; in every kernel since 3.x that has it). `Err` says which
/// one is missing.
pub fn steal_offsets(btf: &Btf, offs: &mut TaskOffsets) -> Result<()> {
    offs.se_cfs_rq = btf.member_offset("task_struct", "se.cfs_rq", 8)?;
    offs.cfs_rq_rq = btf.member_offset("cfs_rq", "rq", 8)?;
    offs.rq_steal = btf.member_offset("rq", "prev_steal_time_rq", 8)?;
    Ok(())
}

/// Whether the hypervisor has taken any time from this node since boot (/proc/stat's `steal`):
/// only then is each wait's steal worth reading (bare metal never has any).
fn node_has_steal() -> bool {
    crate::host::sysstat::SysStat::read().is_ok_and(|s| s.all.steal > 0)
}

/// Entries of the per-task snapshot map: every thread that can exist at once, up to 64 Ki
/// (a thread beyond that falls back to classifying its switches from the tracepoint and is
/// counted as `start_map_full`).
pub fn task_cap() -> u32 {
    crate::host::proc::pid_max().clamp(4096, 65536)
}

/// Slots of the wakeup array: the task cap rounded up to a power of two (a slot is
/// `tid & (slots - 1)`).
pub fn wake_slots() -> u32 {
    task_cap().next_power_of_two()
}

/// One process (or thread) in one window: its names and what the kernel aggregated.
#[derive(Clone, Debug)]
pub struct Row {
    /// tgid, or tid with `--threads`; 0 for the `[other]` row.
    pub id: u32,
    pub tgid: u32,
    pub comm: Vec<u8>,
    /// The name before an exec during the window (the row spans it), if any.
    pub exec_from: Option<Vec<u8>>,
    /// The process title (`postgres: walwriter`), read while the process lives.
    pub title: Title,
    /// Switches, migrations, the kernel's run_delay, waits after a wakeup (wall clock) and
    /// after a preemption (`run_delay`).
    pub v: SchedVal,
    /// The part of the window the task lived (CLOCK_MONOTONIC ns, see [`alive`]); the whole
    /// window for `[other]` and container rows (sums of tasks have no one life).
    pub alive: (u64, u64),
}

/// The part of window `span` (CLOCK_MONOTONIC ns) a task lived: from its start, or the
/// window's, to its death (`exit_ns`), or the window's end.
pub fn alive(v: &SchedVal, span: (u64, u64)) -> (u64, u64) {
    let (start, end) = (span.0, span.1.max(span.0));
    let from = v.born_ns.max(start).min(end);
    let to = if v.exit_ns == 0 {
        end
    } else {
        v.exit_ns.max(from).min(end)
    };
    (from, to)
}

/// A task's rates are per second of its life in the window (`alive_ns`), but at least of one
/// second (or of the whole window, if shorter): a process that lived 5 ms and switched 300
/// times is not a 60,000/s storm.
pub const MIN_RATE_SPAN_NS: u64 = 1_000_000_000;

/// The seconds a task's counts are divided by for its rates (see [`MIN_RATE_SPAN_NS`]).
pub fn rate_secs(alive_ns: u64, window_secs: f64) -> f64 {
    let floor = (MIN_RATE_SPAN_NS as f64 / 1e9).min(window_secs);
    (alive_ns as f64 / 1e9)
        .clamp(floor, window_secs.max(floor))
        .max(1e-9)
}

impl Row {
    /// How long the task lived in the window, in ns.
    pub fn alive_ns(&self) -> u64 {
        self.alive.1 - self.alive.0
    }

    pub fn switches(&self) -> u64 {
        self.v.voluntary + self.v.involuntary
    }

    /// Every run-queue wait, however it began.
    pub fn waits(&self) -> LatHist {
        let mut h = self.v.wake;
        h.merge(&self.v.preempt);
        h
    }

    /// Waits after a wakeup whose wakeup was seen (timed on the wall clock).
    pub fn woken(&self) -> u64 {
        self.v.wake.count.saturating_sub(self.v.wake_unmeasured)
    }

    /// The name for text, with the title beside it: `python3 [python3 app.py] (was sh)` when
    /// the row spans an exec.
    pub fn name_text(&self) -> String {
        let name = self.title.beside(&self.comm);
        match &self.exec_from {
            Some(old) => format!("{name} (was {})", sanitize::text(old)),
            None => name,
        }
    }
}

/// Who a row is, as every row type of both tools serialises it (flattened): the shared
/// [`Id`] (`pid`, `tid` with `--threads`, `comm`, the title `cmdline`, the container) and,
/// when the row spans an exec, `exec_from` (with `_bytes` when not UTF-8).
#[derive(Clone, Debug, Serialize)]
pub struct Who {
    #[serde(flatten)]
    pub id: Id,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exec_from: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exec_from_bytes: Option<Vec<u8>>,
}

impl std::ops::Deref for Who {
    type Target = Id;
    fn deref(&self) -> &Id {
        &self.id
    }
}

impl Who {
    /// The COMM cell of row `r`: its name (with title and exec), or the container's.
    pub fn row_name(&self, r: &Row) -> String {
        if self.processes.is_some() {
            sanitize::text(self.comm.as_bytes())
        } else {
            r.name_text()
        }
    }

    /// A task known by its name only (no exec seen): a task that held the CPU, a test's row.
    pub fn named(pid: u32, tid: Option<u32>, comm: Vec<u8>) -> Who {
        Who {
            id: Id::new(
                tid.unwrap_or(pid),
                pid,
                tid.is_some(),
                comm,
                Title::default(),
            ),
            exec_from: None,
            exec_from_bytes: None,
        }
    }

    pub fn of(r: &Row, threads: bool) -> Who {
        let (exec_from, exec_from_bytes) = match &r.exec_from {
            Some(e) => {
                let (a, b) = sanitize::name_fields(e);
                (Some(a), b)
            }
            None => (None, None),
        };
        Who {
            id: Id::new(r.id, r.tgid, threads, r.comm.clone(), r.title.clone()),
            exec_from,
            exec_from_bytes,
        }
    }
}

/// Two tasks and what passed between them in one window (see `PairKey`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pair {
    pub a: u32,
    pub a_tgid: u32,
    pub b: u32,
    pub b_tgid: u32,
    pub count: u64,
    pub ns: u64,
}

fn row(
    id: u32,
    tgid: u32,
    comm: Vec<u8>,
    exec_from: Option<Vec<u8>>,
    title: Title,
    v: &SchedVal,
    alive: (u64, u64),
) -> Row {
    Row {
        id,
        tgid,
        comm,
        exec_from,
        title,
        v: *v,
        alive,
    }
}

/// Names of the tasks a window mentions: a row's name when the task has one (it may have exited
/// since), else /proc while it lives.
pub struct Names {
    rows: BTreeMap<u32, Vec<u8>>,
}

impl Names {
    pub fn of(rows: &[Row]) -> Names {
        Names {
            rows: rows
                .iter()
                .filter(|r| r.id != 0)
                .map(|r| (r.id, r.comm.clone()))
                .collect(),
        }
    }

    /// The names of a window's tasks: its rows' and those the row cap summed in `[other]`.
    pub fn of_window(iv: &Interval) -> Names {
        let mut n = Names::of(&iv.rows);
        n.rows.extend(iv.folded_names.iter().cloned());
        n
    }

    /// The name of task `id` (a tgid, or a tid in per-thread mode).
    pub fn get(&self, id: u32) -> Vec<u8> {
        if id == 0 {
            return b"[idle]".to_vec();
        }
        if id == STEAL_ID {
            return b"[steal]".to_vec();
        }
        if let Some(c) = self.rows.get(&id) {
            return c.clone();
        }
        // /proc/<tid>/comm exists for threads too (not listed, but readable).
        crate::host::proc::comm(id).unwrap_or_else(|| b"[exited]".to_vec())
    }
}

/// A task at the other end of a pair, for JSON: who it is (`pid`, `tid` per thread, `comm`),
/// the count, and the time where the pair carries one.
#[derive(Clone, Debug, Serialize)]
pub struct Peer {
    #[serde(flatten)]
    pub who: Who,
    pub count: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay_ns: Option<u64>,
    #[serde(skip)]
    pub id: u32,
    #[serde(skip)]
    pub name: Vec<u8>,
}

impl Peer {
    /// The `b` side of `p` (the preemptor, culprit or wakee).
    pub fn b_of(p: &Pair, names: &Names, threads: bool, with_ns: bool) -> Peer {
        Self::new(
            p.b,
            p.b_tgid,
            p.count,
            with_ns.then_some(p.ns),
            names,
            threads,
        )
    }

    pub fn new(
        id: u32,
        tgid: u32,
        count: u64,
        delay_ns: Option<u64>,
        names: &Names,
        threads: bool,
    ) -> Peer {
        let name = names.get(id);
        Peer {
            who: Who::named(tgid, threads.then_some(id), name.clone()),
            count,
            delay_ns,
            id,
            name,
        }
    }

    /// `name(id)`, for text.
    pub fn text(&self) -> String {
        if self.id == STEAL_ID {
            // The hypervisor: no task id to show.
            return "[steal]".into();
        }
        format!("{}({})", sanitize::text(&self.name), self.id)
    }
}

/// Header lines for what the programs could not record in a window.
pub fn stats_notes(st: &[u64; NSTATS as usize]) -> Vec<String> {
    let mut out = Vec::new();
    let (full, keys, pairs, nobase) = (
        st[stats::START_MAP_FULL as usize],
        st[stats::KEY_MAP_FULL as usize],
        st[STAT_PAIR_MAP_FULL as usize],
        st[STAT_NO_BASELINE as usize],
    );
    if full > 0 {
        out.push(format!(
            "{full} switch(es) of tasks beyond the {}-task snapshot cap were classified from the tracepoint alone, their waits not measured",
            task_cap()
        ));
    }
    if keys > 0 {
        out.push(format!(
            "{keys} switch(es) over the --max-keys cap are counted in the [other] row"
        ));
    }
    if pairs > 0 {
        out.push(format!(
            "{pairs} preemption(s), wait(s) or wakeup(s) not attributed to a pair: the pair map was full (--max-keys)"
        ));
    }
    if nobase > 0 {
        out.push(format!(
            "{nobase} task(s) already running at start: their first switch was classified from the tracepoint and its wait not measured"
        ));
    }
    out
}

/// The `"type":"stats"` line: the kernel's counters, plus `count` (what the tool counted) and
/// `folded_rows` (tasks the row cap summed in the `[other]` row).
pub fn stats(iv: &Interval, count: u64) -> Stats {
    let st = iv.stats;
    Stats::new(st)
        .with("count", count)
        .with("folded_rows", iv.folded as u64)
        .with("missed", st[stats::START_MAP_FULL as usize])
        .with("pair_map_full", st[STAT_PAIR_MAP_FULL as usize])
        .with("no_baseline", st[STAT_NO_BASELINE as usize])
        .with("idle_switches", st[STAT_IDLE_SWITCHES as usize])
}

#[cfg(test)]
mod tests;
