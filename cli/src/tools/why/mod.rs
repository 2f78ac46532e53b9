//! `tracekit why --pid N`: where one process's wall-clock time goes — running, waiting for a
//! CPU, blocked in storage, in memory management, on a lock or another thread, on the
//! network, sleeping on purpose, or in another wait — with the culprit behind each part, in
//! parts that add up to the time it existed in the window.
//!
//! Kernel side (`probes-ebpf/src/bin/why.rs`): one pass over `sched_switch`, `sched_waking`,
//! `sched_wakeup_new` and `sched_process_exit` keeps each thread's state; every state change
//! ends an interval, added whole to the thread's aggregate for that state (blocks: for the
//! kernel stack it blocked in) in the window where it ends, and to whoever ended it (the waker;
//! for a runnable wait the task that held the CPU last). Userspace classifies each blocking
//! stack ([`classify`]), counts the part of intervals still going at a window's end into that
//! window from the per-thread state map, and takes it out of the window where they end, so each
//! window's parts add up to its wall time.
//!
//! Threads alive at the start are seeded from `/proc/<tid>/stat` (running or blocked) and, for
//! blocked ones, `/proc/<tid>/stack` (the kernel stack of their current wait).

use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use aya::maps::{stack_trace::StackTraceMap, HashMap as AyaHash, MapData};
use probes_common::{
    hist::LatHist,
    profile::NO_STACK,
    stats,
    why::{
        ByKey, ByVal, WhyKey, WhyTask, WhyVal, BLOCKED_BEFORE, EXITING, MEM_DIRECT, RECLAIM_RUN,
        RUNNABLE_PREEMPT, RUNNABLE_WAKEUP, RUNNING, STAT_BY_FULL, STAT_NO_WAKEUP, STAT_UNSEEN,
    },
};

use crate::{
    host::kallsyms::Symbolizer,
    report::who::{Id, InContainer, Title},
    tools::prelude::*,
};

pub mod classify;
mod detail;
mod findings;
pub mod rows;
mod threads;

use classify::{classify, Part};
use rows::*;
use threads::*;

pub const INFO: ToolInfo = ToolInfo {
    name: "why",
    summary: "Where one process's wall-clock time goes: running, waiting for a CPU, blocked in storage, memory, on a lock or another thread, on the network, sleeping, or another wait, in parts that add up to 100 %, each with its count, p50/p99/max and the culprit (the CPU holder, the waker); findings name the largest harmful part.",
    hooks: HOOKS,
    triage: false,
    hidden: false,
    needs_btf: true,
    rows: &[&SUMMARY_ROWS, &PART_ROWS],
    causes: &[
        crate::tools::runq_lat::RUNQ_DELAY,
        crate::tools::fsync_lat::FSYNC,
        crate::tools::io_lat::IO_LATENCY,
        crate::tools::memstall::RECLAIM,
        crate::tools::memstall::MEMCG_LIMIT,
        crate::tools::memstall::THP_COMPACTION,
        crate::tools::profile::OFF_CPU_WAIT,
    ],
    by_container: false,
    joins: &[],
};

const OBJECT: Object = crate::object!("why");

/// The wakeup hook first, so no block is seen before its wakeups are; then the switch, so
/// every state the later hooks create is followed from its start (a child forked while
/// `sched_wakeup_new` was attached but `sched_switch` not yet was left runnable from its fork
/// until its last switch-in: one such child in each run of a shell forking every 50 ms).
pub const HOOKS: &[Hook] = &[
    crate::hook!("sched:sched_waking", "tk_why_waking", [TpBtf, RawTp]),
    crate::hook!("sched:sched_switch", "tk_why_switch", [TpBtf, RawTp]),
    crate::hook!(
        "sched:sched_wakeup_new",
        "tk_why_wakeup_new",
        [TpBtf, RawTp],
        optional: true,
    ),
    crate::hook!(
        "sched:sched_process_exit",
        "tk_why_exit",
        [TpBtf, RawTp],
        optional: true,
    ),
    crate::hook!(
        "vmscan:mm_vmscan_direct_reclaim_end",
        "tk_why_direct_end",
        [TpBtf, RawTp],
        optional: true,
    ),
    crate::hook!(
        "vmscan:mm_vmscan_direct_reclaim_begin",
        "tk_why_direct_begin",
        [TpBtf, RawTp],
        optional: true,
    ),
    crate::hook!(
        "vmscan:mm_vmscan_memcg_reclaim_end",
        "tk_why_memcg_end",
        [TpBtf, RawTp],
        optional: true,
    ),
    crate::hook!(
        "vmscan:mm_vmscan_memcg_reclaim_begin",
        "tk_why_memcg_begin",
        [TpBtf, RawTp],
        optional: true,
    ),
];

const EXAMPLES: &str = "  tracekit why --pid 4711 --duration 10s             # where its time goes, and who is behind each part
  tracekit why --pid 4711 --threads --detail --cpu --duration 10s   # per thread, with the fsyncs, stalls, devices and functions behind it
  tracekit why --comm postgres --interval 2s --duration 30s --json";

const NEEDS: &str = "root, or exactly CAP_BPF and CAP_PERFMON on a kernel with BTF (task_struct's \
pid and tgid offsets; the hooks are tp_btf, else raw_tp), plus read access to /proc/<pid>/task \
and, for the waits of threads blocked before the start, /proc/<tid>/stack.";

#[derive(clap::Args, Debug)]
#[command(after_help = tools::help_footer(EXAMPLES, NEEDS))]
pub struct Args {
    #[command(flatten)]
    pub common: Common,

    /// Part rows shown, most time first (0: all). JSON has every row.
    #[arg(long, default_value_t = 25, value_name = "N")]
    pub rows: usize,

    /// Also sample its CPU (`profile`'s sampler, same scope): the top functions of its running
    /// part, in the same windows.
    #[arg(long)]
    pub cpu: bool,

    /// Also run the collectors behind the blocked parts in the same windows: fsync-lat (which
    /// calls, on which files, how long) and memstall (which stall, which cgroup) for the same processes, and
    /// io-lat for the whole node (the devices it waits on and who else issues to them).
    #[arg(long)]
    pub detail: bool,
}

pub fn run(args: Args) -> Result<()> {
    tools::run_collectors(INFO.name, &args.common, |ctx| {
        let mut why = open_why(&args, ctx)?;
        let companions = detail::open(&args, ctx, &mut why.cannot);
        let mut all: Vec<Box<dyn Collector>> = vec![Box::new(why)];
        all.extend(companions);
        Ok(all)
    })
}

/// Loads why's programs, attaches them, and seeds the threads in scope.
pub fn open(args: &Args, ctx: &OpenCtx) -> Result<Box<dyn Collector>> {
    Ok(Box::new(open_why(args, ctx)?))
}

fn open_why(args: &Args, ctx: &OpenCtx) -> Result<Why> {
    let scope = &ctx.scope;
    if scope.by_container {
        return Err(Error::Usage(
            "why: --by container does not apply (rows are per process or, with --threads, per thread)".into(),
        ));
    }
    let plan = loader::plan(HOOKS, &ctx.env, &ctx.symbols)?;
    let btf = crate::kernel::btf::vmlinux().map_err(|e| {
        Error::KernelFeature(format!(
            "why needs the kernel's BTF to find task_struct.pid and .tgid ({}, or TRACEKIT_BTF): {e}",
            crate::kernel::btf::vmlinux_path().display()
        ))
    })?;
    let pid_off = btf.member("task_struct", "pid")?.offset;
    let tgid_off = btf.member("task_struct", "tgid")?.offset;
    // prev_state is sched_switch's 5th BTF parameter from 5.18 on (see tools::sched).
    let has_state = btf
        .proto_params("btf_trace_sched_switch")
        .is_none_or(|n| n >= 5);
    let task_cap = crate::tools::sched::task_cap();
    let spec = LoadSpec::new()
        .global("WHY_PID_OFF", &pid_off)
        .global("WHY_TGID_OFF", &tgid_off)
        .global("WHY_HAS_STATE", &u8::from(has_state))
        .max_entries("WHY_TASKS", task_cap)
        .max_entries("WHY_PARTS", scope.key_cap())
        .max_entries("WHY_BY", scope.key_cap())
        .tp_btf_planned(HOOKS, &plan);
    let mut session = Session::load(OBJECT, scope.filter(), spec)?;
    session.attach_planned(HOOKS, &plan)?;
    let parts = GenMap::take(
        &mut session,
        "WHY_PARTS",
        Some("WHY_OTHER"),
        WhyVal {
            comm: [0; 16],
            hist: LatHist::ZERO,
        },
    )?;
    let by = GenMap::take(&mut session, "WHY_BY", None, ByVal::default())?;
    let stacks = StackTraceMap::try_from(session.take_map("WHY_STACKS")?).context("WHY_STACKS")?;
    let mut why = Why {
        session,
        parts,
        by,
        stacks,
        symbols: Symbolizer::load().ok().filter(|s| !s.is_empty()),
        frames: HashMap::new(),
        seeds: HashMap::new(),
        carry: HashMap::new(),
        scope: scope.clone(),
        facts: ctx.facts.clone(),
        has_state,
        rows: args.rows,
        seeded: 0,
        cannot: Vec::new(),
        container: scope
            .container
            .as_deref()
            .and_then(|q| crate::host::container::pids_of(q).1),
    };
    why.seed()?;
    Ok(why)
}

struct Why {
    session: Session,
    parts: GenMap<WhyKey, WhyVal>,
    by: GenMap<ByKey, ByVal>,
    stacks: StackTraceMap<MapData>,
    symbols: Option<Symbolizer>,
    /// Kernel stacks by id, function names innermost first.
    frames: HashMap<i32, Rc<Vec<String>>>,
    /// The `/proc/<tid>/stack` of threads seeded blocked.
    seeds: HashMap<u32, Vec<String>>,
    /// Intervals still going at the last window's end, by tid.
    carry: HashMap<u32, Carry>,
    scope: Scope,
    facts: crate::host::facts::Facts,
    has_state: bool,
    rows: usize,
    seeded: usize,
    /// Companions of `--cpu`/`--detail` that could not run here, and why.
    cannot: Vec<String>,
    /// The container `--container` named.
    container: Option<std::sync::Arc<crate::host::container::Container>>,
}

impl Why {
    /// Seeds every thread in scope alive now (threads the kernel side already saw are kept).
    fn seed(&mut self) -> Result<()> {
        let now = crate::host::proc::mono_ns();
        let want = self.scope.comm_bytes();
        let map = self.session.map_mut("WHY_TASKS")?;
        let mut tasks: AyaHash<&mut MapData, u32, WhyTask> =
            AyaHash::try_from(map).context("WHY_TASKS")?;
        for pid in processes(&self.scope) {
            let Ok(dir) = std::fs::read_dir(crate::host::proc_path(&format!("{pid}/task"))) else {
                continue;
            };
            for tid in dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok()) {
                let Some((state, comm, stack)) = seed_of(pid, tid) else {
                    continue;
                };
                let mut c = [0u8; 16];
                let n = comm.len().min(15);
                c[..n].copy_from_slice(&comm[..n]);
                if want.is_some_and(|w| w != c) {
                    continue;
                }
                let t = WhyTask {
                    since_ns: now,
                    tgid: pid,
                    state,
                    stack: NO_STACK,
                    mem: 0,
                    comm: c,
                };
                // BPF_NOEXIST: a thread the programs saw since the attach keeps its state.
                if tasks.insert(tid, t, 1).is_ok() {
                    self.seeded += 1;
                    if state == BLOCKED_BEFORE {
                        self.seeds.insert(tid, stack);
                    }
                }
            }
        }
        Ok(())
    }

    /// Function names of kernel stack `id`, innermost first (cached; empty when unknown).
    fn stack(&mut self, id: i32) -> Rc<Vec<String>> {
        if let Some(f) = self.frames.get(&id) {
            return f.clone();
        }
        let names: Vec<String> = match (
            &self.symbols,
            crate::tools::profile::stacks::stack_ips(&self.stacks, id),
        ) {
            (Some(sym), Some(ips)) => ips
                .iter()
                .filter_map(|&ip| sym.function(ip).map(str::to_string))
                .collect(),
            _ => Vec::new(),
        };
        let f = Rc::new(names);
        if id != NO_STACK {
            self.frames.insert(id, f.clone());
        }
        f
    }

    /// The part and kind of wait of a state (and stack) of thread `tid`.
    fn class_of(
        &mut self,
        state: u32,
        stack: i32,
        tid: u32,
        sockets: &mut HashMap<u32, bool>,
        tgid: u32,
    ) -> (Part, String) {
        match state {
            RUNNING => (Part::Running, "on CPU".into()),
            RUNNABLE_WAKEUP => (Part::Runnable, "after wakeup".into()),
            RUNNABLE_PREEMPT => (Part::Runnable, "after preemption".into()),
            // On a CPU inside reclaim: the same kind of wait as a block in it.
            RECLAIM_RUN if stack == MEM_DIRECT as i32 => (Part::Memory, "direct reclaim".into()),
            RECLAIM_RUN => (Part::Memory, "memcg reclaim".into()),
            BLOCKED_BEFORE => {
                let s = *sockets.entry(tgid).or_insert_with(|| holds_sockets(tgid));
                let f = self.seeds.get(&tid).cloned().unwrap_or_default();
                let refs: Vec<&str> = f.iter().map(String::as_str).collect();
                let mut c = classify(&refs, s);
                if refs.is_empty() {
                    c.what = "[blocked before tracing, stack unknown]".into();
                }
                (c.part, c.what)
            }
            _ => {
                let s = *sockets.entry(tgid).or_insert_with(|| holds_sockets(tgid));
                let f = if stack == NO_STACK {
                    Rc::new(Vec::new())
                } else {
                    self.stack(stack)
                };
                let refs: Vec<&str> = f.iter().map(String::as_str).collect();
                let c = classify(&refs, s);
                (c.part, c.what)
            }
        }
    }

    /// The per-thread state map now.
    fn tasks(&mut self) -> Result<Vec<(u32, WhyTask)>> {
        let map = self.session.map_mut("WHY_TASKS")?;
        let tasks: AyaHash<&mut MapData, u32, WhyTask> =
            AyaHash::try_from(map).context("WHY_TASKS")?;
        Ok(tasks.iter().filter_map(|r| r.ok()).collect())
    }

    /// Forgets a thread the kernel side still holds although it is gone (kernels without
    /// `prev_state` cannot tell an exit's last switch-out from a block).
    fn forget(&mut self, tid: u32) -> Result<()> {
        let map = self.session.map_mut("WHY_TASKS")?;
        let mut tasks: AyaHash<&mut MapData, u32, WhyTask> =
            AyaHash::try_from(map).context("WHY_TASKS")?;
        let _ = tasks.remove(&tid);
        Ok(())
    }
}

impl Collector for Why {
    fn name(&self) -> &'static str {
        INFO.name
    }

    fn meta(&self) -> Meta {
        Meta::of(
            INFO.name,
            "wall-clock time by part: running, runnable, storage, memory, lock, network, sleep, other",
            &self.scope,
            &self.session,
        )
        .with("seeded_threads", self.seeded)
    }

    fn session(&mut self) -> Option<&mut Session> {
        Some(&mut self.session)
    }

    /// Often enough to learn the facts (title, memory cgroup, container) of a process in scope
    /// that lives a fraction of a second, before it exits.
    fn poll_interval(&self) -> Option<std::time::Duration> {
        // Narrowed to a few processes, often; over the whole node (a walk of every thread's
        // state), once a second.
        let scoped = !self.scope.pids.is_empty() || self.scope.comm.is_some();
        Some(std::time::Duration::from_millis(if scoped {
            100
        } else {
            1000
        }))
    }

    fn on_events(&mut self) -> Result<()> {
        let tgids: std::collections::BTreeSet<u32> =
            self.tasks()?.into_iter().map(|(_, t)| t.tgid).collect();
        let mut facts = self.facts.lock();
        for tgid in tgids {
            if facts.known(tgid).is_none() {
                facts.learn(tgid);
                let _ = crate::host::container::of_pid(tgid);
            }
        }
        Ok(())
    }

    fn collect(&mut self, w: &Window) -> Result<Output> {
        let drained = self
            .parts
            .drain(self.session.drained())
            .context("reading WHY_PARTS")?;
        let by = self
            .by
            .drain(self.session.drained())
            .context("reading WHY_BY")?;
        let st = self.session.stats_delta()?;
        let (ws, we) = self.session.drained_span_ns();
        let secs = self.session.drained_secs();
        let mut sockets: HashMap<u32, bool> = HashMap::new();
        let mut acc: BTreeMap<u32, ThreadAcc> = BTreeMap::new();
        for (k, v) in &drained.rows {
            let (part, what) = self.class_of(k.state, k.stack, k.pid, &mut sockets, k.tgid);
            let t = acc.entry(k.pid).or_default();
            t.tgid = k.tgid;
            t.comm = crate::tools::row_comm(k.pid, k.tgid, true, &v.comm);
            t.add(part, &what, v.hist.sum as i128, Some(&v.hist));
        }
        for (k, v) in &by.rows {
            let (part, what) = self.class_of(k.state, k.stack, k.pid, &mut sockets, k.tgid);
            let t = acc.entry(k.pid).or_default();
            let wt = t.waits.entry((part, what)).or_default();
            let e = wt
                .by
                .entry((k.by_tgid, k.by_pid))
                .or_insert_with(|| (v.by_comm.to_vec(), 0));
            e.1 += v.ns;
        }
        // Intervals that were going at the last window's end and ended in this one: the
        // kernel counted them whole here; what the last window counted comes off.
        let tasks = self.tasks()?;
        let live: HashMap<u32, WhyTask> = tasks.iter().copied().collect();
        let mut pending: HashMap<u32, Carry> = HashMap::new();
        for (tid, c) in std::mem::take(&mut self.carry) {
            if live.get(&tid).is_some_and(|t| t.since_ns == c.since_ns) {
                continue;
            }
            let counted = ws.saturating_sub(c.since_ns) as i128;
            match acc.get_mut(&tid) {
                Some(t) if t.waits.contains_key(&(c.part, c.what.clone())) => {
                    t.add(c.part, &c.what, -counted, None)
                }
                Some(t)
                    if c.part == Part::Running
                        && t.waits
                            .contains_key(&(Part::Runnable, "after preemption".into())) =>
                {
                    t.add(Part::Runnable, "after preemption", -counted, None)
                }
                // Ended after this window's end (between the flip and the read above): the
                // next window has it.
                _ if crate::host::proc::exists(tid) => {
                    pending.insert(tid, c);
                }
                _ => {}
            }
        }
        // Intervals going now: their part inside this window counts here.
        for (tid, t) in tasks {
            if t.state == EXITING {
                continue;
            }
            if !crate::host::proc::exists(tid) {
                self.forget(tid)?;
                continue;
            }
            let (state, stack) = if t.state == RUNNING && t.mem != 0 {
                (RECLAIM_RUN, t.mem as i32)
            } else {
                (t.state, t.stack)
            };
            let (part, what) = self.class_of(state, stack, tid, &mut sockets, t.tgid);
            let inside = we.saturating_sub(t.since_ns.max(ws));
            if inside > 0 {
                let a = acc.entry(tid).or_default();
                a.tgid = t.tgid;
                if a.comm.is_empty() {
                    a.comm = crate::tools::row_comm(tid, t.tgid, true, &t.comm);
                }
                a.add(part, &what, inside as i128, None);
            }
            if !pending.contains_key(&tid) {
                self.carry.insert(
                    tid,
                    Carry {
                        since_ns: t.since_ns,
                        part,
                        what,
                    },
                );
            }
        }
        for (tid, c) in pending {
            self.carry.entry(tid).or_insert(c);
        }
        self.seeds.retain(|tid, _| self.carry.contains_key(tid));

        // Rows: per thread, or per process (its threads' times added).
        let threads = self.scope.threads;
        let mut groups: BTreeMap<u32, Group> = BTreeMap::new();
        for (tid, t) in &acc {
            let id = if threads { *tid } else { t.tgid };
            let g = groups
                .entry(id)
                .or_insert_with(|| (t.tgid, Vec::new(), 0, [0; 8], BTreeMap::new()));
            if g.1.is_empty() || *tid == t.tgid {
                g.1 = t.comm.clone();
            }
            g.2 += 1;
            for (i, n) in t.parts.iter().enumerate() {
                g.3[i] += n;
            }
            for (k, wt) in &t.waits {
                let e = g.4.entry(k.clone()).or_default();
                e.ns += wt.ns;
                e.hist.merge(&wt.hist);
                for (who, (comm, ns)) in &wt.by {
                    let b = e.by.entry(*who).or_insert_with(|| (comm.clone(), 0));
                    b.1 += ns;
                }
            }
        }
        let mut summaries = Vec::new();
        let mut part_rows = Vec::new();
        for (id, (tgid, comm, nthreads, parts, waits)) in groups {
            let title = Title::cached(&mut self.facts.lock(), tgid);
            let who = || {
                let mut who = Id::new(id, tgid, threads, comm.clone(), title.clone());
                // With --container every process in scope is the container's, those that
                // exited before they could be looked up too (a shell's short-lived children).
                if who.container.container.is_none() && self.container.is_some() {
                    who.container = InContainer::of(self.container.clone());
                }
                who
            };
            let mut s = SummaryRow::new(who(), nthreads, &parts);
            // Read again while it lives (it may have moved since it was first seen), else as
            // learnt.
            let cg = crate::host::facts::ProcFacts::read(tgid)
                .and_then(|f| f.cgroup)
                .or_else(|| self.facts.lock().get(tgid).and_then(|f| f.cgroup.clone()));
            s.cgroup = cg.map(|c| String::from_utf8_lossy(&c).into_owned());
            for ((part, what), wt) in waits {
                if wt.ns == 0 && wt.hist.count == 0 {
                    continue;
                }
                let mut r = PartRow::new(who(), part, what, wt.ns, s.wall_ns, &wt.hist);
                let total: u64 = wt.by.values().map(|(_, n)| n).sum();
                if let Some(((btgid, bpid), (bcomm, bns))) = wt
                    .by
                    .iter()
                    .max_by_key(|(k, (_, n))| (*n, std::cmp::Reverse(**k)))
                {
                    r.by_pid = Some(*btgid);
                    r.by_tid = Some(*bpid);
                    r.by_comm = Some(
                        String::from_utf8_lossy(bcomm.split(|&b| b == 0).next().unwrap_or(&[]))
                            .into_owned(),
                    );
                    r.by_ppm = Some(crate::report::units::ppm(*bns, total.max(1) as f64));
                }
                part_rows.push(r);
            }
            summaries.push(s);
        }
        summaries.sort_by(|a, b| b.wall_ns.cmp(&a.wall_ns).then(a.who.pid.cmp(&b.who.pid)));
        part_rows.sort_by(|a, b| {
            b.total_ns
                .cmp(&a.total_ns)
                .then(a.who.pid.cmp(&b.who.pid))
                .then(a.what.cmp(&b.what))
        });

        let mut out = Output::default();
        let missed = out.note_missed(&st, "thread", "");
        out.title = format!(
            "why: {} {}, {}; {} (traced {})",
            summaries.len(),
            if threads { "threads" } else { "processes" },
            self.scope.describe(),
            w.span(),
            fmt_ns(we.saturating_sub(ws))
        );
        out.notes.push(format!(
            "parts add up to each row's wall time (the time its threads existed in the window); an occurrence still going at the window's end counts here up to the end, its count and percentiles in the window where it ends; blocks whose wakeup was not seen run to the switch-in: {}; threads seen first mid-run: {}; culprits not recorded (map full): {}",
            st[STAT_NO_WAKEUP as usize], st[STAT_UNSEEN as usize], st[STAT_BY_FULL as usize]
        ));
        if !self.has_state {
            out.notes.push("this kernel does not pass sched_switch's prev_state (before 5.18): every switch-out that is not a preemption counts as a block".into());
        }
        if self.symbols.is_none() {
            out.notes.push("kernel symbols (/proc/kallsyms) unreadable: blocked time cannot be told apart and counts as other".into());
        }
        if drained.other.hist.count > 0 {
            out.notes.push(format!(
                "{} in {} occurrences did not fit the part map (--max-keys) and is left out of the rows",
                fmt_ns(drained.other.hist.sum),
                drained.other.hist.count
            ));
        }
        out.note_skipped(&self.session.skipped);
        out.notes.extend(self.cannot.iter().cloned());
        if summaries.is_empty() {
            out.notes
                .push("no thread in scope ran or waited in the window".into());
        }
        out.findings = findings::findings(&summaries, &part_rows, secs);
        let ctx = Ctx { secs };
        out.sections.push(
            Section::build(&SUMMARY_ROWS, &summaries, SUMMARIES, &ctx, 0)
                .caption("Where the time went (% of each row's wall time):"),
        );
        out.sections.push(
            Section::build(&PART_ROWS, &part_rows, PARTS, &ctx, self.rows)
                .caption("Each part by kind of wait, most time first (P50/P99/MAX per occurrence):")
                .with_dists(
                    &part_rows,
                    |r| format!("{} {} {}", r.who.id_text(), r.part, r.what),
                    |r| vec![("occurrence", r.hist)],
                ),
        );
        out.footnotes.push(legend());
        out.stats = Some(
            Stats::new(st)
                .with("events", st[stats::EVENTS as usize])
                .with("window_ns", we.saturating_sub(ws))
                .with("no_wakeup", st[STAT_NO_WAKEUP as usize])
                .with("unseen_threads", st[STAT_UNSEEN as usize])
                .with("culprits_lost", st[STAT_BY_FULL as usize])
                .with("missed", missed),
        );
        Ok(out)
    }
}

pub use crate::report::render::fmt_ns;
