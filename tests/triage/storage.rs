//! Storage incidents under triage: an fsync loop slowed by another issuer of its disk (a
//! direct-I/O flood, background writeback, a writer at its memcg limit), and a deep queue.

use super::*;

/// A WAL-like fsync loop (`triage-fsync` on `wal`, 6 s) with `other` running beside it during
/// an 8 s triage: the findings in rank order, the loop's report and what `other` returned. The
/// first finding must be the loop's fsync finding (checked here).
#[cfg(test)]
fn fsync_loop_beside(wal: &std::path::Path, other: impl FnOnce() -> Value) -> (Vec<Value>, Value) {
    let (mut report, mut theirs) = (Value::Null, Value::Null);
    let (f, _) = triage(8, &[], || {
        let w = Command::new(workload_bin())
            .args(["triage-fsync", wal.to_str().unwrap(), "6000"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the fsync loop");
        theirs = other();
        let out = w.wait_with_output().unwrap();
        report = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("the fsync loop failed ({e}): {out:?}"));
    });
    eprintln!("fsync loop: {report}; beside it: {theirs}");
    eprintln!("findings: {:#?}", brief(&f));
    assert_eq!(f[0]["cause"], "fsync", "{:#?}", brief(&f));
    assert_eq!(f[0]["pid"], report["pid"], "{:#?}", brief(&f));
    (f, theirs)
}

/// A WAL-like fsync loop on a disk that an O_DIRECT writer floods (queue depth 32, another file
/// of the same ext4 file system), among innocents: the fsync loop ranks first and names the
/// flood as its culprit, measured as its share of the disk's request time.
#[test]
fn fsync_loop_beside_a_direct_io_flood_names_the_flood() {
    require_root();
    let _s = serial();
    io::ensure_fio();
    let innocents = Innocents::start("triage-flood-innocents", 14_000);
    let lo = io::LoopDev::new("triage-flood");
    let m = io::Mounted::new(&lo).expect("mkfs.ext4 (e2fsprogs) is on every Debian system");
    let (wal, flood) = (m.mnt.join("wal.log"), m.mnt.join("flood"));
    let (f, job) = fsync_loop_beside(&wal, || {
        io::fio(
            flood.to_str().unwrap(),
            &[
                // A 16 MiB file of the 64 MiB disk: room left for the WAL.
                "--size=16M",
                "--rw=randwrite",
                "--bs=4k",
                "--ioengine=libaio",
                "--iodepth=32",
                "--time_based",
                "--runtime=6",
            ],
        )
    });
    eprintln!(
        "fio: {} writes, clat p99 {} ns",
        job["write"]["total_ios"], job["write"]["clat_ns"]["percentile"]["99.000000"]
    );
    let first = &f[0];
    assert_eq!(first["culprit_comm"], "fio", "{first}");
    assert!(
        first["evidence"]["culprit_disk_share_ppm"]
            .as_u64()
            .unwrap_or(0)
            >= 500_000,
        "{first}"
    );
    innocents.assert_named_only_for_what_they_felt(&f, Some(&f[0]));
}

/// A WAL-like fsync loop on a disk whose page cache a bulk writer keeps dirty (another file of
/// the same ext4 file system, rewritten at 200 MiB/s, never synced), among innocents: the
/// flusher's writeback is what the loop waits behind, and the finding names the process that
/// dirtied those pages (io-lat's dirtied rows), not the kworker. Background writeback starts at
/// 4 MiB of dirty pages for the test, so the flusher runs the whole window, as on a node whose
/// writers outpace the threshold.
#[test]
fn fsync_loop_beside_background_writeback_names_the_dirtier() {
    require_root();
    let _s = serial();
    let innocents = Innocents::start("triage-wb-innocents", 14_000);
    let lo = io::LoopDev::new("triage-wb");
    let m = io::Mounted::new(&lo).expect("mkfs.ext4 (e2fsprogs) is on every Debian system");
    let _wb = background_writeback_from(4 << 20);
    let (wal, bulk) = (m.mnt.join("wal.log"), m.mnt.join("bulk"));
    let (f, writer) = fsync_loop_beside(&wal, || {
        run_workload(&["bulk-rewrite", bulk.to_str().unwrap(), "32", "6000", "5000"])
    });
    let first = &f[0];
    assert_eq!(first["culprit_pid"], writer["pid"], "{first}");
    let ev = &first["evidence"];
    assert!(
        ev["culprit_disk_share_ppm"].as_u64().unwrap_or(0) >= 500_000
            && ev["culprit_dirtied_share_ppm"].as_u64().unwrap_or(0) >= 500_000,
        "{first}"
    );
    // What it dirtied in the window is at most what its own counter says it dirtied.
    assert!(
        ev["culprit_dirtied_bytes"].as_u64().unwrap_or(0)
            <= writer["write_bytes"].as_u64().unwrap(),
        "{first} vs {writer}"
    );
    innocents.assert_only_victims_of(&f, &[&writer["pid"]]);
}

/// The same fsync loop beside a bulk writer held at its memory cgroup's limit (16 MiB for a
/// 32 MiB file), with the host's own writeback settings: reclaim in the cgroup finds the
/// writer's dirty pages and wakes the flusher, whose writeback the loop then waits behind. On a
/// v1 host (this one) that writeback is charged to the root cgroup, so the finding names the
/// writer by what it dirtied; on v2 the kernel charges it to the cgroup, named as such.
#[test]
fn fsync_loop_beside_a_writer_at_its_memcg_limit_names_the_writer() {
    require_root();
    let _s = serial();
    let cg = Cgroup::create("triage-wbcg", 16 << 20);
    let innocents = Innocents::start("triage-wbcg-innocents", 14_000);
    let lo = io::LoopDev::new("triage-wbcg");
    let m = io::Mounted::new(&lo).expect("mkfs.ext4 (e2fsprogs) is on every Debian system");
    let (wal, bulk) = (m.mnt.join("wal.log"), m.mnt.join("bulk"));
    let procs = cg.procs();
    let (f, writer) = fsync_loop_beside(&wal, || {
        run_workload(&[
            "bulk-rewrite",
            bulk.to_str().unwrap(),
            "32",
            "6000",
            // 100 MiB/s: reclaim in the cgroup costs CPU (2.4 s in 6 s at 200 MiB/s), and at
            // that rate the page-cache innocent waited 6 % of its time behind the writer in a
            // CI run; the writeback still holds the disk (measured below).
            "10000",
            procs.to_str().unwrap(),
        ])
    });
    let first = &f[0];
    let by_cgroup = first["culprit"]["name"].as_str() == Some(&format!("/{}", cg.name));
    assert!(
        first["culprit_pid"] == writer["pid"] || by_cgroup,
        "the writer or its cgroup is the culprit: {first}"
    );
    innocents.assert_only_victims_of(&f, &[&writer["pid"]]);
}

/// O_DIRECT random writes at queue depth 32 on a device behind mq-deadline: io-queue (or
/// io-latency) on that device, ranked first.
#[test]
fn deep_direct_io_queue_ranks_first() {
    require_root();
    let _s = serial();
    io::ensure_fio();
    let _innocents = Innocents::start("triage-io-innocents", 14_000);
    let lo = io::LoopDev::new("triage-io");
    lo.set("scheduler", "mq-deadline");
    lo.set("nr_requests", "4");
    let (f, _) = triage(8, &[], || {
        io::fio(
            &lo.dev,
            &[
                "--rw=randwrite",
                "--bs=4k",
                "--ioengine=libaio",
                "--iodepth=32",
                "--time_based",
                "--runtime=6",
            ],
        );
    });
    assert!(!f.is_empty(), "no finding");
    let first = &f[0];
    assert!(
        first["cause"] == "io-queue" || first["cause"] == "io-latency",
        "{:#?}",
        brief(&f)
    );
    assert!(
        first["summary"].as_str().unwrap_or("").contains(&lo.name)
            || first["subject"]["name"]
                .as_str()
                .unwrap_or("")
                .contains(&lo.name),
        "{first}"
    );
}
