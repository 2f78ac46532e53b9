//! Which perf clock a sampling profiler can use here: a hardware PMU registers the event source
//! `cpu` (`/sys/bus/event_source/devices/cpu`, or `cpu_core`/`cpu_atom` on hybrid Intel parts);
//! virtual machines often have none, and only the software clocks (`cpu-clock`) exist.

use std::path::Path;

/// The hardware PMU's event-source name under `dir` (`/sys/bus/event_source/devices`), if any.
pub fn hardware_pmu_in(dir: &Path) -> Option<&'static str> {
    ["cpu", "cpu_core", "cpu_atom"]
        .into_iter()
        .find(|n| dir.join(n).join("type").exists())
}

/// The hardware PMU of this machine, if any.
pub fn hardware_pmu() -> Option<&'static str> {
    hardware_pmu_in(&super::sys_path("bus/event_source/devices"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_pmu_only_where_one_is_registered() {
        let d = std::env::temp_dir().join(format!("tk-pmu-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        for n in ["software", "tracepoint"] {
            std::fs::create_dir_all(d.join(n)).unwrap();
            std::fs::write(d.join(n).join("type"), "1\n").unwrap();
        }
        assert_eq!(hardware_pmu_in(&d), None);
        std::fs::create_dir_all(d.join("cpu_core")).unwrap();
        std::fs::write(d.join("cpu_core").join("type"), "4\n").unwrap();
        assert_eq!(hardware_pmu_in(&d), Some("cpu_core"));
        let _ = std::fs::remove_dir_all(&d);
    }
}
