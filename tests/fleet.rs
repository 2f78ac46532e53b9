//! Root tests for the fleet: `tracekit serve` exports triage's findings
//! (`tracekit_finding_score`), a real Prometheus (Debian's) scrapes it and evaluates the
//! shipped rules (deploy/alerts.yml), and a real Alertmanager (Debian's
//! `prometheus-alertmanager`) sends what fires to a webhook this test serves and records, as a
//! team's pager would receive it. Staged one after another: an fsync storm, a context-switch
//! storm and a memory cgroup at its limit; each must fire its alert, naming the process and the
//! cause, and resolve when its workload ends; the quiet node before them fires nothing.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use serde_json::Value;
use tracekit_tests::{mm::Cgroup, prometheus::*, *};

/// serve's window in these tests: the rules' durations, written for 10 s windows, are scaled
/// to it (deploy/alerts.yml says to scale them with --interval).
const WINDOW_S: u64 = 2;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// deploy/alerts.yml with its durations scaled from 10 s windows to [`WINDOW_S`].
fn scaled_rules(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(repo().join("deploy/alerts.yml")).unwrap();
    assert!(
        text.contains("for: 10s") && text.contains("[30s]"),
        "{text}"
    );
    let scaled = text
        .replace("for: 10s", &format!("for: {WINDOW_S}s"))
        .replace("[30s]", &format!("[{}s]", 3 * WINDOW_S));
    let p = dir.join("alerts.yml");
    std::fs::write(&p, scaled).unwrap();
    p
}

/// An HTTP endpoint that records every JSON body POSTed to it (Alertmanager's webhook).
struct Webhook {
    port: u16,
    got: Arc<Mutex<Vec<Value>>>,
}

impl Webhook {
    fn start() -> Webhook {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let got = Arc::new(Mutex::new(Vec::new()));
        let g = got.clone();
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                let mut r = BufReader::new(&s);
                let mut len = 0usize;
                let mut line = String::new();
                while r.read_line(&mut line).is_ok_and(|n| n > 0) {
                    if line == "\r\n" {
                        break;
                    }
                    if let Some(v) = line
                        .to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().to_string())
                    {
                        len = v.parse().unwrap_or(0);
                    }
                    line.clear();
                }
                let mut body = vec![0u8; len];
                if r.read_exact(&mut body).is_ok() {
                    if let Ok(v) = serde_json::from_slice::<Value>(&body) {
                        g.lock().unwrap().push(v);
                    }
                }
                let _ = (&s).write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
            }
        });
        Webhook { port, got }
    }

    /// Notifications received so far.
    fn count(&self) -> usize {
        self.got.lock().unwrap().len()
    }

    /// Every alert of the notifications from the `since`-th on, with its status (`firing`,
    /// `resolved`) and the index of its notification.
    fn alerts(&self, since: usize) -> Vec<(usize, Value)> {
        self.got
            .lock()
            .unwrap()
            .iter()
            .enumerate()
            .skip(since)
            .flat_map(|(i, n)| {
                let a = n["alerts"].as_array().cloned().unwrap_or_default();
                a.into_iter().map(move |a| (i, a))
            })
            .collect()
    }

    /// Waits (at most `secs`) for an alert of `status` that `matches`, in the notifications
    /// from the `since`-th on: it, its notification's index, and when it was seen.
    fn wait(
        &self,
        status: &str,
        matches: impl Fn(&Value) -> bool,
        since: usize,
        secs: u64,
    ) -> Option<(Value, usize, Instant)> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let hit = self
                .alerts(since)
                .into_iter()
                .find(|(_, a)| a["status"] == status && matches(a));
            if let Some((i, a)) = hit {
                return Some((a, i, Instant::now()));
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// Debian's Alertmanager, sending every alert to `webhook` at once, killed on drop.
struct Alertmanager(Daemon);

const ALERTMANAGER: &str = "prometheus-alertmanager";

impl Alertmanager {
    fn start(webhook: u16) -> Alertmanager {
        ensure_daemon(ALERTMANAGER, ALERTMANAGER);
        let dir = scratch("alertmanager");
        let config = dir.join("alertmanager.yml");
        std::fs::write(
            &config,
            format!(
                "route:\n  receiver: hook\n  group_by: [alertname, instance, cause, comm]\n  group_wait: 1s\n  group_interval: 1s\n  repeat_interval: 1h\nreceivers:\n  - name: hook\n    webhook_configs:\n      - url: http://127.0.0.1:{webhook}/\n        send_resolved: true\n"
            ),
        )
        .unwrap();
        Alertmanager(Daemon::start(
            ALERTMANAGER,
            dir.clone(),
            &[
                format!("--config.file={}", config.display()),
                format!("--storage.path={}", dir.join("data").display()),
                // One instance: no gossip port to collide with another.
                "--cluster.listen-address=".to_string(),
            ],
        ))
    }
}

/// A workload started in the background in a process group of its own (the whole group
/// killed and the child reaped on drop: `pingpong` plays in two children of its own).
struct Bg(Child);

impl Bg {
    fn start(args: &[&str]) -> Bg {
        Bg::of(Command::new(workload_bin()).args(args))
    }

    /// Spawns `c`, killed with the test process if that dies first (no Drop runs then).
    fn of(c: &mut Command) -> Bg {
        use std::os::unix::process::CommandExt;
        // SAFETY: between fork and exec the child only asks for a signal at its parent's death.
        unsafe {
            c.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        Bg(c.process_group(0)
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn a workload"))
    }
}

impl Drop for Bg {
    fn drop(&mut self) {
        // SAFETY: kill(2) of the process group this test made for the child.
        unsafe { libc::kill(-(self.0.id() as i32), libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

/// The shipped rules pass promtool's own checks and unit tests.
#[test]
fn shipped_rules_pass_promtool() {
    ensure_prometheus();
    let deploy = repo().join("deploy");
    output_ok(
        Command::new("promtool")
            .args(["check", "rules"])
            .arg(deploy.join("alerts.yml")),
        "promtool check rules deploy/alerts.yml",
    );
    let out = output_ok(
        Command::new("promtool")
            .args(["test", "rules"])
            .arg(deploy.join("alerts_test.yml")),
        "promtool test rules deploy/alerts_test.yml",
    );
    let out = String::from_utf8_lossy(&out);
    assert!(out.contains("SUCCESS"), "{out}");
}

#[test]
fn alerts_name_the_culprit_through_prometheus_and_alertmanager() {
    require_root();
    let _s = serial();
    let dir = scratch("fleet");
    let rules = scaled_rules(&dir);
    let hook = Webhook::start();
    let am = Alertmanager::start(hook.port);
    let interval = format!("{WINDOW_S}s");
    let serve = Serve::start(&["--interval", &interval]);
    let prom = Prometheus::start_with(
        &format!(
            "  - job_name: tracekit\n    static_configs:\n      - targets: [\"{}\"]\n",
            serve.addr
        ),
        &format!(
            "rule_files: [\"{}\"]\nalerting:\n  alertmanagers:\n    - static_configs:\n        - targets: [\"{}\"]\n",
            rules.display(),
            am.0.addr
        ),
    );
    let window = Duration::from_secs(WINDOW_S);
    // The quiet node (this test's own Prometheus, Alertmanager and tracekit running): nothing
    // fires over five windows.
    std::thread::sleep(5 * window);
    let quiet = prom.query("ALERTS");
    assert!(quiet.is_empty(), "alerts on a quiet node: {quiet:#?}");

    // (what to run, alert, cause): each fires naming the process, then resolves.
    let file = dir.join("wal");
    let cg = Cgroup::create("fleet-memcg", 64 << 20);
    let procs = cg.procs();
    let fill_file = dir.join("fill");
    let stages: Vec<(&str, Vec<String>, &str, &str)> = vec![
        (
            "fsync storm",
            vec![
                "triage-fsync".into(),
                file.display().to_string(),
                "60000".into(),
            ],
            "TracekitStorageStall",
            "fsync",
        ),
        (
            "context-switch storm",
            // About a minute of round trips at most, should the test die without its Drop.
            vec!["pingpong".into(), "1500000".into()],
            "TracekitCpuStarvation",
            "ctxsw-storm",
        ),
        (
            "memory cgroup at its limit",
            vec![
                "memcg-fill".into(),
                procs.display().to_string(),
                fill_file.display().to_string(),
                "60000".into(),
            ],
            "TracekitMemoryStall",
            "memcg-limit",
        ),
    ];
    for (what, args, alert, cause) in stages {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        // Only what Alertmanager sends from now on: an earlier stage may have fired the same
        // alert for its own workload (an fsync loop switches often enough to be a storm too).
        let since = hook.count();
        let t0 = Instant::now();
        let w = Bg::start(&args);
        let pid = w.0.id().to_string();
        let labels = [
            ("alertname", alert),
            ("cause", cause),
            ("comm", "tk-workload"),
        ];
        let fired = hook.wait(
            "firing",
            |a| labels.iter().all(|(k, v)| a["labels"][*k] == *v),
            since,
            60,
        );
        let (a, fired_at, at) = fired.unwrap_or_else(|| {
            panic!(
                "{what}: no {alert} for {cause} in 60 s; received {:#?}; Prometheus's ALERTS {:#?}; serve's findings {:?}",
                hook.alerts(since),
                prom.query("ALERTS"),
                prom.query("tracekit_finding_score")
            )
        });
        let took = at.duration_since(t0);
        eprintln!(
            "{what}: {alert} fired {:.1} s after the workload started (pid {pid}): {a}",
            took.as_secs_f64()
        );
        // Within two windows: the incident's first window ends at most a window after it
        // began and its finding must stand one window more (`for`); then one scrape, one rule
        // evaluation and Alertmanager's group_wait (a second each here) carry it, and a
        // second more is for a busy machine. Fired 4.4-6.2 s after the start in five runs.
        assert!(
            took <= 2 * window + Duration::from_secs(4),
            "{what}: {alert} fired {took:?} after the workload started, windows of {window:?}"
        );
        let desc = a["annotations"]["description"].as_str().unwrap_or("");
        assert!(
            desc.contains(&format!("found {cause} for tk-workload"))
                && desc.contains("On the node: tracekit"),
            "{a}"
        );
        drop(w);
        let t_end = Instant::now();
        let fingerprint = a["fingerprint"].as_str().unwrap_or("").to_string();
        assert!(
            !fingerprint.is_empty(),
            "Alertmanager sent no fingerprint: {a}"
        );
        // Its resolution: the same alert (its fingerprint: a storm may fire a second alert
        // for the same process with other labels, a culprit named in one window and not in
        // another), in a notification after the one that fired it.
        let resolved = hook.wait(
            "resolved",
            |r| r["fingerprint"] == fingerprint.as_str(),
            fired_at + 1,
            60,
        );
        let (_, _, at) = resolved.unwrap_or_else(|| {
            panic!(
                "{what}: {alert} ({fingerprint}) never resolved; received {:#?}; Prometheus's ALERTS {:#?}",
                hook.alerts(fired_at + 1),
                prom.query("ALERTS")
            )
        });
        eprintln!(
            "{what}: resolved {:.1} s after the workload ended",
            at.duration_since(t_end).as_secs_f64()
        );
        // Let the next stage start on a node whose alerts have all resolved, and
        // Alertmanager's last notifications of this one arrive (group_interval: 1 s).
        let deadline = Instant::now() + Duration::from_secs(60);
        while !prom.query("ALERTS").is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(500));
        }
        std::thread::sleep(Duration::from_secs(3));
    }
    cg.remove();
    serve.stop();
}

/// Finding series are bounded as every metric is: with `--max-series 2`, five processes each
/// in its own fsync storm (five findings a window) give at most two series, the worst, and
/// the rest are counted as left out.
#[test]
fn finding_series_stay_within_max_series() {
    require_root();
    let _s = serial();
    let dir = scratch("fleet-bound");
    let serve = Serve::start(&[
        "--interval",
        "2s",
        "--max-series",
        "2",
        "--tools",
        "fsync-lat",
    ]);
    let loops: Vec<Bg> = (0..5)
        .map(|i| {
            // A copy of tk-workload under its own name: its own comm, its own finding.
            let bin = dir.join(format!("tkbound{i}"));
            std::fs::copy(workload_bin(), &bin).unwrap();
            let file = dir.join(format!("f{i}"));
            Bg::of(Command::new(&bin).args(["triage-fsync", file.to_str().unwrap(), "30000"]))
        })
        .collect();
    let m = serve.metrics_until("findings beyond the cap", |m| {
        sample(m, "tracekit_findings", &[]).is_some_and(|n| n >= 3.0)
            && sample(m, "tracekit_findings_dropped_total", &[]).is_some_and(|n| n > 0.0)
    });
    drop(loops);
    let series: Vec<&str> = m
        .lines()
        .filter(|l| l.starts_with("tracekit_finding_score{"))
        .collect();
    eprintln!("{series:#?}");
    assert!(
        (1..=2).contains(&series.len()),
        "at most --max-series finding series: {series:#?}"
    );
    assert!(
        series
            .iter()
            .all(|s| s.contains("cause=\"fsync\"") && s.contains("comm=\"tkbound")),
        "{series:#?}"
    );
    serve.stop();
}

/// The series of each family with a process label (`comm`, or the overflow series), by family:
/// a histogram's `_bucket`/`_sum`/`_count` are one series per label set without `le`.
fn series_by_family(page: &str) -> std::collections::BTreeMap<String, usize> {
    let mut sets: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        Default::default();
    for l in page.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, rest)) = l.split_once('{') else {
            continue;
        };
        let Some((labels, _)) = rest.rsplit_once('}') else {
            continue;
        };
        if !labels.contains("comm=\"") && !labels.contains("overflow=\"true\"") {
            continue;
        }
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(name);
        let set: Vec<&str> = labels
            .split("\",")
            .map(|kv| kv.trim_end_matches('"'))
            .filter(|kv| !kv.starts_with("le="))
            .collect();
        sets.entry(family.to_string())
            .or_default()
            .insert(set.join("\","));
    }
    sets.into_iter().map(|(k, v)| (k, v.len())).collect()
}

/// A fork storm: 3,000 short-lived processes, each under its own name doing one fsync, beside
/// eight fsync loops under their own names, against every default collector with
/// `--max-series 5`. Every scrape during and after the storm keeps each family with a process
/// label within 5 series plus the overflow one, and at most 5 finding series; the storm went
/// past the bound (series and findings left out were counted), so the bound was tested.
#[test]
fn a_fork_storm_stays_within_the_series_bound() {
    require_root();
    let _s = serial();
    let dir = scratch("fleet-forks");
    let serve = Serve::start(&["--interval", "2s", "--max-series", "5"]);
    let file = dir.join("f");
    let path = file.to_str().unwrap().to_string();
    // Beside it, eight fsync loops under their own names: eight findings a window, past the
    // five the bound keeps (a process living a millisecond for one fsync is no finding).
    let loops: Vec<Bg> = (0..8)
        .map(|i| {
            let name: String = format!("tkloop{i}")
                .bytes()
                .map(|b| format!("{b:02x}"))
                .collect();
            let f = dir.join(format!("loop{i}"));
            Bg::of(Command::new(workload_bin()).args([
                "named",
                &name,
                f.to_str().unwrap(),
                "1000000",
            ]))
        })
        .collect();
    let storm = std::thread::spawn(move || {
        let t0 = Instant::now();
        let mut n = 0;
        while n < 3000 && t0.elapsed() < Duration::from_secs(40) {
            let name: String = format!("tkf{n}")
                .bytes()
                .map(|b| format!("{b:02x}"))
                .collect();
            let ok = Command::new(workload_bin())
                .args(["named", &name, &path, "1"])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            n += usize::from(ok);
        }
        (n, t0.elapsed())
    });
    let (mut worst, mut scrapes, mut findings_worst) = (0usize, 0, 0usize);
    let mut families = std::collections::BTreeMap::new();
    let mut check = |m: &str| {
        for (f, n) in series_by_family(m) {
            assert!(n <= 6, "{f}: {n} series with --max-series 5:\n{m}");
            worst = worst.max(n);
            let e = families.entry(f).or_insert(0);
            *e = (*e).max(n);
        }
        let findings = m
            .lines()
            .filter(|l| l.starts_with("tracekit_finding_score{"))
            .count();
        assert!(findings <= 5, "{findings} finding series:\n{m}");
        findings_worst = findings_worst.max(findings);
    };
    while !storm.is_finished() {
        check(&serve.metrics());
        scrapes += 1;
        std::thread::sleep(Duration::from_secs(1));
    }
    let (forked, took) = storm.join().unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let last = serve.metrics();
    check(&last);
    drop(loops);
    eprintln!(
        "{forked} processes in {took:?}, {scrapes} scrapes; most series of a family {worst}, most finding series {findings_worst}; {families:?}"
    );
    assert!(forked >= 1000, "the storm forked only {forked}");
    let dropped: f64 = last
        .lines()
        .filter(|l| l.starts_with("tracekit_series_dropped_total{"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    assert!(
        dropped > 0.0,
        "no series left out: the storm never reached the bound\n{last}"
    );
    assert!(
        sample(&last, "tracekit_findings_dropped_total", &[]).is_some_and(|n| n > 0.0),
        "no finding left out: the storm never reached the findings' bound\n{last}"
    );
    serve.stop();
}

/// `--no-findings`: the windows' data only, nothing judged. Beside a judged serve over the same
/// fsync loop, it exports the loop's fsyncs and no finding series and no finding count (0 would
/// say "nothing found"), while the judged one exports the loop's fsync finding.
#[test]
fn no_findings_exports_the_data_and_no_judgement() {
    require_root();
    let _s = serial();
    let dir = scratch("fleet-nofind");
    let judged = Serve::start(&["--tools", "fsync-lat", "--interval", "2s"]);
    let plain = Serve::start(&["--tools", "fsync-lat", "--interval", "2s", "--no-findings"]);
    let file = dir.join("wal");
    let looping = Bg::of(Command::new(workload_bin()).args([
        "triage-fsync",
        file.to_str().unwrap(),
        "20000",
    ]));
    let j = judged.metrics_until("the fsync loop's finding", |m| {
        m.lines()
            .any(|l| l.starts_with("tracekit_finding_score{") && l.contains("cause=\"fsync\""))
    });
    let p = plain.metrics_until("the fsync loop's fsyncs", |m| {
        sample(
            m,
            "tracekit_fsync_calls_total",
            &[("comm", "tk-workload"), ("syscall", "fsync")],
        )
        .is_some_and(|n| n > 0.0)
            && sample(m, "tracekit_windows_total", &[]).is_some_and(|n| n >= 2.0)
    });
    drop(looping);
    assert!(
        sample(&j, "tracekit_findings", &[]).is_some_and(|n| n >= 1.0),
        "{j}"
    );
    assert!(!p.contains("tracekit_finding_score{"), "{p}");
    assert_eq!(sample(&p, "tracekit_findings", &[]), None, "{p}");
    assert_eq!(
        sample(&p, "tracekit_findings_dropped_total", &[]),
        None,
        "{p}"
    );
    judged.stop();
    plain.stop();
}
