//! `tracekit memstall`: time processes lose stalled in direct compaction, direct reclaim, memcg
//! reclaim and THP collapse, per process, with the THP settings and `/proc/vmstat` counters that
//! explain it, and a verdict that cites its evidence.
//!
//! Events (classic tracepoints, fields at offsets from their `format` files):
//! `compaction:mm_compaction_begin/end` (`status`), `vmscan:mm_vmscan_direct_reclaim_begin/end`
//! and `vmscan:mm_vmscan_memcg_reclaim_begin/end` (`nr_reclaimed`),
//! `syscalls:sys_enter_madvise` (`behavior`) / `sys_exit_madvise`, and
//! `huge_memory:mm_khugepaged_scan_pmd`, `mm_collapse_huge_page_isolate`,
//! `mm_collapse_huge_page` (`status`).

use std::{
    collections::{BTreeMap, HashMap as StdHashMap},
    os::fd::{AsRawFd, RawFd},
    path::Path,
};

use anyhow::Context as _;
use aya::maps::{Array, HashMap, MapData, RingBuf};
use probes_common::{
    memstall::{
        MsKey, MsNew, MsVal, KIND_COMPACTION, KIND_MEMCG_RECLAIM, KIND_NAMES, KIND_RECLAIM,
        KIND_THP_COLLAPSE, NOUTCOMES,
    },
    stats,
};
use procfs::FromBufRead;
use serde_json::json;

use crate::{
    engine::{self, Collector, Window},
    error::UserError,
    host::cgroup,
    kernel::loader::{self, AttachMode, LoadSpec, Session},
    kernel::tracefs::Tracefs,
    options::Common,
    report::hist::{self, LatStats},
    report::output::Sink,
    report::render::{fmt_ns, Align, Report, Table},
    report::sanitize,
    tools::{self, row_comm, Hook},
};

pub const NAME: &str = "memstall";

pub const REQUIRES_BTF: bool = false;

const BTF_OR_TP: &[AttachMode] = &[AttachMode::TpBtf, AttachMode::Tracepoint];

macro_rules! hook {
    ($event:literal, $fields:expr) => {
        Hook {
            event: $event,
            raw: None,
            fields: $fields,
            modes: BTF_OR_TP,
            optional: true,
        }
    };
    ($event:literal, $raw:literal, $fields:expr) => {
        Hook {
            event: $event,
            raw: Some($raw),
            fields: $fields,
            modes: BTF_OR_TP,
            optional: true,
        }
    };
}

/// Every hook is optional: the tool traces whichever groups the kernel has and names the rest.
pub const HOOKS: &[Hook] = &[
    hook!("compaction:mm_compaction_begin", &[]),
    hook!("compaction:mm_compaction_end", &["status"]),
    hook!("vmscan:mm_vmscan_direct_reclaim_begin", &[]),
    hook!("vmscan:mm_vmscan_direct_reclaim_end", &["nr_reclaimed"]),
    hook!("vmscan:mm_vmscan_memcg_reclaim_begin", &[]),
    hook!("vmscan:mm_vmscan_memcg_reclaim_end", &["nr_reclaimed"]),
    hook!("syscalls:sys_enter_madvise", "sys_enter", &["behavior"]),
    hook!("syscalls:sys_exit_madvise", "sys_exit", &["ret"]),
    hook!("huge_memory:mm_khugepaged_scan_pmd", &[]),
    hook!("huge_memory:mm_collapse_huge_page_isolate", &[]),
    hook!("huge_memory:mm_collapse_huge_page", &["status"]),
];

/// One hook of a group: the classic-tracepoint program, the tp_btf program, the event's
/// category and name, and the raw tracepoint the tp_btf program attaches to.
struct Attach {
    tp_prog: &'static str,
    btf_prog: &'static str,
    category: &'static str,
    event: &'static str,
    raw: &'static str,
}

const fn at(
    tp_prog: &'static str,
    btf_prog: &'static str,
    category: &'static str,
    event: &'static str,
) -> Attach {
    Attach {
        tp_prog,
        btf_prog,
        category,
        event,
        raw: event,
    }
}

/// The traced groups; a group is attached whole (all tp_btf, else all classic) or skipped.
const GROUPS: &[(&str, &[Attach])] = &[
    (
        "compaction",
        &[
            at(
                "tk_ms_compact_begin",
                "tk_ms_compact_begin_b",
                "compaction",
                "mm_compaction_begin",
            ),
            at(
                "tk_ms_compact_end",
                "tk_ms_compact_end_b",
                "compaction",
                "mm_compaction_end",
            ),
        ],
    ),
    (
        "reclaim",
        &[
            at(
                "tk_ms_reclaim_begin",
                "tk_ms_reclaim_begin_b",
                "vmscan",
                "mm_vmscan_direct_reclaim_begin",
            ),
            at(
                "tk_ms_reclaim_end",
                "tk_ms_reclaim_end_b",
                "vmscan",
                "mm_vmscan_direct_reclaim_end",
            ),
        ],
    ),
    (
        "memcg_reclaim",
        &[
            at(
                "tk_ms_memcg_begin",
                "tk_ms_memcg_begin_b",
                "vmscan",
                "mm_vmscan_memcg_reclaim_begin",
            ),
            at(
                "tk_ms_memcg_end",
                "tk_ms_memcg_end_b",
                "vmscan",
                "mm_vmscan_memcg_reclaim_end",
            ),
        ],
    ),
    (
        "thp_collapse",
        &[
            at(
                "tk_ms_thp_scan",
                "tk_ms_thp_scan_b",
                "huge_memory",
                "mm_khugepaged_scan_pmd",
            ),
            at(
                "tk_ms_thp_isolate",
                "tk_ms_thp_isolate_b",
                "huge_memory",
                "mm_collapse_huge_page_isolate",
            ),
            at(
                "tk_ms_thp_collapse",
                "tk_ms_thp_collapse_b",
                "huge_memory",
                "mm_collapse_huge_page",
            ),
        ],
    ),
    (
        "madvise_collapse_time",
        &[
            Attach {
                tp_prog: "tk_ms_madv_enter",
                btf_prog: "tk_ms_madv_enter_b",
                category: "syscalls",
                event: "sys_enter_madvise",
                raw: "sys_enter",
            },
            Attach {
                tp_prog: "tk_ms_madv_exit",
                btf_prog: "tk_ms_madv_exit_b",
                category: "syscalls",
                event: "sys_exit_madvise",
                raw: "sys_exit",
            },
        ],
    ),
];

const EXAMPLES: &str = "  tracekit memstall --duration 10s                    # who stalls in compaction, reclaim, THP collapse
  tracekit memstall --duration 1m --interval 10s      # one report (and verdict) per 10 s
  tracekit memstall --duration 30s --comm postgres --json   # one program, as NDJSON";

const NEEDS: &str = "root, or exactly CAP_BPF and CAP_PERFMON on kernels with BTF (CAP_SYS_ADMIN \
stands in for both). Without BTF it falls back to classic tracepoints and then also needs \
CAP_DAC_READ_SEARCH to read tracefs (mode 0700), and CAP_SYS_ADMIN to mount tracefs if it is not \
mounted. THP_KB of other users' processes is shown only with CAP_SYS_PTRACE (else `-`).";

#[derive(clap::Args, Debug)]
#[command(after_help = tools::help_footer(EXAMPLES, NEEDS))]
pub struct Args {
    #[command(flatten)]
    pub common: Common,

    /// Rows shown per table, largest total stall first (0: all). JSON has every row.
    #[arg(long, default_value_t = 25, value_name = "N")]
    pub rows: usize,
}

// ---------------------------------------------------------------------------------------------
// Context: THP settings and /proc/vmstat.

const THP_DIR: &str = "/sys/kernel/mm/transparent_hugepage";

/// THP settings from sysfs; `None` where a file is missing (kernel without THP, or older).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ThpSettings {
    pub enabled: Option<String>,
    pub defrag: Option<String>,
    /// `khugepaged/defrag`: 1 lets khugepaged compact/reclaim to get a huge page.
    pub khugepaged_defrag: Option<String>,
    pub scan_sleep_ms: Option<u64>,
    pub pages_to_scan: Option<u64>,
}

/// The selected value of a sysfs choice file (`always [madvise] never`), or its whole trimmed
/// text when it has no brackets (`1`).
pub fn selected(text: &str) -> Option<String> {
    let t = text.trim();
    if t.is_empty() {
        return None;
    }
    match (t.find('['), t.find(']')) {
        (Some(a), Some(b)) if a < b => Some(t[a + 1..b].to_string()),
        _ => Some(t.to_string()),
    }
}

impl ThpSettings {
    pub fn read(dir: &Path) -> ThpSettings {
        let get =
            |f: &str| crate::host::read_text_capped(&dir.join(f), crate::host::SMALL_FILE).ok();
        let num = |f: &str| get(f).and_then(|s| s.trim().parse().ok());
        ThpSettings {
            enabled: get("enabled").and_then(|s| selected(&s)),
            defrag: get("defrag").and_then(|s| selected(&s)),
            khugepaged_defrag: get("khugepaged/defrag").and_then(|s| selected(&s)),
            scan_sleep_ms: num("khugepaged/scan_sleep_millisecs"),
            pages_to_scan: num("khugepaged/pages_to_scan"),
        }
    }

    fn text(&self) -> String {
        let s = |v: &Option<String>| v.clone().unwrap_or_else(|| "?".into());
        let n = |v: Option<u64>| v.map(|x| x.to_string()).unwrap_or_else(|| "?".into());
        format!(
            "enabled={} defrag={} khugepaged/defrag={} khugepaged/scan_sleep_millisecs={} khugepaged/pages_to_scan={}",
            s(&self.enabled),
            s(&self.defrag),
            s(&self.khugepaged_defrag),
            n(self.scan_sleep_ms),
            n(self.pages_to_scan)
        )
    }

    fn json(&self) -> serde_json::Value {
        json!({
            "enabled": self.enabled,
            "defrag": self.defrag,
            "khugepaged_defrag": self.khugepaged_defrag,
            "scan_sleep_ms": self.scan_sleep_ms,
            "pages_to_scan": self.pages_to_scan,
        })
    }
}

/// The `/proc/vmstat` counters memstall reports. `allocstall` is the sum of `allocstall_*`.
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

/// Selected vmstat counters; a key is absent when this kernel does not have it.
pub type VmCounters = BTreeMap<&'static str, i64>;

/// The counters of [`VM_KEYS`] from `/proc/vmstat` text.
pub fn parse_vmstat(text: &str) -> Result<VmCounters, procfs::ProcError> {
    let all = procfs::VmStat::from_buf_read(text.as_bytes())?.0;
    Ok(select_vm(&all))
}

fn select_vm(all: &std::collections::HashMap<String, i64>) -> VmCounters {
    let mut out = VmCounters::new();
    for k in VM_KEYS {
        if *k == "allocstall" {
            let parts: Vec<i64> = all
                .iter()
                .filter(|(n, _)| n.starts_with("allocstall_"))
                .map(|(_, v)| *v)
                .collect();
            if !parts.is_empty() {
                out.insert(k, parts.iter().sum());
            }
        } else if let Some(v) = all.get(*k) {
            out.insert(k, *v);
        }
    }
    out
}

fn read_vmstat() -> VmCounters {
    crate::host::read_text_capped(Path::new("/proc/vmstat"), crate::host::SMALL_FILE)
        .ok()
        .and_then(|t| parse_vmstat(&t).ok())
        .unwrap_or_default()
}

/// `after - before` for keys present in both.
pub fn vm_delta(before: &VmCounters, after: &VmCounters) -> VmCounters {
    after
        .iter()
        .filter_map(|(k, a)| before.get(k).map(|b| (*k, a - b)))
        .collect()
}

/// `AnonHugePages` of a live process from `/proc/<pid>/smaps_rollup`, in KiB.
fn anon_huge_kb(pid: u32) -> Option<u64> {
    let r = procfs::process::Process::new(pid as i32)
        .ok()?
        .smaps_rollup()
        .ok()?;
    let m = r.memory_map_rollup.0.first()?;
    m.extension.map.get("AnonHugePages").map(|b| b / 1024)
}

// ---------------------------------------------------------------------------------------------
// Verdict: a pure function of the rows, the settings and the vmstat deltas.

/// One row as the verdict sees it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Finding {
    pub pid: u32,
    pub comm: String,
    pub kind: u32,
    /// A kernel thread (kcompactd, khugepaged): background work, nobody's stall.
    pub kthread: bool,
    pub cgroup: Option<String>,
    /// Timed stalls (THP: `MADV_COLLAPSE` calls).
    pub count: u64,
    pub total_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
    pub reclaimed_pages: u64,
    pub collapses: u64,
    pub collapsed: u64,
    pub scans: u64,
}

/// Everything the verdict reasons from.
#[derive(Clone, Debug)]
pub struct Evidence<'a> {
    pub secs: f64,
    pub thp: &'a ThpSettings,
    pub vm: &'a VmCounters,
    pub rows: &'a [Finding],
}

fn secs_text(s: f64) -> String {
    if s >= 10.0 {
        format!("{s:.0} s")
    } else {
        format!("{s:.1} s")
    }
}

fn ns_text(ns: u64) -> String {
    let s = fmt_ns(ns);
    // "1.90s" reads better as "1.90 s" in prose; units stay as in the tables otherwise.
    match s.strip_suffix('s') {
        Some(v) if !v.ends_with(['m', 'u', 'n']) => format!("{v} s"),
        _ => s,
    }
}

fn times(n: u64) -> String {
    if n == 1 {
        "once".into()
    } else {
        format!("{n} times")
    }
}

/// Verdict lines, most stall time first; each carries the numbers it rests on.
pub fn verdict(e: &Evidence) -> Vec<String> {
    let vm = |k: &str| e.vm.get(k).copied();
    let vmt = |k: &str| match vm(k) {
        Some(v) => format!("{k} +{v}"),
        None => format!("{k} n/a"),
    };
    let secs = secs_text(e.secs);
    let setting = |v: &Option<String>| v.clone().unwrap_or_else(|| "?".into());
    let mut rows: Vec<&Finding> = e.rows.iter().collect();
    rows.sort_by(|a, b| {
        a.kthread
            .cmp(&b.kthread)
            .then(b.total_ns.cmp(&a.total_ns))
            .then(b.collapses.cmp(&a.collapses))
            .then(a.pid.cmp(&b.pid))
    });
    let mut out = Vec::new();
    for r in rows {
        let who = format!("{} ({})", r.comm, r.pid);
        let timing = format!(
            "{}, {} in {secs} ({:.1} % of the time; p99 {}, max {})",
            times(r.count),
            ns_text(r.total_ns),
            r.total_ns as f64 / 1e9 / e.secs.max(1e-9) * 100.0,
            ns_text(r.p99_ns),
            ns_text(r.max_ns)
        );
        match (r.kind, r.kthread) {
            (KIND_COMPACTION, true) => out.push(format!(
                "{who} compacted in the background: {timing}. No application waited on it; /proc/vmstat compact_stall counts the direct (waited-for) compactions: {}.",
                vmt("compact_stall")
            )),
            (KIND_COMPACTION, false) if r.count > 0 => {
                let direct = vm("compact_stall").unwrap_or(0);
                if direct == 0 {
                    out.push(format!(
                        "compaction ran in {who}: {timing}, but /proc/vmstat compact_stall +0: it was requested explicitly (a write to /proc/sys/vm/compact_memory, or proactive compaction), not an allocation stall."
                    ));
                    continue;
                }
                let thp_faults = vm("thp_fault_alloc").unwrap_or(0) + vm("thp_fault_fallback").unwrap_or(0);
                let defrag = setting(&e.thp.defrag);
                let advice = if thp_faults == 0 {
                    "No THP faults in the window (thp_fault_alloc and thp_fault_fallback +0): high-order kernel allocations compacted, so raise vm.min_free_kbytes (persistently in /etc/sysctl.d/) to leave kcompactd more headroom.".to_string()
                } else if defrag == "always" {
                    "Consider defrag=madvise or never (`echo madvise > /sys/kernel/mm/transparent_hugepage/defrag`); to make it persistent, add a systemd-tmpfiles line `w /sys/kernel/mm/transparent_hugepage/defrag - - - - madvise` (or boot with transparent_hugepage=madvise).".to_string()
                } else if defrag == "madvise" || defrag == "defer+madvise" {
                    format!("With defrag={defrag} only MADV_HUGEPAGE regions compact at fault: if {} asks for huge pages, consider defrag=defer+madvise or defer (kcompactd works instead), or disabling THP for it (prctl PR_SET_THP_DISABLE).", r.comm)
                } else {
                    format!("defrag={defrag} should not compact at THP faults; check enabled={} and per-process THP policy.", setting(&e.thp.enabled))
                };
                out.push(format!(
                    "THP defrag={defrag}: direct compaction stalled {who} {timing}; /proc/vmstat {}, {}, {}, {}, {}. {advice}",
                    vmt("compact_stall"),
                    vmt("compact_success"),
                    vmt("compact_fail"),
                    vmt("thp_fault_alloc"),
                    vmt("thp_fault_fallback")
                ));
            }
            (KIND_RECLAIM, _) if r.count > 0 => out.push(format!(
                "direct reclaim stalled {who} {timing}, reclaiming {} pages; /proc/vmstat {}, {}. Free memory fell below the min watermark faster than kswapd freed it: raise vm.watermark_scale_factor or vm.min_free_kbytes (persistently in /etc/sysctl.d/) so kswapd starts earlier, or reduce memory use.",
                r.reclaimed_pages,
                vmt("allocstall"),
                vmt("pgscan_direct")
            )),
            (KIND_MEMCG_RECLAIM, _) if r.count > 0 => out.push(format!(
                "{who} in memory cgroup {} hit its limit: memcg reclaim {timing}, reclaiming {} pages. Raise the cgroup's limit (memory.max on v2, memory.limit_in_bytes on v1) or shrink its working set (page cache counts: O_DIRECT or posix_fadvise DONTNEED for streaming writes).",
                r.cgroup.as_deref().unwrap_or("?"),
                r.reclaimed_pages
            )),
            (KIND_THP_COLLAPSE, true) if r.collapses > 0 => out.push(format!(
                "{who} collapsed {} of {} huge-page attempts ({} PMD scans) in {secs} in the background (khugepaged/defrag={}, scan_sleep_millisecs={}, pages_to_scan={}); /proc/vmstat {}, {}. No application waits on it; lower pages_to_scan if its CPU use matters.",
                r.collapsed,
                r.collapses,
                r.scans,
                setting(&e.thp.khugepaged_defrag),
                e.thp.scan_sleep_ms.map(|v| v.to_string()).unwrap_or_else(|| "?".into()),
                e.thp.pages_to_scan.map(|v| v.to_string()).unwrap_or_else(|| "?".into()),
                vmt("thp_collapse_alloc"),
                vmt("thp_collapse_alloc_failed")
            )),
            (KIND_THP_COLLAPSE, false) if r.collapses > 0 || r.count > 0 => {
                let timed = if r.count > 0 {
                    format!("; its MADV_COLLAPSE calls stalled it {timing}")
                } else {
                    String::new()
                };
                out.push(format!(
                    "{who} collapsed {} of {} huge-page attempts itself (MADV_COLLAPSE){timed}; /proc/vmstat {}. The program asked for this; if the pauses matter, collapse off the latency path or leave it to khugepaged.",
                    r.collapsed,
                    r.collapses,
                    vmt("thp_collapse_alloc")
                ));
            }
            _ => {}
        }
    }
    let seen_direct = e
        .rows
        .iter()
        .any(|r| !r.kthread && r.kind == KIND_COMPACTION && r.count > 0);
    if !seen_direct && vm("compact_stall").unwrap_or(0) > 0 {
        out.push(format!(
            "/proc/vmstat {} but no compaction stall was traced in scope: the stalled processes are outside --pid/--comm, or compaction ran before tracing started.",
            vmt("compact_stall")
        ));
    }
    if out.is_empty() {
        out.push(format!(
            "no memory stalls seen in {secs}: no direct compaction, direct or memcg reclaim, or THP collapse traced; /proc/vmstat {}, {}, {}, {}.",
            vmt("compact_stall"),
            vmt("allocstall"),
            vmt("pgscan_direct"),
            vmt("thp_collapse_alloc")
        ));
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Collection.

/// What userspace learnt about a process while it lived.
#[derive(Clone, Debug, Default)]
struct ProcInfo {
    cgroup: Option<Vec<u8>>,
    kthread: Option<bool>,
    anon_huge_kb: Option<u64>,
}

const PF_KTHREAD: u32 = 0x0020_0000;

fn is_kthread(pid: u32) -> Option<bool> {
    let st = procfs::process::Process::new(pid as i32)
        .ok()?
        .stat()
        .ok()?;
    Some(st.flags & PF_KTHREAD != 0)
}

/// Kernel threads that do memory work in the background, for rows whose process is gone.
fn kthread_by_name(comm: &[u8]) -> bool {
    [&b"kcompactd"[..], b"khugepaged", b"kswapd"]
        .iter()
        .any(|p| comm.starts_with(p))
}

struct Memstall {
    session: Session,
    hist: HashMap<MapData, MsKey, MsVal>,
    other: Array<MapData, MsVal>,
    news: RingBuf<MapData>,
    procs: StdHashMap<u32, ProcInfo>,
    layout: cgroup::Layout,
    ids: cgroup::IdResolver,
    traced: Vec<&'static str>,
    skipped: Vec<(&'static str, String)>,
    /// Names of `mm_compaction_end.status` values, from its format.
    outcome_names: StdHashMap<usize, String>,
    thp_dir: std::path::PathBuf,
    thp_start: ThpSettings,
    vm_start: VmCounters,
    vm_prev: VmCounters,
    common: Common,
    max_rows: usize,
}

/// How a group is attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Btf,
    Classic,
}

/// Globals and value names the programs need, from the kernel's BTF (BTF-mode groups) or the
/// tracefs format files (classic groups).
struct Offsets {
    compact_status: u32,
    compact_status_arg: u32,
    reclaimed: u32,
    reclaimed_classic: Option<u32>,
    madv_behavior: u32,
    madv_ret: u32,
    collapse_status: u32,
    collapse_status_arg: u32,
    scan_succeed: u32,
    regs_arg2: u32,
    regs_nr: u32,
    outcome_names: StdHashMap<usize, String>,
}

impl Offsets {
    fn new() -> Offsets {
        Offsets {
            compact_status: 0,
            compact_status_arg: 0,
            reclaimed: 0,
            reclaimed_classic: None,
            madv_behavior: 0,
            madv_ret: 0,
            collapse_status: 0,
            collapse_status_arg: 0,
            scan_succeed: u32::MAX,
            regs_arg2: 0,
            regs_nr: 0,
            outcome_names: StdHashMap::new(),
        }
    }

    /// Checks a group can attach as BTF tracepoints here and records what its programs need.
    fn btf_group(&mut self, group: &str, hooks: &[Attach]) -> Result<(), String> {
        if !crate::kernel::features::btf_present() {
            return Err("no kernel BTF".into());
        }
        let btf = crate::kernel::btf::vmlinux().map_err(|e| e.to_string())?;
        let proto = |tp: &str| {
            btf.proto_param_sizes(&format!("btf_trace_{tp}"))
                .ok_or_else(|| format!("kernel BTF has no btf_trace_{tp}"))
        };
        for h in hooks {
            proto(h.raw)?;
        }
        // Positions in the tracepoint's arguments (the BTF prototype's first parameter is the
        // probe's data pointer, hence the - 1), and the sizes the programs read them as.
        let last_int = |tp: &str| -> Result<u32, String> {
            let p = proto(tp)?;
            match p.last() {
                Some(4) if p.len() >= 2 && p.len() <= 8 => Ok(p.len() as u32 - 2),
                _ => Err(format!(
                    "btf_trace_{tp}: no int status as the last argument ({p:?})"
                )),
            }
        };
        match group {
            "compaction" => {
                self.compact_status_arg = last_int("mm_compaction_end")?;
                for (name, v) in btf.enum_values("COMPACT_") {
                    if v >= 0 {
                        let slot = (v as usize).min(NOUTCOMES - 1);
                        let short = name.trim_start_matches("COMPACT_").to_ascii_lowercase();
                        self.outcome_names.entry(slot).or_insert(short);
                    }
                }
            }
            "reclaim" | "memcg_reclaim" => {
                for h in hooks.iter().filter(|h| h.event.ends_with("_end")) {
                    let p = proto(h.raw)?;
                    if p != [8, 8] {
                        return Err(format!(
                            "btf_trace_{}: expected (nr_reclaimed), found {p:?}",
                            h.raw
                        ));
                    }
                }
            }
            "thp_collapse" => {
                self.collapse_status_arg = last_int("mm_collapse_huge_page")?;
                self.scan_succeed =
                    btf.enum_value("SCAN_SUCCEED")
                        .ok_or("kernel BTF has no SCAN_SUCCEED")? as u32;
            }
            "madvise_collapse_time" => {
                for tp in ["sys_enter", "sys_exit"] {
                    let p = proto(tp)?;
                    if p.len() != 3 || p[2] != 8 {
                        return Err(format!("unexpected btf_trace_{tp} prototype {p:?}"));
                    }
                }
                let reg = |m: &str| match btf.member("pt_regs", m) {
                    Ok(m) if m.size == 8 => Ok(m.offset),
                    Ok(m) => Err(format!("pt_regs.{m:?} is not 8 bytes")),
                    Err(e) => Err(e.to_string()),
                };
                // x86_64: the third syscall argument is in dx, the number stays in orig_ax.
                self.regs_arg2 = reg("dx")?;
                self.regs_nr = reg("orig_ax")?;
            }
            _ => {}
        }
        Ok(())
    }

    /// Records what a classic-tracepoint group needs from the format files.
    fn classic_group(&mut self, t: &Tracefs, group: &str) -> anyhow::Result<()> {
        match group {
            "compaction" => {
                let f = t.format("compaction", "mm_compaction_end")?;
                self.compact_status = f.offset_of("status", &[4])?;
                for (v, name) in f.symbols("status") {
                    let slot = (v.max(0) as usize).min(NOUTCOMES - 1);
                    self.outcome_names.entry(slot).or_insert(name);
                }
            }
            "reclaim" | "memcg_reclaim" => {
                // Both end programs read nr_reclaimed at one offset.
                let event = if group == "reclaim" {
                    "mm_vmscan_direct_reclaim_end"
                } else {
                    "mm_vmscan_memcg_reclaim_end"
                };
                let off = t.format("vmscan", event)?.offset_of("nr_reclaimed", &[8])?;
                match self.reclaimed_classic {
                    Some(prev) if prev != off => anyhow::bail!(
                        "vmscan: nr_reclaimed at offset {off} in {event} but {prev} in the other reclaim end event; this layout is not supported"
                    ),
                    _ => {
                        self.reclaimed_classic = Some(off);
                        self.reclaimed = off;
                    }
                }
            }
            "madvise_collapse_time" => {
                let f = t.format("syscalls", "sys_enter_madvise")?;
                self.madv_behavior = f.offset_of("behavior", &[8])?;
                let x = t.format("syscalls", "sys_exit_madvise")?;
                self.madv_ret = x.offset_of("ret", &[8])?;
            }
            "thp_collapse" => {
                let f = t.format("huge_memory", "mm_collapse_huge_page")?;
                self.collapse_status = f.offset_of("status", &[4])?;
                self.scan_succeed = f
                    .symbols("status")
                    .iter()
                    .find(|(_, n)| n == "succeeded")
                    .map(|(v, _)| *v as u32)
                    .ok_or_else(|| {
                        anyhow::anyhow!(
                            "huge_memory:mm_collapse_huge_page: no \"succeeded\" value in the status names of its format"
                        )
                    })?;
            }
            _ => {}
        }
        Ok(())
    }
}

/// Loads the object and attaches each group in its planned mode. `Err(Ok(group))`: a BTF group
/// failed to attach (the caller retries it classic); `Err(Err(e))`: a real error.
fn load_and_attach(
    common: &Common,
    plan: &[(&'static str, Mode)],
    offs: &Offsets,
) -> Result<Session, Result<&'static str, anyhow::Error>> {
    let spec = LoadSpec::new()
        .global("MS_COMPACT_STATUS_OFF", &offs.compact_status)
        .global("MS_COMPACT_STATUS_ARG", &offs.compact_status_arg)
        .global("MS_RECLAIMED_OFF", &offs.reclaimed)
        .global("MS_MADV_BEHAVIOR_OFF", &offs.madv_behavior)
        .global("MS_MADV_RET_OFF", &offs.madv_ret)
        .global("MS_COLLAPSE_STATUS_OFF", &offs.collapse_status)
        .global("MS_COLLAPSE_STATUS_ARG", &offs.collapse_status_arg)
        .global("MS_SCAN_SUCCEED", &offs.scan_succeed)
        .global("MS_NR_MADVISE", &(libc::SYS_madvise as u64))
        .global("MS_REGS_ARG2_OFF", &offs.regs_arg2)
        .global("MS_REGS_NR_OFF", &offs.regs_nr)
        .global("MS_PER_THREAD", &u8::from(common.threads))
        .max_entries("MS_HIST", tools::key_cap(common))
        .max_entries("MS_START", tools::inflight_cap());
    let mut session = Session::load(loader::MEMSTALL, common, spec).map_err(Err)?;
    for (group, mode) in plan {
        let hooks = GROUPS
            .iter()
            .find(|(g, _)| g == group)
            .map(|(_, h)| *h)
            .unwrap_or(&[]);
        match mode {
            Mode::Btf => {
                let mut done = Vec::new();
                for h in hooks {
                    match session.attach_tp_btf(h.btf_prog, h.raw) {
                        Ok(id) => done.push((h, id)),
                        Err(e) => {
                            tracing::info!("memstall {group}: tp_btf {} refused ({e})", h.raw);
                            for (h, id) in done {
                                session.detach_tp_btf(h.btf_prog, h.raw, id);
                            }
                            return Err(Ok(group));
                        }
                    }
                }
            }
            Mode::Classic => {
                for h in hooks {
                    session
                        .attach_tracepoint(h.tp_prog, h.category, h.event)
                        .map_err(|e| Err(e.into()))?;
                }
            }
        }
    }
    Ok(session)
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let common = args.common;
    let sink = tools::preflight(NAME, &common)?;

    // Each group as BTF tracepoints where this kernel allows, else classic tracepoints (which
    // need tracefs, opened only then), else skipped with the reason.
    let mut offs = Offsets::new();
    let mut plan: Vec<(&'static str, Mode)> = Vec::new();
    let mut skipped: Vec<(&'static str, String)> = Vec::new();
    let mut tracefs: Option<Tracefs> = None;
    let mut classic: Vec<&'static str> = Vec::new();
    for (group, hooks) in GROUPS {
        match offs.btf_group(group, hooks) {
            Ok(()) => plan.push((group, Mode::Btf)),
            Err(why) => {
                tracing::info!("memstall {group}: no BTF tracepoints ({why})");
                classic.push(group);
            }
        }
    }
    loop {
        for group in std::mem::take(&mut classic) {
            let t = match &tracefs {
                Some(t) => t,
                None => tracefs.insert(Tracefs::open()?),
            };
            let hooks = GROUPS
                .iter()
                .find(|(g, _)| *g == group)
                .map(|(_, h)| *h)
                .unwrap_or(&[]);
            let mut missing = None;
            for h in hooks {
                if !t.has_event(h.category, h.event)? {
                    missing = Some(format!("no tracepoint {}:{}", h.category, h.event));
                    break;
                }
            }
            match missing {
                Some(why) => skipped.push((group, why)),
                None => {
                    offs.classic_group(t, group)?;
                    plan.push((group, Mode::Classic));
                }
            }
        }
        if !plan
            .iter()
            .any(|(g, _)| ["compaction", "reclaim", "memcg_reclaim", "thp_collapse"].contains(g))
        {
            return Err(UserError::KernelFeature(
                "no compaction, vmscan or huge_memory tracepoints on this kernel (CONFIG_COMPACTION, CONFIG_TRANSPARENT_HUGEPAGE and tracepoints missing)".into(),
            )
            .into());
        }
        match load_and_attach(&common, &plan, &offs) {
            Ok(session) => {
                return start(args.rows, common, sink, session, plan, skipped, offs);
            }
            Err(Ok(group)) => {
                plan.retain(|(g, _)| *g != group);
                classic.push(group);
            }
            Err(Err(e)) => return Err(e),
        }
    }
}

fn start(
    rows: usize,
    common: Common,
    sink: Sink,
    mut session: Session,
    plan: Vec<(&'static str, Mode)>,
    skipped: Vec<(&'static str, String)>,
    offs: Offsets,
) -> anyhow::Result<()> {
    // Groups in their declared order.
    let traced: Vec<&'static str> = GROUPS
        .iter()
        .map(|(g, _)| *g)
        .filter(|g| plan.iter().any(|(p, _)| p == g))
        .collect();
    let thp_dir = std::path::PathBuf::from(THP_DIR);
    let thp_start = ThpSettings::read(&thp_dir);
    let vm_start = read_vmstat();
    let take = |s: &mut Session, m: &str| {
        s.ebpf.take_map(m).ok_or_else(|| {
            anyhow::Error::new(loader::LoadError::NoMap {
                object: s.object,
                map: m.into(),
            })
        })
    };
    let hist = HashMap::try_from(take(&mut session, "MS_HIST")?).context("MS_HIST")?;
    let other = Array::try_from(take(&mut session, "MS_OTHER")?).context("MS_OTHER")?;
    let news = RingBuf::try_from(take(&mut session, "MS_NEW")?).context("MS_NEW")?;
    tools::announce(
        &format!("memory stalls ({})", traced.join(", ")),
        &common,
        &session,
        &skipped,
    );
    let layout = cgroup::Layout::detect();
    let mut tool = Memstall {
        session,
        hist,
        other,
        news,
        procs: StdHashMap::new(),
        ids: cgroup::IdResolver::new(&layout),
        layout,
        traced,
        skipped,
        outcome_names: offs.outcome_names,
        thp_dir,
        thp_start,
        vm_prev: vm_start.clone(),
        vm_start,
        common: common.clone(),
        max_rows: rows,
    };
    engine::drive(&common, sink, &mut tool)?;
    Ok(())
}

/// One report row: a process (or thread) and kind.
struct Row {
    id: u32,
    tgid: u32,
    kind: u32,
    comm: Vec<u8>,
    kthread: bool,
    cgroup: Option<Vec<u8>>,
    cgroup_id: u64,
    anon_huge_kb: Option<u64>,
    val: MsVal,
    stats: LatStats,
}

impl Memstall {
    /// Learns what can only be read while the process lives.
    fn learn(&mut self, tgid: u32) {
        let info = self.procs.entry(tgid).or_default();
        if info.cgroup.is_none() {
            info.cgroup = cgroup::memory_path_of(tgid);
        }
        if info.kthread.is_none() {
            info.kthread = is_kthread(tgid);
        }
        if let Some(kb) = anon_huge_kb(tgid) {
            info.anon_huge_kb = Some(kb);
        }
    }

    fn outcome_text(&self, v: &MsVal) -> Vec<(String, u64)> {
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
}

impl Collector for Memstall {
    fn event_fd(&self) -> Option<RawFd> {
        Some(self.news.as_raw_fd())
    }

    fn on_events(&mut self) -> anyhow::Result<()> {
        let mut tgids = Vec::new();
        while let Some(item) = self.news.next() {
            if item.len() >= std::mem::size_of::<MsNew>() {
                // SAFETY: the kernel wrote an MsNew (repr(C), plain integers) here; the length
                // was checked and read_unaligned tolerates any alignment.
                let e = unsafe { std::ptr::read_unaligned(item.as_ptr() as *const MsNew) };
                tgids.push(e.tgid);
            }
        }
        for t in tgids {
            self.learn(t);
        }
        Ok(())
    }

    fn preamble(&self) -> Option<Report> {
        let skipped: Vec<_> = self
            .skipped
            .iter()
            .map(|(n, r)| json!({"group": n, "reason": r}))
            .collect();
        let cgroup_memory = if self.layout.memory_on_v2() {
            "v2"
        } else if self.layout.v1_memory.is_some() {
            "v1"
        } else {
            "none"
        };
        tools::meta_report(
            NAME,
            &self.common,
            &self.session,
            json!({
                "traced": self.traced,
                "skipped": skipped,
                "cgroup_memory": cgroup_memory,
                "thp": self.thp_start.json(),
                "vmstat": self.vm_start,
            }),
        )
    }

    fn collect(&mut self, w: &Window) -> anyhow::Result<Report> {
        let gen = self.session.flip_generation()?;
        let drained =
            loader::drain_generation(&mut self.hist, gen, |k| k.gen).context("reading MS_HIST")?;
        let other = self.other.get(&gen, 0).context("reading MS_OTHER")?;
        // The kernel writes the other generation now, so the reset races with nothing.
        self.other
            .set(gen, MsVal::ZERO, 0)
            .context("resetting MS_OTHER")?;
        let st = self.session.stats_delta()?;
        let vm_now = read_vmstat();
        let vm = vm_delta(&self.vm_prev, &vm_now);
        self.vm_prev = vm_now;
        let thp = ThpSettings::read(&self.thp_dir);

        let mut merged: BTreeMap<(u32, u32), MsVal> = BTreeMap::new();
        for (k, v) in &drained {
            merged
                .entry((k.id, k.kind))
                .and_modify(|m| m.merge(v))
                .or_insert(*v);
        }
        let threads = self.common.threads;
        let mut rows = Vec::new();
        for ((id, kind), v) in merged {
            self.learn(v.tgid);
            let info = self.procs.get(&v.tgid).cloned().unwrap_or_default();
            let comm = row_comm(id, v.tgid, threads, &v.comm);
            let cgroup = info.cgroup.clone().or_else(|| {
                if self.layout.memory_on_v2() {
                    self.ids.path(v.cgroup_id)
                } else {
                    None
                }
            });
            rows.push(Row {
                id,
                tgid: v.tgid,
                kind,
                kthread: info.kthread.unwrap_or_else(|| kthread_by_name(&comm)),
                comm,
                cgroup,
                cgroup_id: v.cgroup_id,
                anon_huge_kb: info.anon_huge_kb,
                stats: hist::stats(&v.hist),
                val: v,
            });
        }
        if other.hist.count > 0 || other.collapses > 0 || other.scans > 0 {
            rows.push(Row {
                id: 0,
                tgid: 0,
                kind: u32::MAX,
                comm: b"[other]".to_vec(),
                kthread: false,
                cgroup: None,
                cgroup_id: 0,
                anon_huge_kb: None,
                stats: hist::stats(&other.hist),
                val: other,
            });
        }
        rows.sort_by(|a, b| {
            b.stats
                .total_ns
                .cmp(&a.stats.total_ns)
                .then(b.val.collapses.cmp(&a.val.collapses))
                .then(a.id.cmp(&b.id))
                .then(a.kind.cmp(&b.kind))
        });

        let secs = w.secs();
        let (end_text, end_ns) = w.end_json();
        let mut report = Report::default();
        let when = if w.interval {
            format!("interval {} ending {end_text}, ", w.index + 1)
        } else {
            String::new()
        };
        let stalls: u64 = rows.iter().map(|r| r.stats.count).sum();
        let missed = st[stats::START_MAP_FULL as usize] + st[stats::RINGBUF_FULL as usize];
        let over_cap = st[stats::KEY_MAP_FULL as usize];
        report.title = format!(
            "memstall: {stalls} timed stalls in {}; {when}{secs:.2}s ({}); missed {missed}",
            tools::scope(&self.common),
            w.stop.as_str()
        );
        if missed > 0 || over_cap > 0 {
            report.notes.push(format!(
                "missed: in-flight map full {}, ring buffer full {} (cgroup names may be missing); {over_cap} event(s) over the --max-keys cap are counted in the [other] row",
                st[stats::START_MAP_FULL as usize],
                st[stats::RINGBUF_FULL as usize],
            ));
        }
        for (n, r) in &self.skipped {
            report.notes.push(format!("skipped {n}: {r}"));
        }
        let thp_changed = thp != self.thp_start;
        report.notes.push(format!(
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
        report.notes.push(format!(
            "/proc/vmstat over the window: {}",
            VM_KEYS
                .iter()
                .map(|k| match vm.get(k) {
                    Some(v) => format!("{k} +{v}"),
                    None => format!("{k} n/a"),
                })
                .collect::<Vec<_>>()
                .join(", ")
        ));

        let id_col = if threads { "TID" } else { "PID" };
        let columns = [
            (id_col, Align::Right),
            ("COMM", Align::Left),
            ("KIND", Align::Left),
            ("COUNT", Align::Right),
            ("TOTAL", Align::Right),
            ("STALL/s", Align::Right),
            ("P50", Align::Right),
            ("P99", Align::Right),
            ("MAX", Align::Right),
            ("THP_KB", Align::Right),
            ("CGROUP", Align::Left),
            ("DETAIL", Align::Left),
        ];
        let mut user_t = Table::new(&columns);
        user_t.caption = Some("Stalled processes:".into());
        let mut kt = Table::new(&columns);
        kt.caption = Some("Kernel threads (background work, no application waits on it):".into());
        let (mut shown_user, mut shown_k) = (0usize, 0usize);
        let mut hidden = 0usize;
        let mut findings = Vec::new();
        for r in &rows {
            let s = &r.stats;
            let kind = KIND_NAMES.get(r.kind as usize).copied().unwrap_or("all");
            let timed = r.kind != KIND_THP_COLLAPSE || s.count > 0;
            let per_s = (s.total_ns as f64 / secs).round() as u64;
            let detail = match r.kind {
                KIND_COMPACTION => self
                    .outcome_text(&r.val)
                    .iter()
                    .map(|(n, c)| format!("{n} {c}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                KIND_RECLAIM | KIND_MEMCG_RECLAIM => {
                    format!("{} pages reclaimed", r.val.reclaimed)
                }
                KIND_THP_COLLAPSE => format!(
                    "{}/{} collapsed, {} scans, {} isolates{}",
                    r.val.collapsed,
                    r.val.collapses,
                    r.val.scans,
                    r.val.isolates,
                    if s.count > 0 {
                        format!(", {} MADV_COLLAPSE calls", s.count)
                    } else {
                        String::new()
                    }
                ),
                _ => String::new(),
            };
            let t = |v: u64| if timed { fmt_ns(v) } else { "-".into() };
            let cells = vec![
                r.id.to_string(),
                sanitize::text(&r.comm),
                kind.to_string(),
                if timed {
                    s.count.to_string()
                } else {
                    "-".into()
                },
                t(s.total_ns),
                if timed { fmt_ns(per_s) } else { "-".into() },
                t(s.p50_ns),
                t(s.p99_ns),
                t(s.max_ns),
                r.anon_huge_kb
                    .map(|k| k.to_string())
                    .unwrap_or_else(|| "-".into()),
                r.cgroup
                    .as_deref()
                    .map(sanitize::text)
                    .unwrap_or_else(|| "?".into()),
                detail,
            ];
            let (table, shown) = if r.kthread {
                (&mut kt, &mut shown_k)
            } else {
                (&mut user_t, &mut shown_user)
            };
            if self.max_rows == 0 || *shown < self.max_rows {
                table.push(cells);
                *shown += 1;
                if timed && s.count > 0 {
                    report.hists.push((
                        format!("{kind}[{} {}]", r.id, sanitize::text(&r.comm)),
                        r.val.hist,
                    ));
                }
            } else {
                hidden += 1;
            }
            let null_unless = |v: u64| if timed { json!(v) } else { json!(null) };
            let mut line = json!({
                "tool": NAME,
                "type": "summary",
                "pid": if threads { r.tgid } else { r.id },
                "kind": kind,
                "kthread": r.kthread,
                "cgroup": null,
                "cgroup_id": r.cgroup_id,
                "count": s.count,
                "timed": timed,
                "total_ns": null_unless(s.total_ns),
                "stall_ns_per_s": null_unless(per_s),
                "mean_ns": null_unless(s.mean_ns),
                "p50_ns": null_unless(s.p50_ns),
                "p90_ns": null_unless(s.p90_ns),
                "p99_ns": null_unless(s.p99_ns),
                "max_ns": null_unless(s.max_ns),
                "anon_huge_kb": r.anon_huge_kb,
                "interval_ns": w.elapsed.as_nanos() as u64,
                "interval_end": end_text,
                "interval_end_ns": end_ns,
            });
            match r.kind {
                KIND_COMPACTION => {
                    line["outcomes"] = json!(self
                        .outcome_text(&r.val)
                        .into_iter()
                        .collect::<BTreeMap<_, _>>());
                }
                KIND_RECLAIM | KIND_MEMCG_RECLAIM => {
                    line["reclaimed_pages"] = json!(r.val.reclaimed);
                }
                KIND_THP_COLLAPSE => {
                    line["collapses"] = json!(r.val.collapses);
                    line["collapsed"] = json!(r.val.collapsed);
                    line["scans"] = json!(r.val.scans);
                    line["isolates"] = json!(r.val.isolates);
                    line["madvise_calls"] = json!(s.count);
                }
                _ => {}
            }
            sanitize::put_json(&mut line, "comm", &r.comm);
            if let Some(c) = &r.cgroup {
                sanitize::put_json(&mut line, "cgroup", c);
            }
            if threads {
                line["tid"] = json!(r.id);
            }
            report.json.push(line);
            if r.kind < probes_common::memstall::NKINDS {
                findings.push(Finding {
                    pid: r.tgid,
                    comm: sanitize::text(&r.comm),
                    kind: r.kind,
                    kthread: r.kthread,
                    cgroup: r.cgroup.as_deref().map(sanitize::text),
                    count: s.count,
                    total_ns: s.total_ns,
                    p99_ns: s.p99_ns,
                    max_ns: s.max_ns,
                    reclaimed_pages: r.val.reclaimed,
                    collapses: r.val.collapses,
                    collapsed: r.val.collapsed,
                    scans: r.val.scans,
                });
            }
        }
        if !user_t.rows.is_empty() {
            report.tables.push(user_t);
        }
        if !kt.rows.is_empty() {
            report.tables.push(kt);
        }
        if hidden > 0 {
            report.footnotes.push(format!(
                "{hidden} more row(s) with less stall time not shown (--rows 0 shows all)"
            ));
        }
        report.footnotes.push(
            "COUNT: timed stalls, which add up to the header's count (compaction: one per zone compacted; thp_collapse: MADV_COLLAPSE calls, with the collapse attempts in DETAIL; `-`: background work, not timed). STALL/s: stall time per second of the window. THP_KB: AnonHugePages (KiB) from smaps_rollup, last read while the process lived.".into(),
        );
        let verdict_lines = verdict(&Evidence {
            secs,
            thp: &thp,
            vm: &vm,
            rows: &findings,
        });
        report.footnotes.push("Verdict:".into());
        for v in &verdict_lines {
            report.footnotes.push(format!("- {v}"));
        }
        report.json.push(json!({
            "tool": NAME,
            "type": "context",
            "thp": thp.json(),
            "thp_changed": thp_changed,
            "vmstat_delta": vm,
            "interval_end": end_text,
            "interval_end_ns": end_ns,
        }));
        report.json.push(json!({
            "tool": NAME,
            "type": "verdict",
            "lines": verdict_lines,
            "interval_end": end_text,
            "interval_end_ns": end_ns,
        }));
        report.json.push(engine::stats_line(
            NAME,
            w,
            &st,
            json!({"stalls": stalls, "missed": missed}),
        ));
        if w.interval {
            // Keep what is known about live processes; forget the exited.
            self.procs.retain(|pid, _| crate::host::proc::exists(*pid));
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture_dir() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/memstall")
    }

    fn fixture(name: &str) -> String {
        let p = fixture_dir().join(name);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    }

    #[test]
    fn thp_settings_from_sysfs_fixtures() {
        let a = ThpSettings::read(&fixture_dir().join("thp-always"));
        assert_eq!(a.enabled.as_deref(), Some("always"));
        assert_eq!(a.defrag.as_deref(), Some("always"));
        assert_eq!(a.khugepaged_defrag.as_deref(), Some("1"));
        assert_eq!(a.scan_sleep_ms, Some(10000));
        assert_eq!(a.pages_to_scan, Some(4096));
        let m = ThpSettings::read(&fixture_dir().join("thp-madvise"));
        assert_eq!(m.enabled.as_deref(), Some("madvise"));
        assert_eq!(m.defrag.as_deref(), Some("defer+madvise"));
        // A kernel without THP has no directory: every setting is unknown, nothing panics.
        let none = ThpSettings::read(&fixture_dir().join("no-such-dir"));
        assert_eq!(none, ThpSettings::default());
        assert!(none.text().contains("defrag=?"));
    }

    #[test]
    fn selected_values() {
        assert_eq!(
            selected("always [madvise] never\n").as_deref(),
            Some("madvise")
        );
        assert_eq!(selected("1\n").as_deref(), Some("1"));
        assert_eq!(selected("  \n"), None);
        assert_eq!(selected("]odd[").as_deref(), Some("]odd["));
    }

    #[test]
    fn vmstat_fixture_and_deltas() {
        let before = parse_vmstat(&fixture("vmstat.before")).unwrap();
        let after = parse_vmstat(&fixture("vmstat.after")).unwrap();
        assert_eq!(before["compact_stall"], 10);
        // allocstall_* summed.
        assert_eq!(before["allocstall"], 3 + 4);
        let d = vm_delta(&before, &after);
        assert_eq!(d["compact_stall"], 23);
        assert_eq!(d["compact_fail"], 5);
        assert_eq!(d["compact_success"], 18);
        assert_eq!(d["thp_fault_alloc"], 40);
        assert_eq!(d["thp_collapse_alloc"], 3);
        assert_eq!(d["allocstall"], 2);
        assert_eq!(d["pgscan_direct"], 500);
        // An old kernel without THP counters: those keys are absent, not zero.
        let old = parse_vmstat("nr_free_pages 100\ncompact_stall 1\n").unwrap();
        assert!(!old.contains_key("thp_fault_alloc"));
        assert!(parse_vmstat("compact_stall notanumber\n").is_err());
    }

    fn thp(defrag: &str) -> ThpSettings {
        ThpSettings {
            enabled: Some("always".into()),
            defrag: Some(defrag.into()),
            khugepaged_defrag: Some("1".into()),
            scan_sleep_ms: Some(10000),
            pages_to_scan: Some(4096),
        }
    }

    fn vm(pairs: &[(&'static str, i64)]) -> VmCounters {
        let mut v: VmCounters = VM_KEYS.iter().map(|k| (*k, 0)).collect();
        v.extend(pairs.iter().copied());
        v
    }

    fn row(comm: &str, pid: u32, kind: u32, count: u64, total_ns: u64) -> Finding {
        Finding {
            pid,
            comm: comm.into(),
            kind,
            count,
            total_ns,
            p99_ns: 180_000_000,
            max_ns: 200_000_000,
            ..Default::default()
        }
    }

    #[test]
    fn verdict_defrag_always_names_the_process_and_the_fix() {
        let s = thp("always");
        let v = vm(&[
            ("compact_stall", 23),
            ("compact_success", 20),
            ("compact_fail", 3),
            ("thp_fault_alloc", 50),
        ]);
        let rows = [row("postgres", 42, KIND_COMPACTION, 23, 1_900_000_000)];
        let out = verdict(&Evidence {
            secs: 10.0,
            thp: &s,
            vm: &v,
            rows: &rows,
        });
        assert_eq!(out.len(), 1, "{out:?}");
        let l = &out[0];
        assert!(
            l.starts_with("THP defrag=always: direct compaction stalled postgres (42) 23 times, 1.90 s in 10 s (19.0 % of the time; p99 180ms"),
            "{l}"
        );
        assert!(l.contains("compact_stall +23"), "{l}");
        assert!(l.contains("defrag=madvise or never"), "{l}");
        assert!(l.contains("persistent"), "{l}");
    }

    #[test]
    fn verdict_explicit_compaction_is_not_called_a_stall() {
        let s = thp("madvise");
        let v = vm(&[]);
        let rows = [row("sh", 7, KIND_COMPACTION, 3, 30_000_000)];
        let out = verdict(&Evidence {
            secs: 1.0,
            thp: &s,
            vm: &v,
            rows: &rows,
        });
        assert_eq!(out.len(), 1);
        assert!(out[0].contains("compact_stall +0"), "{}", out[0]);
        assert!(out[0].contains("requested explicitly"), "{}", out[0]);
    }

    #[test]
    fn verdict_madvise_defrag_and_no_thp_faults() {
        let v = vm(&[("compact_stall", 5)]);
        let rows = [row("java", 9, KIND_COMPACTION, 5, 10_000_000)];
        let s = thp("madvise");
        let out = verdict(&Evidence {
            secs: 5.0,
            thp: &s,
            vm: &v,
            rows: &rows,
        });
        assert!(
            out[0].contains("high-order kernel allocations"),
            "{}",
            out[0]
        );
        let v = vm(&[("compact_stall", 5), ("thp_fault_alloc", 5)]);
        let out = verdict(&Evidence {
            secs: 5.0,
            thp: &s,
            vm: &v,
            rows: &rows,
        });
        assert!(out[0].contains("defer+madvise"), "{}", out[0]);
    }

    #[test]
    fn verdict_reclaim_memcg_thp_and_kthreads() {
        let s = thp("madvise");
        let v = vm(&[
            ("allocstall", 4),
            ("pgscan_direct", 900),
            ("thp_collapse_alloc", 2),
        ]);
        let mut memcg = row("writer", 11, KIND_MEMCG_RECLAIM, 100, 50_000_000);
        memcg.cgroup = Some("/tk-test".into());
        memcg.reclaimed_pages = 8000;
        let mut reclaim = row("redis", 12, KIND_RECLAIM, 4, 80_000_000);
        reclaim.reclaimed_pages = 128;
        let mut collapse = row("app", 13, KIND_THP_COLLAPSE, 1, 3_000_000);
        collapse.collapses = 2;
        collapse.collapsed = 2;
        let mut khp = row("khugepaged", 50, KIND_THP_COLLAPSE, 0, 0);
        khp.kthread = true;
        khp.collapses = 5;
        khp.collapsed = 4;
        khp.scans = 9;
        let mut kcd = row("kcompactd0", 51, KIND_COMPACTION, 2, 9_000_000);
        kcd.kthread = true;
        let rows = [khp, collapse, memcg, reclaim, kcd];
        let out = verdict(&Evidence {
            secs: 2.0,
            thp: &s,
            vm: &v,
            rows: &rows,
        });
        assert_eq!(out.len(), 5, "{out:?}");
        // Applications first, most stall time first; kernel threads last, also by stall time.
        assert!(
            out[0].starts_with("direct reclaim stalled redis (12) 4 times"),
            "{}",
            out[0]
        );
        assert!(
            out[0].contains("allocstall +4, pgscan_direct +900"),
            "{}",
            out[0]
        );
        assert!(
            out[1].contains("writer (11) in memory cgroup /tk-test hit its limit"),
            "{}",
            out[1]
        );
        assert!(out[1].contains("8000 pages"), "{}", out[1]);
        assert!(
            out[2].starts_with("app (13) collapsed 2 of 2"),
            "{}",
            out[2]
        );
        assert!(out[2].contains("thp_collapse_alloc +2"), "{}", out[2]);
        assert!(
            out[4].contains("background") && out[4].starts_with("khugepaged"),
            "{}",
            out[4]
        );
        assert!(
            out[4].contains("4 of 5") && out[4].contains("9 PMD scans"),
            "{}",
            out[4]
        );
        assert!(
            out[3].starts_with("kcompactd0 (51) compacted in the background"),
            "{}",
            out[3]
        );
    }

    #[test]
    fn verdict_nothing_seen_says_so_with_evidence() {
        let s = thp("madvise");
        let v = vm(&[]);
        let out = verdict(&Evidence {
            secs: 10.0,
            thp: &s,
            vm: &v,
            rows: &[],
        });
        assert_eq!(out.len(), 1);
        assert!(
            out[0].starts_with("no memory stalls seen in 10 s"),
            "{}",
            out[0]
        );
        assert!(out[0].contains("compact_stall +0"), "{}", out[0]);
        // Counters moved but nothing in scope was traced: said, not hidden.
        let v = vm(&[("compact_stall", 3)]);
        let out = verdict(&Evidence {
            secs: 10.0,
            thp: &s,
            vm: &v,
            rows: &[],
        });
        assert_eq!(out.len(), 1);
        assert!(
            out[0].contains("compact_stall +3 but no compaction stall was traced"),
            "{}",
            out[0]
        );
        // Counters this kernel lacks are "n/a", never a made-up zero.
        let out = verdict(&Evidence {
            secs: 1.0,
            thp: &s,
            vm: &VmCounters::new(),
            rows: &[],
        });
        assert!(out[0].contains("compact_stall n/a"), "{}", out[0]);
    }
}
