use std::collections::BTreeMap;

use super::*;
use crate::tools::memstall::report::VM_KEYS;

fn thp(defrag: &str) -> ThpSettings {
    ThpSettings {
        enabled: Some("always".into()),
        defrag: Some(defrag.into()),
        khugepaged_defrag: Some("1".into()),
        scan_sleep_ms: Some(10000),
        pages_to_scan: Some(4096),
    }
}

fn vm(pairs: &[(&str, i64)]) -> Vmstat {
    let mut v: BTreeMap<String, i64> = VM_KEYS.iter().map(|k| (k.to_string(), 0)).collect();
    v.extend(pairs.iter().map(|(k, x)| (k.to_string(), *x)));
    Vmstat(v)
}

fn row(comm: &str, pid: u32, kind: u32, count: u64, total_ns: u64) -> Subj {
    Subj {
        pid,
        comm: comm.into(),
        kind,
        count,
        total_ns,
        p99_ns: 180_000_000,
        max_ns: 200_000_000,
        direct: if kind == KIND_COMPACTION { count } else { 0 },
        zones: if kind == KIND_COMPACTION { count } else { 0 },
        ..Default::default()
    }
}

/// Asserts that `text` (a finding's summary or advice, a note) says `part`.
#[track_caller]
fn has(text: &str, part: &str) {
    assert!(text.contains(part), "{part:?} not in {text}");
}

fn run(secs: f64, thp: &ThpSettings, vm: &Vmstat, rows: &[Subj]) -> (Vec<Finding>, Vec<String>) {
    findings(&Evidence {
        secs,
        thp,
        vm,
        rows,
        cgroups: &[],
        ooms: &[],
        per_allocation: true,
    })
}

#[test]
fn defrag_always_names_the_process_and_the_fix() {
    let s = thp("always");
    let v = vm(&[
        ("compact_stall", 23),
        ("compact_success", 20),
        ("compact_fail", 3),
        ("thp_fault_alloc", 50),
    ]);
    let mut r = row("postgres", 42, KIND_COMPACTION, 23, 1_900_000_000);
    r.zones = 40;
    let (out, notes) = run(10.0, &s, &v, &[r]);
    assert_eq!(out.len(), 1, "{out:?}");
    assert!(notes.is_empty(), "{notes:?}");
    let f = &out[0];
    assert_eq!(f.cause, crate::tools::memstall::THP_COMPACTION);
    assert_eq!(f.score, Score::NsPerS(190_000_000));
    assert!(
        f.summary.starts_with("THP defrag=always: direct compaction stalled postgres (pid 42) 23 times, 1.90 s in 10 s (19.0 % of the time; p99 180ms"),
        "{}",
        f.summary
    );
    has(&f.summary, "(allocations, 40 zones)");
    has(&f.summary, "compact_stall +23");
    has(&f.advice, "defrag=madvise or never");
    has(&f.advice, "persistent");
    let j = f.json();
    assert_eq!(j["evidence"]["direct_stalls"], 23);
    assert_eq!(j["evidence"]["vmstat_compact_stall"], 23);
    assert_eq!(
        j["next"],
        "tracekit memstall --pid 42 --duration 30s --hist"
    );
}

#[test]
fn share_of_the_time_is_of_the_time_alive() {
    let s = thp("always");
    let v = vm(&[("compact_stall", 2), ("thp_fault_alloc", 2)]);
    let mut r = row("worker", 7, KIND_COMPACTION, 2, 1_500_000_000);
    r.alive_ns = 3_000_000_000;
    let (out, _) = run(22.0, &s, &v, &[r]);
    has(&out[0].summary, "(50.0 % of the 3.00 s it was alive;");
    // The score is per second of its life (report::harm::per_second_alive): what it felt.
    assert_eq!(out[0].score, Score::NsPerS(500_000_000));
}

#[test]
fn compaction_for_no_allocation_is_not_called_a_stall() {
    let s = thp("madvise");
    let v = vm(&[("compact_stall", 4)]);
    let mut r = row("sh", 7, KIND_COMPACTION, 3, 30_000_000);
    r.direct = 0;
    let (out, notes) = run(1.0, &s, &v, &[r]);
    assert_eq!(out.len(), 1);
    has(&out[0].summary, "for no allocation");
    has(&out[0].summary, "compact_memory");
    // The four compact_stall were someone else's: said, not hidden.
    has(&notes[0], "compact_stall +4 but 0 direct");
}

#[test]
fn madvise_defrag_and_no_thp_faults() {
    let v = vm(&[("compact_stall", 5)]);
    let rows = [row("java", 9, KIND_COMPACTION, 5, 10_000_000)];
    let s = thp("madvise");
    let (out, _) = run(5.0, &s, &v, &rows);
    has(&out[0].advice, "high-order kernel allocations");
    let v = vm(&[("compact_stall", 5), ("thp_fault_alloc", 5)]);
    let (out, _) = run(5.0, &s, &v, &rows);
    has(&out[0].advice, "defer+madvise");
}

#[test]
fn reclaim_memcg_thp_and_kthreads() {
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
    kcd.direct = 0;
    let cgroups = [CgFacts {
        path: "/tk-test".into(),
        failcnt: Some(130),
        ..Default::default()
    }];
    let rows = [khp, collapse, memcg, reclaim, kcd];
    let (out, _) = findings(&Evidence {
        secs: 2.0,
        thp: &s,
        vm: &v,
        rows: &rows,
        cgroups: &cgroups,
        ooms: &[],
        per_allocation: true,
    });
    assert_eq!(out.len(), 5, "{out:?}");
    let s: Vec<&str> = out.iter().map(|f| f.summary.as_str()).collect();
    // Applications first, most stall time first; background work last.
    assert!(
        s[0].starts_with("direct reclaim stalled redis (pid 12) 4 times"),
        "{}",
        s[0]
    );
    has(
        s[0],
        "allocstall +4, pgscan_direct +900 (global reclaim only",
    );
    has(
        s[1],
        "writer (pid 11) in memory cgroup /tk-test hit its limit",
    );
    has(s[1], "8000 pages; memory.failcnt +130");
    assert_eq!(out[1].subject.cgroup.as_deref(), Some("/tk-test"));
    assert_eq!(out[1].json()["evidence"]["failcnt_delta"], 130);
    assert!(
        s[2].starts_with("app (pid 13) collapsed 2 of 2"),
        "{}",
        s[2]
    );
    has(s[2], "thp_collapse_alloc +2");
    assert!(matches!(out[3].score, Score::RatePerS(_)));
    let bg: Vec<&&str> = s[3..].iter().collect();
    assert!(
        bg.iter()
            .any(|l| l.starts_with("kcompactd0 (pid 51) compacted in the background")),
        "{bg:?}"
    );
    assert!(
        bg.iter().any(|l| l.starts_with("khugepaged")
            && l.contains("4 of 5")
            && l.contains("9 PMD scans")),
        "{bg:?}"
    );
}

#[test]
fn the_root_cgroup_never_hit_a_limit() {
    let s = thp("madvise");
    let v = vm(&[]);
    let mut r = row("w", 3, KIND_MEMCG_RECLAIM, 1, 1_000_000);
    r.cgroup = Some("/".into());
    let (out, _) = run(1.0, &s, &v, &[r.clone()]);
    assert!(
        !out[0].summary.contains("hit its limit"),
        "{}",
        out[0].summary
    );
    r.cgroup = None;
    let (out, _) = run(1.0, &s, &v, &[r]);
    has(&out[0].summary, "could not be named");
}

#[test]
fn oom_kills_per_cgroup_with_counters() {
    let s = thp("madvise");
    let v = vm(&[]);
    let ooms: Vec<Oom> = (0..3)
        .map(|i| Oom {
            pid: 100 + i,
            comm: "worker".into(),
            cgroup: Some("/tkrw".into()),
            killer: "worker".into(),
        })
        .collect();
    let cgroups = [CgFacts {
        path: "/tkrw".into(),
        failcnt: Some(40),
        oom_kill: Some(3),
        ..Default::default()
    }];
    let (out, notes) = findings(&Evidence {
        secs: 2.0,
        thp: &s,
        vm: &v,
        rows: &[],
        cgroups: &cgroups,
        ooms: &ooms,
        per_allocation: true,
    });
    assert!(notes.is_empty(), "{notes:?}");
    assert_eq!(out.len(), 1);
    let f = &out[0];
    assert_eq!(f.cause, crate::tools::memstall::OOM_KILL);
    assert_eq!(f.subject.kind, "cgroup");
    assert!(
        f.summary.starts_with(
            "the OOM killer killed 3 process(es) in memory cgroup /tkrw: worker (pid 100)"
        ),
        "{}",
        f.summary
    );
    has(&f.summary, "memory.failcnt +40, oom_kill +3");
    assert_eq!(f.json()["evidence"]["oom_kills"], 3);
}

#[test]
fn thp_faults_say_what_the_time_covers() {
    let s = thp("always");
    let v = vm(&[("thp_fault_alloc", 30), ("thp_fault_fallback", 2)]);
    let mut r = row("db", 5, KIND_THP_FAULT, 32, 4_400_000_000);
    r.fallbacks = 2;
    let (out, _) = run(22.0, &s, &v, &[r]);
    assert_eq!(out[0].cause, crate::tools::memstall::THP_FAULT);
    has(&out[0].summary, "whole 2 MiB faults");
    has(&out[0].summary, "zeroing 2 MiB");
    has(&out[0].summary, "2 fell back");
}

#[test]
fn nothing_seen_says_so_with_evidence() {
    let s = thp("madvise");
    let (out, notes) = run(10.0, &s, &vm(&[]), &[]);
    assert!(out.is_empty());
    assert_eq!(notes.len(), 1);
    assert!(
        notes[0].starts_with("no memory stalls seen in 10 s"),
        "{}",
        notes[0]
    );
    has(&notes[0], "compact_stall +0");
    // Counters moved but nothing in scope was traced: said, not hidden.
    let (_, notes) = run(10.0, &s, &vm(&[("compact_stall", 3)]), &[]);
    has(
        &notes[0],
        "compact_stall +3 but 0 direct compaction stall(s) traced",
    );
    // Counters this kernel lacks are "n/a", never a made-up zero.
    let (_, notes) = run(1.0, &s, &Vmstat::default(), &[]);
    has(&notes[0], "compact_stall n/a");
}

/// The memory-cgroup incident of the README's harm model: `dd` fills a 32 MiB cgroup with page
/// cache, a service in the same cgroup stalls in reclaim for it. The service's finding names
/// `dd` (87 % of the cgroup's reclaimed pages) and ranks above `dd`'s own, which says whom it
/// stalls; a process of another cgroup that reclaimed more is nobody's filler here, and a
/// neighbour with less than half the pages is no culprit.
#[test]
fn a_stall_at_the_cgroup_limit_names_who_fills_the_cgroup() {
    let memcg = |comm: &str, pid: u32, count: u64, total_ns: u64, pages: u64, cg: &str| Subj {
        cgroup: Some(cg.into()),
        reclaimed_pages: pages,
        alive_ns: 6_000_000_000,
        ..row(comm, pid, KIND_MEMCG_RECLAIM, count, total_ns)
    };
    let rows = [
        memcg("dd", 1, 6_167, 3_678_000_000, 1_578_752, "/tk"),
        memcg("svc", 2, 885, 574_000_000, 226_560, "/tk"),
        memcg("big", 3, 9_000, 5_000_000_000, 9_000_000, "/other"),
    ];
    let (f, _) = run(6.0, &thp("madvise"), &vm(&[]), &rows);
    let svc = f.iter().find(|x| x.subject.pid == Some(2)).unwrap();
    let dd = f.iter().position(|x| x.subject.pid == Some(1)).unwrap();
    assert_eq!(svc.culprit.as_ref().and_then(|c| c.pid), Some(1));
    has(&svc.summary, "What fills /tk: dd (pid 1), whose allocations made it reclaim 1578752 of the 1805312 pages its reclaim freed in the window (87 %; svc (pid 2) its own 226560)");
    assert_eq!(svc.ev("culprit_reclaim_share_ppm"), Some(874_503.0));
    has(&svc.advice, "give that its own memory cgroup");
    has(
        &f[dd].summary,
        "It fills /tk, where svc (pid 2) stalled 885 times",
    );
    assert!(f[dd].score.ns_per_s() < svc.score.ns_per_s());
    let svc_rank = f.iter().position(|x| x.subject.pid == Some(2)).unwrap();
    assert!(svc_rank < dd, "{f:?}");
    assert_eq!(
        f.iter().find(|x| x.subject.pid == Some(3)).unwrap().culprit,
        None
    );
    let rows = [
        memcg("a", 1, 100, 100_000_000, 400, "/tk"),
        memcg("b", 2, 100, 100_000_000, 350, "/tk"),
        memcg("c", 4, 100, 100_000_000, 300, "/tk"),
    ];
    let (f, _) = run(6.0, &thp("madvise"), &vm(&[]), &rows);
    assert!(f.iter().all(|x| x.culprit.is_none()), "{f:?}");
}
