use super::*;
use std::path::Path;

fn fixture_dir(rel: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}

fn probe(ok: bool, why: &str) -> ProbeFacts {
    ProbeFacts {
        available: ok,
        why: why.into(),
    }
}

/// A two-node, pure-v2 node with conntrack, from the fixture tree `doctor/node`.
fn two_nodes() -> System {
    let mountinfo = host::fixture("doctor/mountinfo.v2");
    let bit = |c: Cap| 1u64 << c as u32;
    let h = HostFacts {
        kernel: Some("6.1.0-57-amd64".into()),
        euid: 1000,
        capeff: bit(Cap::Bpf) | bit(Cap::Perfmon),
        mounts: mountinfo::parse(&mountinfo),
        cgroup: cgroup::Layout::from_mountinfo(&mountinfo),
        containers: crate::host::container::Census::of(
            b"0::/user.slice/user-1000.slice/session-2.scope\n",
            [
                b"0::/\n".as_slice(),
                b"0::/system.slice/postgresql@15-main.service\n",
                b"0::/system.slice/postgresql@15-main.service\n",
                b"0::/user.slice/user-1000.slice/session-2.scope\n",
            ],
        ),
        topology: Topology::read_from(&fixture_dir("doctor/node"), 4),
        settings: Settings {
            numa_balancing: Some("1".into()),
            thp: ThpSettings::read_from(&fixture_dir("memstall/thp-madvise")),
            disks: vec![
                Disk {
                    name: "loop0".into(),
                    major: 7,
                    minor: 0,
                    queue: QueueFacts {
                        scheduler: Some("none".into()),
                        ..Default::default()
                    },
                },
                Disk {
                    name: "nvme0n1".into(),
                    major: 259,
                    minor: 0,
                    queue: QueueFacts {
                        scheduler: Some("none".into()),
                        nr_requests: Some(1023),
                        ..Default::default()
                    },
                },
                Disk {
                    name: "vda".into(),
                    major: 254,
                    minor: 0,
                    queue: QueueFacts {
                        scheduler: Some("mq-deadline".into()),
                        ..Default::default()
                    },
                },
            ],
            conntrack: Some(Conntrack {
                count: 6_000,
                max: 8_000,
                stats: [("drop".to_string(), 3), ("early_drop".to_string(), 0)]
                    .into_iter()
                    .collect(),
            }),
            lockdown: Some("integrity".into()),
            lockdown_error: None,
        },
    };
    let k = KernelFacts {
        btf_path: "/sys/kernel/btf/vmlinux".into(),
        btf_present: true,
        btf_error: None,
        tracefs: TracefsFacts {
            available: true,
            path: Some("/sys/kernel/tracing".into()),
            mounted_by_doctor: true,
            error: None,
        },
        raw_tp: probe(true, "a raw tracepoint program loaded"),
        fentry: probe(
            true,
            "a fentry program on bpf_fentry_test1 loaded and attached",
        ),
        kprobes: probe(false, "no kprobe PMU"),
    };
    System::new(h, k)
}

fn line<'a>(lines: &'a [String], label: &str) -> &'a str {
    lines
        .iter()
        .find(|l| l.trim_start().starts_with(label))
        .unwrap_or_else(|| panic!("no {label} line in {lines:#?}"))
}

/// Asserts that the `label` line says `part`.
#[track_caller]
fn line_has(lines: &[String], label: &str, part: &str) {
    assert!(line(lines, label).contains(part), "{part:?}: {lines:#?}");
}

/// Asserts that the `label` line ends with `tail`.
#[track_caller]
fn line_ends(lines: &[String], label: &str, tail: &str) {
    assert!(line(lines, label).ends_with(tail), "{tail:?}: {lines:#?}");
}

#[test]
fn two_node_fixture_renders_every_fact() {
    let s = two_nodes();
    assert_eq!(
        s.title(),
        "tracekit doctor: Linux 6.1.0-57-amd64, not root but with CAP_BPF and CAP_PERFMON"
    );
    let l = s.lines();
    assert_eq!(
        line(&l, "NUMA nodes"),
        "  NUMA nodes      2 (node0: CPUs 0-1, 2.0 GiB (1.5 GiB free); node1: CPUs 2-3,6, 1.0 GiB (0.2 GiB free))"
    );
    line_ends(
        &l,
        "NUMA distance",
        "node0: 10 21; node1: 21 10 (remote memory up to 2.1x the local cost)",
    );
    line_has(&l, "NUMA balancing", "1 (on");
    line_has(&l, "THP", "defrag=defer+madvise");
    line_ends(
        &l,
        "I/O scheduler",
        "none: loop0, nvme0n1; mq-deadline: vda",
    );
    line_ends(
        &l,
        "conntrack",
        "loaded: 6000 of 8000 entries (75.0%), drop=3, early_drop=0",
    );
    line_ends(
        &l,
        "cgroup",
        "v2: unified hierarchy at /sys/fs/cgroup; memory controller at /sys/fs/cgroup (v2)",
    );
    line_ends(
        &l,
        "capabilities",
        "has CAP_BPF, CAP_PERFMON; tools need CAP_BPF and CAP_PERFMON",
    );
    line_ends(
        &l,
        "containers",
        "recognised systemd 1 unit (2 processes); host 2 processes (the root, systemd's slices, login sessions)",
    );
    line_has(&l, "tracefs", "doctor mounted it");
    line_ends(&l, "lockdown", "integrity");
    // Values line up after the longest label ("NUMA balancing").
    let at = 2 + "NUMA balancing".len() + 2;
    for x in &l {
        assert!(
            x[..at].ends_with("  ") && !x[at..].starts_with(' '),
            "{x:?}"
        );
    }
    assert!(s.preflight_refusal.is_none() && !s.unprivileged());
}

#[test]
fn two_node_fixture_json_keeps_the_compared_keys() {
    let v = serde_json::to_value(two_nodes()).unwrap();
    // The keys `xtask vm-test` compares, and those the root tests read.
    for ptr in [
        "/kernel",
        "/btf",
        "/kprobes/available",
        "/fentry/available",
        "/raw_tp/available",
        "/numa_nodes",
        "/cgroup",
        "/thp/enabled",
        "/thp/defrag",
        "/lockdown",
        "/tracefs/available",
        "/tracefs/path",
        "/tracefs/mounted_by_doctor",
        "/missing_capabilities",
        "/btf_error",
    ] {
        assert!(v.pointer(ptr).is_some(), "{ptr} missing in {v}");
    }
    assert_eq!(v["numa_nodes"], 2);
    assert_eq!(v["numa_node_ids"], serde_json::json!([0, 1]));
    assert_eq!(v["numa"][1]["distance"], serde_json::json!([21, 10]));
    assert_eq!(v["numa"][1]["cpus"], serde_json::json!([2, 3, 6]));
    assert_eq!(v["disks"][2]["scheduler"], "mq-deadline");
    assert_eq!(v["disks"][1]["nr_requests"], 1023);
    assert_eq!(v["conntrack"]["max"], 8000);
    assert_eq!(v["numa_balancing"], "1");
    assert_eq!(v["cgroup"], "v2");
    assert_eq!(v["capabilities"]["missing"], serde_json::json!([]));
    assert!(v.get("preflight_refusal").is_none() && v.get("missing").is_none());
}

#[test]
fn an_unprivileged_flat_node_says_what_is_missing() {
    let mut h = HostFacts {
        kernel: Some("6.18.0".into()),
        euid: 65534,
        capeff: 0,
        topology: Topology::read_from(Path::new("/nonexistent"), 2),
        settings: Settings {
            lockdown_error: Some("reading /sys/kernel/security/lockdown: No such file".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    h.mounts = mountinfo::parse(&host::fixture("doctor/mountinfo.hybrid"));
    let k = KernelFacts {
        btf_path: "/tmp/garbage".into(),
        btf_present: true,
        btf_error: Some("/tmp/garbage: not BTF (bad magic or truncated header)".into()),
        tracefs: TracefsFacts {
            error: Some("permission denied".into()),
            ..Default::default()
        },
        raw_tp: probe(false, "EPERM"),
        fentry: probe(false, "EPERM"),
        kprobes: probe(false, "no kprobe PMU"),
    };
    let s = System::new(h, k);
    assert!(s.unprivileged());
    assert!(
        s.title()
            .contains("NOT PERMITTED: lacking CAP_BPF and CAP_PERFMON"),
        "{}",
        s.title()
    );
    assert!(s.preflight_refusal.as_deref().unwrap().contains("not BTF"));
    let l = s.lines();
    line_ends(
        &l,
        "capabilities",
        "LACKS CAP_BPF and CAP_PERFMON, which every tool needs (has: none)",
    );
    line_ends(&l, "NUMA nodes", "1 (node0: CPUs 0-1)");
    line_ends(&l, "NUMA distance", "node0: 10");
    line_has(&l, "NUMA balancing", "absent");
    line_ends(&l, "I/O scheduler", "no block devices");
    line_has(&l, "conntrack", "not loaded");
    line_has(&l, "cgroup", "hybrid: v1 controllers (2 mounts, e.g. /sys/fs/cgroup/memory) and a v2 tree at /sys/fs/cgroup/unified");
    line_has(&l, "BTF", "no: /tmp/garbage: not BTF");
    line_ends(&l, "tracefs", "unavailable: permission denied");
    line_has(&l, "lockdown", "unknown: reading");
    let v = serde_json::to_value(&s).unwrap();
    assert_eq!(
        v["missing_capabilities"],
        serde_json::json!(["CAP_BPF", "CAP_PERFMON"])
    );
    assert_eq!(v["btf"], false);
    assert_eq!(v["lockdown"], serde_json::Value::Null);
}

#[test]
fn layouts_and_cpu_lists() {
    let m = |t: &str| mountinfo::parse(t);
    let v1 = "30 24 0:26 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
    let v2 = "31 24 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";
    assert_eq!(cgroup_mode(&m(&format!("{v1}{v2}"))).0, "hybrid");
    assert_eq!(cgroup_mode(&m(v1)).0, "v1");
    assert_eq!(
        cgroup_mode(&m("22 1 0:21 / /sys rw - sysfs sysfs rw\n")).0,
        "none"
    );
    assert_eq!(cpu_ranges(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
    assert_eq!(cpu_ranges(&[5]), "5");
    assert_eq!(cpu_ranges(&[]), "none");
    assert_eq!(
        host::parse_cpu_list(&cpu_ranges(&[0, 2, 3, 4, 9])).unwrap(),
        [0, 2, 3, 4, 9]
    );
}

#[test]
fn reads_this_node() {
    let s = System::new(
        HostFacts::read(),
        KernelFacts {
            btf_path: String::new(),
            btf_present: false,
            btf_error: None,
            tracefs: TracefsFacts::default(),
            raw_tp: probe(false, ""),
            fentry: probe(false, ""),
            kprobes: probe(false, ""),
        },
    );
    assert!(s.numa_nodes >= 1);
    assert_eq!(s.numa_node_ids.len(), s.numa_nodes);
    assert_ne!(s.kernel, "unknown");
    assert_eq!(s.lines().len(), 15);
}
