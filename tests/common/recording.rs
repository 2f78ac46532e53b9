//! `tracekit record` and `compare` as the tests drive them: a recording started once its
//! header is written, ended with SIGINT, and `compare` run to its end.

use std::{
    process::Command,
    thread,
    time::{Duration, Instant},
};

use crate::{tracekit_bin, Tracer};

/// Starts `tracekit record --output OUT ARGS` and returns once its header line is in the file:
/// the collectors are attached then (the recording's own announcement of attaching).
pub fn start_recording(out: &std::path::Path, args: &[&str]) -> Tracer {
    start_recording_env(out, args, &[])
}

/// [`start_recording`] with `env` set for tracekit.
pub fn start_recording_env(out: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> Tracer {
    let mut all = vec!["record", "--output", out.to_str().expect("UTF-8 path")];
    all.extend_from_slice(args);
    let tk = Tracer::spawn_env(&all, env);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(out).is_ok_and(|s| s.contains('\n')) {
        assert!(Instant::now() < deadline, "no header in {}", out.display());
        thread::sleep(Duration::from_millis(20));
    }
    tk
}

/// Ends a recording started by [`start_recording`] (SIGINT) and checks it said it recorded.
pub fn end_recording(tk: Tracer) {
    tk.signal(libc::SIGINT);
    let (status, _, stderr) = tk.finish(Duration::from_secs(30));
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("Recorded "), "{stderr}");
}

/// `tracekit compare ARGS` to its end: (exit code, stdout, stderr).
pub fn compare(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(tracekit_bin())
        .arg("compare")
        .args(args)
        .output()
        .expect("spawn tracekit compare");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
