//! `numa`'s rows, text columns and findings: pure functions of one window's numbers, tested on
//! fixtures below.

use crate::report::units::or_dash;
use crate::report::units::ppm;
use crate::report::{
    schema::{Direction::*, Field, Rows},
    who::ID_FIELDS,
};
use serde::Serialize;

use crate::{
    host::numa::{Allowed, Placement, TaskNuma},
    report::{
        findings::{Finding, Score, Subject},
        render::fmt_ns,
        rows::Column,
        sanitize,
        who::Id,
    },
};

use super::INFO;

/// One process (or thread) in one window.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SummaryRow {
    /// pid, tid (`--threads`), comm, title, container.
    #[serde(flatten)]
    pub who: Id,
    pub cpu_ns: u64,
    /// On-CPU time per node id (index = node id).
    pub cpu_ns_by_node: Vec<u64>,
    /// Resident KiB per node id, from numa_maps (`null`: not read this window).
    pub mem_kib_by_node: Option<Vec<u64>>,
    /// The node holding most of its memory.
    pub mem_node: Option<u32>,
    /// Share of CPU time on nodes other than `mem_node`, parts per million (`null`: memory
    /// unknown or none).
    pub remote_cpu_share_ppm: Option<u64>,
    /// NUMA hinting faults (`null`: no fentry/kprobe on `task_numa_fault` here).
    pub hint_faults: Option<u64>,
    pub hint_faults_local: Option<u64>,
    /// Pages its hinting faults migrated (same hook).
    pub hint_pages_migrated: Option<u64>,
    /// The same pages by destination node id (the node each page is on after its fault; the
    /// source node is not known): sums to `hint_pages_migrated`.
    pub pages_migrated_by_node: Option<Vec<u64>>,
    /// Pages NUMA balancing migrated in its context (`mm_migrate_pages`, NUMA_MISPLACED).
    pub pages_migrated: u64,
    pub pages_migrate_failed: u64,
    pub task_moves: u64,
    pub task_swaps: u64,
    pub task_sticks: u64,
    /// `Cpus_allowed_list` / `Mems_allowed_list` (read with numa_maps).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpus_allowed: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mems_allowed: Option<String>,
    /// Memory policy holding most of its memory (`default`, `bind:1`, `interleave:0-1`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mempolicy: Option<String>,
    /// From `/proc/<pid>/task/<tid>/sched`, where the kernel has them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preferred_node: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pages_migrated_life: Option<u64>,
    #[serde(skip)]
    pub id: u32,
}

impl crate::report::rows::Row for SummaryRow {
    fn container(&self) -> Option<&crate::report::who::InContainer> {
        Some(&self.who.container)
    }
}

/// What was read from /proc for one process at the end of a window.
#[derive(Clone, Debug, Default)]
pub struct ProcNuma {
    pub placement: Placement,
    pub allowed: Option<Allowed>,
    pub task: Option<TaskNuma>,
}

impl SummaryRow {
    /// Adds what /proc says about its process (`None`: not read this window).
    pub fn with_proc(mut self, p: Option<&ProcNuma>, nodes: usize) -> SummaryRow {
        let Some(p) = p else {
            return self;
        };
        let mut mem = vec![0u64; nodes];
        for (&n, &kib) in &p.placement.kib_by_node {
            if let Some(slot) = mem.get_mut(n as usize) {
                *slot += kib;
            }
        }
        self.mem_node = p.placement.main_node().map(|(n, _)| n);
        self.remote_cpu_share_ppm = self.mem_node.and_then(|m| {
            let remote: u64 = self
                .cpu_ns_by_node
                .iter()
                .enumerate()
                .filter(|(n, _)| *n as u32 != m)
                .map(|(_, ns)| ns)
                .sum();
            (self.cpu_ns > 0).then(|| ppm(remote, self.cpu_ns as f64))
        });
        self.mem_kib_by_node = Some(mem);
        self.mempolicy = p
            .placement
            .policies
            .iter()
            .max_by_key(|(_, kib)| **kib)
            .map(|(pol, _)| pol.clone());
        if let Some(a) = &p.allowed {
            self.cpus_allowed = Some(a.cpus.clone());
            self.mems_allowed = Some(a.mems.clone());
        }
        if let Some(t) = &p.task {
            self.preferred_node = Some(t.preferred_nid);
            self.pages_migrated_life = Some(t.pages_migrated);
        }
        self
    }

    pub fn mem_kib(&self) -> Option<u64> {
        self.mem_kib_by_node.as_ref().map(|v| v.iter().sum())
    }

    /// Where most of its CPU time went.
    pub fn cpu_node(&self) -> Option<(u32, u64)> {
        let (n, ns) = self
            .cpu_ns_by_node
            .iter()
            .enumerate()
            .max_by_key(|(n, ns)| (**ns, usize::MAX - n))?;
        (self.cpu_ns > 0).then(|| (n as u32, ppm(*ns, self.cpu_ns as f64)))
    }
}

/// `12.3G`, `64.0M`, `512K` from KiB.
pub fn fmt_kib(kib: u64) -> String {
    match kib {
        0 => "0".into(),
        1..1024 => format!("{kib}K"),
        1024..0x10_0000 => format!("{:.1}M", kib as f64 / 1024.0),
        _ => format!("{:.1}G", kib as f64 / 1048576.0),
    }
}

/// Shares per node as whole percents, `100/0`.
pub fn shares(v: &[u64]) -> String {
    let total: u64 = v.iter().sum();
    if total == 0 {
        return "-".into();
    }
    v.iter()
        .map(|x| ((*x as f64 * 100.0 / total as f64).round() as u64).to_string())
        .collect::<Vec<_>>()
        .join("/")
}

const NUMA_SUMMARY: &[Field] = &[
    Field::count("cpu_ns", Neutral),
    Field::key("mem_node"),
    Field::level("remote_cpu_share_ppm", LowerIsBetter),
    Field::count("hint_faults", Neutral).export(
        "tracekit_numa_hint_faults",
        "NUMA hinting faults (the kernel sampling where a task's memory is).",
    ),
    Field::count("hint_faults_local", Neutral).export(
        "tracekit_numa_hint_faults_local",
        "NUMA hinting faults on memory of the task's own node.",
    ),
    Field::count("hint_pages_migrated", Neutral),
    Field::count("pages_migrated", Neutral).export(
        "tracekit_numa_pages_migrated",
        "Pages NUMA balancing migrated.",
    ),
    Field::count("pages_migrate_failed", LowerIsBetter),
    Field::count("task_moves", Neutral),
    Field::count("task_swaps", Neutral),
    Field::count("task_sticks", Neutral),
    Field::key("preferred_node"),
    Field::count("pages_migrated_life", Neutral),
];

/// The summary rows: per process (or thread), where it ran and where its memory is.
pub const SUMMARY_ROWS: Rows = Rows {
    kind: "summary",
    labels: &[],
    fields: &[ID_FIELDS, NUMA_SUMMARY],
    dists: &[],
};

pub const SUMMARY: &[Column<SummaryRow>] = &[
    Column::right("PID", |r, _| r.who.id_text()),
    Column::left("COMM", |r, _| r.who.title.beside(&r.who.comm_raw)),
    Column::right("CPU", |r, _| fmt_ns(r.cpu_ns)),
    Column::right("CPU%/NODE", |r, _| shares(&r.cpu_ns_by_node)),
    Column::right("MEM", |r, _| r.mem_kib().map_or("-".into(), fmt_kib)),
    Column::right("MEM%/NODE", |r, _| {
        r.mem_kib_by_node.as_deref().map_or("-".into(), shares)
    }),
    Column::right("REMOTE%", |r, _| {
        r.remote_cpu_share_ppm
            .map_or("-".into(), |p| format!("{:.1}", p as f64 / 10_000.0))
    }),
    Column::right("HINTS/LOCAL", |r, _| {
        match (r.hint_faults, r.hint_faults_local) {
            (Some(a), Some(b)) => format!("{a}/{b}"),
            _ => "-".into(),
        }
    }),
    Column::right("MIGRATED", |r, _| r.pages_migrated.to_string()),
    Column::right("MOVES/SWAPS", |r, _| {
        format!("{}/{}", r.task_moves, r.task_swaps)
    }),
    Column::left("POLICY", |r, _| or_dash(r.mempolicy.as_ref())),
    Column::left("CPUS", |r, _| or_dash(r.cpus_allowed.as_ref())),
    Column::left("MEMS", |r, _| or_dash(r.mems_allowed.as_ref())),
];

/// One node in one window.
#[derive(Clone, Debug, Default, Serialize)]
pub struct NodeRow {
    pub node: u32,
    pub cpus: String,
    pub mem_total_kib: Option<u64>,
    pub mem_free_kib: Option<u64>,
    /// Relative access cost to each node (10 = local).
    pub distance: Vec<u32>,
    /// Everyone's on-CPU time on this node in the window.
    pub cpu_ns: u64,
    /// Pages NUMA hinting faults migrated onto this node (`null`: no hook on `task_numa_fault`).
    pub pages_migrated_in: Option<u64>,
    /// `nodeN/numastat` deltas.
    pub numa_hit: u64,
    pub numa_miss: u64,
    pub numa_foreign: u64,
    pub interleave_hit: u64,
    pub local_node: u64,
    pub other_node: u64,
}

impl crate::report::rows::Row for NodeRow {}

const NUMA_NODE: &[Field] = &[
    Field::id("node"),
    Field::level("mem_total_kib", Neutral),
    Field::level("mem_free_kib", Neutral),
    Field::count("cpu_ns", Neutral),
    Field::count("pages_migrated_in", Neutral),
    Field::count("numa_hit", Neutral),
    Field::count("numa_miss", LowerIsBetter),
    Field::count("numa_foreign", Neutral),
    Field::count("interleave_hit", Neutral),
    Field::count("local_node", Neutral),
    Field::count("other_node", Neutral),
];

/// Per NUMA node.
pub const NODE_ROWS: Rows = Rows {
    kind: "node",
    labels: &[],
    fields: &[NUMA_NODE],
    dists: &[],
};

pub const NODES: &[Column<NodeRow>] = &[
    Column::right("NODE", |r, _| r.node.to_string()),
    Column::left("CPUS", |r, _| r.cpus.clone()),
    Column::right("MEM", |r, _| or_dash(r.mem_total_kib.map(fmt_kib))),
    Column::right("FREE", |r, _| or_dash(r.mem_free_kib.map(fmt_kib))),
    Column::right("CPU TIME", |r, _| fmt_ns(r.cpu_ns)),
    Column::right("MIGRATED IN", |r, _| or_dash(r.pages_migrated_in.as_ref())),
    Column::right("NUMA_HIT", |r, _| r.numa_hit.to_string()),
    Column::right("NUMA_MISS", |r, _| r.numa_miss.to_string()),
    Column::right("FOREIGN", |r, _| r.numa_foreign.to_string()),
    Column::right("OTHER_NODE", |r, _| r.other_node.to_string()),
    Column::left("DISTANCE", |r, _| {
        r.distance
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(" ")
    }),
];

/// Below this resident size a process's placement is not worth a finding.
pub const MIN_MEM_KIB: u64 = 16 << 10;
/// Below this share of CPU time away from its memory, no finding.
pub const MIN_REMOTE_PPM: u64 = 500_000;
/// The memory must be mostly on one node for "the wrong node" to mean anything.
pub const MIN_MEM_MAIN_PPM: u64 = 600_000;
/// Remote CPU time below this (per second of window) is negligible: 5 % of a CPU.
pub const MIN_REMOTE_NS_PER_S: u64 = 50_000_000;
/// Balancing migrations below this rate are background noise: 1 MiB/s of 4 KiB pages.
pub const MIN_MIGRATE_PAGES_PER_S: f64 = 256.0;

/// The node facts findings cite.
pub struct Context<'a> {
    pub secs: f64,
    /// `kernel.numa_balancing` (None: the kernel has no NUMA balancing).
    pub balancing: Option<u32>,
    /// CPU list of each node id.
    pub node_cpus: &'a [(u32, String)],
    pub page_kib: u64,
}

fn balancing_text(b: Option<u32>) -> &'static str {
    match b {
        Some(0) => "numa_balancing off",
        Some(_) => "numa_balancing on",
        None => "no NUMA balancing in this kernel",
    }
}

/// The subject of a finding about row `r`: its process, and its thread with `--threads`.
fn subject(r: &SummaryRow) -> Subject {
    Subject {
        tid: r.who.tid,
        ..r.who.subject()
    }
}

/// A process running away from its memory.
pub fn misplaced(r: &SummaryRow, c: &Context) -> Option<Finding> {
    let (share, mem_node, mem) = (r.remote_cpu_share_ppm?, r.mem_node?, r.mem_kib()?);
    let mem_on_main = r
        .mem_kib_by_node
        .as_ref()?
        .get(mem_node as usize)
        .copied()?;
    let remote_ns = (r.cpu_ns as u128 * share as u128 / 1_000_000) as u64;
    let ns_per_s = (remote_ns as f64 / c.secs) as u64;
    let main_ppm = ppm(mem_on_main, mem as f64);
    if share < MIN_REMOTE_PPM
        || mem < MIN_MEM_KIB
        || main_ppm < MIN_MEM_MAIN_PPM
        || ns_per_s < MIN_REMOTE_NS_PER_S
    {
        return None;
    }
    let (cpu_node, cpu_ppm) = r.cpu_node()?;
    let inside = match r.who.container.get() {
        Some(k) => format!(" in container {}", sanitize::text(k.label().as_bytes())),
        None => String::new(),
    };
    let who = match r.who.tid {
        Some(t) => format!("{} (pid {}, tid {t}){inside}", r.who.comm_text(), r.who.pid),
        None => format!("{} (pid {}){inside}", r.who.comm_text(), r.who.pid),
    };
    let cpus = c
        .node_cpus
        .iter()
        .find(|(n, _)| *n == mem_node)
        .map(|(_, l)| l.as_str())
        .unwrap_or("?");
    let bound = r
        .mempolicy
        .as_deref()
        .is_some_and(|p| p.starts_with("bind") || p.starts_with("prefer"));
    let why = if bound {
        format!(
            "its memory policy ({}) keeps the memory on node {mem_node} while its CPUs are elsewhere (allowed CPUs {}): the two bindings contradict each other",
            r.mempolicy.as_deref().unwrap_or("?"),
            r.cpus_allowed.as_deref().unwrap_or("?")
        )
    } else if c.balancing == Some(0) {
        "NUMA balancing is off, so nothing moves the memory or the task".to_string()
    } else {
        "NUMA balancing has not fixed it (the task may be pinned, or the memory shared)".to_string()
    };
    let mut f = Finding {
        tool: INFO.name,
        cause: crate::tools::numa::NUMA_MISPLACED,
        subject: subject(r),
        culprit: None,
        score: Score::NsPerS(ns_per_s),
        summary: format!(
            "{who}: {:.0} % of its CPU time ({} of {}) ran on node {cpu_node}, {:.0} % of its {} on node {mem_node}: {:.0} % of its run time was remote from its memory; {}; {why}.",
            cpu_ppm as f64 / 1e4,
            fmt_ns((r.cpu_ns as u128 * cpu_ppm as u128 / 1_000_000) as u64),
            fmt_ns(r.cpu_ns),
            main_ppm as f64 / 1e4,
            fmt_kib(mem),
            share as f64 / 1e4,
            balancing_text(c.balancing),
        ),
        evidence: vec![],
        advice: format!(
            "run it where its memory is: `numactl --cpunodebind={mem_node} --membind={mem_node} <command>` (systemd: `NUMAPolicy=bind`, `NUMAMask={mem_node}` and `CPUAffinity={cpus}` in its unit), or move the memory to where it runs (`migratepages {} {mem_node} {cpu_node}`){}",
            r.who.pid,
            if c.balancing == Some(0) && !bound {
                "; or let the kernel do it: `sysctl kernel.numa_balancing=1`"
            } else {
                ""
            }
        ),
        next: Some(format!("tracekit numa --pid {} --duration 30s", r.who.pid)),
        fold: None,
        members: Vec::new(),
    }
    .evidence("cpu_ns", r.cpu_ns)
    .evidence("remote_cpu_ns", remote_ns)
    .evidence("remote_cpu_share_ppm", share)
    .evidence("cpu_node", cpu_node)
    .evidence("mem_kib", mem)
    .evidence("mem_node", mem_node)
    .evidence("mem_node_share_ppm", main_ppm)
    .evidence("window_ns", (c.secs * 1e9) as u64);
    if let Some(b) = c.balancing {
        f = f.evidence("numa_balancing", b);
    }
    Some(f)
}

/// NUMA balancing moving a process's pages at a rate worth knowing.
pub fn migrating(r: &SummaryRow, c: &Context) -> Option<Finding> {
    let rate = r.pages_migrated as f64 / c.secs;
    if rate < MIN_MIGRATE_PAGES_PER_S {
        return None;
    }
    let kib = r.pages_migrated * c.page_kib;
    let faults = match (r.hint_faults, r.hint_faults_local) {
        (Some(a), Some(l)) => format!(
            " after {a} hinting faults ({:.0} % local)",
            ppm(l, a as f64) as f64 / 1e4
        ),
        _ => String::new(),
    };
    let moved = r.task_moves + r.task_swaps;
    let pingpong = moved > 0;
    let mut f = Finding {
        tool: INFO.name,
        cause: crate::tools::numa::NUMA_MIGRATION,
        subject: subject(r),
        culprit: None,
        score: Score::RatePerS(rate),
        summary: format!(
            "NUMA balancing migrated {} of {} (pid {})'s memory in {:.1} s ({}/s){faults}{}.",
            fmt_kib(kib),
            r.who.title.beside(&r.who.comm_raw),
            r.who.pid,
            c.secs,
            fmt_kib((kib as f64 / c.secs) as u64),
            if pingpong {
                format!(
                    ", while the scheduler moved its threads between nodes {moved} times: pages ping-pong between nodes"
                )
            } else {
                String::new()
            }
        ),
        evidence: vec![],
        advice: if pingpong {
            "its threads and its memory chase each other across nodes: bind the process to one node (`numactl --cpunodebind=N --membind=N`, or systemd `NUMAPolicy=bind` with `NUMAMask=`) so there is nothing to move".into()
        } else {
            "balancing is moving its memory to where it runs, which costs CPU time and TLB flushes while it lasts; if it persists, bind the process to one node (`numactl --cpunodebind=N --membind=N`) so there is nothing to move".into()
        },
        next: Some(format!(
            "tracekit numa --pid {} --interval 5s --duration 1m",
            r.who.pid
        )),
        fold: None,
        members: Vec::new(),
    }
    .evidence("pages_migrated", r.pages_migrated)
    .evidence("migrated_kib", kib)
    .evidence("task_moves", r.task_moves)
    .evidence("task_swaps", r.task_swaps)
    .evidence("window_ns", (c.secs * 1e9) as u64);
    if let (Some(a), Some(l)) = (r.hint_faults, r.hint_faults_local) {
        f = f
            .evidence("hint_faults", a)
            .evidence("hint_faults_local", l);
    }
    Some(f)
}

/// Every finding of a window, most harmful first; tracekit itself and the `[other]` row are
/// never subjects.
pub fn findings(rows: &[SummaryRow], c: &Context) -> Vec<Finding> {
    let me = std::process::id();
    let mut out: Vec<Finding> = rows
        .iter()
        .filter(|r| r.id != 0 && r.who.pid != me)
        .flat_map(|r| [misplaced(r, c), migrating(r, c)])
        .flatten()
        .collect();
    crate::report::findings::rank(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::numa::parse_numa_maps;

    fn row(pid: u32, cpu: [u64; 2]) -> SummaryRow {
        SummaryRow {
            who: Id {
                pid,
                comm: "postgres".into(),
                comm_raw: b"postgres".to_vec(),
                ..Default::default()
            },
            id: pid,
            cpu_ns: cpu.iter().sum(),
            cpu_ns_by_node: cpu.to_vec(),
            ..Default::default()
        }
    }

    fn proc_numa(maps: &str) -> ProcNuma {
        ProcNuma {
            placement: parse_numa_maps(maps),
            allowed: Some(Allowed {
                cpus: "0".into(),
                mems: "0-1".into(),
            }),
            task: None,
        }
    }

    const ON_NODE1: &str =
        "7f0000000000 default anon=16384 dirty=16384 N1=16000 N0=384 kernelpagesize_kB=4\n";
    const ON_NODE0: &str =
        "7f0000000000 default anon=16384 dirty=16384 N0=16384 kernelpagesize_kB=4\n";

    fn ctx(b: Option<u32>) -> Context<'static> {
        static CPUS: [(u32, String); 0] = [];
        Context {
            secs: 2.0,
            balancing: b,
            node_cpus: &CPUS,
            page_kib: 4,
        }
    }

    #[test]
    fn remote_share_against_the_memory_node() {
        let r = row(4711, [1_900_000_000, 100_000_000]).with_proc(Some(&proc_numa(ON_NODE1)), 2);
        assert_eq!(r.mem_kib_by_node, Some(vec![384 * 4, 16000 * 4]));
        assert_eq!(r.mem_node, Some(1));
        assert_eq!(r.remote_cpu_share_ppm, Some(950_000));
        assert_eq!(r.cpu_node(), Some((0, 950_000)));
        assert_eq!(r.mempolicy.as_deref(), Some("default"));
        let f = findings(std::slice::from_ref(&r), &ctx(Some(0)));
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].cause, crate::tools::numa::NUMA_MISPLACED);
        assert_eq!(f[0].score, Score::NsPerS(950_000_000));
        assert!(
            f[0].summary.contains("95 % of its CPU time"),
            "{}",
            f[0].summary
        );
        assert!(f[0].summary.contains("on node 1"), "{}", f[0].summary);
        assert!(
            f[0].advice.contains("--cpunodebind=1 --membind=1"),
            "{}",
            f[0].advice
        );
        assert!(f[0].advice.contains("numa_balancing=1"), "{}", f[0].advice);
        let j = f[0].json();
        assert_eq!(j["evidence"]["remote_cpu_share_ppm"], 950_000);
        assert_eq!(j["pid"], 4711);
        // With balancing on, the advice does not ask to enable it.
        let on = findings(&[r], &ctx(Some(1)));
        assert!(!on[0].advice.contains("numa_balancing=1"));
    }

    #[test]
    fn local_small_or_unknown_gives_no_finding() {
        let local = row(1, [2_000_000_000, 0]).with_proc(Some(&proc_numa(ON_NODE0)), 2);
        assert_eq!(local.remote_cpu_share_ppm, Some(0));
        let unread = row(2, [2_000_000_000, 0]).with_proc(None, 2);
        assert_eq!(unread.remote_cpu_share_ppm, None);
        assert_eq!(unread.mem_kib_by_node, None);
        let small = row(3, [2_000_000_000, 0]).with_proc(
            Some(&proc_numa(
                "7f00 default anon=10 N1=10 kernelpagesize_kB=4\n",
            )),
            2,
        );
        assert_eq!(small.remote_cpu_share_ppm, Some(1_000_000));
        let idle = row(4, [1_000, 0]).with_proc(Some(&proc_numa(ON_NODE1)), 2);
        assert!(findings(&[local, unread, small, idle], &ctx(Some(0))).is_empty());
    }

    #[test]
    fn bound_memory_is_called_a_contradiction() {
        let r = row(7, [2_000_000_000, 0]).with_proc(
            Some(&proc_numa(
                "7f00 bind:1 anon=16384 dirty=16384 N1=16384 kernelpagesize_kB=4\n",
            )),
            2,
        );
        let f = findings(&[r], &ctx(Some(0)));
        assert!(f[0].summary.contains("bind:1"), "{}", f[0].summary);
        assert!(!f[0].advice.contains("numa_balancing=1"));
    }

    #[test]
    fn migration_rate_and_ping_pong() {
        let mut r = row(9, [1_000_000, 0]);
        r.pages_migrated = 8192;
        r.hint_faults = Some(10000);
        r.hint_faults_local = Some(2500);
        let f = findings(&[r.clone()], &ctx(Some(1)));
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].cause, crate::tools::numa::NUMA_MIGRATION);
        assert_eq!(f[0].score, Score::RatePerS(4096.0));
        assert!(f[0].summary.contains("32.0M"), "{}", f[0].summary);
        assert!(f[0].summary.contains("25 % local"), "{}", f[0].summary);
        r.task_swaps = 3;
        let f = findings(&[r.clone()], &ctx(Some(1)));
        assert!(f[0].summary.contains("ping-pong"), "{}", f[0].summary);
        r.pages_migrated = 100;
        assert!(findings(&[r], &ctx(Some(1))).is_empty());
    }

    #[test]
    fn formats() {
        assert_eq!(fmt_kib(0), "0");
        assert_eq!(fmt_kib(512), "512K");
        assert_eq!(fmt_kib(65536), "64.0M");
        assert_eq!(fmt_kib(12_897_485), "12.3G");
        assert_eq!(shares(&[3, 1]), "75/25");
        assert_eq!(shares(&[0, 0]), "-");
    }
}
