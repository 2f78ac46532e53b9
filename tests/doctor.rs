//! Root test for `tracekit doctor` on this host: its answers against what the kernel shows
//! directly (sysfs, procfs, and an fentry load attempted here with raw `bpf()` calls, not through
//! tracekit's or aya's probe), and the exit code against its own per-tool verdicts.

use std::{path::Path, process::Command};

use serde_json::Value;
use tracekit_tests::*;

fn doctor(json: bool) -> (i32, Vec<Value>, String, String) {
    let mut c = Command::new(tracekit_bin());
    c.arg("doctor");
    if json {
        c.arg("--json");
    }
    let out = c.output().expect("run tracekit doctor");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines = stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    (
        out.status.code().unwrap_or(-1),
        lines,
        stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// BPF_PROG_LOAD of `r0 = 0; exit` as an fentry program on `bpf_fentry_test1`, then attach
/// (BPF_RAW_TRACEPOINT_OPEN): Ok when both work, else the errno of the step that failed.
fn fentry_ground_truth() -> Result<(), String> {
    let btf = aya::Btf::from_sys_fs().map_err(|e| format!("no BTF: {e}"))?;
    let id = btf
        .id_by_type_name_kind("bpf_fentry_test1", aya_obj::btf::BtfKind::Func)
        .map_err(|e| format!("no bpf_fentry_test1: {e}"))?;
    let insns: [u8; 16] = [0xb7, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0];
    let license = c"GPL";
    // union bpf_attr, BPF_PROG_LOAD part: offsets from include/uapi/linux/bpf.h.
    let mut attr = [0u8; 128];
    let put32 =
        |a: &mut [u8; 128], off: usize, v: u32| a[off..off + 4].copy_from_slice(&v.to_ne_bytes());
    let put64 =
        |a: &mut [u8; 128], off: usize, v: u64| a[off..off + 8].copy_from_slice(&v.to_ne_bytes());
    put32(&mut attr, 0, 26); // prog_type = BPF_PROG_TYPE_TRACING
    put32(&mut attr, 4, 2); // insn_cnt
    put64(&mut attr, 8, insns.as_ptr() as u64);
    put64(&mut attr, 16, license.as_ptr() as u64);
    put32(&mut attr, 68, 24); // expected_attach_type = BPF_TRACE_FENTRY
    put32(&mut attr, 108, id); // attach_btf_id
                               // SAFETY: bpf(BPF_PROG_LOAD) reads `attr` and the buffers it points to, all alive here.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, 5, attr.as_ptr(), attr.len() as u32) };
    if fd < 0 {
        return Err(format!(
            "BPF_PROG_LOAD: {}",
            std::io::Error::last_os_error()
        ));
    }
    let mut open = [0u8; 16];
    open[8..12].copy_from_slice(&(fd as u32).to_ne_bytes()); // raw_tracepoint.prog_fd
                                                             // SAFETY: bpf(BPF_RAW_TRACEPOINT_OPEN) reads `open`; name 0 means "the attach_btf_id".
    let link = unsafe { libc::syscall(libc::SYS_bpf, 17, open.as_ptr(), open.len() as u32) };
    let res = if link < 0 {
        Err(format!(
            "BPF_RAW_TRACEPOINT_OPEN: {}",
            std::io::Error::last_os_error()
        ))
    } else {
        // SAFETY: closing the link fd we own detaches it.
        unsafe { libc::close(link as i32) };
        Ok(())
    };
    // SAFETY: closing the program fd we own unloads it.
    unsafe { libc::close(fd as i32) };
    res
}

#[test]
fn answers_match_the_kernel() {
    require_root();
    let (code, lines, _, stderr) = doctor(true);
    let sys = lines
        .iter()
        .find(|l| l["type"] == "system")
        .unwrap_or_else(|| panic!("no system line; stderr {stderr}"));
    assert_eq!(
        sys["kernel"].as_str().unwrap(),
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap()
            .trim()
    );
    assert_eq!(sys["btf"], Path::new("/sys/kernel/btf/vmlinux").exists());
    assert_eq!(
        sys["kprobes"]["available"],
        Path::new("/sys/bus/event_source/devices/kprobe/type").exists()
    );
    let truth = fentry_ground_truth();
    assert_eq!(
        sys["fentry"]["available"],
        truth.is_ok(),
        "doctor says {}, a direct load says {truth:?}",
        sys["fentry"]
    );
    if let Err(e) = &truth {
        // On this project's 6.18 hosts BPF_PROG_LOAD answers EPERM: doctor must say why.
        if e.contains("Operation not permitted") {
            assert!(
                sys["fentry"]["why"]
                    .as_str()
                    .unwrap()
                    .contains("Operation not permitted"),
                "{}",
                sys["fentry"]
            );
        }
    }
    let nodes = std::fs::read_dir("/sys/devices/system/node")
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.len() > 4 && n.starts_with("node") && n[4..].bytes().all(|b| b.is_ascii_digit())
        })
        .count();
    assert_eq!(sys["numa_nodes"], nodes);
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap();
    assert!(
        thp.contains(&format!("[{}]", sys["thp"]["enabled"].as_str().unwrap())),
        "{thp} vs {}",
        sys["thp"]
    );
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert_eq!(sys["tracefs"]["available"], true);
    assert!(mountinfo.contains(sys["tracefs"]["path"].as_str().unwrap()));
    let has_v1 = mountinfo.contains(" - cgroup ");
    let has_v2 = mountinfo.contains(" - cgroup2 ");
    let want = match (has_v1, has_v2) {
        (true, true) => "hybrid",
        (true, false) => "v1",
        (false, true) => "v2",
        _ => "none",
    };
    assert_eq!(sys["cgroup"], want);

    // Per tool: hook lines add up, each hook has a mode or a reason, and the exit code follows.
    let tools: Vec<&Value> = lines.iter().filter(|l| l["type"] == "tool").collect();
    assert!(tools.iter().any(|t| t["name"] == "fsync-lat"), "{tools:?}");
    // The hidden benchmark control is no tool a user runs.
    assert!(
        !tools.iter().any(|t| t["name"] == "bench-floor"),
        "doctor lists the hidden bench-floor: {tools:?}"
    );
    for t in &tools {
        let hooks: Vec<&Value> = lines
            .iter()
            .filter(|l| l["type"] == "hook" && l["for"] == t["name"])
            .collect();
        assert_eq!(t["hooks"], hooks.len(), "{t}");
        for h in &hooks {
            assert!(
                !h["why"].as_str().unwrap().is_empty(),
                "hook without a reason: {h}"
            );
            if h["mode"].is_null() {
                assert!(!h["rejected"].as_array().unwrap().is_empty(), "{h}");
            }
        }
    }
    let all = tools.iter().all(|t| t["can_run"] == true);
    assert_eq!(code, if all { 0 } else { 6 }, "stderr {stderr}");
    // fsync-lat's classic tracepoints exist on this kernel, with the fields its programs read.
    let fs = lines
        .iter()
        .find(|l| l["type"] == "hook" && l["event"] == "syscalls:sys_enter_fsync")
        .unwrap();
    assert_eq!(fs["fields_found"], serde_json::json!(["__syscall_nr"]));
    assert_eq!(fs["layout"]["__syscall_nr"]["size"], 4, "{fs}");
    assert_eq!(fs["group"], "sync", "{fs}");
    node_facts_match_sysfs(sys);
}

/// The facts added for the node, each against the file the kernel shows it in.
fn node_facts_match_sysfs(sys: &Value) {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
    };
    for (i, node) in sys["numa"].as_array().unwrap().iter().enumerate() {
        assert_eq!(node["id"], sys["numa_node_ids"][i]);
        if let Some(d) = read(&format!(
            "/sys/devices/system/node/node{}/distance",
            node["id"]
        )) {
            let want: Vec<u64> = d.split_whitespace().map(|x| x.parse().unwrap()).collect();
            assert_eq!(node["distance"], serde_json::json!(want), "{node}");
        }
    }
    assert_eq!(
        sys["numa_balancing"].as_str().map(String::from),
        read("/proc/sys/kernel/numa_balancing")
    );
    let disks = sys["disks"].as_array().unwrap();
    let mut names: Vec<String> = std::fs::read_dir("/sys/block")
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let listed: Vec<&str> = disks.iter().map(|d| d["name"].as_str().unwrap()).collect();
    assert_eq!(listed, names);
    for d in disks {
        let sched = read(&format!(
            "/sys/block/{}/queue/scheduler",
            d["name"].as_str().unwrap()
        ));
        if let Some(s) = sched {
            let chosen = s
                .split('[')
                .nth(1)
                .and_then(|x| x.split(']').next())
                .unwrap_or(&s);
            assert_eq!(d["scheduler"], chosen, "{d}");
        }
    }
    let conntrack = std::path::Path::new("/proc/sys/net/netfilter/nf_conntrack_count").exists();
    assert_eq!(
        !sys["conntrack"].is_null(),
        conntrack,
        "{}",
        sys["conntrack"]
    );
    assert_eq!(sys["capabilities"]["missing"], serde_json::json!([]));
    assert!(sys["capabilities"]["effective"]
        .as_array()
        .unwrap()
        .contains(&Value::from("CAP_BPF")));
}

/// doctor's word against the tool's deed: every program fsync-lat attaches on this kernel is
/// one doctor named for that hook, in the mode doctor said, and every hook doctor says attaches
/// is attached.
#[test]
fn fsync_lat_attaches_as_doctor_says() {
    require_root();
    let (_, lines, _, stderr) = doctor(true);
    let said: Vec<&Value> = lines
        .iter()
        .filter(|l| l["type"] == "hook" && l["for"] == "fsync-lat")
        .collect();
    assert!(!said.is_empty(), "stderr {stderr}");
    let o = Command::new(tracekit_bin())
        .args(["fsync-lat", "--duration", "200ms", "--json"])
        .output()
        .unwrap();
    let meta: Value = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| l["type"] == "meta")
        .unwrap_or_else(|| panic!("no meta line: {}", String::from_utf8_lossy(&o.stderr)));
    let mut attached = std::collections::BTreeSet::new();
    for p in meta["programs"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            let h = said
                .iter()
                .find(|h| h["event"] == *t)
                .unwrap_or_else(|| panic!("{p} attached to {t}, which doctor does not list"));
            assert_eq!(h["mode"], p["attach"], "{h} vs {p}");
            assert_eq!(h["program"], p["name"], "{h} vs {p}");
            attached.insert(t.as_str().unwrap().to_string());
        }
    }
    for h in &said {
        assert_eq!(
            !h["mode"].is_null(),
            attached.contains(h["event"].as_str().unwrap()),
            "doctor and fsync-lat disagree on {h}"
        );
    }
}

#[test]
fn text_report_names_modes_and_features() {
    require_root();
    let (code, _, out, stderr) = doctor(false);
    assert!(code == 0 || code == 6, "exit {code}: {stderr}");
    for needle in [
        "tracekit doctor: Linux",
        "fentry",
        "kprobes",
        "NUMA nodes",
        "fsync-lat: can run",
        "syscalls:sys_exit_fsync",
        "tracepoint",
    ] {
        assert!(out.contains(needle), "missing {needle:?} in:\n{out}");
    }
    if code == 6 {
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
        assert!(stderr.contains("cannot run on this kernel"));
    }
}
