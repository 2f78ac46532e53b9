//! Root tests for `tracekit memstall`: real compaction, THP collapse and memcg reclaim, caused on
//! purpose by `tk-workload` children, must be attributed to those children and agree with the
//! kernel's own counters (`/proc/vmstat`) and the children's own clocks.

use std::{path::PathBuf, sync::Mutex, time::Duration};

use serde_json::Value;
use tracekit_tests::*;

/// The triggers move global counters (`/proc/vmstat`) and compete for memory: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn rows<'a>(lines: &'a [Value], pid: u32, kind: &str) -> Vec<&'a Value> {
    rows_for(lines, "memstall", pid)
        .into_iter()
        .filter(|r| r["kind"] == kind)
        .collect()
}

fn sum(rows: &[&Value], field: &str) -> u64 {
    rows.iter().map(|r| r[field].as_u64().unwrap_or(0)).sum()
}

fn vmstat(key: &str) -> u64 {
    std::fs::read_to_string("/proc/vmstat")
        .unwrap()
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == key).then(|| v.trim().parse().unwrap())
        })
        .unwrap_or_else(|| panic!("/proc/vmstat has no {key}"))
}

fn run_traced(workload: &[&str]) -> (Value, Vec<Value>) {
    let mut tk = Tracer::spawn(&["memstall", "--json"]);
    let meta = tk.wait_attached();
    assert!(
        meta["traced"].as_array().unwrap().len() >= 4,
        "all groups traced here: {meta}"
    );
    let w = run_workload(workload);
    tk.signal(libc::SIGINT);
    let (status, lines, stderr) = tk.finish(Duration::from_secs(15));
    assert!(status.success(), "exit {status}: {stderr}");
    assert!(
        lines
            .iter()
            .any(|l| l["type"] == "stats" && l["missed"] == 0),
        "stats line with missed=0: {lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l["type"] == "verdict" && !l["lines"].as_array().unwrap().is_empty()),
        "a verdict"
    );
    (w, lines)
}

#[test]
fn compaction_is_attributed_to_the_writer_of_compact_memory() {
    require_root();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (w, lines) = run_traced(&["compact"]);
    let pid = w["pid"].as_u64().unwrap() as u32;
    let r = rows(&lines, pid, "compaction");
    assert_eq!(r.len(), 1, "one compaction row for {pid}: {lines:?}");
    let row = r[0];
    assert!(row["count"].as_u64().unwrap() >= 1, "{row}");
    assert_eq!(row["comm"], "tk-workload");
    assert_eq!(row["kthread"], false);
    let total = row["total_ns"].as_u64().unwrap();
    let wall = w["wall_ns"].as_u64().unwrap();
    assert!(
        total > 0 && total <= wall,
        "stall {total} ns must be within the writer's wall time {wall} ns"
    );
    assert!(row["max_ns"].as_u64().unwrap() <= total);
    assert!(row["p99_ns"].as_u64().unwrap() <= row["max_ns"].as_u64().unwrap());
    // Every zone run ended with a named outcome from the format file.
    let outcomes: u64 = row["outcomes"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| {
            assert!(!k.starts_with("status_"), "unnamed outcome {k}");
            v.as_u64().unwrap()
        })
        .sum();
    assert_eq!(outcomes, row["count"].as_u64().unwrap());
    let verdict = lines.iter().find(|l| l["type"] == "verdict").unwrap();
    assert!(
        verdict["lines"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l.as_str().unwrap().contains(&format!("({pid})"))),
        "the verdict names the child: {verdict}"
    );
}

#[test]
fn madv_collapse_matches_thp_collapse_alloc() {
    require_root();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    const N: u64 = 4;
    let before = vmstat("thp_collapse_alloc");
    let (w, lines) = run_traced(&["collapse", &N.to_string()]);
    let delta = vmstat("thp_collapse_alloc") - before;
    assert_eq!(w["rc"], 0, "MADV_COLLAPSE failed: {w}");
    let pid = w["pid"].as_u64().unwrap() as u32;
    let r = rows(&lines, pid, "thp_collapse");
    assert_eq!(r.len(), 1, "one thp_collapse row for {pid}: {lines:?}");
    let row = r[0];
    // Collapses elsewhere in the window (khugepaged) also move the counter: they are traced
    // too, in their own rows.
    let others: u64 = lines
        .iter()
        .filter(|l| {
            l["tool"] == "memstall"
                && l["type"] == "summary"
                && l["kind"] == "thp_collapse"
                && l["pid"] != pid
        })
        .map(|l| l["collapsed"].as_u64().unwrap())
        .sum();
    let mine = row["collapsed"].as_u64().unwrap();
    assert!(
        delta >= 1,
        "the kernel collapsed nothing (thp_collapse_alloc +0)"
    );
    assert_eq!(
        mine + others,
        delta,
        "collapses traced ({mine} in the child, {others} elsewhere) vs thp_collapse_alloc +{delta}"
    );
    assert_eq!(mine, N, "every 2 MiB range collapsed");
    assert_eq!(row["collapses"].as_u64().unwrap(), N);
    assert!(row["scans"].as_u64().unwrap() >= N);
    assert_eq!(row["madvise_calls"], 1);
    let total = row["total_ns"].as_u64().unwrap();
    assert!(
        total > 0 && total <= w["wall_ns"].as_u64().unwrap(),
        "{row} vs {w}"
    );
}

/// A memory cgroup with a 32 MiB limit, removed on drop.
struct Cgroup {
    dir: PathBuf,
    name: String,
}

impl Cgroup {
    fn create() -> Cgroup {
        let name = format!("tk-memstall-{}", std::process::id());
        let limit = (32u64 << 20).to_string();
        let v1 = PathBuf::from("/sys/fs/cgroup/memory");
        let dir = if v1.join("memory.limit_in_bytes").exists() {
            let d = v1.join(&name);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("memory.limit_in_bytes"), &limit).unwrap();
            d
        } else {
            // Pure v2: the memory controller must be enabled for children of the root.
            let root = PathBuf::from("/sys/fs/cgroup");
            let ctl = std::fs::read_to_string(root.join("cgroup.controllers")).unwrap_or_default();
            assert!(
                ctl.split_whitespace().any(|c| c == "memory"),
                "no memory controller on v1 or v2 here"
            );
            let _ = std::fs::write(root.join("cgroup.subtree_control"), "+memory");
            let d = root.join(&name);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("memory.max"), &limit).unwrap();
            d
        };
        Cgroup { dir, name }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // The child has exited; its page cache charges do not keep the directory alive.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("could not remove {}", self.dir.display());
    }
}

#[test]
fn memcg_reclaim_is_attributed_to_the_writer_in_the_cgroup() {
    require_root();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let cg = Cgroup::create();
    let dir = scratch("memstall-memcg");
    let file = dir.join("big");
    let procs = cg.dir.join("cgroup.procs");
    let (w, lines) = run_traced(&[
        "memcg-write",
        procs.to_str().unwrap(),
        file.to_str().unwrap(),
        "128",
    ]);
    let _ = std::fs::remove_dir_all(&dir);
    let pid = w["pid"].as_u64().unwrap() as u32;
    let r = rows(&lines, pid, "memcg_reclaim");
    assert_eq!(r.len(), 1, "one memcg_reclaim row for {pid}: {lines:?}");
    let row = r[0];
    assert!(row["count"].as_u64().unwrap() >= 1, "{row}");
    assert!(row["reclaimed_pages"].as_u64().unwrap() > 0, "{row}");
    let cgroup = row["cgroup"].as_str().unwrap_or("");
    assert!(
        cgroup.ends_with(&format!("/{}", cg.name)),
        "cgroup {cgroup:?} should name {}",
        cg.name
    );
    let total = row["total_ns"].as_u64().unwrap();
    assert!(total <= w["wall_ns"].as_u64().unwrap(), "{row} vs {w}");
    // Writing 128 MiB into 32 MiB: reclaim also frees the data written, at least ~96 MiB.
    assert!(
        sum(&r, "reclaimed_pages") * 4096 >= 64 << 20,
        "reclaimed only {} pages",
        sum(&r, "reclaimed_pages")
    );
    let verdict = lines.iter().find(|l| l["type"] == "verdict").unwrap();
    assert!(
        verdict["lines"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l.as_str().unwrap().contains("hit its limit")),
        "{verdict}"
    );
}

/// A MADV_COLLAPSE the kernel refuses with EINVAL did no collapse work: no row, no verdict.
#[test]
fn failed_madv_collapse_is_not_a_stall() {
    require_root();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (w, lines) = run_traced(&["collapse-einval"]);
    assert_eq!(w["errno"], libc::EINVAL);
    let pid = w["pid"].as_u64().unwrap() as u32;
    assert!(
        rows(&lines, pid, "thp_collapse").is_empty(),
        "an EINVAL MADV_COLLAPSE reported as a stall: {lines:?}"
    );
    let verdict = lines.iter().find(|l| l["type"] == "verdict").unwrap();
    assert!(
        !verdict.to_string().contains(&format!("({pid})")),
        "{verdict}"
    );
}

/// The header's count of timed stalls is the sum of the rows' COUNT (text) and `count`
/// (JSON): a THP collapse row counts its timed MADV_COLLAPSE calls, the attempts are detail.
#[test]
fn header_count_matches_the_rows() {
    require_root();
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut tk = Tracer::spawn(&["memstall", "--json"]);
    tk.wait_attached();
    let w = run_workload(&["collapse", "3"]);
    tk.signal(libc::SIGINT);
    let (status, lines, stderr) = tk.finish(Duration::from_secs(15));
    assert!(status.success(), "{stderr}");
    let pid = w["pid"].as_u64().unwrap() as u32;
    let row = rows(&lines, pid, "thp_collapse")[0];
    assert_eq!(row["count"], 1, "one timed MADV_COLLAPSE call: {row}");
    assert_eq!(row["collapses"], 3, "{row}");
    let summed: u64 = lines
        .iter()
        .filter(|l| l["type"] == "summary")
        .map(|l| l["count"].as_u64().unwrap())
        .sum();
    assert_eq!(summed, last_stats(&lines)["stalls"].as_u64().unwrap());
    // Text: the header's number is the sum of the COUNT column.
    let o = std::process::Command::new(tracekit_bin())
        .args(["memstall", "--duration", "1500ms", "--rows", "0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    run_workload(&["collapse", "2"]);
    let out = o.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let header: u64 = text
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("memstall: "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no header: {text}"));
    let mut col = None;
    let mut sum = 0u64;
    for l in text.lines() {
        let cells: Vec<&str> = l.split_whitespace().collect();
        if let Some(i) = cells.iter().position(|c| *c == "COUNT") {
            col = Some(i);
            continue;
        }
        if let Some(i) = col {
            match cells.get(i).map(|c| c.parse::<u64>()) {
                Some(Ok(n)) => sum += n,
                Some(Err(_)) if cells.get(i) == Some(&"-") => {}
                _ => col = None,
            }
        }
    }
    assert_eq!(header, sum, "{text}");
}
