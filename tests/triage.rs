//! Root tests for `tracekit triage`: staged incidents, each a culprit among innocent busy
//! processes; `triage --json` must rank the culprit's finding first with the right `cause` and
//! `pid` (and `culprit_pid` where someone else caused it), and leave no program loaded.

use std::{
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::{json, Value};
use tracekit_tests::{mm::*, *};

/// io-lat's loop devices and fio runner, shared rather than copied (only in the test build:
/// tk-workload already holds them through io-lat's own file).
#[cfg(test)]
#[path = "io_lat/fixtures.rs"]
#[allow(dead_code)]
#[allow(clippy::duplicate_mod)] // tk-workload's unit-test build holds it through io-lat's file too
mod io;

#[path = "triage/cpu.rs"]
mod cpu;
#[path = "triage/memory.rs"]
mod memory;
#[path = "triage/postgres.rs"]
mod postgres;
#[path = "triage/softirq.rs"]
mod softirq;
#[path = "triage/storage.rs"]
mod storage;
#[path = "triage/workloads.rs"]
mod workloads;

/// Two innocent busy processes: one on the CPU a third of the time in 0.5 ms bursts, one
/// writing to the page cache every 10 ms without syncing. Killed when dropped.
struct Innocents(Vec<Child>, Vec<u64>);

impl Innocents {
    fn start(tag: &str, ms: u64) -> Innocents {
        Innocents::start_in(&scratch(tag), ms)
    }

    /// As [`Innocents::start`], writing under `dir` (the VM guests write under /tmp).
    fn start_in(dir: &std::path::Path, ms: u64) -> Innocents {
        Innocents::start_on(dir, ms, None)
    }

    /// As [`Innocents::start_in`], pinned to `cpu` when given (taskset execs the workload: the
    /// pids are the workloads').
    fn start_on(dir: &std::path::Path, ms: u64, cpu: Option<&str>) -> Innocents {
        let spawn = |args: &[&str]| {
            let mut c = match cpu {
                Some(cpu) => {
                    let mut c = Command::new("taskset");
                    c.args(["-c", cpu]).arg(workload_bin());
                    c
                }
                None => Command::new(workload_bin()),
            };
            c.args(args)
                .stdout(Stdio::null())
                .spawn()
                .expect("spawn tk-workload")
        };
        let children = vec![
            spawn(&["triage-duty", &ms.to_string()]),
            spawn(&[
                "triage-writer",
                dir.join("buffered").to_str().unwrap(),
                &ms.to_string(),
            ]),
        ];
        let at = children.iter().map(|c| run_delay_ns(c.id())).collect();
        Innocents(children, at)
    }

    fn pids(&self) -> Vec<u64> {
        self.0.iter().map(|c| c.id() as u64).collect()
    }

    /// No finding is about an innocent unless it names one of `culprits` (its `culprit_pid`) and ranks
    /// below the staged victim (rank 1): a bulk writer at 200 MiB/s is also CPU work, and the
    /// 3 ms burster beside it felt that (fresh machine, 11 % steal: 1 in 89 wakeups over 1 ms,
    /// p99.9 4.46 ms, 61 ms of its long waits behind the writer). That is harm the writer did,
    /// told truly; an innocent named for anything else is held to
    /// [`Innocents::assert_named_only_for_what_they_felt`].
    fn assert_only_victims_of(&self, findings: &[Value], culprits: &[&Value]) {
        let rest: Vec<Value> = findings
            .iter()
            .filter(|x| {
                !(culprits.contains(&&x["culprit_pid"]) && x["rank"].as_u64().unwrap_or(0) > 1)
            })
            .cloned()
            .collect();
        self.assert_named_only_for_what_they_felt(&rest, findings.first());
    }

    /// An innocent is named only for what it felt, as a run-queue victim: on a busy node it
    /// feels the node's other work, truly (beside two nice-19 spinners on this 2-vCPU guest
    /// the 0.5 ms duty loop waited up to 89 ms, 109 ms in 12 waits behind one of them, and
    /// triage said so; on a fresh guest it waited 23.9 ms behind this test's own memory
    /// fragmenting). Ranked after `first`, the staged incident, when there is one; and the
    /// wait it is named for is within what the kernel counted for it since it started
    /// (run_delay in /proc/<pid>/schedstat): an innocent named for waits it never had fails.
    fn assert_named_only_for_what_they_felt(&self, findings: &[Value], first: Option<&Value>) {
        let felt: Vec<(u64, u64)> = self
            .0
            .iter()
            .zip(&self.1)
            .map(|(c, at)| (c.id() as u64, run_delay_ns(c.id()).saturating_sub(*at)))
            .collect();
        for x in findings {
            let Some(&(_, kernel)) = felt.iter().find(|(p, _)| x["pid"] == *p) else {
                continue;
            };
            // The wait it is named for: its score over the window (a tail victim's excess, a
            // starved one's waits less the idle CPU's wakeup and the hypervisor's steal). Not
            // all its wake waits: those run from sched_waking, before the enqueue that starts
            // run_delay, and hold each wakeup's IPI and idle exit (112 ms of wake waits beside
            // 81.5 ms of run_delay for the duty loop's 3,914 wakeups on this guest).
            let secs = x["evidence"]["window_ns"].as_u64().unwrap_or(0) as f64 / 1e9;
            let told = (x["score_ns_per_s"].as_u64().unwrap_or(u64::MAX) as f64 * secs) as u64;
            assert!(
                x["cause"] == "runq-delay"
                    && first.is_none_or(|f| x["rank"].as_u64() > f["rank"].as_u64())
                    && told <= kernel + kernel / 10 + 2_000_000,
                "an innocent was named for what it did not feel (the kernel's run_delay since it started: {kernel} ns): {x}\n{:#?}",
                brief(findings)
            );
        }
    }
}

/// A task's time waiting for a CPU so far (`run_delay`, the second field of
/// /proc/<pid>/schedstat).
fn run_delay_ns(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .ok()
        .and_then(|t| t.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or_else(|| panic!("/proc/{pid}/schedstat: no run_delay"))
}

impl Drop for Innocents {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Runs `triage --json` for `secs` while `during` runs (it gets the time to stop), and returns
/// the findings in rank order and the `checked` line, after checking that every program the
/// run loaded is gone.
fn triage(secs: u64, extra: &[&str], during: impl FnOnce()) -> (Vec<Value>, Value) {
    let d = format!("{secs}s");
    let mut args = vec!["triage", "--json", "--duration", d.as_str()];
    args.extend_from_slice(extra);
    let mut tk = Tracer::spawn(&args);
    let meta = tk.wait_attached();
    let ids = program_ids(&meta);
    during();
    let (status, lines, stderr) = tk.finish(Duration::from_secs(secs + 30));
    assert!(status.success(), "exit {status}: {stderr}");
    assert_eq!(
        wait_unloaded(&ids),
        Vec::<u32>::new(),
        "programs left loaded"
    );
    let findings: Vec<Value> = lines
        .iter()
        .filter(|l| l["type"] == "finding")
        .cloned()
        .collect();
    let checked = lines
        .iter()
        .find(|l| l["type"] == "checked")
        .cloned()
        .unwrap_or_else(|| panic!("no checked line in {lines:?}"));
    for (i, f) in findings.iter().enumerate() {
        assert_eq!(f["rank"], i as u64 + 1, "ranks in order: {findings:?}");
    }
    (findings, checked)
}

fn brief(findings: &[Value]) -> Vec<String> {
    findings
        .iter()
        .map(|f| format!("{} {} {}", f["cause"], f["pid"], f["summary"]))
        .collect()
}

/// The hogs' pids from `spin`'s report.
fn hog_pids(hogs: Child) -> Vec<u64> {
    let w: Value = serde_json::from_slice(&hogs.wait_with_output().unwrap().stdout).unwrap();
    w["procs"]
        .as_array()
        .map(|a| a.iter().filter_map(|p| p["pid"].as_u64()).collect())
        .unwrap_or_default()
}

#[test]
fn fsync_loop_ranks_first() {
    require_root();
    let _s = serial();
    let innocents = Innocents::start("triage-fsync-innocents", 14_000);
    let file = scratch("triage-fsync").join("ledger.log");
    let mut report = Value::Null;
    let (f, checked) = triage(8, &[], || {
        report = run_workload(&["triage-fsync", file.to_str().unwrap(), "6000"])
    });
    let pid = report["pid"].as_u64().unwrap();
    assert!(report["calls"].as_u64().unwrap() > 0);
    assert!(!f.is_empty(), "no finding");
    assert_eq!(f[0]["cause"], "fsync", "{:#?}", brief(&f));
    assert_eq!(f[0]["pid"], pid, "{:#?}", brief(&f));
    assert!(f[0]["score_ns_per_s"].as_u64().unwrap() > 100_000_000);
    assert!(f[0]["next"].as_str().unwrap().starts_with("tracekit "));
    assert!(!f[0]["advice"].as_str().unwrap().is_empty());
    innocents.assert_named_only_for_what_they_felt(&f, Some(&f[0]));
    assert!(checked["ran"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t == "fsync-lat"));
}

/// Datagrams to a closed port and into a receiver whose buffer is full: net-drops, with the
/// receiving process named.
#[test]
fn udp_drops_rank_first() {
    require_root();
    let _s = serial();
    let _innocents = Innocents::start("triage-udp-innocents", 14_000);
    // The receiver holds a 1 KiB buffer and never reads; the sender fills it.
    let mut rx = Command::new(workload_bin())
        .args(["net-rx-hold", "12000"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let line = {
        use std::io::BufRead;
        let mut l = String::new();
        std::io::BufReader::new(rx.stdout.as_mut().unwrap())
            .read_line(&mut l)
            .unwrap();
        l
    };
    let held: Value = serde_json::from_str(&line).unwrap();
    let port = held["port"].as_u64().unwrap().to_string();
    let mut sent = Value::Null;
    let (f, _) = triage(6, &[], || {
        sent = run_workload(&["net-rx-send", &port, "20000", "64"]);
        std::thread::sleep(Duration::from_millis(500));
    });
    let _ = rx.kill();
    let _ = rx.wait();
    assert!(sent["rcvbuf_errors"].as_u64().unwrap() > 1000, "{sent}");
    let first = f
        .iter()
        .find(|x| x["cause"] == "net-drops")
        .unwrap_or_else(|| panic!("no net-drops finding: {:#?}", brief(&f)));
    assert_eq!(first["rank"], 1, "{:#?}", brief(&f));
    assert_eq!(first["pid"], held["pid"], "{:#?}", brief(&f));
    assert!(
        first["evidence"]["drops_per_s"].as_f64().unwrap() > 100.0,
        "{first}"
    );
    // Issue #26: scored by the share of the receiver's traffic lost, on the scale of time lost.
    // It reads nothing, so all that reaches it past its 1 KiB buffer is lost; the node's other
    // datagrams (a resolver's, say) only lower the bound.
    let share = first["evidence"]["lost_share_ppm"].as_u64().unwrap();
    assert!(share > 500_000, "{first}");
    assert_eq!(
        first["score_ns_per_s"].as_u64().unwrap() / 1_000,
        share,
        "{first}"
    );
}

/// #26 (3), receive drops linked to the receiver's CPU: iperf3's UDP server pinned to the last
/// CPU beside two CPU hogs at nice 0 (and the innocents), its client on CPU 0 at 400 Mbit/s into
/// a 64 KiB buffer. Alone it loses about 0.3 % (178,543 datagrams, 526 lost); beside the hogs it
/// waits for its CPU and loses 5-17 %. Its drops name a hog as culprit (runq-lat measured who
/// held its CPU, in the same window), it ranks first, and the CPU saturation ranks below its
/// drops. The one-off server exits with its test before the window ends: the drop finding still
/// names it (net-rx learns a socket's owner on its poll, which triage's ring-buffer traffic had
/// kept from firing: "no process holds it now").
#[test]
fn udp_receiver_behind_hogs_names_a_hog_for_its_drops() {
    require_root();
    let _s = serial();
    let cpu = (std::thread::available_parallelism().map_or(1, |n| n.get()) - 1).to_string();
    let innocents = Innocents::start("triage-udp-hogs", 12_000);
    let hogs = hogs_at("9000", 0);
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .map(|a| a.port())
        .unwrap();
    let mut server = udp::iperf3_one_off_server(port, Some(&cpu));
    let server_pid = server.id() as u64;
    let (mut client, mut snmp) = (Value::Null, Default::default());
    let mut client_pid = 0u64;
    let (f, _) = triage(7, &[], || {
        let before = udp::udp_snmp();
        let c = Command::new("taskset")
            .args([
                "-c",
                "0",
                "iperf3",
                "-c",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .args([
                "-u", "-b", "400M", "-l", "1400", "-w", "64K", "-t", "5", "--json",
            ])
            .stdout(Stdio::piped())
            .spawn()
            .expect("iperf3 -c");
        client_pid = u64::from(c.id());
        let out = c.wait_with_output().expect("iperf3 -c");
        assert!(out.status.success(), "iperf3 client: {out:?}");
        client = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let _ = server.wait();
        snmp = (before, udp::udp_snmp());
    });
    let hog_pids = hog_pids(hogs);
    let errs = udp::delta(&snmp.0, &snmp.1, "RcvbufErrors");
    let sum = &client["end"]["sum"];
    eprintln!(
        "iperf3: lost {} of {} datagrams; Udp: RcvbufErrors +{errs}; hogs {hog_pids:?}; findings {:#?}",
        sum["lost_packets"],
        sum["packets"],
        brief(&f)
    );
    assert!(
        sum["lost_packets"].as_u64().unwrap_or(0) > 0 && errs > 0,
        "the staged incident lost nothing: {client}"
    );
    let drops = f
        .iter()
        .find(|x| x["cause"] == "net-drops" && x["pid"] == server_pid)
        .unwrap_or_else(|| panic!("no net-drops finding naming iperf3: {:#?}", brief(&f)));
    let culprit = drops["culprit_pid"].as_u64().unwrap_or(0);
    assert!(hog_pids.contains(&culprit), "culprit {culprit}: {drops}");
    assert!(
        drops["evidence"]["drops"].as_u64().unwrap_or(u64::MAX) <= errs,
        "{drops}"
    );
    assert!(
        drops["summary"]
            .as_str()
            .unwrap_or("")
            .contains("a reader that is not running does not drain its buffer"),
        "{drops}"
    );
    assert_eq!(
        f[0]["pid"],
        server_pid,
        "the victim ranks first: {:#?}",
        brief(&f)
    );
    for sat in f.iter().filter(|x| x["cause"] == "cpu-saturated") {
        assert!(
            sat["rank"].as_u64() > drops["rank"].as_u64(),
            "{:#?}",
            brief(&f)
        );
    }
    // An innocent may be told as another victim of the incident (a hog, or the client
    // sending 400 Mbit/s from CPU 0, where the innocents mostly run) below the staged one, or
    // for what it felt of the node's other work.
    let staged: Vec<Value> = hog_pids
        .iter()
        .chain([&client_pid])
        .map(|p| json!(p))
        .collect();
    innocents.assert_only_victims_of(&f, &staged.iter().collect::<Vec<_>>());
}

/// Issue #33 (1): `perf bench sched messaging` (20 groups of 40 tasks on sockets) made 80
/// near-identical run-queue findings; its tasks are one job, told once per cause.
#[test]
fn perf_bench_messaging_is_one_finding_per_cause() {
    require_root();
    let _s = serial();
    let (f, _) = triage(6, &[], || {
        let st = Command::new("perf")
            .args(["bench", "sched", "messaging", "-g", "10", "-l", "2000"])
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(st.success(), "perf bench: {st}");
    });
    for l in brief(&f).iter().take(5) {
        eprintln!("{l}");
    }
    let mut per_cause: std::collections::BTreeMap<String, usize> = Default::default();
    for x in f.iter().filter(|x| x["comm"] == "sched-messaging") {
        *per_cause.entry(x["cause"].to_string()).or_default() += 1;
    }
    assert!(
        !per_cause.is_empty(),
        "no finding about the benchmark: {:#?}",
        brief(&f)
    );
    assert!(
        per_cause.values().all(|n| *n == 1),
        "{per_cause:?}: {:#?}",
        brief(&f)
    );
}

/// Only the innocents: nothing names them but for waits the kernel counted (the node's own
/// work, on a busy machine).
#[test]
fn innocents_alone_are_not_named() {
    require_root();
    let _s = serial();
    let innocents = Innocents::start("triage-quiet", 10_000);
    let (f, checked) = triage(5, &[], || {});
    innocents.assert_named_only_for_what_they_felt(&f, None);
    assert!(checked["node_checks"].as_array().unwrap().len() >= 5);
}

/// `--output report.md`: the same findings as Markdown, to paste into an incident channel.
#[test]
fn markdown_report() {
    require_root();
    let _s = serial();
    let dir = scratch("triage-md");
    let md = dir.join("report.md");
    let file = dir.join("wal");
    let mut tk = Command::new(tracekit_bin())
        .args([
            "triage",
            "--duration",
            "5s",
            "--output",
            md.to_str().unwrap(),
        ])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Started well after tracekit attached (about 20 ms here), and done before the window ends.
    std::thread::sleep(Duration::from_millis(800));
    run_workload(&["triage-fsync", file.to_str().unwrap(), "3500"]);
    assert!(tk.wait().unwrap().success());
    let text = std::fs::read_to_string(&md).unwrap();
    assert!(text.starts_with("# tracekit triage:"), "{text}");
    assert!(text.contains("1. **fsync**"), "{text}");
    assert!(text.contains("   - Next: `tracekit "), "{text}");
}

/// A one-thread fsync loop that runs before, through and after the window: its share of the
/// time in fsync is at most 100 % (a process's calls over the time they were counted), and
/// close to what fsync-lat alone says of the same loop.
#[test]
fn one_thread_share_is_at_most_the_whole() {
    require_root();
    let _s = serial();
    let file = scratch("triage-share").join("ledger.log");
    let path = file.to_str().unwrap().to_string();
    let looping = std::thread::spawn(move || run_workload(&["triage-fsync", &path, "14000"]));
    std::thread::sleep(Duration::from_millis(300));
    let share = |f: &Value| {
        let ev = &f["evidence"];
        ev["total_ns"].as_f64().unwrap() * 100.0 / ev["window_ns"].as_f64().unwrap()
    };
    let (f, _) = triage(4, &[], || {});
    let mine = f
        .iter()
        .find(|x| x["cause"] == "fsync")
        .unwrap_or_else(|| panic!("no fsync finding: {:#?}", brief(&f)));
    let pid = mine["pid"].as_u64().unwrap();
    let under_triage = share(mine);
    let mut tk = Tracer::spawn(&["fsync-lat", "--json", "--duration", "3s"]);
    tk.wait_attached();
    let (status, lines, stderr) = tk.finish(Duration::from_secs(30));
    assert!(status.success(), "{stderr}");
    let report = looping.join().unwrap();
    assert_eq!(report["pid"].as_u64(), Some(pid), "{:#?}", brief(&f));
    let own = lines
        .iter()
        .find(|l| l["type"] == "finding" && l["pid"].as_u64() == Some(pid))
        .map(share)
        .unwrap_or_else(|| panic!("fsync-lat alone found nothing for {pid}: {lines:?}"));
    assert!(
        under_triage <= 100.0,
        "one thread spent {under_triage:.1} % of the time in fsync under triage ({}); fsync-lat alone: {own:.1} %",
        mine["summary"]
    );
    assert!(
        (under_triage - own).abs() < 10.0,
        "triage {under_triage:.1} %, fsync-lat alone {own:.1} %"
    );
}

/// Under a fork storm (3000 short-lived processes a second), triage's memory stays bounded and
/// its window ends on time: the end-of-window work for tens of thousands of pids gone by then
/// is bounded (it held 462 MB and an 8 s run took 14.4 s; here 144 MiB at 7.9k forks before
/// ctxsw and runq-lat capped their resolved rows, 66 MiB at 13.8k after).
#[test]
fn fork_storm_keeps_memory_and_time_bounded() {
    require_root();
    let _s = serial();
    let storm = std::thread::spawn(|| run_workload(&["triage-forks", "3000", "8000"]));
    std::thread::sleep(Duration::from_millis(300));
    let start = Instant::now();
    let (_, checked) = triage(6, &[], || {});
    let took = start.elapsed();
    let report = storm.join().unwrap();
    let spawned = report["spawned"].as_u64().unwrap();
    assert!(
        spawned > 6_000,
        "the storm was too weak to prove anything: {report}"
    );
    let peak_kib = checked["rss_peak_kib"]
        .as_u64()
        .expect("checked has rss_peak_kib");
    eprintln!(
        "fork storm: {spawned} forks, triage peak RSS {} MiB, 6 s window took {took:.1?}",
        peak_kib >> 10
    );
    assert!(
        peak_kib < 120 << 10,
        "triage peaked at {} MiB under {spawned} forks",
        peak_kib >> 10
    );
    assert!(
        took < Duration::from_secs(15),
        "a 6 s triage took {took:?} under {spawned} forks"
    );
}

/// triage's VM check: with two NUMA nodes, a process whose memory is bound to node 1 while it
/// runs on node 0, beside two innocents, is the first finding (numa-misplaced, its pid); on one
/// node, a quiet run ends cleanly with every program gone and names nobody.
pub fn vm_check() -> Result<String, String> {
    let two_nodes = tracekit::host::numa::Topology::read().len() >= 2;
    let dir = std::env::temp_dir().join(format!("tk-triage-vm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let _balancing = if two_nodes {
        Some(Setting::try_set("/proc/sys/kernel/numa_balancing", "0")?)
    } else {
        None
    };
    let innocents = Innocents::start_in(&dir, 30_000);
    let mut tk = Tracer::spawn(&["triage", "--json", "--duration", "8s"]);
    let meta = tk.wait_attached();
    let ids = program_ids(&meta);
    let held = if two_nodes {
        Some(Held::start(&["numa-place", "bind", "0", "1", "64", "2"])?)
    } else {
        None
    };
    let (status, lines, stderr) = tk.finish(Duration::from_secs(90));
    let culprit = held.as_ref().map(|h| h.pid as u64);
    if let Some(h) = held {
        h.release();
    }
    drop(innocents);
    let _ = std::fs::remove_dir_all(&dir);
    if !status.success() {
        return Err(format!("exit {status}: {stderr}"));
    }
    tracekit_tests::vm::all_unloaded(&ids)?;
    let f: Vec<&Value> = lines.iter().filter(|l| l["type"] == "finding").collect();
    let ran = lines
        .iter()
        .find(|l| l["type"] == "checked")
        .map(|c| c["ran"].clone())
        .ok_or("no checked line")?;
    let Some(pid) = culprit else {
        return Ok(format!(
            "one node: {} finding(s), ran {ran}, nothing left loaded",
            f.len()
        ));
    };
    match f.first() {
        Some(first) if first["cause"] == "numa-misplaced" && first["pid"] == pid => Ok(format!(
            "numa-misplaced ranked first of {} for pid {pid} beside two innocents; ran {ran}",
            f.len()
        )),
        _ => Err(format!(
            "misplaced pid {pid} not first: {:?}",
            f.iter()
                .map(|x| format!("{} {} {}", x["cause"], x["pid"], x["summary"]))
                .collect::<Vec<_>>()
        )),
    }
}

/// Workloads for the incidents (tk-workload dispatches here; they live in triage/workloads.rs).
pub fn workload(args: &[String]) -> Option<i32> {
    workloads::workload(args)
}
