//! Device slots (`IO_SLOTS`): a disk attached while io-lat runs is timed at once, and gets its
//! queue-depth slot at the next window.

use std::time::Duration;

use serde_json::Value;

use tracekit_tests::{
    block::{diskstats_of, losetup_on, read_direct, NewLoop},
    *,
};

use super::fixtures::*;

#[test]
fn a_disk_attached_while_tracing_is_timed_then_slotted() {
    require_root();
    let _g = serial();
    let dir = scratch("iolat-slot");
    let file = dir.join("disk.img");
    // Written, not sparse: reads of holes would not reach the backing file.
    std::fs::write(&file, vec![0x5au8; 4 << 20]).unwrap();
    let mut tk = Tracer::spawn(&["io-lat", "--json", "--interval", "1s"]);
    tk.wait_attached();
    // Well inside the first window (tens of milliseconds from here to the reads' end).
    let lo = NewLoop::create();
    let (dev, hold) = losetup_on(Some(&lo.dev), &["--direct-io=on"], &file);
    let name = dev.trim_start_matches("/dev/").to_string();
    let before = diskstats_of(&name).expect("the new disk in /proc/diskstats");
    // In the window it appeared in: no slot yet.
    read_direct(&dev, 100);
    // A window later it has one.
    std::thread::sleep(Duration::from_millis(1500));
    read_direct(&dev, 100);
    let after = diskstats_of(&name).unwrap();
    // Depth is sampled every 10 ms once the disk's first slotted request touched it: 100
    // reads can end within one tick, and a stop signal right after ended the run before any
    // (a fresh machine's first CI run, 12-02: "never sampled"). Twenty ticks of room.
    std::thread::sleep(Duration::from_millis(200));
    tk.signal(libc::SIGINT);
    let (status, lines, stderr) = tk.finish(Duration::from_secs(20));
    assert!(status.success(), "{stderr}");
    let timed = sum(&rows(&lines, &name), "read", "count");
    let completed = after.0 - before.0;
    // A read the programs did not time must be one the tool says it lost: seen without a start
    // (untracked, no_entry), or a run of a program the kernel skipped (recursion, map full).
    // A fresh CI machine once timed 199 of 200 (12-05) with nothing else printed to explain it.
    let stats: Vec<&Value> = lines
        .iter()
        .filter(|l| l["type"] == "stats" && l["tool"] == "io-lat")
        .collect();
    let of = |l: &&Value, k: &str| l[k].as_u64().unwrap_or(0);
    let devs: Vec<&Value> = lines
        .iter()
        .filter(|l| l["type"] == "device" && l["dev"] == name.as_str())
        .collect();
    let said_lost: u64 = devs.iter().map(|l| of(l, "untracked_reads")).sum::<u64>()
        + stats
            .iter()
            .map(|l| {
                [
                    "missed",
                    "recursion_misses",
                    "key_map_full",
                    "start_map_full",
                ]
                .iter()
                .map(|k| of(l, k))
                .sum::<u64>()
                    + l["anomaly_kinds"]["no_entry"].as_u64().unwrap_or(0)
            })
            .sum::<u64>();
    // The window the disk appeared in counts its diskstats from zero (a new disk's counters
    // start there), so no window shows fewer completions than the programs timed.
    let unseen: Vec<i64> = devs
        .iter()
        .map(|l| l["unseen_reads"].as_i64().expect("unseen_reads measured"))
        .collect();
    assert!(
        unseen.iter().all(|&u| u >= 0),
        "negative unseen_reads {unseen:?}: a window counted diskstats the disk did not have"
    );
    // Completions the kernel ran no program for (see fixtures::evidenced_loss): io-lat says
    // each one (unseen_reads), and each left its request address marked issued, found so at
    // its next insert or issue. A fresh CI machine lost 4 of the first 100 (12-06).
    let unseen: i64 = unseen.iter().sum();
    let evidence: i64 = stats
        .iter()
        .map(|l| {
            let k = &l["anomaly_kinds"];
            k["reissue"].as_i64().unwrap_or(0) + k["insert_over_issued"].as_i64().unwrap_or(0)
        })
        .sum();
    let said_lost = said_lost + if evidence >= unseen { unseen as u64 } else { 0 };
    let keep = |v: &[&Value]| {
        v.iter()
            .map(|l| l.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(
        timed <= completed && completed - timed <= said_lost,
        "{timed} reads timed of {completed} in /proc/diskstats for {name}, {said_lost} said lost\n\
         devices:\n{}\nstats:\n{}",
        keep(&devs),
        keep(&stats)
    );
    let no_slot: u64 = lines
        .iter()
        .filter(|l| l["type"] == "stats" && l["tool"] == "io-lat")
        .filter_map(|l| l["anomaly_kinds"]["no_dev_slot"].as_u64())
        .sum();
    assert!(
        no_slot >= 100,
        "{no_slot} requests without a slot; the first 100 reads came before the refresh"
    );
    assert!(
        no_slot < timed,
        "{no_slot} of {timed} without a slot: the disk never got one"
    );
    let sampled: u64 = lines
        .iter()
        .filter(|l| l["type"] == "device" && l["dev"] == name.as_str())
        .filter_map(|l| l["depth_samples"].as_u64())
        .sum();
    assert!(sampled > 0, "the slotted disk's depth was never sampled");
    // Detached (autoclear) before the device goes.
    drop(hold);
    drop(lo);
    let _ = std::fs::remove_dir_all(dir);
}
