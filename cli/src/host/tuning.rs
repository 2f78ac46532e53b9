//! The node settings that explain why two runs of the same workload differ: the kernel, THP,
//! each disk's I/O scheduler, the sysctls field reports tune (swappiness, dirty ratios, network
//! backlogs and buffers, congestion control, NUMA balancing), the CPU frequency governor and the
//! idle-state limits. What a kernel does not have (no cpufreq in a VM, no `intel_idle`) is left
//! out, never an error. `record` stores them; `compare` shows the ones that changed first.

use std::{collections::BTreeMap, path::Path};

use super::{read_trim, selected};

/// The sysctls recorded, by their dotted names.
pub const SYSCTLS: &[&str] = &[
    "kernel.osrelease",
    "kernel.numa_balancing",
    "vm.swappiness",
    "vm.dirty_ratio",
    "vm.dirty_background_ratio",
    "vm.dirty_bytes",
    "vm.dirty_background_bytes",
    "vm.dirty_expire_centisecs",
    "vm.min_free_kbytes",
    "vm.overcommit_memory",
    "vm.zone_reclaim_mode",
    "net.core.netdev_max_backlog",
    "net.core.somaxconn",
    "net.core.rmem_max",
    "net.core.wmem_max",
    "net.core.rmem_default",
    "net.core.wmem_default",
    "net.ipv4.tcp_congestion_control",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
    "kernel.sched_autogroup_enabled",
];

/// Every setting as `name → value` (text as the kernel prints it, whitespace runs collapsed):
/// `sysctl:vm.swappiness`, `thp:enabled`, `disk:vda:scheduler`, `cpu:governor`,
/// `cpuidle:driver`, … A flat map, so two recordings compare key by key.
pub fn read() -> BTreeMap<String, String> {
    read_from(&super::proc_path(""), &super::sys_path(""))
}

/// [`read`] under other roots (fixture trees in tests).
pub fn read_from(proc: &Path, sys: &Path) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    let clean = |s: String| s.split_whitespace().collect::<Vec<_>>().join(" ");
    for name in SYSCTLS {
        if let Some(v) = read_trim(&proc.join("sys").join(name.replace('.', "/"))) {
            m.insert(format!("sysctl:{name}"), clean(v));
        }
    }
    let thp = super::thp::ThpSettings::read_from(&sys.join("kernel/mm/transparent_hugepage"));
    for (k, v) in [
        ("enabled", thp.enabled),
        ("defrag", thp.defrag),
        ("khugepaged/defrag", thp.khugepaged_defrag),
    ] {
        if let Some(v) = v {
            m.insert(format!("thp:{k}"), v);
        }
    }
    for (name, _, _) in super::disks::whole_disks_in(&sys.join("block")) {
        let q = sys.join("block").join(&name).join("queue");
        if let Some(s) = read_trim(&q.join("scheduler")).and_then(|s| selected(&s)) {
            m.insert(format!("disk:{name}:scheduler"), s);
        }
        for f in ["nr_requests", "read_ahead_kb"] {
            if let Some(v) = read_trim(&q.join(f)) {
                m.insert(format!("disk:{name}:{f}"), v);
            }
        }
    }
    let cpu = sys.join("devices/system/cpu");
    // The governors of all CPUs, as one value when they agree (`performance`), else per CPU.
    let mut govs = BTreeMap::new();
    if let Ok(rd) = std::fs::read_dir(&cpu) {
        for e in rd.filter_map(Result::ok) {
            let n = e.file_name().to_string_lossy().into_owned();
            let Some(idx) = n.strip_prefix("cpu").and_then(|i| i.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(g) = read_trim(&e.path().join("cpufreq/scaling_governor")) {
                govs.insert(idx, g);
            }
        }
    }
    let distinct: std::collections::BTreeSet<&String> = govs.values().collect();
    if distinct.len() == 1 {
        m.insert(
            "cpu:governor".into(),
            (*distinct.iter().next().unwrap()).clone(),
        );
    } else {
        for (i, g) in &govs {
            m.insert(format!("cpu:{i}:governor"), g.clone());
        }
    }
    for (k, p) in [
        ("cpuidle:driver", cpu.join("cpuidle/current_driver")),
        ("cpuidle:governor", cpu.join("cpuidle/current_governor")),
        (
            "cpuidle:intel_idle.max_cstate",
            sys.join("module/intel_idle/parameters/max_cstate"),
        ),
        (
            "cpuidle:processor.max_cstate",
            sys.join("module/processor/parameters/max_cstate"),
        ),
    ] {
        if let Some(v) = read_trim(&p) {
            m.insert(k.into(), v);
        }
    }
    // Idle states disabled on CPU 0 (`tuned`'s latency profiles and `cpupower idle-set -d`
    // disable deep C-states on every CPU alike).
    if let Ok(rd) = std::fs::read_dir(cpu.join("cpu0/cpuidle")) {
        let mut off: Vec<String> = rd
            .filter_map(Result::ok)
            .filter(|e| read_trim(&e.path().join("disable")).as_deref() == Some("1"))
            .filter_map(|e| read_trim(&e.path().join("name")))
            .collect();
        off.sort();
        m.insert(
            "cpuidle:cpu0:disabled".into(),
            if off.is_empty() {
                "none".into()
            } else {
                off.join(",")
            },
        );
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_fixture_node() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tuning");
        let m = read_from(&root.join("proc"), &root.join("sys"));
        let get = |k: &str| m.get(k).map(String::as_str);
        assert_eq!(get("sysctl:vm.swappiness"), Some("10"));
        assert_eq!(get("sysctl:kernel.osrelease"), Some("6.1.0-57-amd64"));
        assert_eq!(get("sysctl:net.ipv4.tcp_rmem"), Some("4096 131072 6291456"));
        assert_eq!(get("sysctl:net.ipv4.tcp_congestion_control"), Some("bbr"));
        assert_eq!(
            get("sysctl:vm.dirty_bytes"),
            None,
            "absent files are left out"
        );
        assert_eq!(get("thp:enabled"), Some("always"));
        assert_eq!(get("thp:defrag"), Some("madvise"));
        assert_eq!(get("disk:nvme0n1:scheduler"), Some("none"));
        assert_eq!(get("disk:nvme0n1:nr_requests"), Some("1023"));
        assert_eq!(get("cpu:0:governor"), Some("performance"));
        assert_eq!(get("cpu:1:governor"), Some("powersave"));
        assert_eq!(get("cpuidle:driver"), Some("intel_idle"));
        assert_eq!(get("cpuidle:intel_idle.max_cstate"), Some("1"));
        assert_eq!(get("cpuidle:cpu0:disabled"), Some("C6"));
        let none = read_from(Path::new("/nonexistent"), Path::new("/nonexistent"));
        assert!(none.is_empty(), "{none:?}");
        assert!(read().contains_key("sysctl:kernel.osrelease"));
    }
}
