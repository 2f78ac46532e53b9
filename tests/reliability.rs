//! Every exit path leaves nothing in the kernel, for every tool. A new tool joins by adding one
//! line to `TOOLS`.

use std::time::Duration;

use tracekit_tests::*;

/// One invocation per tool (JSON mode, so the meta line reports program ids).
/// `ctxsw --top` with --json takes the non-terminal path (one JSON set per interval).
const TOOLS: &[&[&str]] = &[
    &["fsync-lat", "--json"],
    &["memstall", "--json"],
    &["ctxsw", "--json"],
    &["ctxsw", "--top", "--json"],
    &["runq-lat", "--json"],
];

fn check_path(args: &[&str], how: &str) {
    let mut full: Vec<&str> = args.to_vec();
    if how == "duration" {
        full.extend(["--duration", "1s"]);
    }
    let fault = match how {
        "panic" => vec![("TRACEKIT_FAULT", "panic")],
        "error" => vec![("TRACEKIT_FAULT", "error")],
        _ => vec![],
    };
    let mut tk = Tracer::spawn_env(&full, &fault);
    let meta = tk.wait_attached();
    let ids = program_ids(&meta);
    assert!(!ids.is_empty(), "{args:?}: no programs reported");
    let loaded = loaded_program_ids();
    assert!(
        ids.iter().all(|i| loaded.contains(i)),
        "{args:?}: reported programs are not loaded"
    );
    let sig = match how {
        "duration" | "panic" | "error" => None,
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
    } else if how == "panic" || how == "error" {
        assert_eq!(status.code(), Some(1), "{args:?} {how}: {stderr}");
        assert_eq!(
            stderr.trim_end().lines().count(),
            1,
            "{args:?} {how}: one line expected: {stderr}"
        );
        assert!(!stderr.contains("backtrace"), "{stderr}");
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
        for how in [
            "duration", "SIGINT", "SIGTERM", "SIGHUP", "SIGKILL", "panic", "error",
        ] {
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

#[test]
fn two_instances_report_the_same_numbers() {
    require_root();
    let dir = scratch("two");
    let mut a = Tracer::spawn(&["fsync-lat", "--json"]);
    let mut b = Tracer::spawn(&["fsync-lat", "--json", "--interval", "250ms"]);
    a.wait_attached();
    b.wait_attached();
    let w = run_workload(&["fsync", dir.join("f").to_str().unwrap(), "40", "25"]);
    let pid = w["pid"].as_u64().unwrap() as u32;
    a.signal(libc::SIGINT);
    b.signal(libc::SIGINT);
    let (_, la, ea) = a.finish(Duration::from_secs(10));
    let (_, lb, eb) = b.finish(Duration::from_secs(10));
    for (lines, err) in [(&la, ea), (&lb, eb)] {
        for (sc, n) in [("fsync", 40), ("fdatasync", 25)] {
            let got = sum_counts(lines, "fsync-lat", |v| {
                v["pid"] == pid && v["syscall"] == sc
            });
            assert_eq!(got, n, "{sc}: {err}");
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn traced_pid_exiting_mid_run_keeps_its_numbers() {
    require_root();
    let dir = scratch("exit-mid");
    let parked = Parked::start(&["fsync", dir.join("f").to_str().unwrap(), "12", "3"]);
    let pid = parked.pid.to_string();
    let mut tk = Tracer::spawn(&["fsync-lat", "--json", "--pid", &pid]);
    tk.wait_attached();
    parked.go();
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        tk.child.try_wait().unwrap().is_none(),
        "tracekit stopped when its --pid exited"
    );
    tk.signal(libc::SIGINT);
    let (status, lines, stderr) = tk.finish(Duration::from_secs(10));
    assert!(status.success(), "{stderr}");
    let p: u32 = pid.parse().unwrap();
    assert_eq!(
        sum_counts(&lines, "fsync-lat", |v| v["pid"] == p
            && v["syscall"] == "fsync"),
        12
    );
    assert_eq!(
        sum_counts(&lines, "fsync-lat", |v| v["pid"] == p
            && v["syscall"] == "fdatasync"),
        3
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// ESC, a newline and a byte that is not UTF-8 in a process name.
const HOSTILE_HEX: &str = "1b5b324a0a6576696cff";

#[test]
fn hostile_process_names_are_escaped_in_text_and_faithful_in_json() {
    require_root();
    let dir = scratch("hostile");
    let path = dir.join("f");
    // Text.
    let tk = Tracer::spawn(&["fsync-lat", "--interval", "200ms"]);
    std::thread::sleep(Duration::from_millis(600));
    run_workload(&["named", HOSTILE_HEX, path.to_str().unwrap(), "3"]);
    std::thread::sleep(Duration::from_millis(300));
    tk.signal(libc::SIGINT);
    let (_, text, _) = tk.finish_text(Duration::from_secs(10));
    let text = text.join("\n");
    assert!(
        !text.contains('\x1b'),
        "raw escape reached the terminal: {text:?}"
    );
    assert!(
        text.contains("\\x1b[2J\\x0aevil\\xff"),
        "escaped name missing: {text}"
    );
    // JSON.
    let mut tj = Tracer::spawn(&["fsync-lat", "--json"]);
    tj.wait_attached();
    let w = run_workload(&["named", HOSTILE_HEX, path.to_str().unwrap(), "3"]);
    tj.signal(libc::SIGINT);
    let (_, lines, _) = tj.finish(Duration::from_secs(10));
    let pid = w["pid"].as_u64().unwrap() as u32;
    let row = rows_for(&lines, "fsync-lat", pid)
        .into_iter()
        .next()
        .expect("row for the named process");
    // Valid UTF-8 is kept as is (JSON escapes the controls); the invalid byte becomes \xff.
    assert_eq!(row["comm"], "\u{1b}[2J\nevil\\xff");
    let _ = std::fs::remove_dir_all(dir);
}

/// Missing kernel pieces: one line naming what is missing and how to fix it, exit code 4.
#[test]
fn missing_tracefs_btf_and_tracepoints_are_named() {
    require_root();
    let run = |args: &[&str], env: (&str, &str)| {
        let o = std::process::Command::new(tracekit_bin())
            .args(args)
            .env(env.0, env.1)
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let one = |err: &str| assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    // No tracefs where it was said to be.
    let (code, err) = run(
        &["fsync-lat", "--duration", "1s"],
        ("TRACEKIT_TRACEFS", "/nonexistent"),
    );
    assert_eq!(code, Some(4), "{err}");
    one(&err);
    assert!(err.contains("not a tracefs"), "{err}");
    // A tracefs without the tracepoints a tool needs.
    let fake = scratch("fake-tracefs");
    std::fs::create_dir_all(fake.join("events/syscalls")).unwrap();
    let (code, err) = run(
        &["fsync-lat", "--duration", "1s"],
        ("TRACEKIT_TRACEFS", fake.to_str().unwrap()),
    );
    assert_eq!(code, Some(4), "{err}");
    one(&err);
    assert!(
        err.contains("syscalls:sys_enter_fsync") && err.contains("CONFIG_FTRACE_SYSCALLS"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(fake);
    // No BTF: the tools that need task_struct offsets say so.
    for tool in ["ctxsw", "runq-lat"] {
        let (code, err) = run(
            &[tool, "--duration", "1s"],
            ("TRACEKIT_BTF", "/nonexistent/vmlinux"),
        );
        assert_eq!(code, Some(4), "{tool}: {err}");
        one(&err);
        assert!(
            err.contains("BTF") && err.contains("/nonexistent/vmlinux"),
            "{err}"
        );
    }
}

/// Different tools at once: fsync-lat stays exact while ctxsw runs beside it, and ctxsw reports.
#[test]
fn different_tools_run_side_by_side() {
    require_root();
    let dir = scratch("side");
    let mut a = Tracer::spawn(&["fsync-lat", "--json"]);
    let mut b = Tracer::spawn(&["ctxsw", "--json"]);
    a.wait_attached();
    b.wait_attached();
    let w = run_workload(&["fsync", dir.join("f").to_str().unwrap(), "30", "10"]);
    let pid = w["pid"].as_u64().unwrap() as u32;
    a.signal(libc::SIGINT);
    b.signal(libc::SIGINT);
    let (_, la, ea) = a.finish(Duration::from_secs(10));
    let (_, lb, eb) = b.finish(Duration::from_secs(10));
    assert_eq!(
        sum_counts(&la, "fsync-lat", |v| v["pid"] == pid
            && v["syscall"] == "fsync"),
        30,
        "{ea}"
    );
    assert_eq!(
        sum_counts(&la, "fsync-lat", |v| v["pid"] == pid
            && v["syscall"] == "fdatasync"),
        10,
        "{ea}"
    );
    // The fsync workload sleeps in every fsync: ctxsw saw its voluntary switches.
    let vol: u64 = rows_for(&lb, "ctxsw", pid)
        .iter()
        .filter_map(|r| r["voluntary"].as_u64())
        .sum();
    assert!(
        vol >= 30,
        "ctxsw saw {vol} voluntary switches of the fsync workload: {eb}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
