//! Root tests for `tracekit memstall`: real compaction, THP collapse, memcg reclaim and OOM kills,
//! caused on purpose by child processes, must be attributed to those children and agree with the
//! kernel's own counters (`/proc/vmstat`, the cgroup's files) and the children's own clocks.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use tracekit_tests::{mm::*, *};

/// The collapse workload faults 4 KiB pages, then collapses them: with `enabled=always` (the
/// default on some distributions, or left behind by a killed run) the faults would already map
/// huge pages, and MADV_COLLAPSE would succeed with nothing to do.
fn small_pages_at_fault() -> Setting {
    Setting::set(THP_ENABLED, "madvise")
}

fn rows<'a>(lines: &'a [Value], pid: u32, kind: &str) -> Vec<&'a Value> {
    rows_for(lines, "memstall", pid)
        .into_iter()
        .filter(|r| r["kind"] == kind)
        .collect()
}

fn of_type<'a>(lines: &'a [Value], t: &str) -> Vec<&'a Value> {
    lines
        .iter()
        .filter(|l| l["tool"] == "memstall" && l["type"] == t)
        .collect()
}

fn n(v: &Value, k: &str) -> u64 {
    v[k].as_u64()
        .unwrap_or_else(|| panic!("{k} missing in {v}"))
}

fn start() -> (Tracer, Value) {
    let mut tk = Tracer::spawn(&["memstall", "--json"]);
    let meta = tk.wait_attached();
    assert!(
        meta["traced"].as_array().unwrap().len() >= 4,
        "all groups traced here: {meta}"
    );
    (tk, meta)
}

fn stop(tk: Tracer) -> Vec<Value> {
    tk.signal(libc::SIGINT);
    let (status, lines, stderr) = tk.finish(Duration::from_secs(15));
    assert!(status.success(), "exit {status}: {stderr}");
    assert!(
        lines
            .iter()
            .any(|l| l["type"] == "stats" && l["missed"] == 0),
        "stats line with missed=0: {lines:?}"
    );
    assert_eq!(of_type(&lines, "context").len(), 1, "one context line");
    lines
}

fn run_traced(workload: &[&str]) -> (Value, Vec<Value>) {
    let (tk, _) = start();
    let w = run_workload(workload);
    (w, stop(tk))
}

/// Findings naming `pid`.
fn findings_of(lines: &[Value], pid: u32) -> Vec<&Value> {
    of_type(lines, "finding")
        .into_iter()
        .filter(|f| f["pid"] == pid)
        .collect()
}

#[test]
fn compaction_is_attributed_to_the_writer_of_compact_memory() {
    require_root();
    let _g = serial();
    let (w, lines) = run_traced(&["compact"]);
    let pid = n(&w, "pid") as u32;
    let r = rows(&lines, pid, "compaction");
    assert_eq!(r.len(), 1, "one compaction row for {pid}: {lines:?}");
    let row = r[0];
    assert!(n(row, "count") >= 1, "{row}");
    assert_eq!(row["comm"], "tk-workload");
    assert_eq!(row["kthread"], false);
    // Compaction for no allocation: each zone is one timed value, none is an allocation stall.
    assert_eq!(n(row, "direct_stalls"), 0, "{row}");
    assert_eq!(n(row, "zones"), n(row, "count"), "{row}");
    let total = n(row, "total_ns");
    let wall = n(&w, "wall_ns");
    assert!(
        total > 0 && total <= wall,
        "stall {total} ns must be within the writer's wall time {wall} ns"
    );
    assert!(n(row, "max_ns") <= total);
    assert!(n(row, "p99_ns") <= n(row, "max_ns"));
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
    assert_eq!(outcomes, n(row, "count"));
    let f = findings_of(&lines, pid);
    assert_eq!(f.len(), 1, "one finding names the writer: {lines:?}");
    assert_eq!(f[0]["cause"], "thp-compaction");
    assert!(
        f[0]["summary"]
            .as_str()
            .unwrap()
            .contains("for no allocation"),
        "{}",
        f[0]
    );
}

#[test]
fn madv_collapse_matches_thp_collapse_alloc() {
    require_root();
    let _g = serial();
    let _thp = small_pages_at_fault();
    const N: u64 = 4;
    let before = vmstat("thp_collapse_alloc");
    let (w, lines) = run_traced(&["collapse", &N.to_string()]);
    let delta = vmstat("thp_collapse_alloc") - before;
    assert_eq!(w["rc"], 0, "MADV_COLLAPSE failed: {w}");
    let pid = n(&w, "pid") as u32;
    let r = rows(&lines, pid, "thp_collapse");
    assert_eq!(r.len(), 1, "one thp_collapse row for {pid}: {lines:?}");
    let row = r[0];
    // Collapses elsewhere in the window (khugepaged) also move the counter: they are traced
    // too, in their own rows.
    let others: u64 = of_type(&lines, "summary")
        .iter()
        .filter(|l| l["kind"] == "thp_collapse" && l["pid"] != pid)
        .map(|l| n(l, "collapsed"))
        .sum();
    let mine = n(row, "collapsed");
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
    assert_eq!(n(row, "collapses"), N);
    assert!(n(row, "scans") >= N);
    assert_eq!(row["madvise_calls"], 1);
    let total = n(row, "total_ns");
    assert!(total > 0 && total <= n(&w, "wall_ns"), "{row} vs {w}");
}

#[test]
fn memcg_reclaim_is_attributed_to_the_writer_in_the_cgroup() {
    require_root();
    let _g = serial();
    let cg = Cgroup::create("memstall-memcg", 32 << 20);
    let dir = scratch("memstall-memcg");
    let file = dir.join("big");
    let procs = cg.procs();
    let (w, lines) = run_traced(&[
        "memcg-write",
        procs.to_str().unwrap(),
        file.to_str().unwrap(),
        "128",
    ]);
    let _ = std::fs::remove_dir_all(&dir);
    let pid = n(&w, "pid") as u32;
    let r = rows(&lines, pid, "memcg_reclaim");
    assert_eq!(r.len(), 1, "one memcg_reclaim row for {pid}: {lines:?}");
    let row = r[0];
    assert!(n(row, "count") >= 1, "{row}");
    assert!(n(row, "reclaimed_pages") > 0, "{row}");
    assert_eq!(row["cgroup"], format!("/{}", cg.name), "{row}");
    // Its title (/proc/<pid>/cmdline: argv as run_workload passed it), learnt while it lived.
    assert_eq!(
        row["cmdline"],
        format!(
            "{} memcg-write {} {} 128",
            workload_bin().display(),
            procs.display(),
            file.display()
        ),
        "{row}"
    );
    assert_eq!(
        n(row, "cgroup_id"),
        cg.id(),
        "the kernel's id is the directory's inode"
    );
    assert!(n(row, "total_ns") <= n(&w, "wall_ns"), "{row} vs {w}");
    // Writing 128 MiB into 32 MiB: reclaim also frees the data written, at least ~96 MiB.
    assert!(
        n(row, "reclaimed_pages") * 4096 >= 64 << 20,
        "reclaimed only {} pages",
        n(row, "reclaimed_pages")
    );
    let f = findings_of(&lines, pid);
    assert!(
        f.iter().any(|f| f["cause"] == "memcg-limit"
            && f["summary"]
                .as_str()
                .unwrap()
                .contains(&format!("in memory cgroup /{} hit its limit", cg.name))),
        "{f:?}"
    );
    // The cgroup's own counter of hitting the limit grew.
    let c = of_type(&lines, "cgroup");
    let c = c
        .iter()
        .find(|c| c["cgroup"] == format!("/{}", cg.name))
        .unwrap_or_else(|| panic!("no cgroup line: {lines:?}"));
    let grew = if cg.v1 {
        n(c, "failcnt_delta")
    } else {
        n(&c["events_delta"], "max")
    };
    assert!(grew > 0, "{c}");
}

/// A MADV_COLLAPSE the kernel refuses with EINVAL did no collapse work: no row, no finding.
#[test]
fn failed_madv_collapse_is_not_a_stall() {
    require_root();
    let _g = serial();
    let (w, lines) = run_traced(&["collapse-einval"]);
    assert_eq!(w["errno"], libc::EINVAL);
    let pid = n(&w, "pid") as u32;
    assert!(
        rows(&lines, pid, "thp_collapse").is_empty(),
        "an EINVAL MADV_COLLAPSE reported as a stall: {lines:?}"
    );
    assert!(findings_of(&lines, pid).is_empty(), "{lines:?}");
}

/// The header's count of timed stalls is the sum of the rows' COUNT (text) and `count`
/// (JSON): a THP collapse row counts its timed MADV_COLLAPSE calls, the attempts are detail.
#[test]
fn header_count_matches_the_rows() {
    require_root();
    let _g = serial();
    let _thp = small_pages_at_fault();
    let (tk, _) = start();
    let w = run_workload(&["collapse", "3"]);
    let lines = stop(tk);
    let pid = n(&w, "pid") as u32;
    let row = rows(&lines, pid, "thp_collapse")[0];
    assert_eq!(row["count"], 1, "one timed MADV_COLLAPSE call: {row}");
    assert_eq!(row["collapses"], 3, "{row}");
    let summed: u64 = of_type(&lines, "summary")
        .iter()
        .map(|l| n(l, "count"))
        .sum();
    assert_eq!(summed, n(last_stats(&lines), "stalls"));
    // Text: the header's number is the sum of the COUNT column.
    let o = Command::new(tracekit_bin())
        .args(["memstall", "--duration", "1500ms", "--rows", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
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
    // COUNT is right-aligned under its header; the COMM cell before it holds spaces
    // (`tk-workload [/path…]`), so the cell is found by where it ends, not by its index.
    let mut end = None;
    let mut sum = 0u64;
    for l in text.lines() {
        let chars: Vec<char> = l.chars().collect();
        if l.trim_start().starts_with("PID ") {
            end = l
                .find(" COUNT")
                .map(|b| l[..b].chars().count() + " COUNT".len());
            continue;
        }
        let Some(e) = end else { continue };
        if l.trim().is_empty() || chars.len() < e {
            end = None;
            continue;
        }
        let start = chars[..e]
            .iter()
            .rposition(|c| *c == ' ')
            .map_or(0, |i| i + 1);
        let cell: String = chars[start..e].iter().collect();
        match cell.parse::<u64>() {
            Ok(n) => sum += n,
            Err(_) if cell == "-" => {}
            Err(_) => panic!("COUNT cell {cell:?} in {l:?}: {text}"),
        }
    }
    assert_eq!(header, sum, "{text}");
}

#[path = "memstall/accuracy.rs"]
mod accuracy;
#[path = "memstall/vm.rs"]
mod vm_check;

/// memstall's VM check (`tests/memstall/vm.rs`): compaction and THP collapse against the
/// kernel's counters, attach modes as doctor said.
pub fn vm_check() -> Result<String, String> {
    vm_check::check()
}

/// memstall's workloads for `tk-workload` (`thp-fault N`; `memcg-fill PROCS FILE MS`,
/// `memcg-service PROCS MS`: the two sides of a memory cgroup at its limit).
pub fn workload(args: &[String]) -> Option<i32> {
    match args {
        [w, n] if w == "thp-fault" => vm_check::thp_fault(n.parse().ok()?),
        [w, procs, file, ms] if w == "memcg-fill" => memcg_fill(procs, file, ms.parse().ok()?),
        [w, procs, ms] if w == "memcg-service" => memcg_service(procs, ms.parse().ok()?),
        _ => return None,
    }
    Some(0)
}

/// Joins the cgroup of `procs`, then rewrites the first 512 MiB of `file` in 1 MiB writes at
/// 400 MiB/s for `ms` ms (page cache that fills the cgroup; the file stays 512 MiB). Paced:
/// as fast as it could (1.6 GB/s here) the cgroup's writeback fell so far behind that its
/// journal's allocations invoked the cgroup's OOM killer beside a CPU hog.
fn memcg_fill(procs: &str, file: &str, ms: u64) {
    use std::io::{Seek, Write};
    std::fs::write(procs, std::process::id().to_string()).expect("join the cgroup");
    let mut f = std::fs::File::create(file).expect("create the file");
    let buf = vec![0x5au8; 1 << 20];
    let start = Instant::now();
    let end = start + Duration::from_millis(ms);
    let mut bytes = 0u64;
    while Instant::now() < end {
        if bytes.is_multiple_of(512 << 20) {
            f.seek(std::io::SeekFrom::Start(0)).expect("seek");
        }
        f.write_all(&buf).expect("write");
        bytes += buf.len() as u64;
        let due = start + Duration::from_secs_f64(bytes as f64 / f64::from(400u32 << 20));
        std::thread::sleep(due.saturating_duration_since(Instant::now()));
    }
    println!(
        "{}",
        serde_json::json!({"pid": std::process::id(), "bytes": bytes})
    );
}

/// Joins the cgroup of `procs`, then every 20 ms for `ms` ms maps 2 MiB of anonymous memory,
/// touches every page and unmaps it, as a service handling a request would, timing each on
/// its own clock: allocations, their p50/p99/max and how many took over 1 ms.
fn memcg_service(procs: &str, ms: u64) {
    std::fs::write(procs, std::process::id().to_string()).expect("join the cgroup");
    const LEN: usize = 2 << 20;
    let end = Instant::now() + Duration::from_millis(ms);
    let mut took: Vec<u64> = Vec::new();
    while Instant::now() < end {
        let t = Instant::now();
        let p = anon_map(LEN) as *mut u8;
        for off in (0..LEN).step_by(4096) {
            // SAFETY: `off` is inside the LEN-byte mapping just made.
            unsafe { p.add(off).write_volatile(1) };
        }
        // SAFETY: unmapping exactly the mapping made above.
        unsafe { libc::munmap(p.cast(), LEN) };
        took.push(t.elapsed().as_nanos() as u64);
        std::thread::sleep(Duration::from_millis(20));
    }
    took.sort_unstable();
    let at = |q: f64| took[((took.len() as f64 * q) as usize).min(took.len() - 1)];
    println!(
        "{}",
        serde_json::json!({
            "pid": std::process::id(),
            "allocs": took.len(),
            "p50_ns": at(0.5),
            "p99_ns": at(0.99),
            "max_ns": took.last(),
            "over_1ms": took.iter().filter(|t| **t > 1_000_000).count(),
        })
    );
}

/// A setting changed by a test process that was then killed (no guard dropped) is put back by
/// the next root test, from the journal under /run.
#[test]
fn a_killed_runs_thp_setting_is_put_back() {
    require_root();
    let _g = serial();
    let now = std::fs::read_to_string(THP_DEFRAG).unwrap();
    let old = &now[now.find('[').unwrap() + 1..now.find(']').unwrap()];
    let other = if old == "never" { "madvise" } else { "never" };
    // A process that has exited, as a killed test run would have.
    let mut dead = Command::new("true").spawn().unwrap();
    dead.wait().unwrap();
    {
        let guard = Setting::set(THP_DEFRAG, other);
        // What a SIGKILL leaves: the changed value and the journal, under the dead pid.
        std::mem::forget(guard);
    }
    let journal = std::fs::read_dir("/run/tracekit-tests/settings")
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| std::fs::read_to_string(p).unwrap().contains(THP_DEFRAG))
        .expect("no journal entry for the defrag setting");
    let text = std::fs::read_to_string(&journal).unwrap();
    let rest = text.split_once('\n').unwrap().1;
    std::fs::write(&journal, format!("{}\n{rest}", dead.id())).unwrap();
    assert!(std::fs::read_to_string(THP_DEFRAG)
        .unwrap()
        .contains(&format!("[{other}]")));
    require_root();
    let after = std::fs::read_to_string(THP_DEFRAG).unwrap();
    assert!(after.contains(&format!("[{old}]")), "not put back: {after}");
    assert!(!journal.exists(), "the journal entry stays after restoring");
}
