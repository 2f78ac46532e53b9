//! Root tests of the capability sets tracekit documents: each tool run as an unprivileged user
//! (nobody) with exactly the capabilities `--help` and the README name (`setpriv`, util-linux),
//! works; without any one of them it refuses with exit 3 naming the missing one. Where a tool
//! falls back to classic tracepoints (no BTF), reading tracefs (mode 0700) needs
//! CAP_DAC_READ_SEARCH: without it, exit 3 naming it, never "this kernel lacks ...".

use std::{process::Command, time::Duration};

use serde_json::Value;
use tracekit_tests::*;

/// Every collector of the registry (`doctor`, `triage` and the hidden controls have their own
/// tests).
fn tools() -> Vec<&'static str> {
    tracekit::tools::TOOLS
        .iter()
        .filter(|t| !t.hidden)
        .map(|t| t.name)
        .collect()
}

/// tracekit as nobody holding exactly `caps` (setpriv names, e.g. "bpf").
fn nobody_cmd(caps: &[&str], args: &[&str]) -> Command {
    let set = if caps.is_empty() {
        "-all".to_string()
    } else {
        format!(
            "-all,{}",
            caps.iter()
                .map(|c| format!("+{c}"))
                .collect::<Vec<_>>()
                .join(",")
        )
    };
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(format!("--inh-caps={set}"))
        .arg(format!("--ambient-caps={set}"))
        .arg(format!("--bounding-set={set}"))
        .arg("--")
        .arg(tracekit_bin())
        .args(args);
    c
}

/// Runs tracekit as nobody holding exactly `caps`, with `env`.
fn as_nobody(caps: &[&str], args: &[&str], env: &[(&str, &str)]) -> (i32, Vec<Value>, String) {
    let o = nobody_cmd(caps, args)
        .envs(env.iter().copied())
        .output()
        .expect("setpriv (util-linux) runs");
    let lines = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    (
        o.status.code().unwrap_or(-1),
        lines,
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn cap_name(c: &str) -> String {
    format!("CAP_{}", c.to_uppercase())
}

/// The documented set, CAP_BPF and CAP_PERFMON, is enough for every tool on this kernel, and
/// each of the two is needed.
#[test]
fn each_tool_runs_with_exactly_the_documented_capabilities() {
    require_root();
    let set = ["bpf", "perfmon"];
    for tool in tools() {
        let (code, lines, err) = as_nobody(&set, &[tool, "--json", "--duration", "300ms"], &[]);
        assert_eq!(code, 0, "{tool} as nobody with {set:?}: {err}");
        assert!(lines.iter().any(|l| l["type"] == "meta"), "{tool}: {err}");
        assert!(lines.iter().any(|l| l["type"] == "stats"), "{tool}: {err}");
        let (_, help) = help_of(tool);
        assert!(
            help.contains("exactly CAP_BPF and CAP_PERFMON"),
            "{tool} --help does not state the set: {help}"
        );
        for missing in set {
            let fewer: Vec<&str> = set.iter().copied().filter(|c| *c != missing).collect();
            let (code, _, err) = as_nobody(&fewer, &[tool, "--duration", "300ms"], &[]);
            assert_eq!(code, 3, "{tool} without {missing}: {err}");
            assert_eq!(err.trim_end().lines().count(), 1, "{err}");
            assert!(
                err.contains(&format!("missing: {}", cap_name(missing))),
                "{tool} without {missing}: {err}"
            );
        }
    }
}

/// The events really are seen under the reduced set (fsync-lat counts a root workload's calls).
#[test]
fn reduced_capabilities_trace_other_users_processes() {
    require_root();
    let dir = scratch("caps-fsync");
    let child = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all,+bpf,+perfmon",
            "--ambient-caps=-all,+bpf,+perfmon",
            "--bounding-set=-all,+bpf,+perfmon",
            "--",
        ])
        .arg(tracekit_bin())
        .args(["fsync-lat", "--json", "--by-file"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut tk = Tracer::from_child(child);
    tk.wait_attached();
    let w = run_workload(&["fsync", dir.join("f").to_str().unwrap(), "50", "0"]);
    tk.signal(libc::SIGINT);
    let (status, lines, stderr) = tk.finish(Duration::from_secs(10));
    assert!(status.success(), "{stderr}");
    let pid = w["pid"].as_u64().unwrap() as u32;
    assert_eq!(
        sum_counts(&lines, "fsync-lat", |v| v["pid"] == pid
            && v["syscall"] == "fsync"),
        50
    );
    // Another user's fd is not readable without CAP_SYS_PTRACE: said, not mislabelled.
    let file = lines
        .iter()
        .find(|l| l["type"] == "file" && l["pid"] == pid)
        .expect("file line");
    assert_eq!(file["file"], "[no access]", "{file}");
    let _ = std::fs::remove_dir_all(dir);
}

/// Classic tracepoints read tracefs (mode 0700): as nobody that needs CAP_DAC_READ_SEARCH,
/// and lacking it is exit 3 naming it, never "this kernel lacks ...". The tools with a classic
/// path: fsync-lat, memstall and io-lat fall back to it without BTF (here: `TRACEKIT_BTF`
/// naming a missing file); net-rx takes it with `--attach tracepoint` (without BTF it cannot
/// run at all: it needs the sk_buff layout, exit 4 once tracefs is readable).
#[test]
fn tracefs_permission_is_exit_3_naming_the_capability() {
    require_root();
    let no_btf = [("TRACEKIT_BTF", "/nonexistent/vmlinux")];
    // (command line, environment, programs expected on classic tracepoints)
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], usize);
    let cases: [Case; 4] = [
        (&["fsync-lat"], &no_btf, usize::MAX),
        (&["memstall"], &no_btf, usize::MAX),
        (&["io-lat"], &no_btf, usize::MAX),
        // Only the drop hook is classic; the softirq and NAPI hooks stay on tp_btf.
        (&["net-rx", "--attach", "tracepoint"], &[], 1),
    ];
    for (tool, env, classic) in cases {
        let args = |json: bool| {
            let mut a = tool.to_vec();
            if json {
                a.push("--json");
            }
            a.extend(["--duration", "300ms"]);
            a
        };
        let (code, _, err) = as_nobody(&["bpf", "perfmon"], &args(false), env);
        assert_eq!(code, 3, "{tool:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(
            err.contains("CAP_DAC_READ_SEARCH") && err.contains("permission denied"),
            "{tool:?}: {err}"
        );
        assert!(!err.contains("lacks"), "{tool:?} blames the kernel: {err}");
        let (code, lines, err) =
            as_nobody(&["bpf", "perfmon", "dac_read_search"], &args(true), env);
        assert_eq!(code, 0, "{tool:?} with CAP_DAC_READ_SEARCH: {err}");
        let meta = lines.iter().find(|l| l["type"] == "meta").expect("meta");
        let progs = meta["programs"].as_array().unwrap();
        let on_tracepoints = progs.iter().filter(|p| p["attach"] == "tracepoint").count();
        assert_eq!(on_tracepoints, classic.min(progs.len()), "{tool:?}: {meta}");
    }
}

/// doctor without privileges says so (exit 3), instead of "no tool can run on this kernel".
#[test]
fn doctor_unprivileged_says_so() {
    require_root();
    let (code, _, err) = as_nobody(&[], &["doctor"], &[]);
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("CAP_BPF") && err.contains("run it as root"),
        "{err}"
    );
    assert!(!err.contains("cannot run on this kernel"), "{err}");
    let o = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--",
        ])
        .arg(tracekit_bin())
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let sys: Value = out
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| l["type"] == "system")
        .expect("system line");
    assert_eq!(
        sys["missing_capabilities"],
        serde_json::json!(["CAP_BPF", "CAP_PERFMON"]),
        "{sys}"
    );
}

/// The set triage, record and serve document: the union of the collectors' (classic
/// tracepoints read tracefs, mode 0700).
const MULTI: [&str; 3] = ["bpf", "perfmon", "dac_read_search"];

/// The collectors triage (and record, serve) run by default.
fn triage_tools() -> Vec<&'static str> {
    tracekit::tools::TOOLS
        .iter()
        .filter(|t| t.triage)
        .map(|t| t.name)
        .collect()
}

fn assert_help_states_the_set(cmd: &str) {
    let (_, help) = help_of(cmd);
    assert!(
        help.contains("(CAP_BPF, CAP_PERFMON, CAP_DAC_READ_SEARCH"),
        "{cmd} --help does not state the set: {help}"
    );
}

/// `could_not_run` of a header or checked line, as "tool: reason" strings.
fn could_not_run(v: &Value) -> Vec<String> {
    v["could_not_run"]
        .as_array()
        .unwrap_or_else(|| panic!("no could_not_run in {v}"))
        .iter()
        .map(|c| format!("{}: {}", c["tool"], c["reason"]))
        .collect()
}

/// triage as nobody with exactly its documented set runs every collector it runs as root.
#[test]
fn triage_runs_every_collector_with_exactly_its_documented_capabilities() {
    require_root();
    assert_help_states_the_set("triage");
    let (code, lines, err) = as_nobody(&MULTI, &["triage", "--json", "--duration", "1s"], &[]);
    assert_eq!(code, 0, "triage as nobody with {MULTI:?}: {err}");
    let checked = lines
        .iter()
        .find(|l| l["type"] == "checked")
        .unwrap_or_else(|| panic!("no checked line: {err}"));
    assert_eq!(could_not_run(checked), Vec::<String>::new(), "{checked}");
    let ran: Vec<&str> = checked["ran"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    eprintln!("triage as nobody with {MULTI:?} ran {ran:?}");
    assert_eq!(ran, triage_tools(), "{checked}");
}

/// record as nobody with exactly its documented set records every collector, into a file
/// nobody may create.
#[test]
fn record_runs_every_collector_with_exactly_its_documented_capabilities() {
    require_root();
    assert_help_states_the_set("record");
    let dir = scratch("caps-record");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = dir.join("run.tkr");
    let (code, _, err) = as_nobody(
        &MULTI,
        &[
            "record",
            "--duration",
            "1s",
            "--interval",
            "500ms",
            "--output",
            out.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "record as nobody with {MULTI:?}: {err}");
    let text = std::fs::read_to_string(&out).unwrap();
    let header: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(could_not_run(&header), Vec::<String>::new(), "{header}");
    let tools: Vec<&str> = header["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    eprintln!(
        "record as nobody with {MULTI:?}: {tools:?}, {} lines",
        text.lines().count()
    );
    assert_eq!(tools, triage_tools(), "{header}");
    let _ = std::fs::remove_dir_all(dir);
}

/// serve as nobody with exactly its documented set (tracefs already mounted) watches every
/// collector, and /metrics says each is up.
#[test]
fn serve_runs_every_collector_with_exactly_its_documented_capabilities() {
    require_root();
    assert_help_states_the_set("serve");
    let child = nobody_cmd(
        &MULTI,
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--interval",
            "500ms",
            "--duration",
            "3s",
        ],
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let mut tk = Tracer::from_child(child);
    let meta = tk.wait_attached();
    assert_eq!(could_not_run(&meta), Vec::<String>::new(), "{meta}");
    let ids = program_ids(&meta);
    let addr = meta["listen"].as_str().expect("listen").to_string();
    // One scrape after the first window.
    std::thread::sleep(Duration::from_millis(1200));
    let body = {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        write!(
            s,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut b = String::new();
        s.read_to_string(&mut b).unwrap();
        b
    };
    let up: Vec<&str> = body
        .lines()
        .filter(|l| l.starts_with("tracekit_collector_up{"))
        .collect();
    eprintln!("serve as nobody with {MULTI:?}: {up:?}");
    assert_eq!(up.len(), triage_tools().len(), "{body}");
    let value = |l: &str| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
    assert!(up.iter().all(|l| value(l) == Some(1.0)), "{up:?}");
    let (status, _, err) = tk.finish(Duration::from_secs(15));
    assert!(status.success(), "{err}");
    assert_eq!(wait_unloaded(&ids), Vec::<u32>::new(), "programs left");
}
