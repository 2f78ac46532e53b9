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
    let o = Command::new(tracekit_bin())
        .args(["fsync-lat", "--help"])
        .output()
        .unwrap();
    assert!(o.status.success());
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(
        s.contains("Exit codes:") && s.contains("5  a --pid names no running process"),
        "{s}"
    );
}

#[test]
fn doctor_documents_its_exit_code() {
    let o = Command::new(tracekit_bin())
        .args(["doctor", "--help"])
        .output()
        .unwrap();
    assert!(o.status.success());
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(s.contains("6  doctor: some tool cannot run"), "{s}");
    assert!(s.contains("--json"), "{s}");
}
