//! Every exit path leaves nothing in the kernel, for every tool. A new tool joins by adding one
//! line to `TOOLS`.

use std::time::Duration;

use tracekit_tests::*;

/// One invocation per tool (JSON mode, so the meta line reports program ids).
/// `ctxsw --top` with --json takes the non-terminal path (one JSON set per interval).
const TOOLS: &[&[&str]] = &[
    &["fsync-lat", "--json"],
    &["ctxsw", "--json"],
    &["ctxsw", "--top", "--json"],
    &["runq-lat", "--json"],
];

fn check_path(args: &[&str], how: &str) {
    let mut full: Vec<&str> = args.to_vec();
    if how == "duration" {
        full.extend(["--duration", "1s"]);
    }
    let mut tk = Tracer::spawn(&full);
    let meta = tk.wait_attached();
    let ids = program_ids(&meta);
    assert!(!ids.is_empty(), "{args:?}: no programs reported");
    let loaded = loaded_program_ids();
    assert!(
        ids.iter().all(|i| loaded.contains(i)),
        "{args:?}: reported programs are not loaded"
    );
    let sig = match how {
        "duration" => None,
        "SIGINT" => Some(libc::SIGINT),
        "SIGTERM" => Some(libc::SIGTERM),
        "SIGHUP" => Some(libc::SIGHUP),
        "SIGKILL" => Some(libc::SIGKILL),
        _ => unreachable!(),
    };
    if let Some(s) = sig {
        std::thread::sleep(Duration::from_millis(200));
        tk.signal(s);
    }
    let (status, lines, stderr) = tk.finish(Duration::from_secs(15));
    if how == "SIGKILL" {
        assert!(!status.success());
    } else {
        assert!(status.success(), "{args:?} {how}: exit {status}: {stderr}");
        // The final summary still prints.
        assert!(
            lines.iter().any(|l| l["type"] == "stats"),
            "{args:?} {how}: no final summary"
        );
    }
    let left = wait_unloaded(&ids);
    assert!(
        left.is_empty(),
        "{args:?} {how}: programs {left:?} still loaded"
    );
}

#[test]
fn no_programs_remain_after_any_exit() {
    require_root();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for args in TOOLS {
        for how in ["duration", "SIGINT", "SIGTERM", "SIGHUP", "SIGKILL"] {
            check_path(args, how);
        }
    }
}

/// Tests here compare the kernel's program list, so they must not overlap each other.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Programs with tracekit's name prefix loaded now.
fn tracekit_programs() -> Vec<u32> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| p.name_as_str().is_some_and(|n| n.starts_with("tk_")))
        .map(|p| p.id())
        .collect()
}

#[test]
fn no_programs_remain_after_an_error() {
    require_root();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for args in TOOLS {
        let before = tracekit_programs();
        let mut full = args.to_vec();
        // The output file cannot be created: the error surfaces after attaching.
        full.extend([
            "--output",
            "/nonexistent-dir/report.json",
            "--duration",
            "1s",
        ]);
        let tk = Tracer::spawn(&full);
        let (status, _, stderr) = tk.finish(Duration::from_secs(15));
        assert_eq!(status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("/nonexistent-dir/"), "{stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let new: Vec<u32> = tracekit_programs()
                .into_iter()
                .filter(|i| !before.contains(i))
                .collect();
            if new.is_empty() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{args:?}: programs {new:?} left after an error exit"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
