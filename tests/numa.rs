//! Root tests for `tracekit numa`, its VM check and its workloads.
//!
//! On this one-node host the tool must say there is nothing to misplace and load nothing; with
//! `--force` it runs its real programs here too, and a workload's CPU time must equal its own
//! `/proc/<pid>/schedstat` run time exactly. The two-node proof is [`vm_check`], in the guests of
//! `cargo xtask vm-test` (node 0 = CPU 0, node 1 = CPU 1): memory bound to node 1 while the
//! process runs on node 0 is reported as remote and named in a finding; the same bound locally
//! is not; with `kernel.numa_balancing=1` and the memory first touched on the far node, the
//! migrations and hinting faults are reported per process and the system totals equal the
//! kernel's `/proc/vmstat` deltas.

use std::{process::Command, time::Duration};

use serde_json::Value;
use tracekit::host::{numa, vmstat::Vmstat};

#[path = "numa/place.rs"]
mod place;
use tracekit_tests::{mm::Setting, *};

#[test]
fn one_node_says_nothing_to_misplace_and_loads_nothing() {
    require_root();
    if numa::Topology::read().len() != 1 {
        eprintln!("skipped: this host has several NUMA nodes (the VM check covers them)");
        return;
    }
    // No window asked for: one line at once.
    let o = Command::new(tracekit_bin()).arg("numa").output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out} {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(
        out.contains("one NUMA node") && out.contains("nothing to misplace"),
        "{out}"
    );
    // With a window: the usual JSON lines, one node, no finding, and no program loaded (other
    // tests of this file load tk_numa programs in parallel, so the meta line is the witness).
    let mut tk = Tracer::spawn(&["numa", "--json", "--duration", "1s"]);
    let meta = tk.wait_attached();
    assert_eq!(meta["programs"], serde_json::json!([]));
    let (status, lines, err) = tk.finish(Duration::from_secs(10));
    assert!(status.success(), "{err}");
    let sys: Vec<&Value> = lines.iter().filter(|l| l["type"] == "system").collect();
    assert_eq!(sys.len(), 1, "{lines:?}");
    assert_eq!(sys[0]["nodes"], 1);
    assert!(!lines.iter().any(|l| l["type"] == "finding"), "{lines:?}");
    assert!(lines.iter().any(|l| l["type"] == "stats"));
}

/// The real programs on this kernel (`--force`): the workload's run time is seen, on node 0,
/// and one node means nothing remote. This host's kernel sometimes switches a task out without a
/// `sched_switch` for its switch-in (checked with bpftrace: ~30 in 4 s, after switches to the
/// sandbox's own threads; 4 such runs once cost 22 % here in CI). Such a run is measured from
/// the kernel's `se.prev_sum_exec_runtime`, which is set when the task is picked, so the row
/// must be within 5 % under schedstat and never over. Exactness on kernels without the quirk is
/// proven by [`vm_check`] (equal on 5.10, 6.1, 6.12).
#[test]
fn forced_on_one_node_counts_run_time() {
    require_root();
    let run = traced_case(
        &["--force"],
        &["numa-place", "bind", "0", "0", "16", "1"],
        false,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let row = run.row().unwrap_or_else(|e| panic!("{e}"));
    let cpu = row["cpu_ns"].as_u64().unwrap();
    let unseen = run.stats()["runs_without_baseline"].as_u64().unwrap();
    assert!(
        cpu <= run.runtime_ns && cpu >= run.runtime_ns / 100 * 95,
        "run time {cpu} vs schedstat {} ({unseen} runs without a seen switch-in): {row}",
        run.runtime_ns
    );
    assert_eq!(row["cpu_ns_by_node"][0], cpu);
    assert_eq!(row["remote_cpu_share_ppm"], 0, "{row}");
    // Its title: /proc/<pid>/cmdline, argv as the test started it.
    assert_eq!(
        row["cmdline"],
        format!("{} numa-place bind 0 0 16 1", workload_bin().display()),
        "{row}"
    );
    let mem = row["mem_kib_by_node"][0].as_u64().unwrap();
    assert!(mem >= 16 << 10, "{row}");
    assert!(
        !run.lines.iter().any(|l| l["type"] == "finding"),
        "{:?}",
        run.lines
    );
    let sys = run.system().unwrap();
    assert_eq!(sys["nodes"], 1);
    // No kprobes or fentry on this host: hinting faults are unknown, not zero.
    if sys["hint_hook"].is_null() {
        assert!(row["hint_faults"].is_null(), "{row}");
    }
}

/// Issue #30: run beside ctxsw and runq-lat (`record`, as `triage` and `serve` do), numa's
/// node time is recorded by the shared `sched_switch` program, so the run holds one switch
/// program and none of numa's; the workload's run time is still its schedstat run time (within
/// the 5 % this host's skipped switch-ins allow, see above), and ctxsw's switches of it still
/// equal its own /proc counts. Also in [`vm_check`] (two nodes there, no force needed).
fn beside_ctxsw() -> Result<String, String> {
    let dir = scratch("numa-composed");
    let out = dir.join("sched.tkr");
    let tk = start_recording_env(
        &out,
        &[
            "--tools",
            "ctxsw,runq-lat,numa",
            "--duration",
            "60s",
            "--interval",
            "1s",
        ],
        &[("TRACEKIT_NUMA_FORCE", "1")],
    );
    let progs = programs_of(tk.child.id());
    let held = Held::start(&["numa-place", "bind", "0", "0", "16", "1"]);
    let runtime = held
        .as_ref()
        .map_err(Clone::clone)
        .and_then(Held::runtime_asleep);
    let own: u64 = held.as_ref().map_or(0, |h| {
        std::fs::read_to_string(format!("/proc/{}/status", h.pid))
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("ctxt_switches"))
            .filter_map(|l| l.split_whitespace().last()?.parse::<u64>().ok())
            .sum()
    });
    // A window boundary after the workload went to sleep: its last run is in a drained window.
    std::thread::sleep(Duration::from_millis(1200));
    tk.signal(libc::SIGINT);
    let (st, _, stderr) = tk.finish(Duration::from_secs(30));
    let held = held?;
    let pid = held.pid;
    held.release();
    let runtime = runtime?;
    if !st.success() {
        return Err(format!("record: exit {st}: {stderr}"));
    }
    let switch: Vec<&String> = progs.iter().filter(|n| n.ends_with("_switch")).collect();
    if switch != ["tk_sched_switch"] || !progs.iter().any(|n| n == "tk_numa_move") {
        return Err(format!("programs: {progs:?}"));
    }
    let rows: Vec<Value> = std::fs::read_to_string(&out)
        .map_err(|e| e.to_string())?
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["type"] == "row" && l["kind"] == "summary" && l["row"]["pid"] == pid)
        .collect();
    let _ = std::fs::remove_dir_all(dir);
    let sum = |tool: &str, f: &dyn Fn(&Value) -> Option<u64>| -> u64 {
        rows.iter()
            .filter(|l| l["tool"] == tool)
            .filter_map(|l| f(&l["row"]))
            .sum()
    };
    let cpu = sum("numa", &|r| r["cpu_ns"].as_u64());
    // By node: all of it where the workload pinned itself (node 0) but its start, before the
    // pin, which on two nodes may run on node 1.
    let node0 = sum("numa", &|r| r["cpu_ns_by_node"][0].as_u64());
    let nodes = sum("numa", &|r| {
        r["cpu_ns_by_node"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_u64).sum())
    });
    if cpu > runtime || cpu < runtime / 100 * 95 || nodes != cpu || node0 < cpu / 100 * 90 {
        return Err(format!(
            "numa {cpu} ns ({nodes} by node, {node0} on node 0) against schedstat {runtime} ({} rows)",
            rows.len()
        ));
    }
    // The workload started under tracing: every switch of its life, up to its sleep.
    let switches =
        sum("ctxsw", &|r| r["voluntary"].as_u64()) + sum("ctxsw", &|r| r["involuntary"].as_u64());
    if switches < own || switches > own + 1 {
        return Err(format!("ctxsw {switches} switches against /proc's {own}"));
    }
    Ok(format!(
        "beside ctxsw and runq-lat: one sched_switch program ({}); run time {cpu} ns against schedstat {runtime}, {switches} switches against /proc's {own}",
        progs.join(" ")
    ))
}

#[test]
fn beside_ctxsw_the_node_time_comes_from_the_shared_switch_program() {
    require_root();
    eprintln!("{}", beside_ctxsw().unwrap_or_else(|e| panic!("{e}")));
}

/// A v1 cpuset cgroup of our own, removed on drop (after its tasks left).
struct Cpuset(std::path::PathBuf);

impl Drop for Cpuset {
    fn drop(&mut self) {
        // A task released a moment ago may still be leaving it.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() || !self.0.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// `Cpus_allowed_list` and `Mems_allowed_list` of a process, from its own status file.
fn allowed_of(pid: u32) -> (String, String) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |k: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(k))
            .map(|v| v.trim().to_string())
            .unwrap_or_else(|| panic!("no {k} in /proc/{pid}/status"))
    };
    (field("Cpus_allowed_list:"), field("Mems_allowed_list:"))
}

/// The cpuset and memory policy a process runs under are shown in its row: a workload whose
/// 16 MiB region is bound to node 0 (`mbind`, MPOL_BIND: a policy even on one node), moved
/// into a cpuset of the last CPU only, shows policy `bind:0` and exactly the CPUs and nodes
/// its own `/proc/<pid>/status` allows (not the host's `0-1`).
#[test]
fn cpuset_and_memory_policy_are_shown() {
    require_root();
    let root = std::path::Path::new("/sys/fs/cgroup/cpuset");
    if !root.join("cpuset.cpus").exists() {
        eprintln!("skipped: no v1 cpuset hierarchy at {}", root.display());
        return;
    }
    // SAFETY: sysconf is a plain query.
    let ncpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize;
    if ncpus < 2 {
        eprintln!("skipped: one CPU, a cpuset cannot narrow it");
        return;
    }
    let last = (ncpus - 1).to_string();
    let cg = Cpuset(root.join(format!("tk-numa-{}", std::process::id())));
    std::fs::create_dir(&cg.0).unwrap();
    std::fs::write(cg.0.join("cpuset.cpus"), &last).unwrap();
    std::fs::write(cg.0.join("cpuset.mems"), "0").unwrap();
    let mut tk = Tracer::spawn(&["numa", "--json", "--maps", "64", "--force"]);
    let ids = program_ids(&tk.wait_attached());
    let held = Held::start(&["numa-place", "bind", "0", "0", "16", "1"]).unwrap();
    let pid = held.pid;
    // It sleeps now until released: move it into the cpuset, then end the window.
    std::fs::write(cg.0.join("cgroup.procs"), pid.to_string()).unwrap();
    let (cpus, mems) = allowed_of(pid);
    tk.signal(libc::SIGINT);
    let (status, lines, stderr) = tk.finish(Duration::from_secs(60));
    held.release();
    assert!(status.success(), "{stderr}");
    assert_eq!(cpus, last, "the cpuset narrowed its CPUs");
    let rows = rows_for(&lines, "numa", pid);
    assert_eq!(rows.len(), 1, "{lines:?}");
    let row = rows[0];
    eprintln!(
        "policy {} cpus {} mems {} (status: {cpus} / {mems})",
        row["mempolicy"], row["cpus_allowed"], row["mems_allowed"]
    );
    assert_eq!(row["mempolicy"], "bind:0", "{row}");
    assert_eq!(row["cpus_allowed"], cpus.as_str(), "{row}");
    assert_eq!(row["mems_allowed"], mems.as_str(), "{row}");
    assert!(wait_unloaded(&ids).is_empty(), "programs left loaded");
}

const BALANCING: &str = "/proc/sys/kernel/numa_balancing";

/// One traced workload: tracekit's lines, the workload's report and run time, the kernel's
/// vmstat deltas over the workload, how the tool attached.
struct Run {
    lines: Vec<Value>,
    w: Value,
    pid: u32,
    runtime_ns: u64,
    vmstat: Vmstat,
    modes: String,
}

impl Run {
    fn row(&self) -> Result<&Value, String> {
        let rows = rows_for(&self.lines, "numa", self.pid);
        match rows.as_slice() {
            [r] => Ok(r),
            _ => Err(format!("{} summary rows for pid {}", rows.len(), self.pid)),
        }
    }

    fn system(&self) -> Result<&Value, String> {
        self.lines
            .iter()
            .find(|l| l["tool"] == "numa" && l["type"] == "system")
            .ok_or_else(|| "no system line".to_string())
    }

    fn stats(&self) -> &Value {
        last_stats(&self.lines)
    }

    fn findings(&self, cause: &str) -> Vec<&Value> {
        self.lines
            .iter()
            .filter(|l| l["type"] == "finding" && l["cause"] == cause && l["pid"] == self.pid)
            .collect()
    }
}

/// Runs `tracekit numa --json ARGS` around a held workload (with `kernel.numa_balancing=1`
/// while the workload runs when `balancing`); checks exit, detach and, in `tk-workload
/// vm-check`, doctor's word on attach modes.
fn traced_case(args: &[&str], workload: &[&str], balancing: bool) -> Result<Run, String> {
    // numa_maps of the 64 busiest processes: the workload is among them even on a busy host.
    let mut a = vec!["numa", "--json", "--maps", "64"];
    a.extend_from_slice(args);
    let mut tk = Tracer::spawn(&a);
    let meta = tk.wait_attached();
    let ids = program_ids(&meta);
    let policy = match vm::DOCTOR.get() {
        Some(d) if d.iter().any(|l| l["type"] == "hook" && l["for"] == "numa") => {
            vm::attach_policy("numa", d, &meta, true)
        }
        _ => Ok("attach policy not checked (no doctor report lists numa)".to_string()),
    };
    let before = Vmstat::read().map_err(|e| e.to_string())?;
    let bal = if balancing {
        Some(Setting::try_set(BALANCING, "1")?)
    } else {
        None
    };
    let held = Held::start(workload);
    let runtime = held
        .as_ref()
        .map_err(Clone::clone)
        .and_then(Held::runtime_asleep);
    drop(bal);
    let after = Vmstat::read().map_err(|e| e.to_string())?;
    tk.signal(libc::SIGINT);
    let (status, lines, stderr) = tk.finish(Duration::from_secs(60));
    let held = held?;
    let (pid, w) = (held.pid, held.report.clone());
    held.release();
    let runtime_ns = runtime?;
    if !status.success() {
        return Err(format!("exit {status}: {stderr}"));
    }
    tracekit_tests::vm::all_unloaded(&ids)?;
    let modes = tracekit_tests::vm::attach_modes(&meta);
    Ok(Run {
        lines,
        w,
        pid,
        runtime_ns,
        vmstat: after.since(&before),
        modes: format!("{modes}; {}", policy?),
    })
}

/// Node-1 KiB tracekit read from numa_maps against the workload's own reading (its heap may
/// have grown by a page or two since).
fn mem_agrees(row: &Value, own: &Value, node: usize) -> Result<u64, String> {
    let tk = row["mem_kib_by_node"][node]
        .as_u64()
        .ok_or("no mem_kib_by_node")?;
    let mine = own["mem_kib_by_node"][node]
        .as_u64()
        .ok_or("workload: no mem_kib_by_node")?;
    if tk.abs_diff(mine) > 256 + mine / 100 {
        return Err(format!(
            "node {node}: tracekit {tk} KiB, the workload's numa_maps {mine} KiB"
        ));
    }
    Ok(tk)
}

/// Memory bound to node 1, run on node 0: ≥ 90 % remote, memory on node 1, a finding.
fn misplaced() -> Result<String, String> {
    let r = traced_case(&[], &["numa-place", "bind", "0", "1", "64", "2"], false)?;
    let row = r.row()?;
    if row["cpu_ns"] != r.runtime_ns {
        return Err(format!(
            "cpu_ns {} != schedstat {}",
            row["cpu_ns"], r.runtime_ns
        ));
    }
    let share = row["remote_cpu_share_ppm"].as_u64().unwrap_or(0);
    if share < 900_000 || row["mem_node"] != 1 {
        return Err(format!(
            "remote share {share} ppm, memory node {}: {row}",
            row["mem_node"]
        ));
    }
    let kib = mem_agrees(row, &r.w, 1)?;
    let f = r.findings("numa-misplaced");
    if f.len() != 1 {
        return Err(format!(
            "{} numa-misplaced findings for pid {}",
            f.len(),
            r.pid
        ));
    }
    Ok(format!(
        "misplaced: cpu_ns {} = schedstat, remote {:.1} %, {kib} KiB on node 1 as its numa_maps, finding; {}",
        r.runtime_ns,
        share as f64 / 1e4,
        r.modes
    ))
}

/// The same bound locally: no finding.
fn local() -> Result<String, String> {
    let r = traced_case(&[], &["numa-place", "bind", "0", "0", "64", "2"], false)?;
    let row = r.row()?;
    let share = row["remote_cpu_share_ppm"].as_u64().unwrap_or(u64::MAX);
    // Before it pins itself (exec, start-up) it may run on node 1: 8 % of its run time under
    // TCG on 6.1. The finding needs 50 %.
    if share > 250_000 || row["mem_node"] != 0 || row["cpu_ns"] != r.runtime_ns {
        return Err(format!("local run: {row}"));
    }
    mem_agrees(row, &r.w, 0)?;
    if !r
        .lines
        .iter()
        .all(|l| l["type"] != "finding" || l["pid"] != r.pid)
    {
        return Err(format!("a finding for the local run: {:?}", r.lines));
    }
    Ok(format!(
        "local: remote {:.1} %, no finding",
        share as f64 / 1e4
    ))
}

/// With balancing on and the memory first touched on node 1, run on node 0: per-process
/// migrations and hinting faults, equal to the task's own `numa_pages_migrated`; the system
/// line equal to /proc/vmstat over the same span, and to the sum of the rows.
fn balancing() -> Result<String, String> {
    let r = traced_case(
        &[],
        &["numa-place", "first-touch", "0", "1", "32", "6"],
        true,
    )?;
    let row = r.row()?;
    let sys = r.system()?;
    let pages = row["pages_migrated"].as_u64().unwrap_or(0);
    let own = r.w["pages_migrated_life"].as_u64().unwrap_or(0);
    // The task's own counter is bumped by task_numa_fault() for the fault that asked for the
    // migration, the tracepoint by migrate_pages() for the pages it moved, in whatever context:
    // seen on 5.10 and 6.12 to differ by up to 4 pages of ~8200 in either direction on a quiet
    // host, and by 18 and 70 of ~8250 on 5.10 under TCG with the host loaded (the two counters
    // move at different points of a migration), once by 605 of 8799 (6.9 %) on 5.10 with the
    // host running three guests and a build, and once the task's counter 10,791 against 8,200
    // pages moved (its 32 MiB, each once) on 5.10 beside two other guests (12-06): the task's
    // counter can run ahead, never far behind. So this per-task check allows 10 % above it and
    // half below; the exact check is the system line below (every migration, /proc/vmstat over
    // the same window).
    if pages == 0 || pages > own + own / 10 + 8 || pages < own / 2 {
        return Err(format!(
            "pages_migrated {pages}, the task's numa_pages_migrated {own}"
        ));
    }
    let mut got = vec![format!(
        "pid {}: {pages} pages migrated, its numa_pages_migrated {own}",
        r.pid
    )];
    if !sys["hint_hook"].is_null() {
        let faults = row["hint_faults"].as_u64().unwrap_or(0);
        if faults == 0 || row["hint_pages_migrated"] != pages {
            return Err(format!("hinting faults: {row}"));
        }
        got.push(format!(
            "{faults} hinting faults ({} local)",
            row["hint_faults_local"]
        ));
    }
    let rows: Vec<&Value> = r
        .lines
        .iter()
        .filter(|l| l["tool"] == "numa" && l["type"] == "summary")
        .collect();
    let mut keys = vec![("numa_pages_migrated", "pages_migrated")];
    if !sys["hint_hook"].is_null() {
        keys.push(("numa_hint_faults", "hint_faults"));
        keys.push(("numa_hint_faults_local", "hint_faults_local"));
    }
    // The system line is /proc/vmstat over tracekit's own window; the rows are what its
    // programs saw in the same window, in every process: they must be equal exactly. The
    // test's own reading around the workload (balancing on only then) lies inside that window.
    for (vm, field) in keys {
        let kernel = r
            .vmstat
            .get(vm)
            .ok_or_else(|| format!("no {vm} in /proc/vmstat"))?;
        let line = sys["vmstat"][vm]
            .as_i64()
            .ok_or_else(|| format!("no {vm} in the system line"))?;
        let sum: u64 = rows.iter().filter_map(|x| x[field].as_u64()).sum();
        if sum as i64 != line || line < kernel {
            return Err(format!(
                "{vm}: system line (/proc/vmstat over the window) +{line}, sum of rows {sum}, /proc/vmstat around the workload +{kernel}"
            ));
        }
        got.push(format!(
            "{vm} +{line} = sum of rows (+{kernel} around the workload)"
        ));
    }
    if !sys["hint_hook"].is_null() {
        let region_pages = r.w["region_kib"].as_u64().unwrap_or(0) / 4;
        got.push(by_destination(row, &rows, sys, region_pages)?);
    }
    got.push(moves_by_pair(&rows, sys)?);
    Ok(format!("balancing: {}", got.join(", ")))
}

/// Integers of a JSON array (`[]` when absent).
fn u64s(v: &Value) -> Vec<u64> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|x| x.as_u64().unwrap_or(u64::MAX))
        .collect()
}

/// Pages migrated by destination node: the system line's per-node pages sum exactly to its
/// `numa_pages_migrated` delta (/proc/vmstat over the window), each row's to its own total,
/// and the workload (run on node 0, memory first touched on node 1) had its pages moved onto
/// node 0: at least 90 % of its region, and at most 64 pages onto node 1 (while it first
/// touches the region pinned to node 1, a scan may already move a few pages it touched on
/// node 0 before pinning itself: its stack, its binary's page cache).
fn by_destination(
    row: &Value,
    rows: &[&Value],
    sys: &Value,
    region_pages: u64,
) -> Result<String, String> {
    let to = u64s(&sys["pages_migrated_by_node"]);
    let total = sys["vmstat"]["numa_pages_migrated"].as_u64().unwrap_or(0);
    if to.len() != 2 || to.iter().sum::<u64>() != total {
        return Err(format!(
            "pages_migrated_by_node {to:?} does not sum to numa_pages_migrated +{total}"
        ));
    }
    for r in rows {
        let v = u64s(&r["pages_migrated_by_node"]);
        if Some(v.iter().sum::<u64>()) != r["hint_pages_migrated"].as_u64() {
            return Err(format!(
                "a row's pages by node do not sum to its total: {r}"
            ));
        }
    }
    let own = u64s(&row["pages_migrated_by_node"]);
    let pages = row["hint_pages_migrated"].as_u64().unwrap_or(0);
    if own.len() != 2 || own[0] < region_pages / 10 * 9 || own[1] > 64 {
        return Err(format!(
            "the workload's {pages} pages by destination {own:?}: expected most of its {region_pages} onto node 0"
        ));
    }
    Ok(format!(
        "pages by destination node {to:?} (sum = numa_pages_migrated), the workload's {own:?}"
    ))
}

/// Task moves by node pair (system-wide, every task) sum to the rows' moves (no `--pid`: every
/// task has a row); a swap moves two tasks, so the rows hold at most twice the swap events.
fn moves_by_pair(rows: &[&Value], sys: &Value) -> Result<String, String> {
    let count = |key: &str| -> Result<(u64, String), String> {
        let list = sys[key].as_array().ok_or(format!("no {key}"))?;
        let mut sum = 0;
        let mut shown = Vec::new();
        for p in list {
            let (s, d, n) = (
                p["src_node"].as_u64(),
                p["dst_node"].as_u64(),
                p["count"].as_u64(),
            );
            let (Some(s), Some(d), Some(n)) = (s, d, n) else {
                return Err(format!("{key}: {p}"));
            };
            if s > 1 || d > 1 || n == 0 {
                return Err(format!("{key}: {p}"));
            }
            sum += n;
            shown.push(format!("{s}→{d} ×{n}"));
        }
        Ok((sum, shown.join(" ")))
    };
    let (moves, mt) = count("task_moves_by_pair")?;
    let (swaps, st) = count("task_swaps_by_pair")?;
    let row_sum = |f: &str| rows.iter().filter_map(|r| r[f].as_u64()).sum::<u64>();
    let (row_moves, row_swaps) = (row_sum("task_moves"), row_sum("task_swaps"));
    if moves != row_moves || row_swaps > 2 * swaps || row_swaps < swaps {
        return Err(format!(
            "pairs: moves {moves} vs rows {row_moves}, swaps {swaps} vs rows {row_swaps}"
        ));
    }
    Ok(format!(
        "task moves by pair [{mt}] = rows' {row_moves}, swaps [{st}] (rows {row_swaps})"
    ))
}

/// ns per `sched_switch` run of the switch program (kernel.bpf_stats_enabled) under a pipe
/// ping-pong, and of the floor program in the same place.
fn switch_cost(force: bool) -> Result<String, String> {
    let _stats = Setting::try_set("/proc/sys/kernel/bpf_stats_enabled", "1")?;
    let mut out = Vec::new();
    let numa: &[&str] = if force {
        &["numa", "--json", "--force"]
    } else {
        &["numa", "--json"]
    };
    for args in [numa, &["bench-floor", "--json", "--hook", "sched-switch"]] {
        let mut tk = Tracer::spawn(args);
        let meta = tk.wait_attached();
        let id = program_on(&meta, "sched_switch").ok_or("no sched_switch program")?;
        let prog = meta["programs"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|p| p["id"] == id)
            .ok_or("no sched_switch program")?;
        let a = prog_run_stats(id);
        run_workload(&["pingpong", "20000"]);
        let b = prog_run_stats(id);
        tk.signal(libc::SIGINT);
        let _ = tk.finish(Duration::from_secs(30));
        let runs = b.1 - a.1;
        out.push(format!(
            "{} ({}) {:.0} ns/run over {runs} runs",
            prog["name"].as_str().unwrap_or("?"),
            prog["attach"].as_str().unwrap_or("?"),
            (b.0 - a.0) as f64 / runs.max(1) as f64
        ));
    }
    Ok(format!("sched_switch cost: {}", out.join(" vs ")))
}

#[test]
fn switch_cost_on_this_host() {
    require_root();
    eprintln!("{}", switch_cost(true).unwrap());
}

/// numa: the two-node proof (see the module docs); on a one-node kernel, the one-line answer
/// and the forced run's cost.
pub fn vm_check() -> Result<String, String> {
    if numa::Topology::read().len() < 2 {
        let o = Command::new(tracekit_bin())
            .args(["numa", "--json"])
            .output()
            .map_err(|e| e.to_string())?;
        let v: Value = serde_json::from_slice(&o.stdout).map_err(|e| e.to_string())?;
        if !o.status.success() || v["nodes"] != 1 {
            return Err(format!("one node: exit {}, {v}", o.status));
        }
        return Ok(format!(
            "one node: nothing to misplace, nothing loaded; {}; {}",
            beside_ctxsw()?,
            switch_cost(true)?
        ));
    }
    let _off = Setting::try_set(BALANCING, "0")?;
    let checks = [
        misplaced(),
        local(),
        balancing(),
        beside_ctxsw(),
        switch_cost(false),
    ];
    let mut ok = Vec::new();
    for c in checks {
        ok.push(c?);
    }
    Ok(ok.join("; "))
}

/// `numa-place` (tk-workload dispatches here; it lives in numa/place.rs).
pub fn workload(args: &[String]) -> Option<i32> {
    place::workload(args)
}
