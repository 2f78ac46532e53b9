//! memstall's findings: a pure function of the rows, the THP settings, the vmstat deltas, the
//! cgroup counters and the OOM kills of a window. Each names who stalled, in what, for how
//! much of the time it was alive, the evidence as numbers, the fix and the next command.

use crate::report::harm::{FELT_SHARE_PPM, FELT_STALL_NS, MIN_FILLER_SHARE_PPM};
use probes_common::memstall::{
    KIND_COMPACTION, KIND_MEMCG_RECLAIM, KIND_RECLAIM, KIND_THP_COLLAPSE, KIND_THP_FAULT,
};

use crate::{
    host::{thp::ThpSettings, vmstat::Vmstat},
    report::{
        findings::{rank, Cause, Finding, Num, Score, Subject},
        render::fmt_ns,
        who::Title,
    },
};

use super::INFO;

/// One row as the findings see it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Subj {
    pub pid: u32,
    pub comm: String,
    /// The process title (`postgres: walwriter`).
    pub title: Title,
    /// The container it runs in, if any.
    pub container: Option<crate::host::container::Container>,
    pub kind: u32,
    /// A kernel thread (kcompactd, khugepaged): background work, nobody's stall.
    pub kthread: bool,
    pub cgroup: Option<String>,
    /// Timed stalls (compaction: allocations, or zones for compaction that served none).
    pub count: u64,
    pub total_ns: u64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
    /// Time it was alive in the window.
    pub alive_ns: u64,
    /// Compaction: allocations that stalled, and zones compacted.
    pub direct: u64,
    pub zones: u64,
    pub reclaimed_pages: u64,
    pub collapses: u64,
    pub collapsed: u64,
    pub scans: u64,
    pub fallbacks: u64,
}

impl Subj {
    /// Who stalled, with the title beside the name.
    pub fn subject(&self) -> Subject {
        Subject::process(self.pid, self.comm.clone())
            .with_title(&self.title)
            .with_container(self.container.as_ref())
    }
}

/// A memory cgroup's limit counters over the window.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CgFacts {
    pub path: String,
    /// v1 `memory.failcnt` growth.
    pub failcnt: Option<u64>,
    /// v2 `memory.events` `max` and `oom_kill` growth.
    pub max: Option<u64>,
    pub oom_kill: Option<u64>,
}

/// One OOM kill.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Oom {
    pub pid: u32,
    pub comm: String,
    pub cgroup: Option<String>,
    pub killer: String,
}

/// Everything the findings reason from.
#[derive(Clone, Debug)]
pub struct Evidence<'a> {
    pub secs: f64,
    pub thp: &'a ThpSettings,
    /// `/proc/vmstat` growth over the window.
    pub vm: &'a Vmstat,
    pub rows: &'a [Subj],
    pub cgroups: &'a [CgFacts],
    pub ooms: &'a [Oom],
    /// Direct compaction is counted per allocation (else per zone).
    pub per_allocation: bool,
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

impl Evidence<'_> {
    fn vm(&self, k: &str) -> u64 {
        self.vm.get(k).unwrap_or(0).max(0) as u64
    }

    fn window_ns(&self) -> u64 {
        (self.secs * 1e9) as u64
    }

    /// `T in S (P % of the time; p99 X, max Y)`, the share of the time it was alive.
    fn share(&self, r: &Subj) -> String {
        let window = self.window_ns();
        let alive = if r.alive_ns == 0 {
            window
        } else {
            r.alive_ns.min(window)
        };
        let of = if alive * 100 >= window * 99 {
            "of the time".to_string()
        } else {
            format!("of the {} it was alive", ns_text(alive))
        };
        format!(
            "{} in {} ({:.1} % {of}; p99 {}, max {})",
            ns_text(r.total_ns),
            secs_text(self.secs),
            r.total_ns as f64 / alive.max(1) as f64 * 100.0,
            ns_text(r.p99_ns),
            ns_text(r.max_ns)
        )
    }

    /// `N times, ` and [`Self::share`].
    fn timing(&self, r: &Subj, n: u64) -> String {
        format!("{}, {}", times(n), self.share(r))
    }

    fn finding(&self, cause: Cause, r: &Subj, summary: String, advice: String) -> Finding {
        Finding {
            tool: INFO.name,
            cause,
            subject: r.subject().with_cgroup(r.cgroup.clone()),
            culprit: None,
            score: Score::NsPerS(crate::report::harm::per_second_alive(
                r.total_ns,
                r.alive_ns,
                self.window_ns(),
            )),
            summary,
            evidence: vec![],
            advice,
            next: Some(format!(
                "tracekit memstall --pid {} --duration 30s --hist",
                r.pid
            )),
            fold: None,
            members: Vec::new(),
        }
        .evidence("stalls", r.count)
        .evidence("total_ns", r.total_ns)
        .evidence("p50_ns", r.p50_ns)
        .evidence("p99_ns", r.p99_ns)
        .evidence("max_ns", r.max_ns)
        .evidence("alive_ns", r.alive_ns)
        .evidence("window_ns", self.window_ns())
    }

    fn background(&self, cause: Cause, r: &Subj, n: u64, summary: String) -> Finding {
        let mut f = self.finding(cause, r, summary, String::new());
        f.score = Score::RatePerS(n as f64 / self.secs.max(1e-9));
        f.next = None;
        f
    }

    fn compaction(&self, r: &Subj) -> Option<Finding> {
        let who = r.subject().text();
        let vmt = |k: &str| self.vm.cite(k);
        let setting = |v: &Option<String>| v.clone().unwrap_or_else(|| "?".into());
        if r.kthread {
            let f = self.background(super::THP_COMPACTION, r, r.zones.max(r.count), format!(
                "{who} compacted in the background: {}. No application waited on it; /proc/vmstat compact_stall counts the direct (waited-for) compactions: {}.",
                self.timing(r, r.count),
                vmt("compact_stall")
            ));
            return Some(f.evidence("zones", r.zones));
        }
        let direct = if self.per_allocation {
            r.direct
        } else if self.vm("compact_stall") > 0 {
            r.count
        } else {
            0
        };
        if direct == 0 {
            if r.count == 0 {
                return None;
            }
            let f = self.finding(super::THP_COMPACTION, r, format!(
                "compaction ran in {who}: {} zone compaction(s), {}, for no allocation: it was requested explicitly (a write to /proc/sys/vm/compact_memory) or is proactive compaction, not an allocation stall; /proc/vmstat {}.",
                r.zones.max(r.count),
                self.share(r),
                vmt("compact_stall")
            ), "Nothing waited for memory here; if these pauses matter, trigger compaction off the latency path, or lower vm.compaction_proactiveness for proactive compaction.".into());
            return Some(f.evidence("zones", r.zones));
        }
        let thp_faults = self.vm("thp_fault_alloc") + self.vm("thp_fault_fallback");
        let defrag = setting(&self.thp.defrag);
        let advice = if thp_faults == 0 {
            "No THP faults in the window (thp_fault_alloc and thp_fault_fallback +0): high-order kernel allocations compacted, so raise vm.min_free_kbytes (persistently in /etc/sysctl.d/) to leave kcompactd more headroom.".to_string()
        } else if defrag == "always" {
            "Consider defrag=madvise or never (`echo madvise > /sys/kernel/mm/transparent_hugepage/defrag`); to make it persistent, add a systemd-tmpfiles line `w /sys/kernel/mm/transparent_hugepage/defrag - - - - madvise` (or boot with transparent_hugepage=madvise).".to_string()
        } else if defrag == "madvise" || defrag == "defer+madvise" {
            format!("With defrag={defrag} only MADV_HUGEPAGE regions compact at fault: if {} asks for huge pages, consider defrag=defer+madvise or defer (kcompactd works instead), or disabling THP for it (prctl PR_SET_THP_DISABLE).", r.comm)
        } else {
            format!(
                "defrag={defrag} should not compact at THP faults; check enabled={} and per-process THP policy.",
                setting(&self.thp.enabled)
            )
        };
        let unit = if self.per_allocation {
            "allocations"
        } else {
            "zone compactions (per zone: this kernel has no per-allocation event)"
        };
        let f = self.finding(super::THP_COMPACTION, r, format!(
            "THP defrag={defrag}: direct compaction stalled {who} {} ({unit}, {} zones); /proc/vmstat {}, {}, {}, {}, {}.",
            self.timing(r, direct),
            r.zones,
            vmt("compact_stall"),
            vmt("compact_success"),
            vmt("compact_fail"),
            vmt("thp_fault_alloc"),
            vmt("thp_fault_fallback")
        ), advice);
        let mut f = f
            .evidence("direct_stalls", direct)
            .evidence("zones", r.zones);
        for k in [
            "compact_stall",
            "compact_success",
            "compact_fail",
            "thp_fault_alloc",
            "thp_fault_fallback",
        ] {
            if let Some(v) = self.vm.get(k) {
                f = f.evidence(vm_name(k), v);
            }
        }
        Some(f)
    }

    fn memcg(&self, r: &Subj) -> Finding {
        let who = r.subject().text();
        let cg = self
            .cgroups
            .iter()
            .find(|c| Some(&c.path) == r.cgroup.as_ref());
        let counters = match cg {
            Some(CgFacts {
                failcnt: Some(f), ..
            }) => format!("; memory.failcnt +{f}"),
            Some(CgFacts { max: Some(m), .. }) => format!("; memory.events max +{m}"),
            _ => String::new(),
        };
        let place = match r.cgroup.as_deref() {
            Some("/") => "in the root memory cgroup (which has no limit: a parent limit or proactive reclaim drove it)".to_string(),
            Some(c) => format!("in memory cgroup {c} hit its limit"),
            None => "in a memory cgroup that could not be named hit its limit".to_string(),
        };
        let mut f = self.finding(super::MEMCG_LIMIT, r, format!(
            "{who} {place}: memcg reclaim {}, reclaiming {} pages{counters}.",
            self.timing(r, r.count),
            r.reclaimed_pages
        ), "Raise the cgroup's limit (memory.max on v2, memory.limit_in_bytes on v1) or shrink its working set (page cache counts: O_DIRECT or posix_fadvise DONTNEED for streaming writes).".into())
        .evidence("reclaimed_pages", r.reclaimed_pages);
        if let Some(c) = cg {
            if let Some(v) = c.failcnt {
                f = f.evidence("failcnt_delta", v);
            }
            if let Some(v) = c.max {
                f = f.evidence("events_max_delta", v);
            }
        }
        f
    }

    fn one(&self, r: &Subj) -> Option<Finding> {
        let who = r.subject().text();
        let vmt = |k: &str| self.vm.cite(k);
        let setting = |v: &Option<String>| v.clone().unwrap_or_else(|| "?".into());
        Some(match (r.kind, r.kthread) {
            (KIND_COMPACTION, _) => return self.compaction(r),
            (KIND_RECLAIM, _) if r.count > 0 && felt(r.max_ns, r.total_ns, r.alive_ns.min(self.window_ns()).max(1)) => self.finding(super::RECLAIM, r, format!(
                "direct reclaim stalled {who} {}, reclaiming {} pages; /proc/vmstat {}, {} (global reclaim only: reclaim at a cgroup's limit is not in these).",
                self.timing(r, r.count),
                r.reclaimed_pages,
                vmt("allocstall"),
                vmt("pgscan_direct")
            ), "Free memory fell below the min watermark faster than kswapd freed it: raise vm.watermark_scale_factor or vm.min_free_kbytes (persistently in /etc/sysctl.d/) so kswapd starts earlier, or reduce memory use.".into())
            .evidence("reclaimed_pages", r.reclaimed_pages)
            .evidence("allocstall", self.vm("allocstall"))
            .evidence("pgscan_direct", self.vm("pgscan_direct")),
            (KIND_MEMCG_RECLAIM, _) if r.count > 0 => self.memcg(r),
            (KIND_THP_COLLAPSE, true) if r.collapses > 0 => self.background(super::THP_COLLAPSE, r, r.collapses, format!(
                "{who} collapsed {} of {} huge-page attempts ({} PMD scans) in {} in the background (khugepaged/defrag={}, scan_sleep_millisecs={}, pages_to_scan={}); /proc/vmstat {}, {}. No application waits on it; lower pages_to_scan if its CPU use matters.",
                r.collapsed,
                r.collapses,
                r.scans,
                secs_text(self.secs),
                setting(&self.thp.khugepaged_defrag),
                self.thp.scan_sleep_ms.map(|v| v.to_string()).unwrap_or_else(|| "?".into()),
                self.thp.pages_to_scan.map(|v| v.to_string()).unwrap_or_else(|| "?".into()),
                vmt("thp_collapse_alloc"),
                vmt("thp_collapse_alloc_failed")
            )).evidence("collapsed", r.collapsed).evidence("collapses", r.collapses),
            (KIND_THP_COLLAPSE, false) if r.collapses > 0 || r.count > 0 => {
                let timed = if r.count > 0 {
                    format!("; its MADV_COLLAPSE calls stalled it {}", self.timing(r, r.count))
                } else {
                    String::new()
                };
                self.finding(super::THP_COLLAPSE, r, format!(
                    "{who} collapsed {} of {} huge-page attempts itself (MADV_COLLAPSE){timed}; /proc/vmstat {}.",
                    r.collapsed,
                    r.collapses,
                    vmt("thp_collapse_alloc")
                ), "The program asked for this; if the pauses matter, collapse off the latency path or leave it to khugepaged.".into())
                .evidence("collapsed", r.collapsed)
                .evidence("collapses", r.collapses)
            }
            (KIND_THP_FAULT, false) if r.count > 0 => self.finding(super::THP_FAULT, r, format!(
                "{who} waited in THP faults {} — whole 2 MiB faults: allocating the huge page (its direct compaction and reclaim included), zeroing 2 MiB and mapping it; {} fell back to small pages; /proc/vmstat {}, {}.",
                self.timing(r, r.count),
                r.fallbacks,
                vmt("thp_fault_alloc"),
                vmt("thp_fault_fallback")
            ), format!("If these faults hurt latency: defrag=defer or defer+madvise (no compaction at fault; now {}), MADV_NOHUGEPAGE on the region, or prctl PR_SET_THP_DISABLE for {}; pre-fault memory at start-up otherwise.", setting(&self.thp.defrag), r.comm))
            .evidence("fallbacks", r.fallbacks),
            _ => return None,
        })
    }

    fn oom_findings(&self) -> Vec<Finding> {
        let mut by_cg: std::collections::BTreeMap<Option<&str>, Vec<&Oom>> = Default::default();
        for o in self.ooms {
            by_cg.entry(o.cgroup.as_deref()).or_default().push(o);
        }
        let mut out = Vec::new();
        for (cg, v) in by_cg {
            let names: Vec<String> = v
                .iter()
                .map(|o| format!("{} (pid {})", o.comm, o.pid))
                .collect();
            let facts = self.cgroups.iter().find(|c| Some(c.path.as_str()) == cg);
            let counters = match facts {
                Some(CgFacts {
                    failcnt: Some(f),
                    oom_kill,
                    ..
                }) => format!(
                    "; memory.failcnt +{f}{}",
                    oom_kill
                        .map(|k| format!(", oom_kill +{k}"))
                        .unwrap_or_default()
                ),
                Some(CgFacts {
                    max,
                    oom_kill: Some(k),
                    ..
                }) => format!(
                    "; memory.events{} oom_kill +{k}",
                    max.map(|m| format!(" max +{m},")).unwrap_or_default()
                ),
                _ => String::new(),
            };
            let place = match cg {
                Some("/") | None => {
                    "outside any limited memory cgroup (the node ran out of memory)".to_string()
                }
                Some(c) => format!("in memory cgroup {c}"),
            };
            let mut f = Finding {
                tool: INFO.name,
                cause: super::OOM_KILL,
                subject: match cg {
                    Some(c) => Subject::named("cgroup", c),
                    None => Subject::process(v[0].pid, v[0].comm.clone()),
                },
                culprit: None,
                score: Score::RatePerS(v.len() as f64 / self.secs.max(1e-9)),
                summary: format!(
                    "the OOM killer killed {} process(es) {place}: {}{counters}.",
                    v.len(),
                    names.join(", ")
                ),
                evidence: vec![],
                advice: "Raise the limit (memory.max on v2, memory.limit_in_bytes on v1) or cut what the processes in it use; memstall's memcg_reclaim rows show who fought the limit before the kill.".into(),
                next: Some("journalctl -k --grep 'Killed process|oom-kill'".into()),
                fold: None,
                members: Vec::new(),
            }
            .evidence("oom_kills", v.len());
            if let Some(c) = facts {
                if let Some(x) = c.failcnt {
                    f = f.evidence("failcnt_delta", x);
                }
                if let Some(x) = c.oom_kill {
                    f = f.evidence("oom_kill_delta", x);
                }
            }
            out.push(f);
        }
        out
    }
}

/// The evidence name of a vmstat counter (its growth over the window).
fn vm_name(k: &str) -> &'static str {
    match k {
        "compact_stall" => "vmstat_compact_stall",
        "compact_success" => "vmstat_compact_success",
        "compact_fail" => "vmstat_compact_fail",
        "thp_fault_alloc" => "vmstat_thp_fault_alloc",
        _ => "vmstat_thp_fault_fallback",
    }
}

/// Links each process stalled at its memory cgroup's limit to the process that fills the
/// cgroup: the one whose allocations made the cgroup reclaim most of the pages it reclaimed in
/// the window (each charge past the limit reclaims about what it allocates, so the pages each
/// process's reclaim freed measure its part of the pressure), if that is at least
/// [`MIN_FILLER_SHARE_PPM`] of them and more than the stalled process's own. The victim's
/// finding names it as culprit; the filler's own finding says whom it stalls and ranks below.
fn link_fillers(out: &mut [Finding], rows: &[Subj]) {
    let at_limit = |r: &&Subj| r.kind == KIND_MEMCG_RECLAIM && !r.kthread;
    let mut notes: Vec<(u32, String, Score)> = Vec::new();
    for f in out.iter_mut().filter(|f| f.cause == super::MEMCG_LIMIT) {
        let (Some(pid), Some(cg)) = (f.subject.pid, f.subject.cgroup.clone()) else {
            continue;
        };
        if cg == "/" {
            continue;
        }
        let mut by: std::collections::BTreeMap<u32, (u64, &Subj)> = Default::default();
        for r in rows
            .iter()
            .filter(at_limit)
            .filter(|r| r.cgroup.as_deref() == Some(cg.as_str()))
        {
            by.entry(r.pid).or_insert((0, r)).0 += r.reclaimed_pages;
        }
        let total: u64 = by.values().map(|v| v.0).sum();
        let own = by.get(&pid).map_or(0, |v| v.0);
        let Some((&filler, &(pages, r))) = by
            .iter()
            .filter(|(p, _)| **p != pid)
            .max_by_key(|(p, v)| (v.0, std::cmp::Reverse(**p)))
        else {
            continue;
        };
        let ppm = (pages as u128 * 1_000_000 / total.max(1) as u128) as u64;
        if ppm < MIN_FILLER_SHARE_PPM || pages <= own {
            continue;
        }
        let culprit = r.subject();
        f.summary.push_str(&format!(
            " What fills {cg}: {}, whose allocations made it reclaim {pages} of the {total} pages its reclaim freed in the window ({:.0} %; {} its own {own}).",
            culprit.text(),
            ppm as f64 / 1e4,
            f.subject.text(),
        ));
        f.advice = format!(
            "{} stalls for memory {} fills: give that its own memory cgroup (or a memory.high of its own below {cg}'s limit), or cut its page cache (O_DIRECT, posix_fadvise DONTNEED for streaming writes); or {}",
            f.subject.text(),
            culprit.text(),
            f.advice
        );
        f.evidence.extend([
            ("culprit_reclaimed_pages", Num::U(pages)),
            ("culprit_reclaim_share_ppm", Num::U(ppm)),
            ("cgroup_reclaimed_pages", Num::U(total)),
        ]);
        notes.push((
            filler,
            format!(
                " It fills {cg}, where {} stalled {} (p99 {}).",
                f.subject.text(),
                times(f.ev("stalls").unwrap_or(0.0) as u64),
                ns_text(f.ev("p99_ns").unwrap_or(0.0) as u64)
            ),
            f.score,
        ));
        f.culprit = Some(culprit);
    }
    for (filler, note, victim) in notes {
        for g in out
            .iter_mut()
            .filter(|g| g.cause == super::MEMCG_LIMIT && g.subject.pid == Some(filler))
        {
            g.summary.push_str(&note);
            // Its stalls are its own limit's cost: the victim it slows ranks first.
            g.rank_below(victim);
        }
    }
}

/// Findings, most harmful first, and notes about what was not seen.
pub fn findings(e: &Evidence) -> (Vec<Finding>, Vec<String>) {
    let mut out: Vec<Finding> = e.rows.iter().filter_map(|r| e.one(r)).collect();
    link_fillers(&mut out, e.rows);
    out.extend(e.oom_findings());
    rank(&mut out);
    let mut notes = Vec::new();
    let traced: u64 = e
        .rows
        .iter()
        .filter(|r| r.kind == KIND_COMPACTION && !r.kthread)
        .map(|r| if e.per_allocation { r.direct } else { r.count })
        .sum();
    let stall = e.vm("compact_stall");
    if stall > traced {
        notes.push(format!(
            "/proc/vmstat compact_stall +{stall} but {traced} direct compaction stall(s) traced in scope: the others are outside --pid/--comm, or began before tracing started."
        ));
    }
    if out.is_empty() {
        notes.push(format!(
            "no memory stalls seen in {}: no direct compaction, direct or memcg reclaim, THP collapse or OOM kill traced; /proc/vmstat {}, {}, {}, {}.",
            secs_text(e.secs),
            e.vm.cite("compact_stall"),
            e.vm.cite("allocstall"),
            e.vm.cite("pgscan_direct"),
            e.vm.cite("thp_collapse_alloc")
        ));
    }
    (out, notes)
}

#[cfg(test)]
mod tests;

/// A direct-reclaim stall worth a finding is one its process felt: a single stall of
/// [`FELT_STALL_NS`] or more (a request that waited that long), or stalls adding up to
/// [`FELT_SHARE_PPM`] of the time it was alive. A process whose THP fault reclaimed once for
/// 53 µs in an 8 s window got a finding before and was named beside the real victim.
fn felt(max_ns: u64, total_ns: u64, alive_ns: u64) -> bool {
    max_ns >= FELT_STALL_NS
        || total_ns.saturating_mul(1_000_000) / alive_ns.max(1) >= FELT_SHARE_PPM
}

#[cfg(test)]
mod felt_tests {
    use super::*;

    #[test]
    fn tiny_reclaim_is_not_felt_long_or_frequent_is() {
        // The innocent of the THP triage test: once, 53.3 µs in 8 s.
        assert!(!felt(53_300, 53_300, 8_000_000_000));
        // One 2 ms stall: felt by whatever request waited on it.
        assert!(felt(2_000_000, 2_000_000, 8_000_000_000));
        // Many short stalls adding up to 1 % of the time.
        assert!(felt(200_000, 80_000_000, 8_000_000_000));
        // dd: 143 stalls, 13.2 ms of its 468 ms alive (2.8 %).
        assert!(felt(1_990_000, 13_200_000, 468_000_000));
    }
}
