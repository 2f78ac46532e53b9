//! Running `tk-workload` (alone, under one or two tracekits) and reading what it reports.

use std::{
    process::{Child, Command, Stdio},
    time::Duration,
};

use serde_json::Value;

use crate::{output_ok, rows_for, run_exec_workload, workload_bin, Tracer};

/// Runs a workload to completion, returning its JSON report.
pub fn run_workload(args: &[&str]) -> Value {
    let out = output_ok(
        Command::new(workload_bin()).args(args),
        &format!("tk-workload {args:?}"),
    );
    serde_json::from_slice(&out).expect("tk-workload prints JSON")
}

/// Runs a workload under `tracekit <args>` (attached first, SIGINT after it exits) and asserts
/// tracekit exits 0: the workload's JSON report and tracekit's JSON lines.
pub fn trace_workload(args: &[&str], workload: &[&str]) -> (Value, Vec<Value>) {
    let mut tk = Tracer::spawn(args);
    tk.wait_attached();
    let w = run_workload(workload);
    tk.signal(libc::SIGINT);
    let (status, lines, stderr) = tk.finish(Duration::from_secs(15));
    assert!(status.success(), "exit {status}: {stderr}");
    (w, lines)
}

/// `tk-workload spin MS` at nice -10 (inherited by its spinners), stdout piped for its report:
/// CPU hogs whose CPU a woken nice-0 task does not get at once.
pub fn niced_hogs(ms: &str) -> Child {
    hogs_at(ms, -10)
}

/// `tk-workload spin MS` (two spinners on the last CPU) at nice `nice`, stdout piped for its
/// report (`procs`: the spinners' pids).
pub fn hogs_at(ms: &str, nice: i32) -> Child {
    use std::os::unix::process::CommandExt;
    let mut hogs = Command::new(workload_bin());
    hogs.args(["spin", ms]).stdout(Stdio::piped());
    // SAFETY: between fork and exec the child only changes its own priority.
    unsafe {
        hogs.pre_exec(move || {
            libc::setpriority(libc::PRIO_PROCESS, 0, nice);
            Ok(())
        });
    }
    hogs.spawn().expect("spawn hogs")
}

/// Runs a workload under two tracekits at once (`a` and `b`, both attached first, SIGINT to both
/// after it exits): the workload's JSON report, and each tracekit's JSON lines and stderr
/// (their exit status is not checked).
pub fn trace_workload_twice(
    a: &[&str],
    b: &[&str],
    workload: &[&str],
) -> (Value, [(Vec<Value>, String); 2]) {
    let mut a = Tracer::spawn(a);
    let mut b = Tracer::spawn(b);
    a.wait_attached();
    b.wait_attached();
    let w = run_workload(workload);
    a.signal(libc::SIGINT);
    b.signal(libc::SIGINT);
    let (_, la, ea) = a.finish(Duration::from_secs(10));
    let (_, lb, eb) = b.finish(Duration::from_secs(10));
    (w, [(la, ea), (lb, eb)])
}

/// The pids a multi-process workload reports under "pids".
pub fn workload_pids(w: &Value) -> std::collections::HashSet<u64> {
    w["pids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_u64().unwrap())
        .collect()
}

/// `/proc/<pid>/cmdline` as one line (arguments joined by spaces), read while it lives.
fn cmdline_of(pid: u32) -> String {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    String::from_utf8(
        raw.iter()
            .map(|b| if *b == 0 { b' ' } else { *b })
            .collect(),
    )
    .unwrap()
    .trim_end()
    .to_string()
}

/// A process with a title (`exec -a` sets it, as postgres and nginx do): a bash loop waking
/// every 20 ms. Returns it with its /proc/<pid>/cmdline, read once it is running.
pub fn titled_ticker() -> (Child, String) {
    use std::os::unix::process::CommandExt as _;
    let ticker = Command::new("bash")
        .arg0("tk-title: ticker")
        .args(["-c", "while :; do sleep 0.02; done"])
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let want = cmdline_of(ticker.id());
    assert_eq!(want, "tk-title: ticker -c while :; do sleep 0.02; done");
    (ticker, want)
}

/// `tracekit <tool> --json` over a process that execs: its one row carries the new name and
/// the name before the exec (`exec_from`).
pub fn assert_exec_renames_the_row(tool: &str) {
    let mut tk = Tracer::spawn(&[tool, "--json"]);
    tk.wait_attached();
    let pid = run_exec_workload();
    tk.signal(libc::SIGINT);
    let (status, lines, stderr) = tk.finish(Duration::from_secs(15));
    assert!(status.success(), "{stderr}");
    let rows = rows_for(&lines, tool, pid);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["comm"], "tk-workload", "{}", rows[0]);
    assert_eq!(rows[0]["exec_from"], "sh", "{}", rows[0]);
}

/// The pids of a workload's "procs" list.
pub fn workload_proc_pids(w: &Value) -> Vec<u64> {
    w["procs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pid"].as_u64().unwrap())
        .collect()
}
