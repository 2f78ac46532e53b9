//! Issue #31, defect 16: tracekit never blinds another tracer. A BPF program attached to a
//! classic tracepoint (or a kprobe) through perf_event gates the event for perf: when it
//! returns 0 the kernel skips `perf_tp_event`, and every `perf record`/`perf stat` user of the
//! same event on that CPU loses the hit (KERNEL-NOTES, 2026-12-01: 0 of 20 `fdatasync`
//! recorded beside `fsync-lat`).
//!
//! The events come from `doctor --json` (every hook this kernel attaches in `tracepoint`
//! mode, for every tool), so a tool that gains a classic hook is checked without a line here;
//! a classic event with no trigger below fails the test, naming it. Each event is made to fire
//! a known number of times by `tk-workload perf-beside EVENT N` under `perf stat` while the
//! tool that attaches it runs; perf must count every hit.

use std::{
    collections::BTreeMap,
    process::{Command, Stdio},
    time::Duration,
};

use serde_json::Value;
use tracekit_tests::*;

/// Hits of each event the workload makes.
const HITS: u64 = 20;

/// The classic-tracepoint events each tool attaches on this kernel, from `doctor --json`.
fn classic_events() -> BTreeMap<String, Vec<String>> {
    let out = output_ok(
        Command::new(tracekit_bin()).args(["doctor", "--json"]),
        "tracekit doctor --json",
    );
    let mut by_tool: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for l in String::from_utf8_lossy(&out).lines() {
        let Ok(v) = serde_json::from_str::<Value>(l) else {
            continue;
        };
        if v["type"] == "hook" && v["mode"] == "tracepoint" {
            let tool = v["for"].as_str().unwrap_or_default().to_string();
            let event = v["target"].as_str().unwrap_or_default().to_string();
            by_tool.entry(tool).or_default().push(event);
        }
    }
    by_tool
}

/// What `perf stat -x,` counted for each event of `events` while `tk-workload perf-beside`
/// fired each `HITS` times (counting only the workload and its children).
fn perf_counts(events: &[String], dir: &std::path::Path) -> BTreeMap<String, u64> {
    let mut cmd = Command::new("perf");
    cmd.args(["stat", "-x,", "--no-big-num"]);
    for e in events {
        cmd.args(["-e", e]);
    }
    cmd.arg("--").arg(workload_bin()).arg("perf-beside");
    cmd.arg(dir).arg(HITS.to_string()).args(events);
    let out = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("run perf stat");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "perf stat failed: {err}");
    // CSV lines: count,unit,event,...
    let mut counts = BTreeMap::new();
    for l in err.lines() {
        let f: Vec<&str> = l.split(',').collect();
        if f.len() >= 3 {
            if let Ok(n) = f[0].parse::<u64>() {
                counts.insert(f[2].to_string(), n);
            }
        }
    }
    counts
}

fn assert_counted(what: &str, events: &[String], counts: &BTreeMap<String, u64>) {
    for e in events {
        let n = counts.get(e).copied().unwrap_or(0);
        assert!(
            n >= HITS,
            "{what}: perf counted {n} of {HITS} {e} (perf stat said {counts:?})"
        );
    }
}

/// perf, installed from Debian when missing (`cargo xtask test` installs it first).
fn have_perf() {
    let ok = || {
        Command::new("perf")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !ok() {
        let _ = Command::new("apt-get").args(["update", "-q"]).status();
        let _ = Command::new("apt-get")
            .args([
                "install",
                "-y",
                "-q",
                "--no-install-recommends",
                "linux-perf",
            ])
            .status();
    }
    assert!(
        ok(),
        "perf is needed beside tracekit and could not be installed"
    );
}

/// Every classic tracepoint any tool attaches here still reaches `perf stat` while the tool
/// runs: the counts equal what the workload made, as they do with nothing attached.
#[test]
fn perf_stat_counts_every_hit_beside_each_tool() {
    require_root();
    have_perf();
    let dir = scratch("perf-beside");
    let tools = classic_events();
    assert!(
        !tools.is_empty(),
        "doctor lists no tracepoint-mode hook: the syscall events of fsync-lat have no other mode"
    );
    for (tool, events) in &tools {
        // Alone first: the workload and the count are right without tracekit.
        assert_counted(
            &format!("{tool} (alone)"),
            events,
            &perf_counts(events, &dir),
        );
        let mut args: Vec<&str> = tool.split_whitespace().collect();
        args.extend(["--json", "--duration", "60s"]);
        let mut tk = Tracer::spawn(&args);
        tk.wait_attached();
        let beside = perf_counts(events, &dir);
        tk.signal(libc::SIGINT);
        let (status, _, stderr) = tk.finish(Duration::from_secs(20));
        assert!(status.success(), "{tool}: {stderr}");
        eprintln!("{tool}: perf beside it counted {beside:?}");
        assert_counted(&format!("beside {tool}"), events, &beside);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The reported case, exactly: `perf record -e syscalls:sys_enter_fdatasync` beside `fsync-lat`
/// records every one of 20 calls, and fsync-lat still times them all.
#[test]
fn perf_record_beside_fsync_lat_records_every_fdatasync() {
    require_root();
    have_perf();
    let dir = scratch("perf-record-beside");
    let data = dir.join("perf.data");
    let mut tk = Tracer::spawn(&["fsync-lat", "--json", "--duration", "60s"]);
    tk.wait_attached();
    output_ok(
        Command::new("perf")
            .args(["record", "-q", "-e", "syscalls:sys_enter_fdatasync", "-o"])
            .arg(&data)
            .arg("--")
            .arg(workload_bin())
            .args(["perf-beside"])
            .arg(&dir)
            .arg(HITS.to_string())
            .arg("syscalls:sys_enter_fdatasync")
            .stdout(Stdio::null()),
        "perf record",
    );
    tk.signal(libc::SIGINT);
    let (status, lines, stderr) = tk.finish(Duration::from_secs(20));
    assert!(status.success(), "{stderr}");
    let script = output_ok(
        Command::new("perf").args(["script", "-i"]).arg(&data),
        "perf script",
    );
    let recorded = String::from_utf8_lossy(&script)
        .lines()
        .filter(|l| l.contains("sys_enter_fdatasync"))
        .count() as u64;
    assert_eq!(recorded, HITS, "perf record beside fsync-lat");
    let timed = sum_counts(&lines, "fsync-lat", |r| {
        r["comm"] == "tk-workload" && r["syscall"] == "fdatasync"
    });
    assert!(
        timed >= HITS,
        "fsync-lat timed {timed} of {HITS} fdatasyncs"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `tk-workload perf-beside DIR N EVENT...`: makes each classic EVENT fire N times in this
/// process (sys_enter and sys_exit of a syscall fire once per call).
pub fn workload(args: &[String]) -> Option<i32> {
    let (cmd, rest) = args.split_first()?;
    if cmd != "perf-beside" {
        return None;
    }
    let [dir, n, events @ ..] = rest else {
        return None;
    };
    let n: u64 = n.parse().ok()?;
    for e in events {
        if let Err(why) = fire(dir, e, n) {
            eprintln!("tk-workload perf-beside: {e}: {why}");
            return Some(1);
        }
    }
    Some(0)
}

fn fire(dir: &str, event: &str, n: u64) -> Result<(), String> {
    use std::{io::Write, os::fd::AsRawFd};
    if event.starts_with("writeback:writeback_dirty_") {
        return dirty(dir, n);
    }
    let call = event
        .strip_prefix("syscalls:sys_enter_")
        .or_else(|| event.strip_prefix("syscalls:sys_exit_"))
        .ok_or("no trigger for this event: add one to tests/perf_beside.rs")?;
    let path = format!("{dir}/perf-beside-{}", std::process::id());
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| e.to_string())?;
    f.write_all(&[1u8; 4096]).map_err(|e| e.to_string())?;
    let fd = f.as_raw_fd();
    // SAFETY: a shared mapping of the 4 KiB file we just wrote, unmapped below.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if map == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error().to_string());
    }
    for _ in 0..n {
        // SAFETY: plain syscalls on our own fd and mapping.
        let rc = unsafe {
            match call {
                "fsync" => libc::fsync(fd),
                "fdatasync" => libc::fdatasync(fd),
                "sync_file_range" => libc::sync_file_range(fd, 0, 0, libc::SYNC_FILE_RANGE_WRITE),
                "msync" => libc::msync(map, 4096, libc::MS_SYNC),
                "syncfs" => libc::syncfs(fd),
                "sync" => {
                    libc::sync();
                    0
                }
                "madvise" => libc::madvise(map, 4096, libc::MADV_NORMAL),
                _ => {
                    libc::munmap(map, 4096);
                    return Err(format!(
                        "no trigger for syscall {call}: add one to tests/perf_beside.rs"
                    ));
                }
            }
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error().to_string());
        }
    }
    // SAFETY: the mapping made above.
    unsafe { libc::munmap(map, 4096) };
    let _ = std::fs::remove_file(&path);
    Ok(())
}

/// `writeback:writeback_dirty_folio` (`_page` before 6.0) N times: a page of a file made dirty,
/// then cleaned by `fdatasync`, so the next write dirties it again.
fn dirty(dir: &str, n: u64) -> Result<(), String> {
    use std::os::unix::fs::FileExt;
    let path = format!("{dir}/perf-beside-dirty-{}", std::process::id());
    let f = std::fs::File::create(&path).map_err(|e| e.to_string())?;
    for _ in 0..n {
        f.write_all_at(&[7u8; 4096], 0).map_err(|e| e.to_string())?;
        f.sync_data().map_err(|e| e.to_string())?;
    }
    let _ = std::fs::remove_file(&path);
    Ok(())
}
