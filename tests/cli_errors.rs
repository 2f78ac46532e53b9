//! Bad input: one clear line on stderr, a documented non-zero exit code, never a panic.

use std::process::Command;

use tracekit_tests::*;

fn run(args: &[&str], uid: Option<u32>) -> (i32, String) {
    use std::os::unix::process::CommandExt;
    let mut c = Command::new(tracekit_bin());
    c.args(args);
    if let Some(u) = uid {
        c.uid(u).gid(u);
    }
    let o = c.output().expect("run tracekit");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn one_line(stderr: &str) {
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "expected one line, got: {stderr:?}"
    );
    assert!(
        !stderr.contains("panicked") && !stderr.contains("backtrace"),
        "{stderr}"
    );
}

#[test]
fn malformed_duration() {
    let (code, err) = run(&["fsync-lat", "--duration", "10x"], None);
    assert_eq!(code, 2);
    one_line(&err);
    assert!(err.contains("invalid duration '10x'"), "{err}");
}

#[test]
fn unknown_subcommand() {
    let (code, err) = run(&["fsync-latency"], None);
    assert_eq!(code, 2);
    one_line(&err);
    assert!(err.contains("unrecognized subcommand"), "{err}");
}

#[test]
fn pid_that_does_not_exist() {
    if !is_root() {
        return; // the privilege check comes first; covered by `not_root` below.
    }
    let (code, err) = run(&["fsync-lat", "--pid", "4000000", "--duration", "1s"], None);
    assert_eq!(code, 5, "{err}");
    one_line(&err);
    assert!(err.contains("no process with pid 4000000"), "{err}");
}

#[test]
fn not_root() {
    // As root, drop to nobody for the child; as a user, run as we are.
    let uid = if is_root() { Some(65534) } else { None };
    let (code, err) = run(&["fsync-lat", "--duration", "1s"], uid);
    assert_eq!(code, 3, "{err}");
    one_line(&err);
    assert!(
        err.contains("needs root") && err.contains("CAP_BPF"),
        "{err}"
    );
}

#[test]
fn help_documents_exit_codes() {
    let (ok, s) = help_of("fsync-lat");
    assert!(ok);
    assert!(
        s.contains("Exit codes:") && s.contains("5  a --pid names no running process"),
        "{s}"
    );
}

#[test]
fn doctor_documents_its_exit_code() {
    let (ok, s) = help_of("doctor");
    assert!(ok);
    assert!(s.contains("6  doctor: some tool cannot run"), "{s}");
    assert!(s.contains("--json"), "{s}");
}

/// Durations that cannot be waited for are refused while parsing (exit 2), never an "internal
/// error: overflow when adding duration to instant" after attaching.
#[test]
fn huge_durations_are_refused_at_parse_time() {
    for args in [
        &["fsync-lat", "--duration", "18446744073709551615s"][..],
        &[
            "fsync-lat",
            "--interval",
            "18446744073709551615s",
            "--duration",
            "1s",
        ][..],
        &["ctxsw", "--duration", "300000000000y"][..],
        &["runq-lat", "--interval", "11y"][..],
    ] {
        let t = std::time::Instant::now();
        let (code, err) = run(args, None);
        assert_eq!(code, 2, "{args:?}: {err}");
        one_line(&err);
        assert!(err.contains("maximum of 10 years"), "{args:?}: {err}");
        assert!(!err.contains("internal error"), "{err}");
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
    }
}

/// The longest accepted duration is waited for in steps, not handed to a timer that overflows:
/// the run starts and ends normally on a signal.
#[test]
fn longest_duration_runs() {
    if !is_root() {
        return;
    }
    let mut t = Tracer::spawn(&[
        "fsync-lat",
        "--json",
        "--duration",
        "10y",
        "--interval",
        "10y",
    ]);
    t.wait_attached();
    t.signal(libc::SIGINT);
    let (status, lines, stderr) = t.finish(std::time::Duration::from_secs(10));
    assert!(status.success(), "{stderr}");
    assert_eq!(last_stats(&lines)["stop"], "SIGINT");
}

/// Bare `tracekit`: the usage and the list of tools (exit 2), not one sentence.
#[test]
fn bare_tracekit_prints_usage_and_tools() {
    let (code, err) = run(&[], None);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("Usage: tracekit <COMMAND>"), "{err}");
    for tool in tools_and_commands() {
        assert!(err.contains(tool), "{tool} missing from {err}");
    }
    assert!(!err.contains("bench-floor"), "{err}");
}

/// Every tool's --help has real examples (run by `help_examples_run` below),
/// the --max-keys range, and the privileges it needs.
#[test]
fn every_help_shows_examples_range_and_privileges() {
    for tool in tools_and_commands() {
        let (ok, s) = help_of(tool);
        assert!(ok);
        let examples = help_examples(&s);
        assert!(
            (2..=3).contains(&examples.len()),
            "{tool}: {} examples in {s}",
            examples.len()
        );
        assert!(examples.iter().all(|e| e[1] == tool), "{examples:?}");
        assert!(s.contains("Privileges: "), "{s}");
        // doctor and compare trace nothing; triage sizes each collector's maps itself.
        if !["doctor", "triage", "compare"].contains(&tool) {
            assert!(
                s.contains("16 to 1000000"),
                "{tool}: no --max-keys range in {s}"
            );
        }
    }
}

/// A thread id given to --pid is refused with the process id to use, instead of tracing
/// nothing and reporting zero.
#[test]
fn pid_of_a_thread_names_its_process() {
    if !is_root() {
        return;
    }
    let idle = IdleThread::start();
    let tid = idle.tid.clone();
    let me = std::process::id();
    let (code, err) = run(&["fsync-lat", "--pid", &tid, "--duration", "1s"], None);
    idle.stop();
    assert_eq!(code, 2, "{err}");
    one_line(&err);
    assert!(
        err.contains(&format!("thread of process {me}")) && err.contains(&format!("--pid {me}")),
        "{err}"
    );
}

/// One OS error is printed once, not twice in the same line.
#[test]
fn os_error_is_printed_once() {
    if !is_root() {
        return;
    }
    let (code, err) = run(
        &[
            "fsync-lat",
            "--output",
            "/nonexistent-dir/r.json",
            "--duration",
            "1s",
        ],
        None,
    );
    assert_eq!(err.matches("No such file or directory").count(), 1, "{err}");
    one_line(&err);
    assert_eq!(code, 2, "{err}");
}

/// `doctor | head -1` and `doctor > /dev/full` end like a tool would: quietly for the closed
/// pipe, with one line naming the full device, never an internal error.
#[test]
fn doctor_handles_stdout_errors_like_the_tools() {
    if !is_root() {
        return;
    }
    let mut child = Command::new(tracekit_bin())
        .arg("doctor")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // `| head -0`: the reader is gone before doctor writes.
    drop(child.stdout.take());
    let status = child.wait().unwrap();
    let err = take_stderr(&mut child);
    assert!(matches!(status.code(), Some(0 | 6)), "{status}: {err}");
    assert!(!err.contains("internal error"), "{err}");
    let full = std::fs::File::create("/dev/full").unwrap();
    let o = Command::new(tracekit_bin())
        .arg("doctor")
        .stdout(full)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    one_line(&err);
    assert!(err.contains("No space left on device"), "{err}");
    assert!(!err.contains("internal error"), "{err}");
}

/// "Ctrl-C to end" only when the run ends on Ctrl-C; with --duration, when it ends.
#[test]
fn announcement_says_how_the_run_ends() {
    if !is_root() {
        return;
    }
    for tool in tools() {
        let (code, err) = run(&[tool, "--duration", "200ms"], None);
        assert_eq!(code, 0, "{err}");
        assert!(!err.contains("Ctrl-C"), "{tool}: {err}");
        assert!(err.contains("Ending after 200ms"), "{tool}: {err}");
    }
}

/// An empty report prints what was not seen, not a table header without rows.
#[test]
fn empty_report_has_no_bare_header() {
    if !is_root() {
        return;
    }
    // This test process makes no sync-family calls.
    let me = std::process::id().to_string();
    let o = Command::new(tracekit_bin())
        .args([
            "fsync-lat",
            "--pid",
            &me,
            "--duration",
            "200ms",
            "--by-file",
        ])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("no sync-family calls seen"), "{out}");
    assert!(!out.contains("COMM"), "bare table header: {out}");
}

/// A whole disk of this machine: the first in /sys/block that is not a loop, ram or zram device.
fn some_disk() -> String {
    let mut names: Vec<String> = std::fs::read_dir("/sys/block")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
        .iter()
        .find(|n| !["loop", "ram", "zram"].iter().any(|p| n.starts_with(p)))
        .or(names.first())
        .cloned()
        .unwrap_or_else(|| "sda".into())
}

/// The examples in every --help are real: each runs as printed (durations shortened, disks
/// this machine's, output files in a scratch directory) and exits 0.
#[test]
fn help_examples_run() {
    if !is_root() {
        return;
    }
    let dir = scratch("examples");
    for tool in tools_and_commands() {
        for ex in help_examples(&help_of(tool).1) {
            // A pipeline's tracekit part (`tracekit triage --json | jq …`).
            let mut args: Vec<String> = ex[1..].iter().take_while(|w| *w != "|").cloned().collect();
            for i in 1..args.len() {
                match args[i - 1].as_str() {
                    "--duration" => args[i] = "600ms".into(),
                    "--interval" => args[i] = "200ms".into(),
                    // An example's disk (nvme0n1) is this machine's first real one.
                    "--dev" => args[i] = some_disk(),
                    // An example's pid (4711) is this test's own process.
                    "--pid" => args[i] = std::process::id().to_string(),
                    _ => {}
                }
            }
            let o = Command::new(tracekit_bin())
                .args(&args)
                .current_dir(&dir)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            // doctor exits 6 when some tool cannot run here; the example itself worked.
            assert!(
                matches!(o.status.code(), Some(0))
                    || (tool == "doctor" && o.status.code() == Some(6)),
                "example {ex:?} exited {:?}: {err}",
                o.status.code()
            );
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}
