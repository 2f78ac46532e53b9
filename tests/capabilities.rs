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

/// Runs tracekit as nobody holding exactly `caps` (setpriv names, e.g. "bpf"), with `env`.
fn as_nobody(caps: &[&str], args: &[&str], env: &[(&str, &str)]) -> (i32, Vec<Value>, String) {
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
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(format!("--inh-caps={set}"))
        .arg(format!("--ambient-caps={set}"))
        .arg(format!("--bounding-set={set}"))
        .arg("--")
        .arg(tracekit_bin())
        .args(args)
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
        let help = Command::new(tracekit_bin())
            .args([tool, "--help"])
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&help.stdout);
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

/// Without BTF (here: `TRACEKIT_BTF` naming a missing file), fsync-lat and memstall read
/// tracefs: as nobody that needs CAP_DAC_READ_SEARCH, and lacking it is exit 3 naming it.
#[test]
fn tracefs_permission_is_exit_3_naming_the_capability() {
    require_root();
    let no_btf = [("TRACEKIT_BTF", "/nonexistent/vmlinux")];
    for tool in ["fsync-lat", "memstall"] {
        let (code, _, err) =
            as_nobody(&["bpf", "perfmon"], &[tool, "--duration", "300ms"], &no_btf);
        assert_eq!(code, 3, "{tool}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(
            err.contains("CAP_DAC_READ_SEARCH") && err.contains("permission denied"),
            "{tool}: {err}"
        );
        assert!(!err.contains("lacks"), "{tool} blames the kernel: {err}");
        let (code, lines, err) = as_nobody(
            &["bpf", "perfmon", "dac_read_search"],
            &[tool, "--json", "--duration", "300ms"],
            &no_btf,
        );
        assert_eq!(code, 0, "{tool} with CAP_DAC_READ_SEARCH: {err}");
        let meta = lines.iter().find(|l| l["type"] == "meta").expect("meta");
        assert!(
            meta["programs"]
                .as_array()
                .unwrap()
                .iter()
                .all(|p| p["attach"] == "tracepoint"),
            "{meta}"
        );
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
