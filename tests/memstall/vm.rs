//! memstall's VM check (run in every guest kernel of `cargo xtask vm-test` and on the host):
//! compaction requested through `/proc/sys/vm/compact_memory` is one timed zone per populated
//! zone of the node(s) (`/proc/zoneinfo`), attributed to the writer, no allocation stall among
//! them, and every direct-compaction stall traced is one of `/proc/vmstat compact_stall`; then
//! THP collapse by `MADV_COLLAPSE` equals `thp_collapse_alloc`, or, before 6.1, memstall says
//! the kernel has no `MADV_COLLAPSE` and shows no stall; then whole THP faults, where fentry or
//! kprobes time them, are one each per `thp_fault_alloc` / `thp_fault_fallback`. Attach modes
//! are held to doctor's.

use serde_json::Value;
use tracekit_tests::{rows_for, vm::traced};

use tracekit_tests::mm::{Setting, THP_ENABLED};

/// `/proc/vmstat` counter `key` (0 when absent).
fn vmstat(key: &str) -> u64 {
    std::fs::read_to_string("/proc/vmstat")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0)
}

/// Zones with pages (`present` > 0 in `/proc/zoneinfo`): what a write to compact_memory
/// compacts, one `mm_compaction_begin/end` each.
fn populated_zones() -> Result<u64, String> {
    let text =
        std::fs::read_to_string("/proc/zoneinfo").map_err(|e| format!("/proc/zoneinfo: {e}"))?;
    let mut zones = 0;
    let mut in_zone = false;
    for l in text.lines() {
        if l.starts_with("Node ") {
            in_zone = true;
        } else if let (true, Some(v)) = (in_zone, l.trim().strip_prefix("present")) {
            in_zone = false;
            if v.trim()
                .parse::<u64>()
                .map_err(|e| format!("zoneinfo {l:?}: {e}"))?
                > 0
            {
                zones += 1;
            }
        }
    }
    Ok(zones)
}

fn n(r: &Value, k: &str) -> u64 {
    r[k].as_u64().unwrap_or(0)
}

fn in_guest() -> bool {
    std::env::var_os("TKVM_GUEST").is_some()
}

pub fn check() -> Result<String, String> {
    let mut done = vec![compaction()?];
    for part in [collapse, faults] {
        match part() {
            Ok(c) => done.push(c),
            Err(e) => return Err(format!("{e}; {}", done.join("; "))),
        }
    }
    Ok(done.join("; "))
}

const HUGE: usize = 2 << 20;

/// `thp-fault N`: N aligned 2 MiB ranges of an anonymous mapping marked MADV_HUGEPAGE, each
/// written once (one THP fault each); prints pid, wall time of the touches, and the result.
pub fn thp_fault(n: usize) {
    // Large and 2 MiB-aligned: the allocator maps fresh anonymous memory, untouched.
    let layout = std::alloc::Layout::from_size_align(n * HUGE, HUGE).expect("layout");
    // SAFETY: a non-zero size; checked for null below, never freed (the process exits).
    let aligned = unsafe { std::alloc::alloc(layout) };
    assert!(!aligned.is_null(), "alloc");
    // SAFETY: the range is mapped and ours.
    let rc = unsafe { libc::madvise(aligned.cast(), n * HUGE, libc::MADV_HUGEPAGE) };
    assert_eq!(rc, 0, "madvise(MADV_HUGEPAGE)");
    let t = std::time::Instant::now();
    for i in 0..n {
        // SAFETY: inside the allocation (n * HUGE bytes from aligned).
        unsafe { aligned.add(i * HUGE).write_volatile(1) };
    }
    let wall = t.elapsed().as_nanos() as u64;
    println!(
        "{}",
        serde_json::json!({"pid": std::process::id(), "faults": n, "wall_ns": wall})
    );
}

/// Whole THP faults: where memstall times them (fentry/fexit or kprobes), the caller's row
/// counts one per fault, `thp_fault_alloc` + `thp_fault_fallback` exactly (in a guest, where
/// nothing else asks for huge pages), its fallbacks are `thp_fault_fallback`, and the time is
/// within the caller's wall time; where it cannot, memstall says the faults are not timed.
fn faults() -> Result<String, String> {
    const N: u64 = 8;
    let _thp = if in_guest() {
        Some(Setting::try_set(THP_ENABLED, "madvise")?)
    } else {
        None
    };
    let (alloc, fallback) = (vmstat("thp_fault_alloc"), vmstat("thp_fault_fallback"));
    let (lines, w, _) = traced(&["memstall"], &["thp-fault", &N.to_string()])?;
    let alloc = vmstat("thp_fault_alloc") - alloc;
    let fallback = vmstat("thp_fault_fallback") - fallback;
    let pid = w["pid"]
        .as_u64()
        .ok_or("thp-fault workload printed no pid")? as u32;
    let meta = lines
        .iter()
        .find(|l| l["type"] == "meta" && l["tool"] == "memstall")
        .ok_or("no meta line")?;
    let row = rows_for(&lines, "memstall", pid)
        .into_iter()
        .find(|r| r["kind"] == "thp_fault");
    if meta["thp_fault_timed"] != true {
        let said = lines.iter().any(|l| {
            l.to_string()
                .contains("a whole fault is not timed on this kernel")
        });
        return match (row, said || alloc + fallback == 0) {
            (None, true) => Ok(format!(
                "THP faults not timed here (no fentry or kprobes), and said so; thp_fault_alloc +{alloc}"
            )),
            _ => Err(format!(
                "THP faults untimed but row {row:?}, note said {said}, thp_fault_alloc +{alloc}"
            )),
        };
    }
    let r = row.ok_or_else(|| {
        format!("no thp_fault row for pid {pid} (thp_fault_alloc +{alloc}, fallback +{fallback})")
    })?;
    let (count, falls, total) = (n(r, "count"), n(r, "fallbacks"), n(r, "total_ns"));
    let exact = count == alloc + fallback && falls == fallback;
    if count != N || (in_guest() && !exact) || total == 0 || total > n(&w, "wall_ns") {
        return Err(format!(
            "THP faults: {count} timed ({falls} fell back) in {total} ns, expected {N} within the {} ns of the touches; thp_fault_alloc +{alloc}, thp_fault_fallback +{fallback}",
            n(&w, "wall_ns")
        ));
    }
    Ok(format!(
        "{count} whole THP faults ({falls} fell back) = thp_fault_alloc +{alloc} + thp_fault_fallback +{fallback}, {total} ns"
    ))
}

fn compaction() -> Result<String, String> {
    let zones = populated_zones()?;
    let stalls_before = vmstat("compact_stall");
    let (lines, w, modes) = traced(&["memstall"], &["compact"])?;
    let stalls = vmstat("compact_stall") - stalls_before;
    let pid = w["pid"].as_u64().ok_or("compact workload printed no pid")? as u32;
    let rows: Vec<&Value> = rows_for(&lines, "memstall", pid)
        .into_iter()
        .filter(|r| r["kind"] == "compaction")
        .collect();
    let [row] = rows.as_slice() else {
        return Err(format!(
            "{} compaction rows for the writer {pid}",
            rows.len()
        ));
    };
    let (count, total, wall) = (n(row, "count"), n(row, "total_ns"), n(&w, "wall_ns"));
    if n(row, "zones") != zones || count != zones || n(row, "direct_stalls") != 0 {
        return Err(format!(
            "compact_memory: {count} timed, {} zone(s), {} allocation stall(s) traced in the writer; /proc/zoneinfo has {zones} populated zone(s) and the writer allocates nothing",
            n(row, "zones"),
            n(row, "direct_stalls")
        ));
    }
    if total == 0 || total > wall {
        return Err(format!(
            "compaction total {total} ns outside (0, writer wall {wall} ns]"
        ));
    }
    // Direct-compaction stalls anywhere during the run: exactly compact_stall (in a guest; on
    // a shared host, stalls before the attach or after the detach move the counter too).
    let traced_stalls: u64 = lines
        .iter()
        .filter(|l| l["tool"] == "memstall" && l["type"] == "summary")
        .map(|l| n(l, "direct_stalls"))
        .sum();
    let exact = if traced_stalls == stalls {
        format!("{traced_stalls} direct stall(s) = compact_stall +{stalls}")
    } else if in_guest() {
        return Err(format!(
            "{traced_stalls} direct-compaction stall(s) traced, /proc/vmstat compact_stall +{stalls}"
        ));
    } else {
        format!("{traced_stalls} direct stall(s) traced, compact_stall +{stalls} (host: others' stalls outside the run count too)")
    };
    Ok(format!(
        "{count} zone compaction(s) = {zones} populated zone(s), {total} ns <= wall {wall} ns; {exact}; {modes}"
    ))
}

/// 4 MiB of small pages collapsed with one `madvise(MADV_COLLAPSE)` (6.1+) are 2 collapse
/// attempts, both successful, in the caller, as `thp_collapse_alloc` says. Needs THP
/// `enabled=madvise` (at `always` the pages are huge at fault, nothing to collapse): set in the
/// guest (Debian's kernels default to `always`) and restored; the host's setting is never
/// changed. Before 6.1 (commit 7d8faaf15545) the call fails with EINVAL at once: memstall must
/// say the kernel has no `MADV_COLLAPSE` and show no collapse stall.
fn collapse() -> Result<String, String> {
    const N: u64 = 2;
    let _thp = if in_guest() {
        Some(Setting::try_set(THP_ENABLED, "madvise")?)
    } else {
        let text = std::fs::read_to_string(THP_ENABLED).unwrap_or_default();
        if !text.contains("[madvise]") {
            return Ok(format!(
                "collapse not checked: THP enabled is {:?} here, not madvise",
                text.trim()
            ));
        }
        None
    };
    let before = vmstat("thp_collapse_alloc");
    let (lines, w, _) = traced(&["memstall"], &["collapse", &N.to_string()])?;
    let delta = vmstat("thp_collapse_alloc") - before;
    let pid = w["pid"]
        .as_u64()
        .ok_or("collapse workload printed no pid")? as u32;
    let row = rows_for(&lines, "memstall", pid)
        .into_iter()
        .find(|r| r["kind"] == "thp_collapse");
    let meta = lines
        .iter()
        .find(|l| l["type"] == "meta" && l["tool"] == "memstall")
        .ok_or("no meta line")?;
    if w["rc"] != 0 {
        if w["errno"] != libc::EINVAL {
            return Err(format!("madvise(MADV_COLLAPSE) failed: {w}"));
        }
        let said = lines
            .iter()
            .any(|l| l.to_string().contains("no MADV_COLLAPSE (6.1+)"));
        return match (row, said, &meta["madv_collapse"]) {
            (None, true, Value::Bool(false)) => {
                Ok("MADV_COLLAPSE absent (EINVAL), memstall says \"no MADV_COLLAPSE (6.1+)\" and shows no stall".into())
            }
            (Some(r), _, _) => Err(format!(
                "MADV_COLLAPSE failed with EINVAL (6.1+) but memstall shows a collapse row: {r}"
            )),
            (None, said, m) => Err(format!(
                "MADV_COLLAPSE failed with EINVAL: memstall said \"no MADV_COLLAPSE (6.1+)\": {said}, meta madv_collapse {m}"
            )),
        };
    }
    let r = row.ok_or_else(|| format!("no thp_collapse row for pid {pid}"))?;
    if meta["madv_collapse"] != true {
        return Err(format!(
            "MADV_COLLAPSE worked but meta says madv_collapse {}",
            meta["madv_collapse"]
        ));
    }
    // Collapses by khugepaged in the window also move the counter: traced in their own rows.
    let others: u64 = lines
        .iter()
        .filter(|l| l["tool"] == "memstall" && l["type"] == "summary")
        .filter(|l| l["kind"] == "thp_collapse" && l["pid"] != pid)
        .map(|l| n(l, "collapsed"))
        .sum();
    let mine = n(r, "collapsed");
    if mine != N || n(r, "collapses") != N || mine + others != delta {
        return Err(format!(
            "collapse: {mine} of {} attempts collapsed in the caller (expected {N} of {N}), {others} elsewhere; thp_collapse_alloc +{delta}",
            n(r, "collapses")
        ));
    }
    let (total, wall) = (n(r, "total_ns"), n(&w, "wall_ns"));
    if r["madvise_calls"] != 1 || total == 0 || total > wall {
        return Err(format!(
            "collapse: {} MADV_COLLAPSE call(s) timed at {total} ns, expected 1 within (0, {wall} ns]",
            r["madvise_calls"]
        ));
    }
    Ok(format!(
        "{mine}/{N} collapsed = thp_collapse_alloc +{delta} (minus {others} by others), 1 call {total} ns"
    ))
}
