//! One window of memstall: the kernel's aggregates drained into typed rows (stalled processes,
//! kernel threads, memory cgroups, OOM kills), the context (THP settings, `/proc/vmstat`), the
//! findings, and the stats line.

use std::collections::{BTreeMap, BTreeSet};

use crate::report::{
    schema::{Direction::*, Dist, Field, Rows},
    who::ID_FIELDS,
};
use probes_common::{
    hist::LatHist,
    memstall::{
        MsVal, KIND_COMPACTION, KIND_MEMCG_RECLAIM, KIND_NAMES, KIND_RECLAIM, KIND_THP_COLLAPSE,
        KIND_THP_FAULT, NKINDS, STAT_LIFE_MAP_FULL,
    },
    stats,
};
use serde::Serialize;
use serde_json::json;

use crate::{
    engine::{Output, Stats, Window},
    error::{Context as _, Result},
    host::{proc, thp::ThpSettings, vmstat::Vmstat},
    report::{
        hist::{self, Keyed, Stat},
        render::fmt_ns,
        rows::{id_columns, Column, Ctx, Section},
        sanitize::{self, name_fields},
        who::{Id, Title},
    },
    tools::row_comm,
};

use super::{
    findings::{self, CgFacts, Evidence, Oom, Subj},
    memcg::{cgroup_text, CgroupRow, OomRow, CGROUP_COLUMNS, OOM_COLUMNS},
    Memstall,
};

/// The `/proc/vmstat` counters memstall reports (`allocstall` is the sum of `allocstall_*`).
pub const VM_KEYS: &[&str] = &[
    "compact_stall",
    "compact_fail",
    "compact_success",
    "thp_fault_alloc",
    "thp_fault_fallback",
    "thp_collapse_alloc",
    "thp_collapse_alloc_failed",
    "allocstall",
    "pgscan_direct",
];

/// Said beside every vmstat line: a reader comparing with memcg reclaim must know.
pub const VM_NOTE: &str = "allocstall and pgscan_direct count global direct reclaim only: reclaim at a memory cgroup's limit is not in them";

/// Kernel threads that do memory work in the background, for rows whose process is gone.
fn kthread_by_name(comm: &[u8]) -> bool {
    [&b"kcompactd"[..], b"khugepaged", b"kswapd"]
        .iter()
        .any(|p| comm.starts_with(p))
}

/// One row: a process (or thread) and kind.
#[derive(Serialize)]
pub struct Row {
    #[serde(flatten)]
    who: Id,
    kind: &'static str,
    kthread: bool,
    cgroup: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cgroup_bytes: Option<Vec<u8>>,
    /// The memory cgroup's id as the kernel read it at the event.
    cgroup_id: u64,
    count: u64,
    timed: bool,
    /// `null` for kinds not timed (background THP work).
    #[serde(flatten)]
    lat: Keyed,
    stall_ns_per_s: Option<u64>,
    /// Time the process (or thread) was alive in the window.
    alive_ns: u64,
    /// Share of `alive_ns` stalled, in parts per million.
    time_ppm: Option<u64>,
    anon_huge_kb: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    outcomes: Option<BTreeMap<String, u64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    direct_stalls: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    zones: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reclaimed_pages: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    collapses: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    collapsed: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    scans: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    isolates: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    madvise_calls: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    fallbacks: Option<u64>,
    #[serde(skip)]
    id: u32,
    #[serde(skip)]
    kind_id: u32,
    #[serde(skip)]
    cgroup_raw: Option<Vec<u8>>,
    #[serde(skip)]
    hist: LatHist,
    #[serde(skip)]
    detail: String,
}

impl crate::report::rows::Row for Row {
    fn container(&self) -> Option<&crate::report::who::InContainer> {
        Some(&self.who.container)
    }
}

fn timed_cell(r: &Row, v: Option<u64>) -> String {
    match v {
        Some(v) if r.timed => fmt_ns(v),
        _ => "-".into(),
    }
}

/// The latency statistics a row carries, in the order of its JSON.
const STALL_STATS: &[Stat] = &[
    Stat::TotalNs,
    Stat::MeanNs,
    Stat::P50Ns,
    Stat::P90Ns,
    Stat::P99Ns,
    Stat::MaxNs,
    Stat::MinNs,
];

const MEMSTALL_SUMMARY: &[Field] = &[
    Field::key("cgroup_id"),
    Field::count("count", LowerIsBetter).export(
        "tracekit_memstall_stalls",
        "Memory stalls (direct compaction, reclaim, memcg reclaim, THP collapse).",
    ),
    Field::count("total_ns", LowerIsBetter),
    Field::stat("mean_ns"),
    Field::stat("p50_ns"),
    Field::stat("p90_ns"),
    Field::stat("p99_ns"),
    Field::stat("max_ns"),
    Field::stat("min_ns"),
    Field::stat("stall_ns_per_s"),
    Field::count("alive_ns", Neutral),
    Field::level("time_ppm", LowerIsBetter),
    Field::count("anon_huge_kb", Neutral),
    Field::count("direct_stalls", LowerIsBetter),
    Field::count("zones", Neutral),
    Field::level("reclaimed_pages", LowerIsBetter),
    Field::count("collapses", Neutral),
    Field::count("collapsed", Neutral),
    Field::count("scans", Neutral),
    Field::count("isolates", Neutral),
    Field::count("madvise_calls", Neutral),
    Field::count("fallbacks", Neutral),
];

/// The summary rows: per process (or thread) and kind of stall.
pub const SUMMARY_ROWS: Rows = Rows {
    kind: "summary",
    labels: &["kind"],
    fields: &[ID_FIELDS, MEMSTALL_SUMMARY],
    dists: &[Dist::exported(
        "stall",
        "tracekit_memstall_latency_seconds",
        "Duration of memory stalls.",
    )],
};

const COLUMNS: &[Column<Row>] = &[
    Column::right("PID", |r, _| r.who.id_text()),
    Column::left("COMM", |r, _| r.who.comm_text()),
    Column::left("KIND", |r, _| r.kind.to_string()),
    Column::right("COUNT", |r, _| {
        if r.timed {
            r.count.to_string()
        } else {
            "-".into()
        }
    }),
    Column::right("TOTAL", |r, _| timed_cell(r, r.lat.get(Stat::TotalNs))),
    Column::right("STALL/s", |r, _| timed_cell(r, r.stall_ns_per_s)),
    Column::right("%ALIVE", |r, _| match r.time_ppm {
        Some(p) if r.timed => format!("{:.1}", p as f64 / 1e4),
        _ => "-".into(),
    }),
    Column::right("P50", |r, _| timed_cell(r, r.lat.get(Stat::P50Ns))),
    Column::right("P99", |r, _| timed_cell(r, r.lat.get(Stat::P99Ns))),
    Column::right("MAX", |r, _| timed_cell(r, r.lat.get(Stat::MaxNs))),
    Column::right("THP_KB", |r, _| {
        r.anon_huge_kb
            .map(|k| k.to_string())
            .unwrap_or_else(|| "-".into())
    }),
    Column::left("CGROUP", |r, _| {
        cgroup_text(r.cgroup_raw.as_deref(), r.cgroup_id)
    }),
    Column::left("DETAIL", |r, _| r.detail.clone()),
];

const LEGEND: &str = "COUNT: timed stalls, which add up to the header's count (compaction: one per allocation that stalled in direct compaction, as /proc/vmstat compact_stall counts them, the zones in DETAIL; compaction that served no allocation, e.g. kcompactd or a write to compact_memory: one per zone; thp_collapse: MADV_COLLAPSE calls, the collapse attempts in DETAIL; thp_fault: whole 2 MiB faults, allocation with its compaction and reclaim, zeroing and mapping; `-`: background work, not timed). STALL/s: stall time per second of the window. %ALIVE: share of the time the process was alive in the window. THP_KB: AnonHugePages (KiB) from smaps_rollup, last read while the process lived. CGROUP: the memory cgroup the kernel saw at the event.";

/// What a row needs besides its value.
struct RowIn<'a> {
    id: u32,
    kind: u32,
    v: &'a MsVal,
    comm: Vec<u8>,
    title: Title,
    kthread: bool,
    cgroup: Option<Vec<u8>>,
    alive_ns: u64,
    anon_huge_kb: Option<u64>,
    threads: bool,
    secs: f64,
}

impl Memstall {
    fn outcome_map(&self, v: &MsVal) -> BTreeMap<String, u64> {
        v.outcomes
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(i, n)| {
                let name = self
                    .outcome_names
                    .get(&i)
                    .cloned()
                    .unwrap_or_else(|| format!("status_{i}"));
                (name, *n)
            })
            .collect()
    }

    fn row(&self, r: RowIn) -> Row {
        let v = r.v;
        let s = hist::stats(&v.hist);
        let timed = r.kind != KIND_THP_COLLAPSE || s.count > 0;
        let t = |x: u64| timed.then_some(x);
        let per_s = (s.total_ns as f64 / r.secs).round() as u64;
        let is = |k: u32| r.kind == k;
        let outcomes = self.outcome_map(v);
        let detail = match r.kind {
            KIND_COMPACTION => {
                let o: Vec<String> = outcomes.iter().map(|(n, c)| format!("{n} {c}")).collect();
                let o = if o.is_empty() {
                    String::new()
                } else {
                    format!(": {}", o.join(", "))
                };
                if v.direct > 0 {
                    format!("{} allocation stall(s), {} zone(s){o}", v.direct, v.zones())
                } else {
                    format!("{} zone(s), for no allocation{o}", v.zones())
                }
            }
            KIND_RECLAIM | KIND_MEMCG_RECLAIM => format!("{} pages reclaimed", v.reclaimed),
            KIND_THP_COLLAPSE => format!(
                "{}/{} collapsed, {} scans, {} isolates{}",
                v.collapsed,
                v.collapses,
                v.scans,
                v.isolates,
                if s.count > 0 {
                    format!(", {} MADV_COLLAPSE calls", s.count)
                } else {
                    String::new()
                }
            ),
            KIND_THP_FAULT => format!("{} fell back to small pages", v.fallbacks),
            _ => String::new(),
        };
        let lat = Keyed::new("", s.clone(), STALL_STATS);
        let (cgroup, cgroup_bytes) = match &r.cgroup {
            Some(p) => {
                let (c, b) = name_fields(p);
                (Some(c), b)
            }
            None => (None, None),
        };
        Row {
            who: Id::new(
                r.id,
                if r.threads { v.tgid } else { r.id },
                r.threads,
                r.comm,
                r.title,
            ),
            kind: KIND_NAMES.get(r.kind as usize).copied().unwrap_or("all"),
            kthread: r.kthread,
            cgroup,
            cgroup_bytes,
            cgroup_id: v.cgroup_id,
            count: s.count,
            timed,
            lat: if timed { lat } else { lat.unmeasured() },
            stall_ns_per_s: t(per_s),
            alive_ns: r.alive_ns,
            time_ppm: t(crate::report::units::ppm(
                s.total_ns,
                r.alive_ns.max(1) as f64,
            )),
            anon_huge_kb: r.anon_huge_kb,
            outcomes: is(KIND_COMPACTION).then_some(outcomes),
            direct_stalls: is(KIND_COMPACTION).then_some(v.direct),
            zones: is(KIND_COMPACTION).then_some(v.zones()),
            reclaimed_pages: (is(KIND_RECLAIM) || is(KIND_MEMCG_RECLAIM)).then_some(v.reclaimed),
            collapses: is(KIND_THP_COLLAPSE).then_some(v.collapses),
            collapsed: is(KIND_THP_COLLAPSE).then_some(v.collapsed),
            scans: is(KIND_THP_COLLAPSE).then_some(v.scans),
            isolates: is(KIND_THP_COLLAPSE).then_some(v.isolates),
            madvise_calls: is(KIND_THP_COLLAPSE).then_some(s.count),
            fallbacks: is(KIND_THP_FAULT).then_some(v.fallbacks),
            id: r.id,
            kind_id: r.kind,
            cgroup_raw: r.cgroup,
            hist: v.hist,
            detail,
        }
    }

    /// Time `id` was alive in the window [`start`, `end`] (monotonic ns): from its start (or the
    /// window's) to its exit (or the window's end); the whole window when unknown.
    fn alive_ns(&self, id: u32, tgid: u32, start: u64, end: u64) -> u64 {
        let window = end.saturating_sub(start);
        let Ok(l) = self.life.get(&id, 0) else {
            return window;
        };
        let from = l.start_ns.max(start);
        let to = if l.exit_ns != 0 && !self.lives(id, tgid) {
            l.exit_ns.min(end)
        } else {
            end
        };
        to.saturating_sub(from)
            .clamp(1_000.min(window), window.max(1))
    }

    fn lives(&self, id: u32, tgid: u32) -> bool {
        if self.scope.threads {
            crate::host::proc_path(&format!("{tgid}/task/{id}")).exists()
        } else {
            proc::exists(id)
        }
    }

    /// Forgets the lifetimes of processes that have exited.
    fn trim_lifetimes(&mut self) {
        let gone: Vec<u32> = self
            .life
            .iter()
            .filter_map(|e| e.ok())
            .filter(|(id, l)| l.exit_ns != 0 && !crate::host::proc_path(&id.to_string()).exists())
            .map(|(id, _)| id)
            .collect();
        for id in gone {
            let _ = self.life.remove(&id);
        }
    }

    /// Everything recorded in the window that just ended.
    pub(super) fn report(&mut self, w: &Window) -> Result<Output> {
        let drained = self
            .hist
            .drain(self.session.drained())
            .context("reading MS_HIST")?;
        let st = self.session.stats_delta()?;
        let vm_now = Vmstat::read().unwrap_or_default();
        let vm = vm_now.since(&self.vm_prev).select(VM_KEYS);
        self.vm_prev = vm_now;
        let thp = ThpSettings::read();
        let secs = w.secs();
        let (ws, we) = (self.win_start_ns, self.flip_ns);
        let threads = self.scope.threads;

        let mut merged: BTreeMap<(u32, u32), MsVal> = BTreeMap::new();
        self.fold.end_window();
        for (k, v) in &drained.rows {
            // Per process (or thread), or per container's representative (--by container).
            let rep = self.fold.rep(v.tgid);
            let id = if self.fold.on() { rep } else { k.id };
            merged
                .entry((id, k.kind))
                .and_modify(|m| m.merge(v))
                .or_insert(MsVal { tgid: rep, ..*v });
        }
        let mut rows = Vec::new();
        for ((id, kind), v) in &merged {
            let facts = self.facts.lock().get(v.tgid).cloned();
            let comm = row_comm(*id, v.tgid, threads, &v.comm);
            let cgroup = if self.cgroups.reads_proc() {
                facts.as_ref().and_then(|f| f.cgroup.clone())
            } else {
                self.cgroups.path(v.cgroup_id)
            };
            if let Some(kb) = proc::anon_huge_kb(v.tgid) {
                self.thp_kb.insert(v.tgid, kb);
            }
            let title = Title::of_or(
                v.tgid,
                facts.as_ref().map(|f| f.cmdline.as_slice()).unwrap_or(&[]),
            );
            let r = RowIn {
                id: *id,
                kind: *kind,
                v,
                title,
                kthread: facts
                    .map(|f| f.kthread)
                    .unwrap_or_else(|| kthread_by_name(&comm)),
                comm,
                cgroup,
                alive_ns: self.alive_ns(*id, v.tgid, ws, we),
                anon_huge_kb: self.thp_kb.get(&v.tgid).copied(),
                threads,
                secs,
            };
            let mut row = self.row(r);
            self.fold.relabel(&mut row.who);
            rows.push(row);
        }
        let o = drained.other;
        if o.hist.count > 0 || o.collapses > 0 || o.scans > 0 {
            let mut r = self.row(RowIn {
                id: 0,
                kind: NKINDS,
                v: &o,
                comm: b"[other]".to_vec(),
                title: Title::default(),
                kthread: false,
                cgroup: None,
                alive_ns: we.saturating_sub(ws),
                anon_huge_kb: None,
                threads: false,
                secs,
            });
            r.who.pid = 0;
            rows.push(r);
        }
        rows.sort_by(|a, b| {
            b.lat
                .s
                .total_ns
                .cmp(&a.lat.s.total_ns)
                .then(b.collapses.cmp(&a.collapses))
                .then(a.id.cmp(&b.id))
                .then(a.kind_id.cmp(&b.kind_id))
        });
        self.trim_lifetimes();
        let ooms = self.oom_rows();
        let cgroups = self.cgroup_rows(&rows, &ooms);
        self.assemble(w, st, rows, ooms, cgroups, vm, thp)
    }

    fn oom_rows(&mut self) -> Vec<OomRow> {
        let kills = std::mem::take(&mut self.oom_kills);
        kills
            .iter()
            .map(|e| {
                let mut comm = sanitize::comm_bytes(&e.victim_comm).to_vec();
                let facts = self.facts.lock().known(e.victim_pid).cloned();
                if comm.is_empty() {
                    comm = facts.as_ref().map(|f| f.comm.clone()).unwrap_or_default();
                }
                let cgroup = if self.cgroups.reads_proc() {
                    facts.and_then(|f| f.cgroup)
                } else {
                    self.cgroups.path(e.cgroup.id)
                };
                OomRow::new(e, comm, cgroup)
            })
            .collect()
    }

    fn cgroup_rows(&mut self, rows: &[Row], ooms: &[OomRow]) -> Vec<CgroupRow> {
        let mut paths: BTreeSet<Vec<u8>> = rows
            .iter()
            .filter(|r| r.kind_id == KIND_MEMCG_RECLAIM)
            .filter_map(|r| r.cgroup_raw.clone())
            .collect();
        paths.extend(ooms.iter().filter_map(|o| o.cgroup_raw.clone()));
        paths
            .into_iter()
            .map(|p| {
                let reclaiming = rows
                    .iter()
                    .filter(|r| {
                        r.kind_id == KIND_MEMCG_RECLAIM && r.cgroup_raw.as_ref() == Some(&p)
                    })
                    .count();
                let kills = ooms
                    .iter()
                    .filter(|o| o.cgroup_raw.as_ref() == Some(&p))
                    .count();
                if self.cgroups.reads_proc() {
                    self.cgroups.first_seen(&p);
                }
                let c = self.cgroups.window_counters(&p);
                CgroupRow::new(&p, c, reclaiming, kills)
            })
            .collect()
    }
}

impl Memstall {
    #[allow(clippy::too_many_arguments)]
    fn assemble(
        &mut self,
        w: &Window,
        st: [u64; stats::NSTATS as usize],
        rows: Vec<Row>,
        ooms: Vec<OomRow>,
        cgroups: Vec<CgroupRow>,
        vm: Vmstat,
        thp: ThpSettings,
    ) -> Result<Output> {
        let secs = w.secs();
        let mut out = Output::default();
        let stalls: u64 = rows.iter().map(|r| r.lat.s.count).sum();
        let missed = out.note_missed(&st, "event", " (cgroup names may be missing)");
        out.title = format!(
            "memstall: {stalls} timed stalls in {}; {}; missed {missed}",
            self.scope.describe(),
            w.span()
        );
        out.note_skipped(&self.session.skipped);
        out.notes.extend(self.setup_notes.iter().cloned());
        let thp_changed = thp != self.thp_start;
        out.notes.push(format!(
            "THP: {}{}",
            thp.text(),
            if thp_changed {
                format!(
                    " (changed during the run; at start: {})",
                    self.thp_start.text()
                )
            } else {
                String::new()
            }
        ));
        let cites: Vec<String> = VM_KEYS.iter().map(|k| vm.cite(k)).collect();
        out.notes.push(format!(
            "/proc/vmstat over the window: {} ({VM_NOTE}).",
            cites.join(", ")
        ));
        let faults =
            vm.get("thp_fault_alloc").unwrap_or(0) + vm.get("thp_fault_fallback").unwrap_or(0);
        if !self.fault_timed && faults > 0 {
            out.notes.push(format!(
                "THP faults: {}, {}; a whole fault is not timed on this kernel (that needs fentry or kprobes on do_huge_pmd_anonymous_page): the direct compaction and reclaim inside faults are in those rows, the zeroing of 2 MiB per fault is not.",
                vm.cite("thp_fault_alloc"),
                vm.cite("thp_fault_fallback")
            ));
        }

        let subj: Vec<Subj> = rows
            .iter()
            .filter(|r| r.kind_id < NKINDS && r.who.processes.is_none())
            .map(|r| Subj {
                pid: r.who.pid,
                comm: sanitize::text(&r.who.comm_raw),
                title: r.who.title.clone(),
                container: r.who.container.get().cloned(),
                kind: r.kind_id,
                kthread: r.kthread,
                cgroup: r.cgroup_raw.as_deref().map(sanitize::text),
                count: r.lat.s.count,
                total_ns: r.lat.s.total_ns,
                p50_ns: r.lat.s.p50_ns,
                p99_ns: r.lat.s.p99_ns,
                max_ns: r.lat.s.max_ns,
                alive_ns: r.alive_ns,
                direct: r.direct_stalls.unwrap_or(0),
                zones: r.zones.unwrap_or(0),
                reclaimed_pages: r.reclaimed_pages.unwrap_or(0),
                collapses: r.collapses.unwrap_or(0),
                collapsed: r.collapsed.unwrap_or(0),
                scans: r.scans.unwrap_or(0),
                fallbacks: r.fallbacks.unwrap_or(0),
            })
            .collect();
        let cgf: Vec<CgFacts> = cgroups
            .iter()
            .map(|c| CgFacts {
                path: sanitize::text(&c.path),
                failcnt: c.failcnt_delta,
                max: c.events_delta.get("max").copied(),
                oom_kill: c.events_delta.get("oom_kill").copied(),
            })
            .collect();
        let oomf: Vec<Oom> = ooms
            .iter()
            .map(|o| Oom {
                pid: o.pid,
                comm: sanitize::text(&o.comm_raw),
                cgroup: o.cgroup_raw.as_deref().map(sanitize::text),
                killer: sanitize::text(&o.killer_raw),
            })
            .collect();
        let (findings, notes) = findings::findings(&Evidence {
            secs,
            thp: &thp,
            vm: &vm,
            rows: &subj,
            cgroups: &cgf,
            ooms: &oomf,
            per_allocation: self.per_allocation,
        });
        out.notes.extend(notes);
        out.findings = findings;

        let ctx = Ctx { secs };
        let (kthreads, user): (Vec<Row>, Vec<Row>) = rows.into_iter().partition(|r| r.kthread);
        for (rs, caption) in [
            (&user, "Stalled processes:"),
            (
                &kthreads,
                "Kernel threads (background work, no application waits on it):",
            ),
        ] {
            let cols = id_columns(COLUMNS, self.scope.threads);
            out.sections.push(
                Section::build(&SUMMARY_ROWS, rs, &cols, &ctx, self.max_rows)
                    .caption(caption)
                    .with_dists(
                        rs,
                        |r| format!("{} {} {}", r.kind, r.id, sanitize::text(&r.who.comm_raw)),
                        |r| {
                            if r.timed {
                                vec![("stall", r.hist)]
                            } else {
                                Vec::new()
                            }
                        },
                    ),
            );
        }
        out.sections.push(
            Section::build(&super::memcg::CGROUP_ROWS, &cgroups, CGROUP_COLUMNS, &ctx, 0).caption(
                "Memory cgroups (counters cumulative; (+growth) over the window, or since the run began for a cgroup first seen in it):",
            ),
        );
        out.sections.push(
            Section::build(&super::memcg::OOM_ROWS, &ooms, OOM_COLUMNS, &ctx, 0)
                .caption("OOM kills:"),
        );
        out.footnotes.push(LEGEND.into());
        out.extra_json.push(json!({
            "type": "context",
            "thp": thp,
            "thp_changed": thp_changed,
            "vmstat_delta": vm.0,
            "vmstat_note": VM_NOTE,
            "madv_collapse": self.madv_collapse,
            "notes": out.notes,
        }));
        out.stats = Some(
            Stats::new(st)
                .with("stalls", stalls)
                .with("missed", missed)
                .with("oom_kills", ooms.len())
                .with("life_map_full", st[STAT_LIFE_MAP_FULL as usize]),
        );
        Ok(out)
    }
}
