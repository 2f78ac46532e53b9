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

/// Two innocent busy processes: one on the CPU a third of the time in 0.5 ms bursts, one
/// writing to the page cache every 10 ms without syncing. Killed when dropped.
struct Innocents(Vec<Child>);

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
        Innocents(vec![
            spawn(&["triage-duty", &ms.to_string()]),
            spawn(&[
                "triage-writer",
                dir.join("buffered").to_str().unwrap(),
                &ms.to_string(),
            ]),
        ])
    }

    fn pids(&self) -> Vec<u64> {
        self.0.iter().map(|c| c.id() as u64).collect()
    }

    /// No finding is about an innocent unless it names `culprit` (its `culprit_pid`) and ranks
    /// below the staged victim (rank 1): a bulk writer at 200 MiB/s is also CPU work, and the
    /// 3 ms burster beside it felt that (fresh machine, 11 % steal: 1 in 89 wakeups over 1 ms,
    /// p99.9 4.46 ms, 61 ms of its long waits behind the writer). That is harm the writer did,
    /// told truly; an innocent named a victim of anything else still fails.
    fn assert_only_victims_of(&self, findings: &[Value], culprit: &Value) {
        let pids = self.pids();
        let innocent = |v: &Value| pids.contains(&v.as_u64().unwrap_or(0));
        for x in findings {
            if innocent(&x["pid"]) {
                assert!(
                    x["culprit_pid"] == *culprit && x["rank"].as_u64().unwrap_or(0) > 1,
                    "an innocent was named, not as a victim of {culprit} below the staged victim: {:#?}",
                    brief(findings)
                );
            }
        }
    }

    /// An innocent is named, if at all, only as a victim far below `first`: ranked after it,
    /// its score at most a tenth of `first`'s. On a busy node the innocents feel the node's
    /// other work too (beside two SCHED_IDLE hogs here, the 0.5 ms burster lost 9 ms/s behind
    /// them and the SCHED_IDLE flood, the kernel's run_delay agreeing: a SCHED_IDLE task
    /// still holds a CPU for a millisecond at times); what triage must not do is rank them
    /// near the incident.
    fn assert_far_below(&self, findings: &[Value], first: &Value) {
        let pids = self.pids();
        let top = first["score_ns_per_s"].as_u64().unwrap_or(0);
        for x in findings
            .iter()
            .filter(|x| pids.contains(&x["pid"].as_u64().unwrap_or(0)))
        {
            assert!(
                x["cause"] == "runq-delay"
                    && x["rank"].as_u64() > first["rank"].as_u64()
                    && x["score_ns_per_s"].as_u64().unwrap_or(u64::MAX) * 10 <= top,
                "an innocent was named near the incident: {:#?}",
                brief(findings)
            );
        }
    }

    /// No finding names an innocent.
    fn assert_unnamed(&self, findings: &[Value]) {
        let pids = self.pids();
        assert!(
            findings
                .iter()
                .all(|x| !pids.contains(&x["pid"].as_u64().unwrap_or(0))),
            "an innocent was named: {:#?}",
            brief(findings)
        );
    }
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
    innocents.assert_unnamed(&f);
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
    // An innocent may be told only as another victim of the incident (a hog, or the client
    // sending 400 Mbit/s from CPU 0, where the innocents mostly run), below the staged one.
    for x in f
        .iter()
        .filter(|x| innocents.pids().contains(&x["pid"].as_u64().unwrap_or(0)))
    {
        let culprit = x["culprit_pid"].as_u64().unwrap_or(0);
        let staged = hog_pids.contains(&culprit) || culprit == client_pid;
        assert!(staged && x["rank"].as_u64() > Some(1), "{:#?}", brief(&f));
    }
}

/// Two processes bouncing a byte through pipes as fast as they can: a context-switch storm.
/// A PostgreSQL 15 cluster of the test's own (Debian's binaries, run as `postgres`, on a
/// Unix socket only, fsync on): stopped (fast shutdown) and removed when dropped.
struct Postgres {
    dir: std::path::PathBuf,
    port: u16,
    child: Child,
}

const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

impl Postgres {
    fn start() -> Postgres {
        assert!(
            std::path::Path::new(PG_BIN).join("postgres").exists(),
            "{PG_BIN}/postgres missing: `cargo xtask test` installs postgresql"
        );
        let dir = scratch("pg");
        let data = dir.join("data");
        let (uid, gid) = {
            let out = Command::new("id")
                .args(["-u", "postgres"])
                .output()
                .unwrap();
            let u: u32 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
            let out = Command::new("id")
                .args(["-g", "postgres"])
                .output()
                .unwrap();
            (
                u,
                String::from_utf8_lossy(&out.stdout)
                    .trim()
                    .parse::<u32>()
                    .unwrap(),
            )
        };
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
        let as_pg = |bin: &str| {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"])
                .arg(format!("{PG_BIN}/{bin}"));
            c
        };
        let st = as_pg("initdb")
            .args(["-A", "trust", "--no-sync", "-D"])
            .arg(&data)
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(st.success(), "initdb: {st}");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let child = as_pg("postgres")
            .arg("-D")
            .arg(&data)
            .arg("-k")
            .arg(&dir)
            .args(["-p", &port.to_string()])
            .args([
                "-c",
                "listen_addresses=",
                "-c",
                "fsync=on",
                "-c",
                "synchronous_commit=on",
            ])
            .args(["-c", "wal_sync_method=fdatasync", "-c", "max_wal_size=1GB"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let pg = Postgres { dir, port, child };
        let up = (0..200).any(|_| {
            std::thread::sleep(Duration::from_millis(50));
            pg.sql("select 1").is_some()
        });
        assert!(up, "postgres did not start");
        pg
    }

    /// Runs `q` with psql as `postgres`; its unaligned output, `None` on failure.
    fn sql(&self, q: &str) -> Option<String> {
        let out = Command::new("psql")
            .args(["-X", "-tA", "-U", "postgres", "-h"])
            .arg(&self.dir)
            .args(["-p", &self.port.to_string(), "-c", q, "postgres"])
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    fn pgbench(&self, args: &[&str]) -> String {
        let out = Command::new("pgbench")
            .args(["-U", "postgres", "-h"])
            .arg(&self.dir)
            .args(["-p", &self.port.to_string()])
            .args(args)
            .arg("postgres")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pgbench {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `pg_stat_wal.wal_sync`: WAL flushes the server issued (fdatasync here).
    fn wal_syncs(&self) -> u64 {
        self.sql("select wal_sync from pg_stat_wal")
            .and_then(|v| v.parse().ok())
            .expect("pg_stat_wal")
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // The postmaster's pid is the first line of postmaster.pid; SIGINT is a fast shutdown.
        if let Some(pid) = std::fs::read_to_string(self.dir.join("data/postmaster.pid"))
            .ok()
            .and_then(|t| t.lines().next().and_then(|l| l.trim().parse::<i32>().ok()))
        {
            // SAFETY: a signal to the server this test started.
            unsafe { libc::kill(pid, libc::SIGINT) };
        }
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Issue #33 (1): pgbench against PostgreSQL made one fsync finding per backend and none for
/// the WAL flushes. Now the backends and the walwriter are one finding whose calls equal
/// `pg_stat_wal.wal_sync`, bracketed: the delta read inside triage's window (around pgbench)
/// is at most what triage counted, the delta read outside it at least.
#[test]
fn postgres_wal_flushes_are_one_fsync_finding() {
    require_root();
    let _s = serial();
    let pg = Postgres::start();
    pg.pgbench(&["-i", "-q", "-s", "1"]);
    pg.sql("checkpoint").expect("checkpoint");
    let outer0 = pg.wal_syncs();
    let (mut inner, mut report) = (0, String::new());
    let (f, _) = triage(8, &[], || {
        let i0 = pg.wal_syncs();
        report = pg.pgbench(&["-n", "-c", "8", "-j", "2", "-T", "4"]);
        inner = pg.wal_syncs() - i0;
    });
    let outer = pg.wal_syncs() - outer0;
    eprintln!(
        "{}",
        report
            .lines()
            .filter(|l| l.contains("tps") || l.contains("latency"))
            .collect::<Vec<_>>()
            .join("; ")
    );
    for l in brief(&f).iter().take(5) {
        eprintln!("{l}");
    }
    let fs: Vec<&Value> = f
        .iter()
        .filter(|x| x["cause"] == "fsync" && x["comm"] == "postgres")
        .collect();
    assert_eq!(fs.len(), 1, "one finding for the service: {:#?}", brief(&f));
    let g = fs[0];
    let members = g["members"].as_array().map_or(0, Vec::len);
    assert!(members >= 2, "grouped: {g}");
    let calls = g["evidence"]["calls"].as_u64().unwrap();
    eprintln!("pg_stat_wal.wal_sync: inside {inner} <= triage {calls} <= outside {outer}; {members} members");
    assert!(
        inner > 0 && inner <= calls && calls <= outer,
        "wal_sync inside {inner} <= calls {calls} <= outside {outer}: {g}"
    );
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

#[test]
fn context_switch_storm_ranks_first() {
    require_root();
    let _s = serial();
    let innocents = Innocents::start("triage-ctxsw-innocents", 14_000);
    let mut report = Value::Null;
    let (f, _) = triage(6, &[], || report = run_workload(&["pingpong", "150000"]));
    let storm = f
        .iter()
        .find(|x| x["cause"] == "ctxsw-storm")
        .unwrap_or_else(|| panic!("no ctxsw-storm finding: {:#?}", brief(&f)));
    assert_eq!(storm["rank"], 1, "{:#?}", brief(&f));
    let procs: Vec<u64> = report["procs"]
        .as_array()
        .map(|a| a.iter().filter_map(|p| p["pid"].as_u64()).collect())
        .unwrap_or_default();
    let pid = storm["pid"].as_u64().unwrap();
    assert!(
        procs.contains(&pid) || report["pid"] == pid,
        "the storm names {pid}, the ping-pong is {report}"
    );
    innocents.assert_unnamed(&f);
}

/// A latency-sensitive process that sleeps 1 ms at a time, pinned to the CPU where two hogs
/// spin: it is the victim (runq-delay, ranked first) and a hog is the culprit.
#[test]
fn starved_sleeper_ranks_first_with_the_hog_as_culprit() {
    require_root();
    let _s = serial();
    let cpu = (std::thread::available_parallelism().map_or(1, |n| n.get()) - 1).to_string();
    // Two spinners at nice -10 on the last CPU: CFS then gives the sleeper's wakeups no
    // precedence over them, as a batch job at a higher priority would.
    let hogs = niced_hogs("7000");
    std::thread::sleep(Duration::from_millis(300));
    sleeper_ranks_first(&cpu, hogs);
}

/// The hogs' pids from `spin`'s report.
fn hog_pids(hogs: Child) -> Vec<u64> {
    let w: Value = serde_json::from_slice(&hogs.wait_with_output().unwrap().stdout).unwrap();
    w["procs"]
        .as_array()
        .map(|a| a.iter().filter_map(|p| p["pid"].as_u64()).collect())
        .unwrap_or_default()
}

/// Runs the 1 ms sleeper on `cpu` for 5 s under a 6 s triage beside `hogs` (its own clock is
/// printed), and checks that it ranks first as a run-queue victim with a hog as culprit: the
/// findings and the hogs' pids.
fn sleeper_ranks_first(cpu: &str, hogs: Child) -> (Vec<Value>, Vec<u64>) {
    let mut victim = Value::Null;
    let (f, _) = triage(6, &[], || {
        victim = run_workload(&["triage-sleeper", cpu, "5000"]);
    });
    let hog_pids = hog_pids(hogs);
    eprintln!("sleeper's own clock: {victim}");
    eprintln!("findings: {:#?}", brief(&f));
    let first = &f[0];
    assert_eq!(first["cause"], "runq-delay", "{:#?}", brief(&f));
    assert_eq!(first["pid"], victim["pid"], "{:#?}", brief(&f));
    let culprit = first["culprit_pid"].as_u64().unwrap_or(0);
    assert!(
        hog_pids.contains(&culprit),
        "culprit {culprit}, hogs {hog_pids:?}: {first}"
    );
    (f, hog_pids)
}

/// The field report's case: a 1 ms sleeper pinned beside two CPU hogs at the default nice
/// level, with two innocent busy processes. It loses only a few percent of its time, but its
/// wakeups wait milliseconds behind a hog: it ranks first, a hog as culprit, and no hog is a
/// victim (the hogs are the saturation finding's culprits). Its own clock is printed beside.
#[test]
fn sleeper_beside_hogs_at_nice_0_ranks_first_among_innocents() {
    require_root();
    let _s = serial();
    let cpu = (std::thread::available_parallelism().map_or(1, |n| n.get()) - 1).to_string();
    let _innocents = Innocents::start("triage-nice0", 9_000);
    let hogs = hogs_at("8000", 0);
    std::thread::sleep(Duration::from_millis(300));
    let (f, hog_pids) = sleeper_ranks_first(&cpu, hogs);
    let first = &f[0];
    // What it felt, in the finding: late waits, and a p99.9 its own clock saw as overshoot.
    assert!(
        first["evidence"]["wake_late"].as_u64().unwrap_or(0) > 0,
        "{first}"
    );
    for x in &f {
        if x["cause"] == "runq-delay" {
            let pid = x["pid"].as_u64().unwrap_or(0);
            assert!(!hog_pids.contains(&pid), "a hog as a victim: {x}");
        }
    }
    let sat: Vec<&Value> = f.iter().filter(|x| x["cause"] == "cpu-saturated").collect();
    assert_eq!(sat.len(), 1, "{:#?}", brief(&f));
    assert!(
        hog_pids.contains(&sat[0]["culprit_pid"].as_u64().unwrap_or(0)),
        "{}",
        sat[0]
    );
}

/// Two cgroups of the CPU controller with equal weights (v1 `cpu.shares` 1024, or v2
/// `cpu.weight` 100, the defaults, written anyway), removed on drop, and on v2 the controller
/// enabled at the root for the test if it was not (put back on drop).
struct EqualCpuGroups {
    dirs: Vec<std::path::PathBuf>,
    enabled_cpu: Option<std::path::PathBuf>,
}

impl EqualCpuGroups {
    fn new(names: &[&str]) -> EqualCpuGroups {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let (mut v1, mut v2) = (None, None);
        for l in info.lines() {
            let Some((pre, post)) = l.split_once(" - ") else {
                continue;
            };
            let mp = pre.split_whitespace().nth(4).map(std::path::PathBuf::from);
            let mut post = post.split_whitespace();
            let fstype = post.next().unwrap_or("");
            let opts = post.nth(1).unwrap_or("");
            if fstype == "cgroup" && opts.split(',').any(|o| o == "cpu") {
                v1 = mp;
            } else if fstype == "cgroup2" && v2.is_none() {
                v2 = mp;
            }
        }
        let mut enabled_cpu = None;
        let (root, file, weight) = match (v1, v2) {
            (Some(r), _) => (r, "cpu.shares", "1024"),
            (None, Some(r)) => {
                let ctl = r.join("cgroup.subtree_control");
                let on = std::fs::read_to_string(&ctl).unwrap_or_default();
                if !on.split_whitespace().any(|c| c == "cpu") {
                    std::fs::write(&ctl, "+cpu").expect("enable the cpu controller");
                    enabled_cpu = Some(ctl);
                }
                (r, "cpu.weight", "100")
            }
            (None, None) => panic!("no cgroup hierarchy with the cpu controller"),
        };
        let me = std::process::id();
        let dirs: Vec<std::path::PathBuf> = names
            .iter()
            .map(|n| root.join(format!("tk-{n}-{me}")))
            .collect();
        for d in &dirs {
            std::fs::create_dir_all(d).unwrap_or_else(|e| panic!("mkdir {}: {e}", d.display()));
            std::fs::write(d.join(file), weight)
                .unwrap_or_else(|e| panic!("{}/{file}: {e}", d.display()));
        }
        EqualCpuGroups { dirs, enabled_cpu }
    }

    /// `tk-workload ARGS` started inside group `i` (a shell moves itself in, then execs).
    fn spawn(&self, i: usize, args: &[&str]) -> Child {
        Command::new("sh")
            .arg("-c")
            .arg(format!(
                "echo $$ > {}/cgroup.procs && exec {} {}",
                self.dirs[i].display(),
                workload_bin().display(),
                args.join(" ")
            ))
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn a workload in a cgroup")
    }
}

impl Drop for EqualCpuGroups {
    fn drop(&mut self) {
        for _ in 0..100 {
            for d in &self.dirs {
                let _ = std::fs::remove_dir(d);
            }
            if self.dirs.iter().all(|d| !d.exists()) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if let Some(ctl) = &self.enabled_cpu {
            let _ = std::fs::write(ctl, "-cpu");
        }
    }
}

/// #26's second shape of the field case: the sleeper and the hogs at nice 0, each in a cgroup
/// of its own with equal CPU weights (as two containers or two systemd services get by
/// default), so the scheduler shares the CPU between the groups before the tasks. What the
/// sleeper felt (its own clock) decides what triage must say. Here its sleeps overshot by
/// p99 0.11 ms but up to 3.9 ms: late in the tail, and triage said "1 in 353 wakeups waited
/// over 1.00ms, p99.9 3.54ms, max 3.95ms", first, behind the hogs; that is near the harm
/// model's threshold, so the test judges by the sleeper's own late sleeps (below). No hog is
/// a victim either way.
#[test]
fn sleeper_beside_hogs_in_equal_weight_cgroups_is_judged_by_what_it_felt() {
    require_root();
    let _s = serial();
    let cpu = (std::thread::available_parallelism().map_or(1, |n| n.get()) - 1).to_string();
    let groups = EqualCpuGroups::new(&["sleeper", "hogs"]);
    let innocents = Innocents::start("triage-cgroups", 9_000);
    let hogs = groups.spawn(1, &["spin", "8000"]);
    std::thread::sleep(Duration::from_millis(300));
    let mut victim = Value::Null;
    let (f, _) = triage(6, &[], || {
        let out = groups
            .spawn(0, &["triage-sleeper", &cpu, "5000"])
            .wait_with_output()
            .unwrap();
        victim = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("the sleeper failed ({e}): {out:?}"));
    });
    let hog_pids = hog_pids(hogs);
    eprintln!("sleeper's own clock: {victim}");
    eprintln!("findings: {:#?}", brief(&f));
    // Judged by the kernel's account of its run-queue waits around each sleep (run_delay) in
    // the harm model's terms (report::harm: at least 5 late waits, 1 in 1000, 5 ms/s of
    // excess), with a factor 2 of margin: clearly hurt → above every finding but the
    // innocents', its culprit none of them, no wait longer than its latest sleep; never 1 ms
    // late → no victim; in between either (fresh-clone runs here: max 4.0 ms late both times,
    // once named with 7.45 ms/s of excess, once not). Not by its oversleeping alone: a guest's
    // vCPU preempted by the host oversleeps with no run-queue wait (17.6 ms once, 11 late
    // sleeps, where triage rightly saw no victim).
    let max = victim["overshoot_max_ns"]
        .as_u64()
        .expect("overshoot_max_ns");
    let late = victim["runq_late_1ms"].as_u64().expect("runq_late_1ms");
    let excess_per_s = victim["runq_excess_ns"].as_u64().unwrap_or(0) / 5;
    let wakeups = victim["wakeups"].as_u64().unwrap_or(0);
    let named = |x: &Value| x["cause"] == "runq-delay" && x["pid"] == victim["pid"];
    if late >= 10 && late * 500 >= wakeups && excess_per_s >= 10_000_000 {
        // Ranked above the saturation and every hog; first on a quiet host. On a busy one the
        // innocents may be hurt more by the host's own load and rightly rank above it (a busy
        // loop beside the test: the 3 ms burster at 418 ms/s of excess, the sleeper 10.9).
        let at = f.iter().position(named).unwrap_or_else(|| {
            panic!(
                "{late} sleeps late, {excess_per_s} ns/s of excess, no finding: {:#?}",
                brief(&f)
            )
        });
        let innocents = innocents.pids();
        for x in &f[..at] {
            let pid = x["pid"].as_u64().unwrap_or(0);
            assert!(
                x["cause"] != "cpu-saturated" && innocents.contains(&pid),
                "ranked below {x}: {:#?}",
                brief(&f)
            );
        }
        let mine = &f[at];
        let culprit = mine["culprit_pid"].as_u64().unwrap_or(0);
        assert!(
            !innocents.contains(&culprit) && culprit != victim["pid"].as_u64().unwrap_or(0),
            "culprit {culprit}, hogs {hog_pids:?}: {mine}"
        );
        // Each wait is inside that sleep's overshoot; the histogram's bucket bound adds < 10 %.
        let wait_max = mine["evidence"]["wake_max_ns"].as_u64().unwrap_or(u64::MAX);
        assert!(
            wait_max <= max + max / 10 + 100_000,
            "a wait of {wait_max} ns, but no sleep was more than {max} ns late: {mine}"
        );
    } else if late == 0 {
        assert!(
            !f.iter().any(named),
            "never waited 1 ms for a CPU by the kernel's run_delay (at most {} ns), yet a victim: {:#?}",
            victim["runq_max_ns"],
            brief(&f)
        );
    }
    for x in &f {
        if x["cause"] == "runq-delay" {
            let pid = x["pid"].as_u64().unwrap_or(0);
            assert!(!hog_pids.contains(&pid), "a hog as a victim: {x}");
        }
    }
}

/// Two CPU hogs alone on one CPU: a busy node, nothing latency-sensitive hurt. One saturation
/// finding (a hog its culprit, the CPU pressure in it), no victim.
#[test]
fn a_merely_busy_node_is_one_saturation_finding_and_no_victim() {
    require_root();
    let _s = serial();
    let hogs = hogs_at("6500", 0);
    std::thread::sleep(Duration::from_millis(300));
    let (f, _) = triage(5, &[], || {});
    let hog_pids = hog_pids(hogs);
    eprintln!("findings: {:#?}", brief(&f));
    let sat: Vec<&Value> = f.iter().filter(|x| x["cause"] == "cpu-saturated").collect();
    assert_eq!(sat.len(), 1, "{:#?}", brief(&f));
    assert!(
        hog_pids.contains(&sat[0]["culprit_pid"].as_u64().unwrap_or(0)),
        "{}",
        sat[0]
    );
    assert!(
        f.iter().all(|x| x["cause"] != "runq-delay"),
        "no victim on a merely busy node: {:#?}",
        brief(&f)
    );
    assert!(
        f.iter().all(|x| x["cause"] != "pressure"),
        "the CPU pressure is the saturation's, not a finding of its own: {:#?}",
        brief(&f)
    );
}

/// A WAL-like fsync loop (`triage-fsync` on `wal`, 6 s) with `other` running beside it during
/// an 8 s triage: the findings in rank order, the loop's report and what `other` returned. The
/// first finding must be the loop's fsync finding (checked here).
#[cfg(test)]
fn fsync_loop_beside(wal: &std::path::Path, other: impl FnOnce() -> Value) -> (Vec<Value>, Value) {
    let (mut report, mut theirs) = (Value::Null, Value::Null);
    let (f, _) = triage(8, &[], || {
        let w = Command::new(workload_bin())
            .args(["triage-fsync", wal.to_str().unwrap(), "6000"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the fsync loop");
        theirs = other();
        let out = w.wait_with_output().unwrap();
        report = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("the fsync loop failed ({e}): {out:?}"));
    });
    eprintln!("fsync loop: {report}; beside it: {theirs}");
    eprintln!("findings: {:#?}", brief(&f));
    assert_eq!(f[0]["cause"], "fsync", "{:#?}", brief(&f));
    assert_eq!(f[0]["pid"], report["pid"], "{:#?}", brief(&f));
    (f, theirs)
}

/// A WAL-like fsync loop on a disk that an O_DIRECT writer floods (queue depth 32, another file
/// of the same ext4 file system), among innocents: the fsync loop ranks first and names the
/// flood as its culprit, measured as its share of the disk's request time.
#[test]
fn fsync_loop_beside_a_direct_io_flood_names_the_flood() {
    require_root();
    let _s = serial();
    io::ensure_fio();
    let innocents = Innocents::start("triage-flood-innocents", 14_000);
    let lo = io::LoopDev::new("triage-flood");
    let m = io::Mounted::new(&lo).expect("mkfs.ext4 (e2fsprogs) is on every Debian system");
    let (wal, flood) = (m.mnt.join("wal.log"), m.mnt.join("flood"));
    let (f, job) = fsync_loop_beside(&wal, || {
        io::fio(
            flood.to_str().unwrap(),
            &[
                // A 16 MiB file of the 64 MiB disk: room left for the WAL.
                "--size=16M",
                "--rw=randwrite",
                "--bs=4k",
                "--ioengine=libaio",
                "--iodepth=32",
                "--time_based",
                "--runtime=6",
            ],
        )
    });
    eprintln!(
        "fio: {} writes, clat p99 {} ns",
        job["write"]["total_ios"], job["write"]["clat_ns"]["percentile"]["99.000000"]
    );
    let first = &f[0];
    assert_eq!(first["culprit_comm"], "fio", "{first}");
    assert!(
        first["evidence"]["culprit_disk_share_ppm"]
            .as_u64()
            .unwrap_or(0)
            >= 500_000,
        "{first}"
    );
    innocents.assert_unnamed(&f);
}

/// A WAL-like fsync loop on a disk whose page cache a bulk writer keeps dirty (another file of
/// the same ext4 file system, rewritten at 200 MiB/s, never synced), among innocents: the
/// flusher's writeback is what the loop waits behind, and the finding names the process that
/// dirtied those pages (io-lat's dirtied rows), not the kworker. Background writeback starts at
/// 4 MiB of dirty pages for the test, so the flusher runs the whole window, as on a node whose
/// writers outpace the threshold.
#[test]
fn fsync_loop_beside_background_writeback_names_the_dirtier() {
    require_root();
    let _s = serial();
    let innocents = Innocents::start("triage-wb-innocents", 14_000);
    let lo = io::LoopDev::new("triage-wb");
    let m = io::Mounted::new(&lo).expect("mkfs.ext4 (e2fsprogs) is on every Debian system");
    let _wb = background_writeback_from(4 << 20);
    let (wal, bulk) = (m.mnt.join("wal.log"), m.mnt.join("bulk"));
    let (f, writer) = fsync_loop_beside(&wal, || {
        run_workload(&["bulk-rewrite", bulk.to_str().unwrap(), "32", "6000", "5000"])
    });
    let first = &f[0];
    assert_eq!(first["culprit_pid"], writer["pid"], "{first}");
    let ev = &first["evidence"];
    assert!(
        ev["culprit_disk_share_ppm"].as_u64().unwrap_or(0) >= 500_000
            && ev["culprit_dirtied_share_ppm"].as_u64().unwrap_or(0) >= 500_000,
        "{first}"
    );
    // What it dirtied in the window is at most what its own counter says it dirtied.
    assert!(
        ev["culprit_dirtied_bytes"].as_u64().unwrap_or(0)
            <= writer["write_bytes"].as_u64().unwrap(),
        "{first} vs {writer}"
    );
    innocents.assert_only_victims_of(&f, &writer["pid"]);
}

/// The same fsync loop beside a bulk writer held at its memory cgroup's limit (16 MiB for a
/// 32 MiB file), with the host's own writeback settings: reclaim in the cgroup finds the
/// writer's dirty pages and wakes the flusher, whose writeback the loop then waits behind. On a
/// v1 host (this one) that writeback is charged to the root cgroup, so the finding names the
/// writer by what it dirtied; on v2 the kernel charges it to the cgroup, named as such.
#[test]
fn fsync_loop_beside_a_writer_at_its_memcg_limit_names_the_writer() {
    require_root();
    let _s = serial();
    let cg = Cgroup::create("triage-wbcg", 16 << 20);
    let innocents = Innocents::start("triage-wbcg-innocents", 14_000);
    let lo = io::LoopDev::new("triage-wbcg");
    let m = io::Mounted::new(&lo).expect("mkfs.ext4 (e2fsprogs) is on every Debian system");
    let (wal, bulk) = (m.mnt.join("wal.log"), m.mnt.join("bulk"));
    let procs = cg.procs();
    let (f, writer) = fsync_loop_beside(&wal, || {
        run_workload(&[
            "bulk-rewrite",
            bulk.to_str().unwrap(),
            "32",
            "6000",
            // 100 MiB/s: reclaim in the cgroup costs CPU (2.4 s in 6 s at 200 MiB/s), and at
            // that rate the page-cache innocent waited 6 % of its time behind the writer in a
            // CI run; the writeback still holds the disk (measured below).
            "10000",
            procs.to_str().unwrap(),
        ])
    });
    let first = &f[0];
    let by_cgroup = first["culprit"]["name"].as_str() == Some(&format!("/{}", cg.name));
    assert!(
        first["culprit_pid"] == writer["pid"] || by_cgroup,
        "the writer or its cgroup is the culprit: {first}"
    );
    innocents.assert_only_victims_of(&f, &writer["pid"]);
}

/// O_DIRECT random writes at queue depth 32 on a device behind mq-deadline: io-queue (or
/// io-latency) on that device, ranked first.
#[test]
fn deep_direct_io_queue_ranks_first() {
    require_root();
    let _s = serial();
    io::ensure_fio();
    let _innocents = Innocents::start("triage-io-innocents", 14_000);
    let lo = io::LoopDev::new("triage-io");
    lo.set("scheduler", "mq-deadline");
    lo.set("nr_requests", "4");
    let (f, _) = triage(8, &[], || {
        io::fio(
            &lo.dev,
            &[
                "--rw=randwrite",
                "--bs=4k",
                "--ioengine=libaio",
                "--iodepth=32",
                "--time_based",
                "--runtime=6",
            ],
        );
    });
    assert!(!f.is_empty(), "no finding");
    let first = &f[0];
    assert!(
        first["cause"] == "io-queue" || first["cause"] == "io-latency",
        "{:#?}",
        brief(&f)
    );
    assert!(
        first["summary"].as_str().unwrap_or("").contains(&lo.name)
            || first["subject"]["name"]
                .as_str()
                .unwrap_or("")
                .contains(&lo.name),
        "{first}"
    );
}

/// THP `defrag=always` with every free 2 MiB block held by the hugetlb pool, so what is free is
/// fragmented: each THP fault of `dd`'s 256 MiB buffer compacts directly. thp-compaction, `dd`
/// named, ranked first; the node's `compact_stall` moved (settings restored after).
#[test]
fn thp_direct_compaction_ranks_first() {
    require_root();
    let _s = serial();
    let _enabled = Setting::set(THP_ENABLED, "always");
    let _defrag = Setting::set(THP_DEFRAG, "always");
    let innocents = Innocents::start("triage-thp-innocents", 12_000);
    let before = vmstat("compact_stall");
    let mut pid = 0;
    let (f, _) = triage(8, &[], || {
        let _pool = hold_free_huge_blocks();
        let mut dd = Command::new("dd")
            .args([
                "if=/dev/zero",
                "of=/dev/null",
                "bs=256M",
                "count=1",
                "status=none",
            ])
            .spawn()
            .expect("dd");
        pid = dd.id() as u64;
        assert!(dd.wait().unwrap().success());
    });
    let stalls = vmstat("compact_stall") - before;
    assert!(stalls > 0, "dd caused no direct compaction");
    assert!(!f.is_empty(), "no finding (compact_stall +{stalls})");
    assert_eq!(f[0]["cause"], "thp-compaction", "{:#?}", brief(&f));
    assert_eq!(f[0]["pid"], pid, "{:#?}", brief(&f));
    assert!(f[0]["score_ns_per_s"].as_u64().unwrap() > 0, "{}", f[0]);
    innocents.assert_unnamed(&f);
}

/// A writer in a 32 MiB memory cgroup writing 768 MiB: every page past the limit is reclaimed
/// first, inside its writes. memcg-limit, the writer and its cgroup named, ranked first.
#[test]
fn memcg_at_its_limit_ranks_first() {
    require_root();
    let _s = serial();
    let cg = Cgroup::create("triage-memcg", 32 << 20);
    let dir = scratch("triage-memcg");
    let file = dir.join("big");
    let innocents = Innocents::start("triage-memcg-innocents", 12_000);
    let mut w = Value::Null;
    let (f, _) = triage(8, &[], || {
        w = run_workload(&[
            "memcg-write",
            cg.procs().to_str().unwrap(),
            file.to_str().unwrap(),
            "768",
        ]);
    });
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!f.is_empty(), "no finding");
    assert_eq!(f[0]["cause"], "memcg-limit", "{:#?}", brief(&f));
    assert_eq!(f[0]["pid"], w["pid"], "{:#?}", brief(&f));
    assert!(
        f[0]["summary"]
            .as_str()
            .unwrap_or("")
            .contains(&format!("/{}", cg.name)),
        "the cgroup is named: {}",
        f[0]
    );
    innocents.assert_unnamed(&f);
}

/// #26 (3), reclaim linked to who fills the memory cgroup: a service allocating 2 MiB every
/// 20 ms shares a 64 MiB cgroup with a writer filling it with page cache at 400 MiB/s (alone
/// in the cgroup the service never reclaims). The service stalls in memcg reclaim for the writer's pages:
/// its finding names the writer (most of the pages the cgroup reclaimed) and ranks above the
/// writer's own, which says whom it stalls. The service's own clock is printed beside.
#[test]
fn service_stalled_at_its_memcg_limit_names_the_filler() {
    require_root();
    let _s = serial();
    let cg = Cgroup::create("triage-memcg-fill", 64 << 20);
    let dir = scratch("triage-memcg-fill");
    let file = dir.join("fill");
    let innocents = Innocents::start("triage-memcg-fill-innocents", 12_000);
    let procs = cg.procs();
    let procs = procs.to_str().unwrap();
    let (mut svc, mut fill) = (Value::Null, Value::Null);
    let (f, _) = triage(8, &[], || {
        std::thread::scope(|s| {
            let filler =
                s.spawn(|| run_workload(&["memcg-fill", procs, file.to_str().unwrap(), "6000"]));
            std::thread::sleep(Duration::from_millis(500));
            svc = run_workload(&["memcg-service", procs, "5000"]);
            fill = filler.join().unwrap();
        });
    });
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!(
        "service's own clock: {svc}; filler: {fill}; findings {:#?}",
        brief(&f)
    );
    assert!(
        svc["over_1ms"].as_u64().unwrap_or(0) > 0,
        "the staged service never waited: {svc}"
    );
    let victim = f
        .iter()
        .find(|x| x["cause"] == "memcg-limit" && x["pid"] == svc["pid"])
        .unwrap_or_else(|| panic!("no memcg-limit finding for the service: {:#?}", brief(&f)));
    assert_eq!(victim["culprit_pid"], fill["pid"], "{victim}");
    assert!(
        victim["evidence"]["culprit_reclaim_share_ppm"]
            .as_u64()
            .unwrap_or(0)
            >= 500_000,
        "{victim}"
    );
    // What it felt, bounded by its own clock: no stall longer than its longest allocation.
    assert!(
        victim["evidence"]["max_ns"].as_u64().unwrap_or(u64::MAX)
            <= svc["max_ns"].as_u64().unwrap_or(0),
        "{victim} vs {svc}"
    );
    assert_eq!(
        f[0]["pid"],
        svc["pid"],
        "the victim ranks first: {:#?}",
        brief(&f)
    );
    if let Some(w) = f
        .iter()
        .find(|x| x["cause"] == "memcg-limit" && x["pid"] == fill["pid"])
    {
        assert!(w["rank"].as_u64() > victim["rank"].as_u64(), "{w}");
        assert!(
            w["summary"].as_str().unwrap_or("").contains("It fills /"),
            "{w}"
        );
    }
    // The service's reclaim is CPU work too (it reclaims the writer's pages in its own time):
    // the 0.5 ms burster beside it felt that in a run here (1 in 83 wakeups over 1 ms, 58 ms
    // of its long waits behind the service). An innocent may be told only as a victim of one
    // of the two, below the staged victim.
    for x in f
        .iter()
        .filter(|x| innocents.pids().contains(&x["pid"].as_u64().unwrap_or(0)))
    {
        let by_staged = x["culprit_pid"] == fill["pid"] || x["culprit_pid"] == svc["pid"];
        assert!(
            by_staged && x["rank"].as_u64() > Some(1),
            "{:#?}",
            brief(&f)
        );
    }
}

/// Only the innocents: nothing names them.
#[test]
fn innocents_alone_are_not_named() {
    require_root();
    let _s = serial();
    let innocents = Innocents::start("triage-quiet", 10_000);
    let (f, checked) = triage(5, &[], || {});
    innocents.assert_unnamed(&f);
    assert!(checked["node_checks"].as_array().unwrap().len() >= 5);
}

/// lo's receive work steered to one CPU with RPS (`rps_cpus` of lo's only queue), the mask
/// before put back when dropped, a failed test included.
struct RpsOnLo(String);

const LO_RPS: &str = "/sys/class/net/lo/queues/rx-0/rps_cpus";

impl RpsOnLo {
    fn steer_to(cpu: usize) -> RpsOnLo {
        let before = std::fs::read_to_string(LO_RPS).expect("lo's rps_cpus");
        std::fs::write(LO_RPS, format!("{:x}", 1u64 << cpu)).expect("write lo's rps_cpus");
        RpsOnLo(before.trim().to_string())
    }
}

impl Drop for RpsOnLo {
    fn drop(&mut self) {
        let _ = std::fs::write(LO_RPS, &self.0);
    }
}

/// A CPU's softirq ticks and all its ticks now (/proc/stat's `cpuN` line).
fn cpu_softirq_ticks(cpu: usize) -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap();
    let line = stat
        .lines()
        .find(|l| l.starts_with(&format!("cpu{cpu} ")))
        .expect("a cpuN line");
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|x| x.parse().unwrap())
        .collect();
    (v[6], v.iter().sum())
}

/// The kernel's softirq work as the culprit: lo's receive work steered to the last CPU (RPS),
/// a UDP flood sent from CPU 0 to a port nobody listens on, and a sleeper woken every 250 us
/// pinned to the last CPU, the innocents on CPU 0. No process holds the sleeper's CPU: its
/// long waits are spent behind that CPU's ksoftirqd, which runs the receive work the
/// interrupt exits could not finish. The first finding names the CPU (its softirq share as
/// /proc/stat counted it) for the sleeper, whenever the sleeper's own account says it was
/// hurt, and the findings about that CPU rank below it.
#[test]
fn a_sleeper_on_the_cpu_that_runs_receive_softirqs_names_that_cpu() {
    require_root();
    let _s = serial();
    let ncpu = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(
        ncpu >= 2,
        "the incident needs two CPUs, this node has {ncpu}"
    );
    let cpu = ncpu - 1;
    let innocents = Innocents::start_on(&scratch("triage-softirq"), 12_000, Some("0"));
    let _rps = RpsOnLo::steer_to(cpu);
    // A port nobody listens on: each datagram is received (on the steered CPU) and dropped.
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .map(|a| a.port())
        .unwrap();
    let (mut victim, mut softirq_ns, mut flood_pid) = (Value::Null, 0u64, Value::Null);
    let (f, _) = triage(7, &[], || {
        // The sender runs on CPU 0 at SCHED_IDLE, a process of its own (a SCHED_IDLE thread
        // of this test was judged by the test's main thread, nice 0, and named as the
        // culprit of an innocent's waits beside a busy machine's hog): it takes what the
        // innocents leave there and delays none of them (at nice 0 it delayed the 0.5 ms
        // burster, a true finding but not this incident's).
        let t0 = cpu_softirq_ticks(cpu);
        let flood = ends_with_the_test(&mut Command::new(workload_bin()))
            .args(["triage-udp-flood", &port.to_string(), "5300"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the UDP flood");
        // Its first datagrams before the sleeper's first wakeup.
        std::thread::sleep(Duration::from_millis(100));
        victim = run_workload(&["triage-sleeper", &cpu.to_string(), "5000", "250"]);
        let out = flood.wait_with_output().expect("the UDP flood");
        let t1 = cpu_softirq_ticks(cpu);
        let sent: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("the UDP flood failed ({e}): {out:?}"));
        flood_pid = sent["pid"].clone();
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        softirq_ns = (t1.0 - t0.0) * 1_000_000_000 / hz;
        eprintln!(
            "flood: {sent}; CPU {cpu} in softirqs {} ppm of the flood, {softirq_ns} ns",
            (t1.0 - t0.0) * 1_000_000 / (t1.1 - t0.1).max(1)
        );
    });
    eprintln!("sleeper's own clock: {victim}");
    eprintln!("findings: {:#?}", brief(&f));
    // The rule's floor: a tenth of the 7 s window in softirqs (harm::MIN_SOFTIRQ_CPU_PPM).
    // Beside a nice-19 hog the CPU ran 0.99-1.6 s of them (ksoftirqd itself waited 30 % of
    // the flood behind the hog, by its schedstat), 3.7-4.0 s on a quiet node.
    assert!(
        softirq_ns >= 700_000_000,
        "the staged incident did not load CPU {cpu} with softirqs: {softirq_ns} ns"
    );
    // Judged by the sleeper's own account of its run-queue waits around each sleep, in the
    // harm model's terms (5 late waits, 5 ms/s of excess over its 5 s) with a factor 2 of
    // margin: clearly hurt, it is named, and only another process's wait ranks above it.
    // Beside a nice-19 hog a process of the node's own (its agent) waited 1.8-4.7 s at once
    // behind ksoftirqd/1 or the hog, and ranked first, rightly; the sleeper was at times
    // barely hurt then (3-18 waits over 1 ms, at most 40 ms of excess). What the sleeper is
    // told, if named, is checked.
    let hurt = victim["runq_late_1ms"].as_u64().unwrap_or(0) >= 10
        && victim["runq_excess_ns"].as_u64().unwrap_or(0) >= 50_000_000;
    let Some(first) = f.iter().find(|x| x["pid"] == victim["pid"]) else {
        assert!(!hurt, "the hurt sleeper is not named: {:#?}", brief(&f));
        eprintln!("the sleeper was not hurt and not named");
        return;
    };
    let staged: Vec<u64> = [&victim["pid"], &flood_pid]
        .iter()
        .filter_map(|p| p.as_u64())
        .chain(innocents.pids())
        .collect();
    for x in f.iter().take_while(|x| x["pid"] != victim["pid"]) {
        assert!(
            x["cause"] == "runq-delay" && !staged.contains(&x["pid"].as_u64().unwrap_or(0)),
            "ranked above the sleeper: {:#?}",
            brief(&f)
        );
    }
    assert_eq!(first["cause"], "runq-delay", "{first}");
    assert_eq!(first["culprit"]["kind"], "cpu", "{first}");
    assert_eq!(first["culprit"]["name"], format!("CPU {cpu}"), "{first}");
    assert_eq!(first["evidence"]["softirq_cpu"], cpu as u64, "{first}");
    // Its window (7 s) holds the flood, which ran while the sleeper did: the softirq time it
    // says the CPU spent is the time /proc/stat counted over the flood, within a tenth (the
    // ticks outside the flood, and one tick each side).
    let seen = first["evidence"]["cpu_softirq_ppm"].as_u64().unwrap_or(0)
        * first["evidence"]["window_ns"].as_u64().unwrap_or(0)
        / 1_000_000;
    assert!(
        seen.abs_diff(softirq_ns) <= softirq_ns / 10 + 20_000_000,
        "triage's {seen} ns of softirq against /proc/stat's {softirq_ns} over the flood: {first}"
    );
    // ksoftirqd held most of the waits the finding is about: its long waits when judged by
    // its tail, all of them when (its median wait itself long) it is judged starved. Its own
    // account of its run-queue time (run_delay around each sleep) saw those waits.
    let e = &first["evidence"];
    let (held, of) = match e.get("culprit_late_delay_ns") {
        Some(h) => (h, &e["wake_long_total_ns"]),
        None => (&e["culprit_delay_ns"], &e["wake_wait_total_ns"]),
    };
    let (held, of) = (held.as_u64().unwrap_or(0), of.as_u64().unwrap_or(0));
    assert!(held * 2 >= of && held > 0, "{first}");
    assert!(
        held <= e["kernel_run_delay_ns"].as_u64().unwrap_or(0) * 11 / 10,
        "ksoftirqd's part is within the run_delay the kernel counted: {first}"
    );
    for x in f
        .iter()
        .filter(|x| x["subject"]["name"] == format!("CPU {cpu}"))
    {
        assert!(
            x["rank"].as_u64().unwrap_or(0) > first["rank"].as_u64().unwrap_or(0)
                && x["summary"].as_str().unwrap_or("").contains("It delays"),
            "{x}"
        );
    }
    innocents.assert_far_below(&f, first);
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

/// Workloads for the incidents (tk-workload dispatches here).
pub fn workload(args: &[String]) -> Option<i32> {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    match a.as_slice() {
        ["triage-duty", ms] => {
            // A third of a CPU in 0.5 ms runs, 1 ms asleep between: busy, and never in anyone's
            // way for long enough to be felt (a late wait is 1 ms or more, report::harm). With
            // 3 ms runs, the page-cache writer woken beside it waited out whole runs (1 wakeup
            // in 35 over 1 ms, p99.9 11.9 ms, 7.3 ms/s of excess) whenever the fsync incident
            // held the other CPU: a real victim, which the harm model names.
            let end = Instant::now() + Duration::from_millis(ms.parse().ok()?);
            while Instant::now() < end {
                let burst = Instant::now() + Duration::from_micros(500);
                while Instant::now() < burst {
                    std::hint::spin_loop();
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            println!("{}", json!({"pid": std::process::id()}));
        }
        ["triage-fsync", path, ms] => {
            // An append-and-fsync loop, like a ledger or a WAL without group commit.
            use std::io::Write;
            let mut f = std::fs::File::create(path).ok()?;
            let end = Instant::now() + Duration::from_millis(ms.parse().ok()?);
            let mut calls = 0u64;
            while Instant::now() < end {
                f.write_all(&[0x42; 512]).ok()?;
                f.sync_all().ok()?;
                calls += 1;
            }
            println!("{}", json!({"pid": std::process::id(), "calls": calls}));
        }
        ["triage-sleeper", cpu, ms, period @ ..] => {
            // A latency-sensitive loop: pinned to CPU, wakes every millisecond (or every
            // `period` microseconds) for a moment.
            let cpu: usize = cpu.parse().ok()?;
            let period = Duration::from_micros(match period {
                [us] => us.parse().ok()?,
                _ => 1_000,
            });
            // SAFETY: cpu_set_t is plain data; we set one bit and pin ourselves.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(cpu, &mut set);
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
            }
            // Its own clock is the ground truth of what it felt: each sleep's overshoot. The
            // kernel's own account of the part spent waiting for a CPU after each wakeup is
            // its run_delay (/proc/thread-self/schedstat), read around each sleep: a guest
            // whose vCPU the host preempts oversleeps without waiting in a run queue (a
            // fresh-clone run: 17.6 ms late once, 11 sleeps late, none of it run-queue time).
            let run_delay = || -> Option<u64> {
                std::fs::read_to_string("/proc/thread-self/schedstat")
                    .ok()?
                    .split_whitespace()
                    .nth(1)?
                    .parse()
                    .ok()
            };
            let end = Instant::now() + Duration::from_millis(ms.parse().ok()?);
            let (mut over, mut queued): (Vec<u64>, Vec<u64>) = (Vec::new(), Vec::new());
            while Instant::now() < end {
                let (t, d) = (Instant::now(), run_delay()?);
                std::thread::sleep(period);
                over.push((t.elapsed().as_nanos() as u64).saturating_sub(period.as_nanos() as u64));
                queued.push(run_delay()?.saturating_sub(d));
            }
            // The harm model's terms (report::harm): waits of 1 ms or more, and their excess
            // over the median.
            let terms = |v: &mut Vec<u64>| {
                v.sort_unstable();
                let q = |q: f64| v[((v.len() as f64 * q) as usize).min(v.len() - 1)];
                let late: Vec<u64> = v.iter().copied().filter(|o| *o >= 1_000_000).collect();
                let excess: u64 = late.iter().map(|o| o - q(0.5)).sum();
                (
                    q(0.5),
                    q(0.99),
                    v.last().copied().unwrap_or(0),
                    late.len(),
                    excess,
                )
            };
            let (p50, p99, max, late, excess) = terms(&mut over);
            let (rq_p50, rq_p99, rq_max, rq_late, rq_excess) = terms(&mut queued);
            println!(
                "{}",
                json!({"pid": std::process::id(), "wakeups": over.len(),
                       "overshoot_p50_ns": p50, "overshoot_p99_ns": p99,
                       "overshoot_max_ns": max, "late_1ms": late, "late_excess_ns": excess,
                       "runq_p50_ns": rq_p50, "runq_p99_ns": rq_p99, "runq_max_ns": rq_max,
                       "runq_late_1ms": rq_late, "runq_excess_ns": rq_excess})
            );
        }
        ["triage-udp-flood", port, ms] => {
            // Datagrams of 200 bytes to 127.0.0.1:PORT for MS, pinned to CPU 0 at SCHED_IDLE:
            // receive work for whichever CPU lo's RPS steers it to, sent in time nobody else
            // wanted on CPU 0.
            // SAFETY: cpu_set_t and sched_param are plain data; we pin ourselves and change
            // our own policy.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                libc::CPU_SET(0, &mut set);
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
                let p = libc::sched_param { sched_priority: 0 };
                if libc::sched_setscheduler(0, libc::SCHED_IDLE, &p) != 0 {
                    return Some(1);
                }
            }
            let port: u16 = port.parse().ok()?;
            let end = Instant::now() + Duration::from_millis(ms.parse().ok()?);
            // One socket, never bound to PORT itself: a fresh socket per batch once drew PORT
            // as its own ephemeral port and flooded itself (net-drops named it, rightly).
            let s = std::iter::repeat_with(|| std::net::UdpSocket::bind("127.0.0.1:0"))
                .take(8)
                .filter_map(Result::ok)
                .find(|s| s.local_addr().is_ok_and(|a| a.port() != port))?;
            let buf = [0x42u8; 200];
            let mut sent = 0usize;
            while Instant::now() < end {
                // ECONNREFUSED (an earlier datagram's ICMP) does not stop it: this one left.
                for _ in 0..1000 {
                    sent += usize::from(s.send_to(&buf, ("127.0.0.1", port)).is_ok());
                }
            }
            println!("{}", json!({"pid": std::process::id(), "sent": sent}));
        }
        ["triage-writer", path, ms] => {
            // 64 KiB to the page cache every 10 ms, rewinding at 16 MiB; never synced.
            use std::io::{Seek, Write};
            let mut f = std::fs::File::create(path).ok()?;
            let buf = vec![0x5a_u8; 64 << 10];
            let end = Instant::now() + Duration::from_millis(ms.parse().ok()?);
            let mut n = 0u64;
            while Instant::now() < end {
                f.write_all(&buf).ok()?;
                n += 1;
                if n.is_multiple_of(256) {
                    f.rewind().ok()?;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            println!("{}", json!({"pid": std::process::id(), "writes": n}));
        }
        ["bulk-rewrite", path, mib, ms, us_per_mib, rest @ ..] => {
            // A bulk writer: rewrites the first MIB MiB of PATH in 64 KiB buffered writes,
            // paced at US_PER_MIB (5000: 200 MiB/s, leaving the CPUs to others), until MS have
            // passed (one pass at least); never syncs. Optionally joins a cgroup first (its
            // `cgroup.procs`). Reports the bytes it dirtied by its own counter (/proc/self/io
            // write_bytes: the page cache counts each page it makes dirty).
            use std::io::{Seek, Write};
            if let [procs] = rest {
                std::fs::write(procs, std::process::id().to_string()).ok()?;
            }
            let write_bytes = || -> Option<u64> {
                let io = std::fs::read_to_string("/proc/self/io").ok()?;
                io.lines()
                    .find_map(|l| l.strip_prefix("write_bytes: "))?
                    .trim()
                    .parse()
                    .ok()
            };
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(false)
                .open(path)
                .ok()?;
            let (mib, start) = (mib.parse::<u64>().ok()?, Instant::now());
            let pace: u64 = us_per_mib.parse().ok()?;
            let end = start + Duration::from_millis(ms.parse().ok()?);
            let buf = vec![0xa5_u8; 64 << 10];
            let before = write_bytes()?;
            let mut written = 0u64;
            loop {
                for _ in 0..mib * 16 {
                    f.write_all(&buf).ok()?;
                    written += 1;
                    let due = start + Duration::from_micros(written * pace / 16);
                    if let Some(d) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(d);
                    }
                }
                if Instant::now() >= end {
                    break;
                }
                f.rewind().ok()?;
            }
            println!(
                "{}",
                json!({"pid": std::process::id(), "written_bytes": written << 16,
                       "write_bytes": write_bytes()? - before})
            );
        }
        ["triage-forks", per_s, ms] => {
            // A fork storm: `true` spawned PER_S times a second (paced in 10 ms steps), reaped
            // in batches, for MS.
            let per_s: u64 = per_s.parse().ok()?;
            let start = Instant::now();
            let end = start + Duration::from_millis(ms.parse().ok()?);
            let mut kids = Vec::new();
            let mut spawned = 0u64;
            while Instant::now() < end {
                let due = start.elapsed().as_millis() as u64 * per_s / 1000;
                while spawned < due {
                    kids.push(
                        Command::new("/bin/true")
                            .stdout(Stdio::null())
                            .spawn()
                            .ok()?,
                    );
                    spawned += 1;
                    if kids.len() >= 64 {
                        for mut k in kids.drain(..) {
                            let _ = k.wait();
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            for mut k in kids {
                let _ = k.wait();
            }
            println!("{}", json!({"pid": std::process::id(), "spawned": spawned}));
        }
        _ => return None,
    }
    Some(0)
}
