//! Root tests for `tracekit runq-lat`:
//! - the kernel's run-delay total per pid (`kernel_run_delay_ns`) agrees with the kernel's own
//!   `run_delay` since fork (`/proc/<pid>/schedstat`, second field) that the workload reads
//!   about itself;
//! - waits after a wakeup, timed on the wall clock, agree with a bpftrace timestamp reference
//!   (`sched_waking` → `sched_switch`) taken in the same run, on a pipe ping-pong and on the
//!   same ping-pong pinned to one CPU, where every wakeup preempts (issue #17: there the
//!   kernel's run_delay reads near zero);
//! - with `--from wakeup` (issue #33) those waits agree with bpftrace timing from
//!   `sched_wakeup` instead, and on the same waits their medians are below those from
//!   `sched_waking`, on a ping-pong pinned to one CPU and split over two;
//! - a latency-sensitive sleeper pinned with CPU hogs is the victim, and the hogs are named.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader},
    os::unix::process::CommandExt,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use probes_common::hist::{bucket_index, bucket_mid, bucket_width};
use serde_json::Value;
use tracekit_tests::{mm::Setting, *};

fn compare(workload: &[&str]) -> (Vec<Value>, Value) {
    require_root();
    let _one = serial();
    let (w, lines) = trace_workload(&["runq-lat", "--json"], workload);
    for p in w["procs"].as_array().unwrap() {
        let pid = p["pid"].as_u64().unwrap() as u32;
        let rows = rows_for(&lines, "runq-lat", pid);
        assert_eq!(rows.len(), 1, "one row for pid {pid}: {rows:?}");
        let r = rows[0];
        for k in [
            "tool",
            "pid",
            "comm",
            "count",
            "total_ns",
            "p50_ns",
            "p99_ns",
            "max_ns",
            "kernel_run_delay_ns",
            "wake_unmeasured",
        ] {
            assert!(!r[k].is_null(), "JSON contract: {k} missing");
        }
        let kernel = r["kernel_run_delay_ns"].as_u64().unwrap();
        let total = r["total_ns"].as_u64().unwrap();
        // Since fork, as tracekit sees a task born under tracing: a delta around the body
        // misses the first wait after fork, milliseconds on a busy machine. What tracekit adds
        // is the exit (a wait after the workload's last read): never less, at most a little more.
        let own = p["run_delay_life_ns"].as_u64().unwrap();
        let err = kernel.abs_diff(own) as f64 / own.max(1) as f64;
        eprintln!(
            "{workload:?} pid {pid}: kernel_run_delay {kernel} ns (schedstat run_delay since fork {own} ns, {:.2} % apart); wall-clock total {total} ns over {} waits",
            err * 100.0,
            r["count"],
        );
        assert!(own > 0, "the workload waited on no run queue: {p}");
        assert!(
            kernel + own / 1000 >= own && kernel <= own + own / 50 + 2_000_000,
            "pid {pid}: kernel_run_delay {kernel} ns vs run_delay since fork {own} ns ({:.1} % off)",
            err * 100.0
        );
        let (p50, p99, max) = (
            r["p50_ns"].as_u64().unwrap(),
            r["p99_ns"].as_u64().unwrap(),
            r["max_ns"].as_u64().unwrap(),
        );
        assert!(p50 <= p99 && p99 <= max, "{r}");
        assert_eq!(
            r["count"].as_u64().unwrap(),
            r["wake_count"].as_u64().unwrap() + r["preempt_count"].as_u64().unwrap()
        );
    }
    (lines, w)
}

#[test]
fn pingpong_kernel_run_delay_matches_schedstat() {
    compare(&["pingpong", "20000"]);
}

#[test]
fn pinned_spinners_wait_after_preemption() {
    let (lines, w) = compare(&["spin", "1500"]);
    for p in w["procs"].as_array().unwrap() {
        let pid = p["pid"].as_u64().unwrap() as u32;
        let r = rows_for(&lines, "runq-lat", pid)[0];
        // Two spinners sharing a CPU wait mostly after being preempted, not after wakeups.
        assert!(
            r["preempt_total_ns"].as_u64().unwrap() > r["wake_total_ns"].as_u64().unwrap(),
            "{r}"
        );
    }
}

/// A process that execs is reported under its new name, with the name before the exec.
#[test]
fn exec_renames_the_row() {
    require_root();
    let _one = serial();
    assert_exec_renames_the_row("runq-lat");
}

/// The last CPU (the one `tk-workload spin` pins to).
fn last_cpu() -> usize {
    // SAFETY: sysconf is a plain query.
    (unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }).max(1) as usize - 1
}

/// `cmd` pinned to `cpu` (its children inherit the affinity).
fn pinned(mut cmd: Command, cpu: usize) -> Command {
    // SAFETY: between fork and exec the child only calls sched_setaffinity on itself.
    unsafe {
        cmd.pre_exec(move || {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd
}

/// The reference: every wait of a `tk-workload` task from its `sched_waking` (or
/// `sched_wakeup_new`) to its switch-in, with the same rule as tracekit for wakeups that start
/// no wait (a task switched out still runnable forgets a wakeup seen while it ran).
///
/// It reads the clock first at switch-in, as tracekit does. Before issue #31 it read it after
/// the `delete` for a prev switched out runnable, and the idle task always is (`prev_state`
/// 0): every wait that ended an idle CPU's sleep (a cross-CPU wakeup, the tail of a ping-pong)
/// had a hash delete in it that tracekit does not time, and the reference read 10–14 % above
/// tracekit at p99 on a fresh machine.
///
/// With `--from wakeup` the reference starts at `sched_wakeup` instead ([`reference`]).
const REFERENCE: &str = r#"
tracepoint:sched:sched_waking /args->comm == "tk-workload"/ { @ts[args->pid] = nsecs; }
tracepoint:sched:sched_wakeup_new /args->comm == "tk-workload"/ { @ts[args->pid] = nsecs; }
tracepoint:sched:sched_switch {
  $now = nsecs;
  if ((args->prev_state & 0xff) == 0) { delete(@ts[args->prev_pid]); }
  $t = @ts[args->next_pid];
  if ($t) { printf("W %d %d\n", args->next_pid, $now - $t); delete(@ts[args->next_pid]); }
}
END { clear(@ts); }
"#;

/// The reference for waits timed from `from` (`sched_waking` or `sched_wakeup`).
fn reference(from: &str) -> String {
    REFERENCE.replacen("sched:sched_waking ", &format!("sched:{from} "), 1)
}

/// runq-lat over the workload's tasks with waits timed `--from` `from` (`waking`, `wakeup`),
/// attached, with its meta line (which must say so).
fn workload_tracer(from: &str) -> (Tracer, Value) {
    let mut tk = Tracer::spawn(&[
        "runq-lat",
        "--json",
        "--comm",
        "tk-workload",
        "--from",
        from,
    ]);
    let meta = tk.wait_attached();
    assert_eq!(meta["wake_from"], format!("sched_{from}"), "{meta}");
    (tk, meta)
}

/// What the bpftrace reference ran alongside tracekit measured.
struct Reference {
    /// Waits by pid, in ns.
    waits: BTreeMap<u32, Vec<u64>>,
    /// How much later than tracekit's the reference's interval ends, less how much later it
    /// starts, in ns: the mean run time of tracekit's `sched_switch` program less that of its
    /// `sched_waking` program over the run (bpf_stats).
    ///
    /// Programs on one tracepoint run in the order they attached, and tracekit attaches first:
    /// at both ends the reference reads the clock after tracekit's program has run. tracekit
    /// reads its clock near the start of both programs (after one array lookup), so the
    /// reference's wait holds the rest of tracekit's switch program (most of its 300–400 ns)
    /// and misses the rest of its waking program (nearly nothing: the clock read is its last
    /// step). Measured here: switch 305–322 ns, waking 143–164 ns a run; the reference read
    /// 150–260 ns above tracekit at p50 across runs, within the bucket of this difference.
    /// Attaching the reference first is worse: its sched_switch program (printf included) ran
    /// 2.9 µs a run and tracekit's waits then held it (p50 10.8 µs vs the reference's 3.5 µs).
    lag_ns: u64,
}

/// Runs `workload` (pinned to the last CPU with `pin`) under runq-lat and the bpftrace
/// reference at once; returns tracekit's lines, the workload's report and the reference.
fn with_reference(workload: &[&str], pin: bool, from: &str) -> (Vec<Value>, Value, Reference) {
    require_root();
    let _one = serial();
    // bpf_stats for the lag (see `Reference::lag_ns`); put back when the run ends.
    let _stats = Setting::try_set("/proc/sys/kernel/bpf_stats_enabled", "1")
        .expect("kernel.bpf_stats_enabled");
    // tracekit first: see `Reference::lag_ns`.
    let (tk, meta) = workload_tracer(from.trim_start_matches("sched_"));
    let prog = |event| program_on(&meta, event).unwrap_or_else(|| panic!("no {event} program"));
    // The program that stamps the wait's start (for the lag, see `Reference::lag_ns`).
    let (switch, waking) = (prog("sched_switch"), prog(from));
    let mut bt = Command::new(bpftrace())
        .args(["-e", &reference(from)])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn bpftrace");
    let mut out = BufReader::new(bt.stdout.take().unwrap());
    let mut line = String::new();
    while out.read_line(&mut line).unwrap_or(0) > 0 && !line.starts_with("Attaching") {
        line.clear();
    }
    // "Attaching" is printed before the probes attach.
    std::thread::sleep(Duration::from_millis(500));
    let reader = std::thread::spawn(move || {
        let mut waits: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        for l in out.lines().map_while(Result::ok) {
            let f: Vec<&str> = l.split_whitespace().collect();
            if let ["W", pid, ns] = f[..] {
                if let (Ok(p), Ok(n)) = (pid.parse(), ns.parse()) {
                    waits.entry(p).or_default().push(n);
                }
            }
        }
        waits
    });
    let mut cmd = Command::new(workload_bin());
    cmd.args(workload);
    let cmd = if pin { pinned(cmd, last_cpu()) } else { cmd };
    let before = (prog_run_stats(switch), prog_run_stats(waking));
    let o = { cmd }.output().expect("run tk-workload");
    let after = (prog_run_stats(switch), prog_run_stats(waking));
    assert!(o.status.success(), "{workload:?}");
    let w: Value = serde_json::from_slice(&o.stdout).expect("workload JSON");
    tk.signal(libc::SIGINT);
    interrupt(&mut bt, "the bpftrace reference", Duration::from_secs(15));
    let (status, lines, stderr) = tk.finish(Duration::from_secs(15));
    assert!(status.success(), "{stderr}");
    let mean = |a: (u64, u64), b: (u64, u64)| (b.0 - a.0) / (b.1 - a.1).max(1);
    let (switch_ns, waking_ns) = (mean(before.0, after.0), mean(before.1, after.1));
    eprintln!("tracekit's programs over the run: sched_switch {switch_ns} ns, {from} {waking_ns} ns a run");
    let waits = reader.join().expect("reference reader");
    (
        lines,
        w,
        Reference {
            waits,
            lag_ns: switch_ns.saturating_sub(waking_ns),
        },
    )
}

/// Wake-wait p50 and p99 per workload process within 10 % (or 1 µs) of the reference timing
/// from `from`; tracekit's p50 per workload process.
fn assert_matches_reference(
    what: &str,
    workload: &[&str],
    pin: bool,
    from: &str,
) -> Vec<(u32, u64)> {
    let (lines, w, reference) = with_reference(workload, pin, from);
    let mut p50s = Vec::new();
    for p in w["procs"].as_array().unwrap() {
        let pid = p["pid"].as_u64().unwrap() as u32;
        let r = rows_for(&lines, "runq-lat", pid);
        assert_eq!(r.len(), 1, "{what}: one row for pid {pid}");
        let r = r[0];
        eprintln!("{what} row: {r}");
        let refs = reference.waits.get(&pid).cloned().unwrap_or_default();
        assert!(
            refs.len() >= 1000,
            "{what}: the reference saw {} waits of pid {pid}",
            refs.len()
        );
        let n = r["wake_count"].as_u64().unwrap();
        let ours = |k: &str| r[k].as_u64().unwrap();
        p50s.push((pid, ours("wake_p50_ns")));
        let (rp50, rp99) = (percentile(&refs, 0.5), percentile(&refs, 0.99));
        eprintln!(
            "{what} pid {pid}: wake waits tracekit {n} p50 {} p99 {} | bpftrace {} p50 {rp50} p99 {rp99}, less {} ns of tracekit's switch program | kernel run_delay total {} ns vs wall-clock wake+preempt total {} ns, {} unmeasured",
            ours("wake_p50_ns"),
            ours("wake_p99_ns"),
            refs.len(),
            reference.lag_ns,
            ours("kernel_run_delay_ns"),
            ours("total_ns"),
            ours("wake_unmeasured"),
        );
        for (k, exact) in [("wake_p50_ns", rp50), ("wake_p99_ns", rp99)] {
            // tracekit reports a percentile as the midpoint of its log-linear bucket (within
            // 6.25 % of any value in it): the reference's goes through the same buckets. The
            // reference's wait holds `lag_ns` of tracekit's own program, measured this run.
            //
            // The bound is 10 % (or 1 µs) of what each measured; both sides are bucket
            // midpoints, and two values in neighbouring buckets have midpoints up to one
            // bucket width further apart than the values are, so the slack holds that width
            // too. Without it the bound at 8 µs was 488 ns (6 %), not 10 %: a fresh machine read
            // p99 6915 ns (the midpoint of [6656, 7168)) against the reference's 7914 less
            // 225 ns (bucket [7680, 8192)), 1021 ns apart on midpoints for values 521–1033 ns
            // apart.
            let i = bucket_index(exact.saturating_sub(reference.lag_ns));
            let want = bucket_mid(i);
            let got = ours(k);
            let slack = (want / 10).max(1_000) + bucket_width(i);
            assert!(
                got.abs_diff(want) <= slack,
                "{what} pid {pid}: {k} {got} ns, bpftrace {exact} ns less {} ns, in tracekit's buckets {want} ns (allowed ±{slack})",
                reference.lag_ns
            );
        }
        // Same events: the counts agree within 5 % (the reference also counts the few wakeups
        // of a task still on a run queue, which start no new wait).
        let diff = n.abs_diff(refs.len() as u64) as f64 / refs.len() as f64;
        assert!(
            diff <= 0.05,
            "{what} pid {pid}: {n} wake waits vs {} in the reference",
            refs.len()
        );
    }
    p50s
}

#[test]
fn pipe_pingpong_wake_waits_match_bpftrace() {
    assert_matches_reference(
        "pipe ping-pong",
        &["pingpong", "20000"],
        false,
        "sched_waking",
    );
}

/// The two pinnings of a pipe ping-pong `--from` is checked on: both ends on one CPU (every
/// wakeup local, preempting the waker) and one end on each CPU (every hop wakes an idle CPU
/// through its wake list: an IPI and an idle exit between `sched_waking` and `sched_wakeup`).
const PINNED_PINGPONGS: [(&str, &str, bool); 2] = [
    ("ping-pong pinned to one CPU", "pingpong", true),
    ("ping-pong split over two CPUs", "pingpong-split", false),
];

/// Issue #33 (10): `--from wakeup` times waits as libbpf-tools runqlat and `perf sched` do,
/// from `sched_wakeup` (and `sched_wakeup_new`), and agrees with bpftrace timing the same
/// over the same run.
#[test]
fn from_wakeup_matches_bpftrace_from_sched_wakeup() {
    for (what, work, pin) in PINNED_PINGPONGS {
        assert_matches_reference(what, &[work, "20000"], pin, "sched_wakeup");
    }
}

/// Issue #33 (10): on the same waits (one run, both definitions traced at once, so the load of
/// the machine is the same for both) the medians from `sched_wakeup` are below those from
/// `sched_waking`: the wakeup path, and across CPUs the IPI, are left out.
#[test]
fn from_wakeup_medians_are_below_from_waking() {
    require_root();
    let _one = serial();
    for (what, work, pin) in PINNED_PINGPONGS {
        let spawn = |from| {
            let (tk, _) = workload_tracer(from);
            tk
        };
        let tracers = [spawn("waking"), spawn("wakeup")];
        let mut cmd = Command::new(workload_bin());
        cmd.args([work, "20000"]);
        let cmd = if pin { pinned(cmd, last_cpu()) } else { cmd };
        let o = { cmd }.output().expect("run tk-workload");
        assert!(o.status.success(), "{work}");
        let w: Value = serde_json::from_slice(&o.stdout).expect("workload JSON");
        let lines: Vec<Vec<Value>> = tracers
            .map(|tk| {
                tk.signal(libc::SIGINT);
                let (status, lines, stderr) = tk.finish(Duration::from_secs(15));
                assert!(status.success(), "{stderr}");
                lines
            })
            .into();
        for p in w["procs"].as_array().unwrap() {
            let pid = p["pid"].as_u64().unwrap() as u32;
            let row = |lines: &[Value]| {
                let r = rows_for(lines, "runq-lat", pid);
                assert_eq!(r.len(), 1, "{what}: one row for pid {pid}");
                let n = |k: &str| r[0][k].as_u64().unwrap();
                (n("wake_count"), n("wake_p50_ns"), n("wake_p99_ns"))
            };
            let (waking, wakeup) = (row(&lines[0]), row(&lines[1]));
            eprintln!(
                "{what} pid {pid}: wake waits from sched_waking {} p50 {} p99 {} | from sched_wakeup {} p50 {} p99 {}",
                waking.0, waking.1, waking.2, wakeup.0, wakeup.1, wakeup.2
            );
            assert!(waking.0 >= 1000, "{what} pid {pid}: {} waits", waking.0);
            // The same waits: each starts later from sched_wakeup, none is lost or added
            // (bar the few of a task switched in between the two events).
            let diff = waking.0.abs_diff(wakeup.0) as f64 / waking.0 as f64;
            assert!(diff <= 0.05, "{what} pid {pid}: {waking:?} vs {wakeup:?}");
            assert!(
                wakeup.1 < waking.1,
                "{what} pid {pid}: p50 from sched_wakeup {} ns, not below from sched_waking {} ns",
                wakeup.1,
                waking.1
            );
        }
    }
}

/// Both ends on one CPU: every wakeup preempts the waker, the case where the kernel's
/// run_delay reads (nearly) zero.
#[test]
fn wakeup_preemption_wake_waits_match_bpftrace() {
    assert_matches_reference(
        "wakeup preemption (pinned ping-pong)",
        &["pingpong", "20000"],
        true,
        "sched_waking",
    );
}

/// A sleeper: renames itself `tk-sleeper`, pins itself to `cpu`, and until `secs` pass sleeps
/// 1 ms then works 50 µs. A forked child doing only plain syscalls.
fn sleeper(cpu: usize, secs: f64) -> u32 {
    // SAFETY: the child makes only async-signal-safe syscalls and _exits.
    match unsafe { libc::fork() } {
        0 => unsafe {
            libc::prctl(libc::PR_SET_NAME, c"tk-sleeper".as_ptr());
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
            let now = || {
                let mut ts: libc::timespec = std::mem::zeroed();
                libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
                ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
            };
            let end = now() + secs;
            let nap = libc::timespec {
                tv_sec: 0,
                tv_nsec: 1_000_000,
            };
            while now() < end {
                libc::nanosleep(&nap, std::ptr::null_mut());
                let t = now() + 50e-6;
                while now() < t {}
            }
            libc::_exit(0);
        },
        -1 => panic!("fork: {}", std::io::Error::last_os_error()),
        pid => pid as u32,
    }
}

/// Turns the scheduler's autogroups off (nice values then rank across sessions) and restores
/// the setting on drop.
struct Autogroups(Option<String>);

const AUTOGROUP: &str = "/proc/sys/kernel/sched_autogroup_enabled";

impl Autogroups {
    fn off() -> Autogroups {
        let old = std::fs::read_to_string(AUTOGROUP).ok();
        if old.is_some() {
            let _ = std::fs::write(AUTOGROUP, "0");
        }
        Autogroups(old)
    }
}

impl Drop for Autogroups {
    fn drop(&mut self) {
        if let Some(v) = &self.0 {
            let _ = std::fs::write(AUTOGROUP, v.trim());
        }
    }
}

/// Issue #17/#14: a latency-sensitive process that sleeps 1 ms, pinned to a CPU with two CPU
/// hogs (nice -10), waits behind the hogs: runq-lat's first finding is that process, with a hog as the
/// culprit, both hogs are named, and the hogs (the aggressors) get no finding as victims.
#[test]
fn a_sleeper_starved_by_hogs_names_the_hogs() {
    require_root();
    let _one = serial();
    let cpu = last_cpu();
    let mut tk = Tracer::spawn(&["runq-lat", "--json"]);
    tk.wait_attached();
    // The hogs at nice -10 (inherited by the two spinners), and nice values compared across
    // sessions for the test's few seconds (autogroups off): on a machine with other busy
    // processes the hogs still hold the sleeper's CPU most of the time.
    let _autogroup = Autogroups::off();
    let hogs = niced_hogs("3000");
    std::thread::sleep(Duration::from_millis(200));
    let victim = sleeper(cpu, 2.5);
    let t0 = Instant::now();
    let mut st = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(victim as i32, &mut st, 0) };
    let w: Value = serde_json::from_slice(&hogs.wait_with_output().unwrap().stdout).unwrap();
    tk.signal(libc::SIGINT);
    let (status, lines, stderr) = tk.finish(Duration::from_secs(15));
    assert!(status.success(), "{stderr}");
    let hog_pids = workload_proc_pids(&w);
    let row = rows_for(&lines, "runq-lat", victim);
    assert_eq!(row.len(), 1, "no row for the sleeper");
    eprintln!("sleeper ran {:?}; its row: {}", t0.elapsed(), row[0]);
    let findings: Vec<&Value> = lines.iter().filter(|l| l["type"] == "finding").collect();
    for f in &findings {
        eprintln!("finding: {}", f["summary"]);
    }
    let first = findings.first().expect("a finding");
    assert_eq!(first["pid"], victim, "the sleeper ranks first: {first}");
    assert_eq!(first["cause"], "runq-delay");
    assert!(
        hog_pids.contains(&first["culprit_pid"].as_u64().unwrap_or(0)),
        "culprit {} is not a hog {hog_pids:?}",
        first["culprit_pid"]
    );
    let behind: Vec<u64> = row[0]["waited_behind"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pid"].as_u64().unwrap())
        .collect();
    for h in &hog_pids {
        assert!(behind.contains(h), "hog {h} not among {behind:?}");
        assert!(
            findings.iter().all(|f| f["pid"] != *h),
            "the hog {h} got a finding of its own"
        );
        let aggr = lines
            .iter()
            .find(|l| l["type"] == "aggressor" && l["pid"] == *h)
            .unwrap_or_else(|| panic!("hog {h} missing from the aggressors"));
        assert!(aggr["delay_caused_ns"].as_u64().unwrap() > 0, "{aggr}");
    }
}

/// Per-CPU steal ticks from /proc/stat (`cpuN` lines, the 8th value; USER_HZ = 100).
fn steal_ticks() -> Vec<u64> {
    std::fs::read_to_string("/proc/stat")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
        .map(|l| {
            l.split_whitespace()
                .nth(8)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        })
        .collect()
}

/// On a guest, the part of each wait the hypervisor took (CPU steal, from the run queue's
/// steal clock) is charged to `[steal]`, not to the task on the CPU: the wakeup hook is
/// attached exactly when the node has steal, and what all rows charge to `[steal]` is within
/// what /proc/stat's steal counted over the run (its ticks are 10 ms: one more per CPU), and
/// each row's within its own waits. A misread clock (another CPU's queue, a wrong offset)
/// charges whole waits and breaks the bound.
#[test]
fn steal_is_charged_to_the_hypervisor_within_the_kernels_steal() {
    require_root();
    let _one = serial();
    let before = steal_ticks();
    let mut tk = Tracer::spawn(&["runq-lat", "--json"]);
    let meta = tk.wait_attached();
    let hogs = hogs_at("2500", 0);
    let victim = sleeper(last_cpu(), 2.5);
    let mut st = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(victim as i32, &mut st, 0) };
    let _ = hogs.wait_with_output();
    tk.signal(libc::SIGINT);
    let (status, lines, stderr) = tk.finish(Duration::from_secs(15));
    assert!(status.success(), "{stderr}");
    let after = steal_ticks();
    let names: Vec<&str> = meta["programs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["name"].as_str())
        .collect();
    let had_steal = before.iter().sum::<u64>() > 0;
    assert_eq!(
        names
            .iter()
            .any(|n| n.starts_with("tk_sched_wakeup") && !n.contains("new")),
        had_steal,
        "the wakeup hook is attached exactly on a node with steal ({before:?}): {names:?}"
    );
    let left_out = meta["left_out"]
        .as_array()
        .is_some_and(|a| a.iter().any(|l| l["hook"] == "sched:sched_wakeup"));
    assert_eq!(
        left_out, !had_steal,
        "the meta line lists the wakeup hook as left out exactly when it is not attached: {meta}"
    );
    let mut charged = 0u64;
    for r in lines
        .iter()
        .filter(|l| l["tool"] == "runq-lat" && l["type"] == "summary")
    {
        let own: u64 = r["waited_behind"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter(|p| p["comm"] == "[steal]")
                    .map(|p| p["delay_ns"].as_u64().unwrap_or(0))
                    .sum()
            })
            .unwrap_or(0);
        let waits = r["wake_total_ns"].as_u64().unwrap_or(0);
        assert!(
            own <= waits,
            "[steal] {own} ns beyond the row's waits {waits}: {r}"
        );
        charged += own;
    }
    let cpus = after.len() as u64;
    let kernel_ns: u64 = after
        .iter()
        .zip(&before)
        .map(|(a, b)| a.saturating_sub(*b))
        .sum::<u64>()
        * 10_000_000;
    eprintln!("charged to [steal] {charged} ns; /proc/stat steal {kernel_ns} ns over {cpus} CPUs");
    assert!(
        charged <= kernel_ns + cpus * 10_000_000,
        "charged to [steal] {charged} ns, the kernel counted {kernel_ns} ns of steal"
    );
    if !had_steal {
        assert_eq!(charged, 0);
    }
}

/// VM check (`tk-workload vm-check`, each guest kernel): per pid, the kernel's `run_delay`
/// total that runq-lat reports (`kernel_run_delay_ns`, summed over the switches it saw from
/// fork to exit) equals the children's `/proc/<pid>/schedstat` run_delay read by their parent
/// once they are zombies (after their last switch-out; 0.1 %), and the wall-clock waits (`total_ns`: after
/// a wakeup timed from `sched_waking`, after a preemption the kernel's `run_delay`) are not
/// below it.
///
/// `total_ns` is not compared with `run_delay`: the two measure different things. `run_delay`
/// is timed on the run queue's clock, from enqueue (`sched_info_queued` in 5.10) to switch-in;
/// a wakeup that asks to preempt the running task skips the next clock update
/// (`check_preempt_curr` → `rq_clock_skip_update`, kernel/sched/core.c, in 5.10 as in every
/// kernel since 4.0; `wakeup_preempt` from 6.8), so that wait reads short, and the time from
/// the wakeup to the enqueue (a remote wakeup queued by IPI, an idle vCPU waking) is not in it
/// at all. The legacy check compared `total_ns` (wall clock since issue #17) with `run_delay`
/// and failed on 5.10 (19.56 ms against 16.52 ms) with nothing counted twice: in the same
/// guest `kernel_run_delay_ns` equals schedstat's (46,027,615 / 46,027,615 ns) while the wall
/// clock reads 5× more under TCG, where waking an idle vCPU takes long.
///
/// Run twice: as by default, and with `--from wakeup` (issue #33), whose `sched_wakeup`
/// program no other run on these guests loads (they have no CPU steal): it must pass each
/// kernel's verifier and time waits.
pub fn vm_check() -> Result<String, String> {
    let waking = vm_check_from("waking")?;
    let wakeup = vm_check_from("wakeup")?;
    Ok(format!("--from waking: {waking}; --from wakeup: {wakeup}"))
}

/// [`vm_check`] with `--from FROM`.
fn vm_check_from(from: &str) -> Result<String, String> {
    let (lines, w, modes) =
        tracekit_tests::vm::traced(&["runq-lat", "--from", from], &["runq-pingpong", "2000"])?;
    let meta = lines
        .iter()
        .find(|l| l["type"] == "meta")
        .ok_or("no meta line")?;
    if meta["wake_from"] != format!("sched_{from}") {
        return Err(format!(
            "--from {from}: meta wake_from {}",
            meta["wake_from"]
        ));
    }
    let mut got = Vec::new();
    for p in w["procs"].as_array().ok_or("no procs")? {
        let pid = p["pid"].as_u64().unwrap_or(0) as u32;
        let sum = |k: &str| tracekit_tests::vm::sum(&lines, "runq-lat", pid, k);
        let (kernel, wall, own) = (
            sum("kernel_run_delay_ns"),
            sum("total_ns"),
            p["run_delay_exit_ns"].as_u64().unwrap_or(0),
        );
        // The same counter from fork to the last switch-out: equal but for rounding.
        if own == 0 || kernel.abs_diff(own) > own / 1000 {
            return Err(format!(
                "pid {pid}: kernel_run_delay {kernel} ns, schedstat run_delay since fork {own} ns"
            ));
        }
        // From sched_waking, every wait after a wakeup starts before the kernel's run_delay
        // does (at the enqueue), and run_delay misses most of a wait after a wakeup that
        // preempts: the wall clock is never much below it. From sched_wakeup there is no such
        // order: the tracepoint fires after the enqueue, and on a guest whose vCPU the host
        // preempts in between, run_delay holds that gap and the wall clock does not (a fresh-clone
        // run's 6.12 guest: 7.46 ms against 11.42 ms, where the run before had 1.15-3.1 times
        // run_delay on every guest). There the check is that waits were timed at all.
        if from == "waking" && (wall as f64) < kernel as f64 * 0.9 {
            return Err(format!(
                "pid {pid}: --from {from}: wall-clock waits {wall} ns below the kernel's run_delay {kernel} ns"
            ));
        }
        if wall == 0 {
            return Err(format!("pid {pid}: --from {from}: no wait timed"));
        }
        let wakes = sum("wake_count");
        if wakes == 0 {
            return Err(format!(
                "pid {pid}: no wait after a wakeup timed from sched_{from}"
            ));
        }
        got.push(format!(
            "{kernel}/{own} ns (wall clock {wall} ns, {wakes} after a wakeup)"
        ));
    }
    Ok(format!("run_delay {}; {modes}", got.join(", ")))
}

/// The workloads of this file (`tk-workload ARGS`).
pub fn workload(args: &[String]) -> Option<i32> {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    match a.as_slice() {
        ["runq-pingpong", n] => runq_pingpong(n.parse().ok()?),
        _ => return None,
    }
    Some(0)
}

/// Two children ping-pong one byte N times over two pipes and exit; the parent reads each
/// one's `/proc/<pid>/schedstat` run_delay once it is a zombie (its last switch-out done, so
/// the whole life, exit included: what tracekit sees), then reaps it. Prints
/// `{"procs":[{pid, run_delay_exit_ns}]}`.
fn runq_pingpong(n: usize) {
    let pipe = || {
        let mut fds = [0; 2];
        // SAFETY: a two-int array for pipe(2).
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0, "pipe");
        fds
    };
    let (ab, ba) = (pipe(), pipe());
    let mut pids = Vec::new();
    for first in [true, false] {
        // SAFETY: the workload is single-threaded; the child makes only read/write/_exit calls.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork");
        if pid == 0 {
            let (rd, wr) = if first {
                (ba[0], ab[1])
            } else {
                (ab[0], ba[1])
            };
            let mut b = [0u8; 1];
            for _ in 0..n {
                // SAFETY: one byte to and from this child's ends of the pipes: the first child
                // writes then reads, the second reads then answers.
                let ok = unsafe {
                    if first {
                        libc::write(wr, b.as_ptr().cast(), 1);
                    }
                    let ok = libc::read(rd, b.as_mut_ptr().cast(), 1) == 1;
                    if !first {
                        libc::write(wr, b.as_ptr().cast(), 1);
                    }
                    ok
                };
                if !ok {
                    // SAFETY: leaves without the parent's atexit handlers.
                    unsafe { libc::_exit(1) };
                }
            }
            // SAFETY: leaves without the parent's atexit handlers.
            unsafe { libc::_exit(0) };
        }
        pids.push(pid);
    }
    let procs: Vec<Value> = pids
        .iter()
        .map(|&pid| {
            // SAFETY: waits for our own child without reaping it (WNOWAIT).
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            let r = unsafe {
                libc::waitid(
                    libc::P_PID,
                    pid as u32,
                    &mut info,
                    libc::WEXITED | libc::WNOWAIT,
                )
            };
            assert_eq!(r, 0, "waitid");
            let ss = std::fs::read_to_string(format!("/proc/{pid}/schedstat")).expect("schedstat");
            let rd: u64 = ss
                .split_whitespace()
                .nth(1)
                .and_then(|v| v.parse().ok())
                .unwrap();
            // SAFETY: reaps our own child.
            unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
            serde_json::json!({"pid": pid, "run_delay_exit_ns": rd})
        })
        .collect();
    println!("{}", serde_json::json!({ "procs": procs }));
}

/// A row carries the process title (`exec -a` sets it, as postgres and nginx do): JSON
/// `cmdline` is /proc/<pid>/cmdline as read while the process lived; `comm` stays the comm.
#[test]
fn rows_carry_the_process_title() {
    require_root();
    let _one = serial();
    let (mut ticker, want) = titled_ticker();
    let pid = ticker.id();
    let p = pid.to_string();
    let mut tk = Tracer::spawn(&["runq-lat", "--json", "--pid", &p]);
    tk.wait_attached();
    std::thread::sleep(Duration::from_millis(600));
    tk.signal(libc::SIGINT);
    let (status, lines, stderr) = tk.finish(Duration::from_secs(15));
    let _ = ticker.kill();
    let _ = ticker.wait();
    assert!(status.success(), "exit {status}: {stderr}");
    let rows = rows_for(&lines, "runq-lat", pid);
    assert_eq!(rows.len(), 1, "one row for the ticker {pid}: {lines:?}");
    assert_eq!(rows[0]["cmdline"], want.as_str(), "{}", rows[0]);
    assert_eq!(rows[0]["comm"], "bash", "{}", rows[0]);
}
