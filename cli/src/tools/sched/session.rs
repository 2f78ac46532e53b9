//! The loaded `sched` object, shared by every collector of one run that reads it: `triage`,
//! `serve` and `record` run ctxsw and runq-lat together, and before this each loaded its own
//! copy, so every context switch ran two `sched_switch` programs reading the same task fields
//! and the clock twice. Now the first to open loads the object with what it records; a second
//! with more to record reloads it once, at open, with the union (one program per hook, doing
//! both tools' work); each window is drained once and every collector reads that drain.

use std::{cell::RefCell, collections::BTreeMap, rc::Rc};

use probes_common::{
    numa::{NumaKey, NumaVal},
    sched::{PairKey, PairVal, SchedKey, SchedVal},
    stats::NSTATS,
};

use super::{
    alive, hooks_for, node_has_steal, row, steal_offsets, task_cap, task_offsets, wake_slots, Cap,
    Pair, Record, Row, WakeFrom, Who, CULPRIT_MIN_NS, OBJECT, STEAL_HOOK,
};
use crate::{
    engine::{Meta, Scope},
    error::{Error, Result},
    kernel::{
        loader::{self, LoadSpec, Session},
        maps::GenMap,
    },
    report::{
        sanitize,
        who::{Folding, Title},
    },
    tools::{row_comm, OpenCtx},
};

/// One window: per-task rows (the `[other]` row last, if non-empty), pairs, and what the
/// programs could not record.
pub struct Interval {
    pub rows: Vec<Row>,
    /// Every task id the window counted, sorted: the rows' and those summed into `[other]` by
    /// the row cap (a pair's end is "in scope" when it is here).
    pub ids: Vec<u32>,
    /// Tasks summed into the `[other]` row by the row cap (see [`Cap`]), not by the kernel.
    pub folded: usize,
    /// The kernel's names of those tasks, for the peers that name them (most have exited).
    pub folded_names: Vec<(u32, Vec<u8>)>,
    pub preemptors: Vec<Pair>,
    pub culprits: Vec<Pair>,
    /// As `culprits`, over the waits of `harm::LATE_FLOOR_NS` or more.
    pub late_culprits: Vec<Pair>,
    pub wakers: Vec<Pair>,
    pub stats: [u64; NSTATS as usize],
}

/// The object one run shares (see the module's doc), kept by [`OpenCtx`] while collectors open.
#[derive(Default)]
pub struct Pool(RefCell<Option<Rc<RefCell<Core>>>>);

/// What one window's drain read from the maps, before any collector's row cap.
struct Raw {
    span: (u64, u64),
    rows: Vec<(SchedKey, SchedVal)>,
    other: SchedVal,
    preemptors: Vec<Pair>,
    culprits: Vec<Pair>,
    late_culprits: Vec<Pair>,
    wakers: Vec<Pair>,
    /// On-CPU time per node ([`Record::node_time`]).
    node_rows: Vec<(NumaKey, NumaVal)>,
    node_other: NumaVal,
    stats: [u64; NSTATS as usize],
}

/// One window of node time as the shared object recorded it for `numa`.
pub struct NodeDrain {
    pub rows: Vec<(NumaKey, NumaVal)>,
    /// What did not fit the map (the `[other]` row).
    pub other: NumaVal,
    /// The object's counters of what it could not record (`numa::STAT_*` slots included).
    pub stats: [u64; NSTATS as usize],
}

/// The loaded object and its maps.
struct Core {
    session: Session,
    agg: GenMap<SchedKey, SchedVal>,
    preemptors: Option<GenMap<PairKey, PairVal>>,
    culprits: Option<GenMap<PairKey, PairVal>>,
    late_culprits: Option<GenMap<PairKey, PairVal>>,
    wakers: Option<GenMap<PairKey, PairVal>>,
    node: Option<GenMap<NumaKey, NumaVal>>,
    /// What the programs record: the union of every reader's [`Record`].
    record: Record,
    /// What a skipped optional hook costs the report.
    notes: Vec<String>,
    /// Waits after a wakeup are timed on the wall clock (the wakeup hooks attached).
    wall_clock: bool,
    /// Collectors reading it.
    readers: usize,
    /// Windows ended ([`SchedSession::flip`]) and drained: a reader that finds `drained <
    /// flips` drains the maps for every reader.
    flips: u64,
    drained: u64,
    /// The last drain, until every reader has taken it (a fork storm's is megabytes).
    raw: Option<Rc<Raw>>,
    taken: usize,
}

fn pair_map(
    s: &mut Session,
    name: &'static str,
    on: bool,
) -> Result<Option<GenMap<PairKey, PairVal>>> {
    if !on {
        return Ok(None);
    }
    Ok(Some(GenMap::take(s, name, None, PairVal::default())?))
}

impl Core {
    /// Loads the `sched` object recording `want` and attaches it as the attach policy chose
    /// on this kernel.
    fn load(ctx: &OpenCtx, want: Record) -> Result<Core> {
        let btf = crate::kernel::btf::vmlinux().map_err(|e| {
        Error::KernelFeature(format!(
            "the scheduler tools need the kernel's BTF to find task_struct fields ({}, or TRACEKIT_BTF): {e}",
            crate::kernel::btf::vmlinux_path().display()
        ))
    })?;
        let mut offs = task_offsets(btf)?;
        let mut notes = Vec::new();
        // Steal is charged where culprits are recorded on a guest that has any; elsewhere the
        // wakeup hook stays out (its `when`), and the meta line says why.
        let left_out = if !want.culprits {
            Some("this tool records no culprits".to_string())
        } else if !node_has_steal() {
            Some("this node has had no CPU steal since boot (/proc/stat)".to_string())
        } else if let Err(e) = steal_offsets(btf, &mut offs) {
            notes.push(format!(
            "CPU steal is charged to whoever held the CPU: this kernel has no run-queue steal clock ({e})"
        ));
            Some(format!("this kernel has no run-queue steal clock ({e})"))
        } else {
            None
        };
        let steal = left_out.is_none();
        let from_wakeup = want.wake_from == WakeFrom::Wakeup;
        let left_out = left_out.filter(|_| !from_wakeup);
        let hooks = hooks_for(steal, want.wake_from);
        let plan = loader::plan(&hooks, &ctx.env, &ctx.symbols)?;
        // `btf_trace_sched_switch` is (void *, bool preempt, prev, next[, unsigned int prev_state]);
        // prev_state was added in 5.18. Without BTF for it, assume the modern layout.
        let has_state = btf
            .proto_params("btf_trace_sched_switch")
            .is_none_or(|n| n >= 5);
        let start_ns = crate::host::proc::mono_ns();
        let scope = &ctx.scope;
        let slots = wake_slots();
        let spec = LoadSpec::new()
            .global("SCHED_OFFS", &offs)
            .global("SCHED_START_NS", &start_ns)
            .global("SCHED_PER_THREAD", &u8::from(scope.threads))
            .global("SCHED_PREEMPTORS", &u8::from(want.preemptors))
            .global("SCHED_CULPRITS", &u8::from(want.culprits))
            .global("SCHED_CULPRIT_MIN_NS", &CULPRIT_MIN_NS)
            .global("SCHED_LATE_MIN_NS", &crate::report::harm::LATE_FLOOR_NS)
            .global("SCHED_WAKERS", &u8::from(want.wakers))
            .global("SCHED_STEAL", &u8::from(steal))
            .global("SCHED_FROM_WAKEUP", &u8::from(from_wakeup))
            .global("SCHED_WAKE_MASK", &(slots - 1))
            .global("SCHED_HAS_STATE", &u8::from(has_state))
            .global("SCHED_NODE_TIME", &u8::from(want.node_time))
            .max_entries("TASKS", task_cap())
            .max_entries("WAKE", slots)
            .max_entries("SCHED_AGG", scope.key_cap())
            .max_entries("PREEMPTORS", scope.key_cap())
            .max_entries("CULPRITS", scope.key_cap())
            .max_entries("LATE_CULPRITS", scope.key_cap())
            .max_entries("WAKERS", scope.key_cap());
        let spec = if want.node_time {
            spec.max_entries("NUMA_AGG", scope.key_cap())
                .max_entries("CPU_NODE", crate::host::proc::possible_cpus() as u32)
        } else {
            spec
        }
        .tp_btf_planned(&hooks, &plan);
        let mut session = Session::load(OBJECT, scope.filter(), spec)?;
        if want.node_time {
            super::fill_cpu_node(&mut session, &crate::host::numa::Topology::read())?;
        }
        session.attach_planned(&hooks, &plan)?;
        session
            .left_out
            .extend(left_out.map(|why| (STEAL_HOOK, why)));
        let mut wall_clock = true;
        for (event, why) in &session.skipped {
            let cost = match *event {
            "sched:sched_process_free" => {
                "a reused tid may inherit an exited task's baseline".to_string()
            }
            "sched:sched_process_exec" => {
                "a process that exec'd may be shown under its name before the exec".to_string()
            }
            "sched:sched_process_exit" => {
                "a process that exited during a window is rated per second of the window from its start, not of its life".to_string()
            }
            STEAL_HOOK if from_wakeup => {
                return Err(Error::KernelFeature(format!(
                    "--from wakeup needs sched:sched_wakeup, which cannot be attached here ({why}); the default, --from waking, times waits from sched_waking"
                ))
                );
            }
            STEAL_HOOK => {
                "the hypervisor's steal is charged to whoever held the CPU, as without a steal clock".to_string()
            }
            _ => {
                wall_clock = false;
                "waits after a wakeup are the kernel's run_delay, which misses most of a wait after a wakeup that preempts".to_string()
            }
        };
            notes.push(format!("{event} unavailable ({why}): {cost}"));
        }
        let agg = GenMap::take(
            &mut session,
            "SCHED_AGG",
            Some("SCHED_OTHER"),
            SchedVal::ZERO,
        )?;
        let node = if want.node_time {
            Some(GenMap::take(
                &mut session,
                "NUMA_AGG",
                Some("NUMA_OTHER"),
                NumaVal::ZERO,
            )?)
        } else {
            None
        };
        Ok(Core {
            node,
            preemptors: pair_map(&mut session, "PREEMPTORS", want.preemptors)?,
            culprits: pair_map(&mut session, "CULPRITS", want.culprits)?,
            late_culprits: pair_map(&mut session, "LATE_CULPRITS", want.culprits)?,
            wakers: pair_map(&mut session, "WAKERS", want.wakers)?,
            session,
            agg,
            record: want,
            notes,
            wall_clock,
            readers: 0,
            flips: 0,
            drained: 0,
            raw: None,
            taken: 0,
        })
    }

    /// This window's drain: read from the maps by the first reader to ask, kept until the last
    /// has taken it.
    fn raw(&mut self) -> Result<Rc<Raw>> {
        if self.drained < self.flips || self.raw.is_none() {
            self.raw = Some(Rc::new(self.drain()?));
            self.drained = self.flips;
            self.taken = 0;
        }
        let raw = self.raw.clone().expect("drained above");
        self.taken += 1;
        if self.taken >= self.readers {
            self.raw = None;
        }
        Ok(raw)
    }

    fn drain(&mut self) -> Result<Raw> {
        let gen = self.session.drained();
        let drained = self.agg.drain(gen)?;
        let node = match self.node.as_mut() {
            Some(m) => m.drain(gen)?,
            None => crate::kernel::maps::Drained {
                rows: Vec::new(),
                other: NumaVal::ZERO,
            },
        };
        Ok(Raw {
            node_rows: node.rows,
            node_other: node.other,
            span: self.session.drained_span_ns(),
            rows: drained.rows,
            other: drained.other,
            preemptors: drain_pairs(&mut self.preemptors, gen)?,
            culprits: drain_pairs(&mut self.culprits, gen)?,
            late_culprits: drain_pairs(&mut self.late_culprits, gen)?,
            wakers: drain_pairs(&mut self.wakers, gen)?,
            stats: self.session.stats_delta()?,
        })
    }
}

/// Loads (or joins) the run's `sched` object for a collector recording `record`: the first
/// collector of a run loads it; a later one with the same `--from` joins it, reloading it
/// once with the union when it records more. Tools that time waits from another event load
/// their own.
pub fn open(ctx: &OpenCtx, record: Record) -> Result<SchedSession> {
    let mut pool = ctx.sched.0.borrow_mut();
    let shared = pool
        .as_ref()
        .filter(|c| c.borrow().record.wake_from == record.wake_from)
        .cloned();
    let (core, owner) = match shared {
        Some(core) => {
            let loaded = core.borrow().record;
            let want = loaded.union(record);
            if want != loaded {
                // Before any window: the old programs are detached as the new ones are in.
                let fresh = Core::load(ctx, want)?;
                let readers = core.borrow().readers;
                *core.borrow_mut() = Core { readers, ..fresh };
            }
            (core, false)
        }
        None => {
            let core = Rc::new(RefCell::new(Core::load(ctx, record)?));
            if pool.is_none() {
                *pool = Some(core.clone());
            }
            (core, true)
        }
    };
    core.borrow_mut().readers += 1;
    Ok(SchedSession {
        core,
        owner,
        record,
        scope: ctx.scope.clone(),
        facts: ctx.facts.clone(),
        fold: Folding::new(ctx.scope.by_container),
    })
}

/// `numa`'s way in: when a collector of this run has loaded the `sched` object, the node time
/// is recorded by its `sched_switch` program (reloaded once with it, at open) instead of a
/// program of numa's own; `None` when none has (numa then attaches its own).
pub fn join_node_time(ctx: &OpenCtx) -> Result<Option<SchedSession>> {
    let loaded = ctx.sched.0.borrow().as_ref().map(|c| c.borrow().record);
    let Some(loaded) = loaded else {
        return Ok(None);
    };
    let record = Record {
        preemptors: false,
        culprits: false,
        wakers: false,
        wake_from: loaded.wake_from,
        node_time: true,
    };
    open(ctx, record).map(Some)
}

/// One collector's handle on the run's `sched` object.
pub struct SchedSession {
    core: Rc<RefCell<Core>>,
    /// The collector that loaded it ends its windows, refreshes its pid filter and counts its
    /// links for everyone.
    owner: bool,
    /// What this collector records (the object may record more for another).
    record: Record,
    pub scope: Scope,
    facts: crate::host::facts::Facts,
    /// `--by container`: rows fold per container.
    pub fold: Folding,
}

fn drain_pairs(m: &mut Option<GenMap<PairKey, PairVal>>, gen: u32) -> Result<Vec<Pair>> {
    let Some(m) = m.as_mut() else {
        return Ok(Vec::new());
    };
    let mut v: Vec<Pair> = m
        .drain(gen)?
        .rows
        .into_iter()
        .map(|(k, v)| Pair {
            a: k.a,
            a_tgid: k.a_tgid,
            b: k.b,
            b_tgid: k.b_tgid,
            count: v.count,
            ns: v.ns,
        })
        .collect();
    // Most time first, then most events: the order every list of peers shows.
    v.sort_by(|x, y| (y.ns, y.count, x.a, x.b).cmp(&(x.ns, x.count, y.a, y.b)));
    Ok(v)
}

impl SchedSession {
    /// The tasks recorded so far, in either generation: every row's id and every task seen
    /// holding a CPU a woken task waited for (their classes are learnt while they live).
    pub fn task_ids(&self) -> Vec<u32> {
        let core = self.core.borrow();
        let mut ids: Vec<u32> = core.agg.keys().into_iter().map(|k| k.id).collect();
        if self.record.culprits {
            for m in [&core.culprits, &core.late_culprits].into_iter().flatten() {
                ids.extend(m.keys().into_iter().map(|k| k.b));
            }
        }
        ids
    }

    /// This window's node time ([`join_node_time`]).
    pub fn drain_node(&mut self) -> Result<NodeDrain> {
        let raw = self.core.borrow_mut().raw()?;
        Ok(NodeDrain {
            rows: raw.node_rows.clone(),
            other: raw.node_other,
            stats: raw.stats,
        })
    }

    /// The collectors this object's programs serve (the meta line's `programs_shared`).
    pub fn readers(&self) -> usize {
        self.core.borrow().readers
    }

    /// Waits after a wakeup are timed on the wall clock (the wakeup hooks attached).
    pub fn wall_clock(&self) -> bool {
        self.core.borrow().wall_clock
    }

    /// Where waits after a wakeup start.
    pub fn wake_from(&self) -> WakeFrom {
        self.record.wake_from
    }

    /// A window's notes after the tool's own: what the skipped hooks cost, what the programs
    /// could not record ([`super::stats_notes`]), and `nothing` (`no context switches seen`)
    /// for a window without rows.
    pub fn window_notes(&self, iv: &Interval, nothing: Option<&str>) -> Vec<String> {
        let mut out = self.core.borrow().notes.clone();
        out.extend(super::stats_notes(&iv.stats));
        if iv.folded > 0 {
            out.push(format!(
                "{} {} with the least to show are summed in the [other] row ({} of {} resolved, the largest)",
                iv.folded,
                if self.scope.threads { "thread(s)" } else { "process(es)" },
                iv.ids.len() - iv.folded,
                iv.ids.len()
            ));
        }
        out.extend(nothing.map(str::to_string));
        out
    }

    /// Ends the window in the kernel (the collector that loaded the object does, once for
    /// every reader).
    pub fn flip(&mut self) -> Result<()> {
        if self.owner {
            let mut core = self.core.borrow_mut();
            core.session.flip_generation()?;
            core.flips += 1;
        }
        Ok(())
    }

    /// Refreshes the `--pid --children` filter (once, by the loader).
    pub fn set_filter_pids(&mut self, pids: &[u32]) -> Result<()> {
        if self.owner {
            self.core.borrow_mut().session.set_filter_pids(pids)?;
        }
        Ok(())
    }

    /// Links whose detach is slow (counted once, by the loader).
    pub fn slow_links(&self) -> usize {
        if self.owner {
            self.core.borrow().session.slow_links()
        } else {
            0
        }
    }

    /// What the window just flipped away from recorded, with at most `cap.rows` rows resolved
    /// in full (names, titles): the tasks largest by `cap.rank` and every task `cap.keep`
    /// accepts; the others are summed into the `[other]` row, so every total stays exact. The
    /// pairs are those this collector records, whatever the shared object records besides.
    pub fn drain(&mut self, cap: &Cap) -> Result<Interval> {
        let threads = self.scope.threads;
        let raw = self.core.borrow_mut().raw()?;
        let span = raw.span;
        let mut ids: Vec<u32> = raw.rows.iter().map(|(k, _)| k.id).collect();
        ids.sort_unstable();
        let mut other = raw.other;
        let mut folded = 0;
        let mut folded_names = Vec::new();
        let mut pick: Vec<usize> = (0..raw.rows.len()).collect();
        // A fork storm leaves tens of thousands of short-lived tasks in one window: ranking the
        // raw aggregates first spares reading /proc for, and copying, the ones never shown.
        if !self.fold.on() && raw.rows.len() > cap.rows {
            let rank = cap.rank;
            let rows = &raw.rows;
            pick.sort_unstable_by(|&a, &b| {
                rank(&rows[b].1)
                    .cmp(&rank(&rows[a].1))
                    .then(rows[a].0.id.cmp(&rows[b].0.id))
            });
            let mut kept = 0;
            pick.retain(|&i| {
                let (k, v) = &rows[i];
                if kept < cap.rows || (cap.keep)(v) {
                    kept += 1;
                    true
                } else {
                    other.add(v);
                    folded += 1;
                    folded_names.push((k.id, sanitize::comm_bytes(&v.comm).to_vec()));
                    false
                }
            });
        }
        let mut rows: Vec<Row> = pick
            .into_iter()
            .map(|i| {
                let (k, v) = &raw.rows[i];
                let comm = row_comm(k.id, v.tgid, threads, &v.comm);
                let from = sanitize::comm_bytes(&v.exec_from);
                let exec_from =
                    (!from.is_empty() && from != comm.as_slice()).then(|| from.to_vec());
                let title = Title::cached(&mut self.facts.lock(), v.tgid);
                row(k.id, v.tgid, comm, exec_from, title, v, alive(v, span))
            })
            .collect();
        if self.fold.on() {
            rows = self.fold_rows(rows, span);
        }
        if other.voluntary + other.involuntary > 0 || other.wake.count + other.preempt.count > 0 {
            rows.push(row(
                0,
                0,
                b"[other]".to_vec(),
                None,
                Title::default(),
                &other,
                span,
            ));
        }
        let mine = |on: bool, pairs: &Vec<Pair>| if on { pairs.clone() } else { Vec::new() };
        let r = self.record;
        Ok(Interval {
            rows,
            ids,
            folded,
            folded_names,
            preemptors: mine(r.preemptors, &raw.preemptors),
            culprits: mine(r.culprits, &raw.culprits),
            late_culprits: mine(r.culprits, &raw.late_culprits),
            wakers: mine(r.wakers, &raw.wakers),
            stats: raw.stats,
        })
    }

    /// `--by container`: one row per container's representative, its processes' counters
    /// summed and their histograms merged.
    fn fold_rows(&mut self, rows: Vec<Row>, span: (u64, u64)) -> Vec<Row> {
        self.fold.end_window();
        let mut by: BTreeMap<u32, Row> = BTreeMap::new();
        for r in rows {
            let rep = self.fold.rep(r.tgid);
            match by.get_mut(&rep) {
                Some(m) => m.v.add(&r.v),
                None => {
                    let comm = crate::host::proc::comm(rep).unwrap_or(r.comm.clone());
                    let title = Title::cached(&mut self.facts.lock(), rep);
                    by.insert(rep, row(rep, rep, comm, None, title, &r.v, span));
                }
            }
        }
        by.into_values().collect()
    }

    /// Who row `r` is: its process, or its container's row with `--by container`.
    pub fn who(&self, r: &Row) -> Who {
        let mut w = Who::of(r, self.scope.threads && !self.fold.on());
        self.fold.relabel(&mut w.id);
        w
    }

    /// The meta line: what was attached, and what a skipped hook costs.
    pub fn meta(&self, tool: &'static str, what: &str) -> Meta {
        let core = self.core.borrow();
        let meta = Meta::of(tool, what, &self.scope, &core.session)
            .with("notes", core.notes.clone())
            .with("programs_shared", core.readers > 1);
        self.record.wake_from.meta(meta, core.wall_clock)
    }
}
