//! The BPF programs loaded now, and those one process holds or ran: what tests check a tool
//! loaded, attached and left behind, and what `kernel.bpf_stats_enabled` says they cost.

use std::{
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

/// Program ids from a meta line's `programs` array.
pub fn program_ids(meta: &Value) -> Vec<u32> {
    meta["programs"]
        .as_array()
        .expect("meta has programs")
        .iter()
        .map(|p| p["id"].as_u64().expect("program id") as u32)
        .collect()
}

/// Ids of every BPF program loaded in the kernel now.
pub fn loaded_program_ids() -> Vec<u32> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .map(|p| p.id())
        .collect()
}

/// Every BPF program loaded now (id, type, name) and every process that may have loaded one
/// (tracekit, bpftrace, perf, bcc and libbpf tools): printed when a count comes up short, so the
/// next such failure says whether another tracer ran beside the test at that moment.
pub fn tracers_now() -> String {
    let progs: Vec<String> = aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .map(|p| {
            format!(
                "{} {:?} {}",
                p.id(),
                p.program_type(),
                p.name_as_str().unwrap_or("?")
            )
        })
        .collect();
    let mut procs = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        let comm = comm.trim();
        if ["tracekit", "bpftrace", "perf", "bpftool"].contains(&comm)
            || comm.ends_with("-bpfcc")
            || comm.starts_with("runqlat")
            || comm.starts_with("bio")
        {
            procs.push(format!("{pid} {comm}"));
        }
    }
    format!(
        "BPF programs loaded now: [{}]; tracer processes now: [{}]",
        progs.join(", "),
        procs.join(", ")
    )
}

/// The ids behind `key` (`map_id:`, `prog_id:`) in the fdinfo of each descriptor process `pid`
/// holds; empty when it is gone.
fn fd_ids(pid: u32, key: &str) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{pid}/fdinfo"))
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .filter_map(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix(key)?.trim().parse().ok())
        })
        .collect()
}

/// The entries of hash map `name` (a u32 key, `V` bytes of value) that process `pid` holds
/// (the `map_id:` of its descriptors' fdinfo); `None` when it holds no such map.
pub fn map_entries<const V: usize>(pid: u32, name: &str) -> Option<usize> {
    let id = fd_ids(pid, "map_id:")
        .into_iter()
        .find(|id| aya::maps::MapInfo::from_id(*id).is_ok_and(|i| i.name_as_str() == Some(name)))?;
    let data = aya::maps::MapData::from_id(id).ok()?;
    let map =
        aya::maps::HashMap::<_, u32, [u8; V]>::try_from(aya::maps::Map::HashMap(data)).ok()?;
    Some(map.keys().filter(Result::is_ok).count())
}

/// Ids of the BPF programs loaded now whose name starts with `prefix` (`tk_` for all of
/// tracekit's).
pub fn program_ids_named(prefix: &str) -> Vec<u32> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| p.name_as_str().is_some_and(|n| n.starts_with(prefix)))
        .map(|p| p.id())
        .collect()
}

/// A loaded program's run time and run count so far (`kernel.bpf_stats_enabled` must be on for
/// them to grow); zeros when it is not loaded.
pub fn prog_run_stats(id: u32) -> (u64, u64) {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .find(|p| p.id() == id)
        .map(|p| (p.run_time().as_nanos() as u64, p.run_count()))
        .unwrap_or((0, 0))
}

/// The id of the program in a meta line's `programs` attached to `event` (e.g. `sched_switch`).
pub fn program_on(meta: &Value, event: &str) -> Option<u32> {
    meta["programs"].as_array()?.iter().find_map(|p| {
        p["targets"]
            .as_array()?
            .iter()
            .any(|t| crate::vm::event_name(t.as_str().unwrap_or("")) == event)
            .then(|| p["id"].as_u64().map(|i| i as u32))?
    })
}

/// Waits until none of `ids` is loaded (the kernel frees programs shortly after their last fd
/// closes); returns those still loaded after the wait.
pub fn wait_unloaded(ids: &[u32]) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let loaded = loaded_program_ids();
        let left: Vec<u32> = ids.iter().copied().filter(|i| loaded.contains(i)).collect();
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Names of the BPF programs process `pid` holds (the `prog_id:` of its descriptors' fdinfo:
/// program and link fds), so tests of this file running in parallel do not count.
pub fn programs_of(pid: u32) -> Vec<String> {
    let ids = fd_ids(pid, "prog_id:");
    let mut names: Vec<String> = aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| ids.contains(&p.id()))
        .filter_map(|p| p.name_as_str().map(str::to_string))
        .collect();
    names.sort();
    names.dedup();
    names
}
