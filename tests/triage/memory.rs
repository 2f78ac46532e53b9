//! Memory incidents under triage: THP direct compaction, a memory cgroup at its limit, and a
//! service stalled at its limit by another process filling the cgroup.

use super::*;

/// THP `defrag=always` with every free 2 MiB block held by the hugetlb pool, so what is free is
/// fragmented: each THP fault of `dd`'s 256 MiB buffer compacts directly. thp-compaction, `dd`
/// named, ranked first; the node's `compact_stall` moved (settings restored after).
#[test]
fn thp_direct_compaction_ranks_first() {
    require_root();
    let _s = serial();
    let _enabled = Setting::set(THP_ENABLED, "always");
    let _defrag = Setting::set(THP_DEFRAG, "always");
    let innocents = Innocents::start("triage-thp-innocents", 12_000);
    let before = vmstat("compact_stall");
    let mut pid = 0;
    let (f, _) = triage(8, &[], || {
        let _pool = hold_free_huge_blocks();
        let mut dd = Command::new("dd")
            .args([
                "if=/dev/zero",
                "of=/dev/null",
                "bs=256M",
                "count=1",
                "status=none",
            ])
            .spawn()
            .expect("dd");
        pid = dd.id() as u64;
        assert!(dd.wait().unwrap().success());
    });
    let stalls = vmstat("compact_stall") - before;
    assert!(stalls > 0, "dd caused no direct compaction");
    assert!(!f.is_empty(), "no finding (compact_stall +{stalls})");
    assert_eq!(f[0]["cause"], "thp-compaction", "{:#?}", brief(&f));
    assert_eq!(f[0]["pid"], pid, "{:#?}", brief(&f));
    assert!(f[0]["score_ns_per_s"].as_u64().unwrap() > 0, "{}", f[0]);
    // Fragmenting memory is CPU work of this test's own process, and an innocent may wait
    // behind it (a fresh guest: the duty loop 5.7 ms/s late, 23.9 ms of it behind the test).
    innocents.assert_named_only_for_what_they_felt(&f, Some(&f[0]));
}

/// A writer in a 32 MiB memory cgroup writing 768 MiB: every page past the limit is reclaimed
/// first, inside its writes. memcg-limit, the writer and its cgroup named, ranked first.
#[test]
fn memcg_at_its_limit_ranks_first() {
    require_root();
    let _s = serial();
    let cg = Cgroup::create("triage-memcg", 32 << 20);
    let dir = scratch("triage-memcg");
    let file = dir.join("big");
    let innocents = Innocents::start("triage-memcg-innocents", 12_000);
    let mut w = Value::Null;
    let (f, _) = triage(8, &[], || {
        w = run_workload(&[
            "memcg-write",
            cg.procs().to_str().unwrap(),
            file.to_str().unwrap(),
            "768",
        ]);
    });
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!f.is_empty(), "no finding");
    assert_eq!(f[0]["cause"], "memcg-limit", "{:#?}", brief(&f));
    assert_eq!(f[0]["pid"], w["pid"], "{:#?}", brief(&f));
    assert!(
        f[0]["summary"]
            .as_str()
            .unwrap_or("")
            .contains(&format!("/{}", cg.name)),
        "the cgroup is named: {}",
        f[0]
    );
    innocents.assert_named_only_for_what_they_felt(&f, Some(&f[0]));
}

/// #26 (3), reclaim linked to who fills the memory cgroup: a service allocating 2 MiB every
/// 20 ms shares a 64 MiB cgroup with a writer filling it with page cache at 400 MiB/s (alone
/// in the cgroup the service never reclaims). The service stalls in memcg reclaim for the writer's pages:
/// its finding names the writer (most of the pages the cgroup reclaimed) and ranks above the
/// writer's own, which says whom it stalls. The service's own clock is printed beside.
#[test]
fn service_stalled_at_its_memcg_limit_names_the_filler() {
    require_root();
    let _s = serial();
    let cg = Cgroup::create("triage-memcg-fill", 64 << 20);
    let dir = scratch("triage-memcg-fill");
    let file = dir.join("fill");
    let innocents = Innocents::start("triage-memcg-fill-innocents", 12_000);
    let procs = cg.procs();
    let procs = procs.to_str().unwrap();
    let (mut svc, mut fill) = (Value::Null, Value::Null);
    let (f, _) = triage(8, &[], || {
        std::thread::scope(|s| {
            let filler =
                s.spawn(|| run_workload(&["memcg-fill", procs, file.to_str().unwrap(), "6000"]));
            std::thread::sleep(Duration::from_millis(500));
            svc = run_workload(&["memcg-service", procs, "5000"]);
            fill = filler.join().unwrap();
        });
    });
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!(
        "service's own clock: {svc}; filler: {fill}; findings {:#?}",
        brief(&f)
    );
    assert!(
        svc["over_1ms"].as_u64().unwrap_or(0) > 0,
        "the staged service never waited: {svc}"
    );
    let victim = f
        .iter()
        .find(|x| x["cause"] == "memcg-limit" && x["pid"] == svc["pid"])
        .unwrap_or_else(|| panic!("no memcg-limit finding for the service: {:#?}", brief(&f)));
    assert_eq!(victim["culprit_pid"], fill["pid"], "{victim}");
    assert!(
        victim["evidence"]["culprit_reclaim_share_ppm"]
            .as_u64()
            .unwrap_or(0)
            >= 500_000,
        "{victim}"
    );
    // What it felt, bounded by its own clock: no stall longer than its longest allocation.
    assert!(
        victim["evidence"]["max_ns"].as_u64().unwrap_or(u64::MAX)
            <= svc["max_ns"].as_u64().unwrap_or(0),
        "{victim} vs {svc}"
    );
    assert_eq!(
        f[0]["pid"],
        svc["pid"],
        "the victim ranks first: {:#?}",
        brief(&f)
    );
    if let Some(w) = f
        .iter()
        .find(|x| x["cause"] == "memcg-limit" && x["pid"] == fill["pid"])
    {
        assert!(w["rank"].as_u64() > victim["rank"].as_u64(), "{w}");
        assert!(
            w["summary"].as_str().unwrap_or("").contains("It fills /"),
            "{w}"
        );
    }
    // The service's reclaim is CPU work too (it reclaims the writer's pages in its own time):
    // the 0.5 ms burster beside it felt that in a run here (1 in 83 wakeups over 1 ms, 58 ms
    // of its long waits behind the service). An innocent may be told as a victim of one of
    // the two below the staged victim, or for what it felt of the node's other work.
    innocents.assert_only_victims_of(&f, &[&fill["pid"], &svc["pid"]]);
}
