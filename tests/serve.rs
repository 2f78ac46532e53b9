//! Root tests for `tracekit serve`: a real Prometheus (Debian's `prometheus`, installed with
//! apt-get when missing) scrapes it; PromQL over Prometheus's HTTP API must return a workload's
//! exact fsync count and a p99 within the documented bucket error of tracekit's own. Also: exit
//! paths (SIGTERM, port in use, bad --tools), series folding, and the deploy/ files (manifest,
//! scrape config, dashboard names exported by a real run).

use std::{
    collections::BTreeSet,
    io::{Read, Write},
    net::TcpStream,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use serde_json::Value;
use tracekit::tools::serve::buckets::MAX_QUANTILE_ERROR;
use tracekit_tests::{prometheus::*, *};

/// A copy of tk-workload under a name no other process has (its comm), for exact counts by
/// comm while other tests run on the machine.
fn named_workload(dir: &Path, name: &str) -> PathBuf {
    assert!(name.len() <= 15, "comm {name} would be cut");
    let p = dir.join(name);
    std::fs::copy(workload_bin(), &p).unwrap();
    p
}

/// Runs `c` and asserts it succeeded (`what` names it in the failure).
fn ok(c: &mut Command, what: &str) -> std::process::Output {
    let out = c.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn run_fsyncs(bin: &Path, file: &Path, n: usize) -> Value {
    let out = ok(
        Command::new(bin).args(["fsync", file.to_str().unwrap(), &n.to_string(), "0"]),
        "fsync workload",
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Fresh at scrape, whatever --interval is: with 60 s windows, a workload's 120 fsyncs are in
/// the first scrape after it (the scrape ends the window), not only when the window would end.
#[test]
fn a_scrape_sees_fsyncs_long_before_the_window_ends() {
    require_root();
    let dir = scratch("serve-fresh");
    let comm = format!("tkfresh{}", std::process::id() % 1_000_000);
    let bin = named_workload(&dir, &comm);
    let serve = Serve::start(&["--tools", "fsync-lat", "--interval", "60s"]);
    let _ = run_fsyncs(&bin, &dir.join("data"), 120);
    std::thread::sleep(Duration::from_secs(2));
    let t0 = Instant::now();
    let m = serve.metrics();
    let took = t0.elapsed();
    let labels = [("comm", comm.as_str()), ("syscall", "fsync")];
    assert_eq!(
        sample(&m, "tracekit_fsync_calls_total", &labels),
        Some(120.0),
        "the first scrape after the workload, {took:?} to answer:\n{m}"
    );
    assert_eq!(sample(&m, "tracekit_windows_total", &[]), Some(1.0), "{m}");
    // A second scrape at once reads the same totals without ending another window.
    let again = serve.metrics();
    assert_eq!(sample(&again, "tracekit_windows_total", &[]), Some(1.0));
    serve.stop();
}

const N_FSYNC: usize = 200;

#[test]
fn prometheus_sees_the_exact_fsync_count_and_p99() {
    require_root();
    let dir = scratch("serve-prom");
    let comm = format!("tkprom{}", std::process::id() % 1_000_000);
    let bin = named_workload(&dir, &comm);
    let serve = Serve::start(&["--tools", "fsync-lat"]);
    // tracekit's own p99 for the same calls, from the tool itself.
    let mut tool = Tracer::spawn(&["fsync-lat", "--json", "--comm", &comm]);
    tool.wait_attached();
    let prom = Prometheus::start(&serve.addr);
    let w = run_fsyncs(&bin, &dir.join("data"), N_FSYNC);
    let pid = w["pid"].as_u64().unwrap() as u32;
    tool.signal(libc::SIGINT);
    let (status, lines, stderr) = tool.finish(Duration::from_secs(15));
    assert!(status.success(), "{stderr}");
    let rows = rows_for(&lines, "fsync-lat", pid);
    let row = rows
        .iter()
        .find(|r| r["syscall"] == "fsync")
        .expect("fsync-lat row");
    assert_eq!(row["count"], N_FSYNC as u64, "fsync-lat's own count");
    let own_p99 = row["p99_ns"].as_f64().unwrap() / 1e9;

    let sel = format!("comm=\"{comm}\",syscall=\"fsync\"");
    let count_q = format!("sum(tracekit_fsync_calls_total{{{sel}}})");
    let got = prom.wait_value(&count_q, N_FSYNC as f64);
    assert_eq!(got, Some(N_FSYNC as f64), "PromQL {count_q}");
    let hist_q = format!("sum(tracekit_fsync_latency_seconds_count{{{sel}}})");
    assert_eq!(prom.value(&hist_q), Some(N_FSYNC as f64), "PromQL {hist_q}");
    // Two scrapes at least, and the target up.
    let deadline = Instant::now() + Duration::from_secs(30);
    let scrapes = loop {
        let n = prom
            .value("count_over_time(up{job=\"tracekit\"}[10m])")
            .unwrap_or(0.0);
        if n >= 2.0 || Instant::now() > deadline {
            break n;
        }
        std::thread::sleep(Duration::from_millis(300));
    };
    assert!(scrapes >= 2.0, "{scrapes} scrapes");
    assert_eq!(
        prom.value(&count_q),
        Some(N_FSYNC as f64),
        "after two scrapes"
    );
    assert_eq!(prom.value("up{job=\"tracekit\"}"), Some(1.0));

    let q99 = format!(
        "histogram_quantile(0.99, sum by (le) (tracekit_fsync_latency_seconds_bucket{{{sel}}}))"
    );
    let p99 = prom.value(&q99).expect("histogram_quantile");
    let err = (p99 - own_p99).abs() / p99.min(own_p99);
    eprintln!(
        "PromQL {count_q} = {N_FSYNC}; {q99} = {p99:.6} s; fsync-lat p99 {own_p99:.6} s ({:.1} % apart)",
        err * 100.0
    );
    assert!(
        err <= MAX_QUANTILE_ERROR,
        "histogram_quantile {p99} s vs fsync-lat p99 {own_p99} s: {:.0} % apart, documented bound {:.0} %",
        err * 100.0,
        MAX_QUANTILE_ERROR * 100.0
    );
    drop(prom);
    serve.stop();
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn serves_pages_and_self_metrics_then_exits_clean_on_sigterm() {
    require_root();
    let serve = Serve::start(&[]);
    let m = serve.metrics_until("two windows", |m| {
        sample(m, "tracekit_windows_total", &[]).is_some_and(|w| w >= 2.0)
    });
    for name in [
        "tracekit_rss_bytes",
        "tracekit_cpu_seconds_total",
        "tracekit_scrape_duration_seconds",
        "tracekit_bpf_stats_enabled",
    ] {
        assert!(sample(&m, name, &[]).is_some(), "{name} missing in\n{m}");
    }
    assert!(sample(&m, "tracekit_rss_bytes", &[]).unwrap() > 1e6);
    let programs = sample(&m, "tracekit_programs_loaded", &[]).unwrap_or(0.0);
    assert_eq!(
        programs as usize,
        program_ids(&serve.meta).len(),
        "tracekit_programs_loaded vs the meta line"
    );
    for t in serve.meta["watching"].as_array().unwrap() {
        let t = t.as_str().unwrap();
        assert_eq!(
            sample(&m, "tracekit_collector_up", &[("tool", t)]),
            Some(1.0),
            "{t}"
        );
    }
    assert!(!m.contains("pid=\""), "no pid label without --pid-labels");
    let (code, index) = http_get(&serve.addr, "/");
    assert_eq!(code, 200);
    assert!(index.contains("/metrics"), "{index}");
    assert_eq!(http_get(&serve.addr, "/nope").0, 404);
    serve.stop();
}

#[test]
fn port_in_use_and_bad_tools_fail_with_one_line() {
    require_root();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let before = program_ids_named("tk_fsync").len();
    let out = Command::new(tracekit_bin())
        .args([
            "serve",
            "--listen",
            &addr,
            "--tools",
            "fsync-lat",
            "--duration",
            "5s",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "port in use: {err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    assert!(err.contains("listening on") && err.contains(&addr), "{err}");
    assert!(
        program_ids_named("tk_fsync").len() <= before,
        "nothing loaded"
    );
    drop(taken);

    let out = Command::new(tracekit_bin())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--tools",
            "fsync-lat,nope",
            "--duration",
            "5s",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "bad --tools is a usage error: {err}"
    );
    assert!(err.contains("--tools") && err.contains("nope"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
}

#[test]
fn max_series_folds_into_overflow_and_counts_it() {
    require_root();
    let dir = scratch("serve-fold");
    let serve = Serve::start(&["--tools", "fsync-lat", "--max-series", "2"]);
    let tag = std::process::id() % 100_000;
    let names: Vec<String> = (0..5).map(|i| format!("tkfold{tag}x{i}")).collect();
    let mut total = 0;
    for (i, n) in names.iter().enumerate() {
        let bin = named_workload(&dir, n);
        run_fsyncs(&bin, &dir.join("data"), 3 + i);
        total += 3 + i;
    }
    let m = serve.metrics_until("folding", |m| {
        sample(
            m,
            "tracekit_series_dropped_total",
            &[("metric", "tracekit_fsync_calls")],
        )
        .is_some_and(|d| d >= 3.0)
    });
    let series: Vec<&str> = m
        .lines()
        .filter(|l| l.starts_with("tracekit_fsync_calls_total{"))
        .collect();
    assert!(
        series.len() <= 3,
        "at most 2 series and the overflow: {series:?}"
    );
    // The overflow series has its own label and no comm: no process name can land in it.
    assert!(
        series
            .iter()
            .any(|l| l.starts_with("tracekit_fsync_calls_total{overflow=\"true\"}")),
        "{series:?}"
    );
    // Folded, not lost: what my comms do not show any more is in the overflow series.
    let shown: f64 = names
        .iter()
        .filter_map(|n| sample(&m, "tracekit_fsync_calls_total", &[("comm", n)]))
        .sum();
    let other = sample(&m, "tracekit_fsync_calls_total", &[("overflow", "true")]).unwrap();
    assert!(shown <= total as f64, "{shown} > {total}");
    assert!(
        other >= total as f64 - shown,
        "other {other} < {total} - {shown} shown"
    );
    serve.stop();
    let _ = std::fs::remove_dir_all(dir);
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every metric name a PromQL expression mentions.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = expr;
    while let Some(i) = rest.find("tracekit_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

fn exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("expr" | "definition", Value::String(s)) => out.push(s.clone()),
                    _ => exprs(x, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| exprs(x, out)),
        _ => {}
    }
}

#[test]
fn deploy_files_are_valid_and_the_dashboard_names_exported_metrics() {
    require_root();
    ensure_prometheus();
    let deploy = repo().join("deploy");
    ok(
        Command::new("promtool")
            .args(["check", "config"])
            .arg(deploy.join("prometheus.yml")),
        "promtool check config deploy/prometheus.yml",
    );
    // The manifest: YAML that parses, and the fields the DaemonSet depends on.
    let check = r#"
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
kinds = {d["kind"]: d for d in docs}
assert all(d.get("apiVersion") and d["metadata"].get("name") for d in docs), "apiVersion/name"
ds = kinds["DaemonSet"]
spec = ds["spec"]["template"]["spec"]
sel = ds["spec"]["selector"]["matchLabels"]
labels = ds["spec"]["template"]["metadata"]["labels"]
assert all(labels.get(k) == v for k, v in sel.items()), "selector matches the template"
assert spec["hostPID"] is True, "hostPID"
c = spec["containers"][0]
sc = c["securityContext"]
assert not sc.get("privileged"), "not privileged"
assert {"BPF", "PERFMON"} <= set(sc["capabilities"]["add"]), "CAP_BPF, CAP_PERFMON"
assert c["readinessProbe"]["httpGet"]["path"] == "/metrics", "readiness on /metrics"
caps = set(sc["capabilities"]["add"])
assert caps <= {"BPF", "PERFMON", "DAC_READ_SEARCH", "SYS_PTRACE"}, f"no capability beyond the documented four: {caps}"
assert sc["capabilities"]["drop"] == ["ALL"], "drop ALL"
assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
assert sc["seccompProfile"]["type"] == "RuntimeDefault", "seccomp RuntimeDefault, not Unconfined"
assert "seccompProfile" not in spec.get("securityContext", {}) or spec["securityContext"]["seccompProfile"]["type"] != "Unconfined"
image = c["image"]
assert not image.endswith(":latest") and (image.endswith(":" + sys.argv[2]) or "@sha256:" in image), f"image pinned to {sys.argv[2]} or a digest: {image}"
assert c["resources"]["limits"]["memory"] and c["resources"]["limits"]["cpu"], "limits"
env = {e["name"]: e["value"] for e in c["env"]}
assert env["TRACEKIT_PROC"] == "/host/proc" and "TRACEKIT_TRACEFS" in env, "env"
mounts = {m["name"]: m for m in c["volumeMounts"]}
vols = {v["name"] for v in spec["volumes"]}
assert set(mounts) <= vols, "every mount has a volume"
assert all(m.get("readOnly") for m in mounts.values()), "host mounts read-only"
assert all(m.get("recursiveReadOnly") == "Enabled" for m in mounts.values()), "submounts read-only too"
host = {v["name"] for v in spec["volumes"] if "hostPath" in v}
assert host <= set(mounts), "every hostPath volume is mounted (read-only)"
assert {"/host/proc", "/host/sys", "/sys/kernel/tracing", "/sys/kernel/btf"} <= {m["mountPath"] for m in mounts.values()}
svc = kinds["Service"]
assert svc["spec"]["selector"] == sel and svc["spec"]["clusterIP"] == "None", "headless service"
# The NetworkPolicy: the DaemonSet's pods, ingress only from Prometheus (namespace AND pod
# selector in one peer), on the metrics port only, no egress.
nps = [d for d in yaml.safe_load_all(open(sys.argv[3])) if d]
assert [d["kind"] for d in nps] == ["NetworkPolicy"], "one NetworkPolicy"
np = nps[0]
assert np["metadata"]["namespace"] == ds["metadata"]["namespace"], "same namespace"
assert np["spec"]["podSelector"]["matchLabels"] == sel, "selects the DaemonSet's pods"
assert set(np["spec"]["policyTypes"]) == {"Ingress", "Egress"}
assert np["spec"].get("egress", []) == [], "no egress"
(rule,) = np["spec"]["ingress"]
(peer,) = rule["from"]
assert peer["namespaceSelector"]["matchLabels"] and peer["podSelector"]["matchLabels"], "Prometheus namespace and pods"
ports = {p["containerPort"] for p in c["ports"]} | {p["name"] for p in c["ports"]}
assert [p["port"] in ports for p in rule["ports"]] == [True], "the metrics port only"
print("ok")
"#;
    ok(
        Command::new("python3")
            .args(["-c", check])
            .arg(deploy.join("daemonset.yaml"))
            .arg(env!("CARGO_PKG_VERSION"))
            .arg(deploy.join("networkpolicy.yaml")),
        "deploy/daemonset.yaml (python3-yaml needed)",
    );
    let cf = std::fs::read_to_string(deploy.join("Containerfile")).unwrap();
    assert!(cf.contains("target/release/tracekit") && cf.contains("serve"));

    let dash: Value = serde_json::from_str(
        &std::fs::read_to_string(deploy.join("grafana-dashboard.json")).unwrap(),
    )
    .expect("dashboard JSON parses");
    let mut all = Vec::new();
    exprs(&dash["panels"], &mut all);
    exprs(&dash["templating"], &mut all);
    assert!(all.len() > 10, "{all:?}");
    let wanted: BTreeSet<String> = all.iter().flat_map(|e| metric_names(e)).collect();

    // What a real serve run exports (every default collector declares its metrics).
    let serve = Serve::start(&[]);
    let m = serve.metrics_until("a window", |m| {
        sample(m, "tracekit_windows_total", &[]).is_some_and(|w| w >= 1.0)
    });
    let mut exported = BTreeSet::new();
    for l in m.lines() {
        if let Some(t) = l.strip_prefix("# TYPE ") {
            let mut p = t.split(' ');
            let (name, kind) = (p.next().unwrap(), p.next().unwrap_or(""));
            exported.insert(name.to_string());
            if kind == "histogram" {
                for s in ["_bucket", "_sum", "_count"] {
                    exported.insert(format!("{name}{s}"));
                }
            }
        }
    }
    serve.stop();
    let missing: Vec<&String> = wanted.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries metrics serve does not export: {missing:?}"
    );
}

/// Slow clients (slowloris) from 127.0.0.2, bounded: `conns` connections that each send a
/// partial request head and then one byte a second, reconnecting whenever the server drops
/// them, until `stop` is set or 120 s have passed. Returns how many connections it opened.
fn slowloris(
    target: std::net::SocketAddr,
    conns: usize,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<usize> {
    use std::sync::atomic::Ordering;
    std::thread::spawn(move || {
        let connect = || -> Option<std::net::TcpStream> {
            // SAFETY: plain socket calls on a descriptor this closure owns until it is wrapped.
            let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) };
            if fd < 0 {
                return None;
            }
            let mut src: libc::sockaddr_in = unsafe { std::mem::zeroed() };
            src.sin_family = libc::AF_INET as u16;
            src.sin_addr.s_addr = u32::from_be_bytes([127, 0, 0, 2]).to_be();
            let std::net::SocketAddr::V4(t) = target else {
                return None;
            };
            let mut dst: libc::sockaddr_in = unsafe { std::mem::zeroed() };
            dst.sin_family = libc::AF_INET as u16;
            dst.sin_port = t.port().to_be();
            dst.sin_addr.s_addr = u32::from_be_bytes(t.ip().octets()).to_be();
            let len = std::mem::size_of::<libc::sockaddr_in>() as u32;
            // SAFETY: src/dst are initialised sockaddr_in of the length given; fd is ours.
            let ok = unsafe {
                libc::bind(fd, &src as *const _ as *const libc::sockaddr, len) == 0
                    && libc::connect(fd, &dst as *const _ as *const libc::sockaddr, len) == 0
            };
            // SAFETY: fd is a socket nobody else owns; the TcpStream closes it.
            let mut s = unsafe { <std::net::TcpStream as std::os::fd::FromRawFd>::from_raw_fd(fd) };
            if !ok {
                return None;
            }
            s.set_nonblocking(true).ok()?;
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n").ok()?;
            Some(s)
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut socks: Vec<Option<std::net::TcpStream>> = (0..conns).map(|_| connect()).collect();
        let mut opened = socks.iter().flatten().count();
        while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_secs(1));
            for s in socks.iter_mut() {
                let alive = s.as_mut().is_some_and(|c| {
                    let mut b = [0u8; 512];
                    // A live connection has nothing to read; a dropped one reads EOF, an
                    // answer (408) or an error.
                    let waiting = matches!(c.read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
                    waiting && c.write_all(b"X").is_ok()
                });
                if !alive {
                    *s = connect();
                    opened += s.is_some() as usize;
                }
            }
        }
        opened
    })
}

/// One GET with a bounded wait: the status, or why none came.
fn try_get(addr: &str, path: &str, timeout: Duration) -> Result<u16, String> {
    let a: std::net::SocketAddr = addr.parse().unwrap();
    let mut s = TcpStream::connect_timeout(&a, timeout).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(timeout)).unwrap();
    s.set_write_timeout(Some(timeout)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("write: {e}"))?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).map_err(|e| format!("read: {e}"))?;
    let out = String::from_utf8_lossy(&out);
    out.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status in {:?}", &out[..out.len().min(80)]))
}

#[test]
fn scrapes_are_answered_while_500_slow_clients_hold_connections() {
    require_root();
    let serve = Serve::start(&["--tools", "fsync-lat", "--listen", "0.0.0.0:0"]);
    let port = serve.addr.rsplit_once(':').unwrap().1.to_string();
    let addr = format!("127.0.0.1:{port}");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let attack = slowloris(addr.parse().unwrap(), 500, stop.clone());
    // Let the slow connections fill whatever the server has.
    std::thread::sleep(Duration::from_secs(2));
    let mut failed = Vec::new();
    for i in 0..20 {
        let path = if i % 5 == 4 { "/" } else { "/metrics" };
        match try_get(&addr, path, Duration::from_secs(10)) {
            Ok(200) => {}
            other => failed.push(format!("{i} {path}: {other:?}")),
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let opened = attack.join().unwrap();
    eprintln!(
        "20 scrapes under {opened} slow connections: {} failed {failed:?}",
        failed.len()
    );
    assert!(opened >= 500, "the attack opened {opened} connections");
    assert!(failed.is_empty(), "scrapes not answered: {failed:?}");
    serve.stop();
}

/// bcrypt of "tk-scrape-pw" at cost 4, from glibc's libxcrypt (crypt(3) with a `$2b$04$` salt):
/// a hash made by another implementation than the one serve verifies with.
const SCRAPE_HASH: &str = "$2b$04$abcdefghijklmnopqrstuuwWfYBoX1nvEaH.LArze3i0Z/fvCwR2a";

#[test]
fn web_config_basic_auth_refuses_without_the_password_and_prometheus_scrapes_with_it() {
    require_root();
    let dir = scratch("serve-auth");
    let web = dir.join("web.yml");
    std::fs::write(&web, format!("basic_auth_users:\n  prom: {SCRAPE_HASH}\n")).unwrap();
    // What exporter-toolkit accepts, Prometheus's own checker accepts too.
    ensure_prometheus();
    ok(
        Command::new("promtool")
            .args(["check", "web-config"])
            .arg(&web),
        "promtool check web-config",
    );
    let serve = Serve::start(&[
        "--tools",
        "fsync-lat",
        "--web-config",
        web.to_str().unwrap(),
    ]);
    for (who, cred) in [
        ("no credentials", None),
        ("a wrong password", Some("prom:wrong")),
        ("an unknown user", Some("nobody:tk-scrape-pw")),
    ] {
        for path in ["/metrics", "/"] {
            let (code, body) = http_get_as(&serve.addr, path, cred);
            assert_eq!(code, 401, "{path} with {who}: {body}");
            assert!(
                !body.contains("tracekit_") && !body.contains("fsync"),
                "{path} with {who} leaks data: {body}"
            );
        }
    }
    let m = |cred| http_get_as(&serve.addr, "/metrics", cred);
    let (code, body) = m(Some("prom:tk-scrape-pw"));
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("tracekit_collector_up"), "{body}");
    // A real Prometheus: with basic_auth in its scrape config it scrapes (up 1, the metrics
    // stored); the same target without it is refused (up 0).
    let prom = Prometheus::start_jobs(&format!(
        "  - job_name: tracekit\n    basic_auth:\n      username: prom\n      password: tk-scrape-pw\n    static_configs:\n      - targets: [\"{a}\"]\n  - job_name: tracekit-noauth\n    static_configs:\n      - targets: [\"{a}\"]\n",
        a = serve.addr
    ));
    assert_eq!(
        prom.wait_value("up{job=\"tracekit\"}", 1.0),
        Some(1.0),
        "scraped with basic_auth"
    );
    assert_eq!(
        prom.wait_value(
            "tracekit_collector_up{job=\"tracekit\",tool=\"fsync-lat\"}",
            1.0
        ),
        Some(1.0)
    );
    assert_eq!(
        prom.wait_value("up{job=\"tracekit-noauth\"}", 0.0),
        Some(0.0),
        "refused without"
    );
    assert!(
        prom.query("tracekit_collector_up{job=\"tracekit-noauth\"}")
            .is_empty(),
        "nothing stored from the refused job"
    );
    drop(prom);
    serve.stop();
    let _ = std::fs::remove_dir_all(dir);
}

/// `serve --duration 1s` with `args`: exit code and stderr.
fn serve_briefly(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(tracekit_bin())
        .args(["serve", "--tools", "fsync-lat", "--duration", "1s"])
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_public_address_without_auth_warns_and_a_bad_web_config_is_one_line() {
    require_root();
    let (code, err) = serve_briefly(&["--listen", "0.0.0.0:0"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("warning: serve: 0.0.0.0:") && err.contains("every process name"),
        "no warning for 0.0.0.0 without --web-config: {err}"
    );
    let (code, err) = serve_briefly(&["--listen", "127.0.0.1:0"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("warning"), "loopback: {err}");
    let dir = scratch("serve-webconf");
    let web = dir.join("web.yml");
    std::fs::write(&web, format!("basic_auth_users:\n  prom: {SCRAPE_HASH}\n")).unwrap();
    let (code, err) = serve_briefly(&[
        "--listen",
        "0.0.0.0:0",
        "--web-config",
        web.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("warning"), "with --web-config: {err}");
    for (bad, says) in [
        (
            "basic_auth_users:\n  prom: not-a-hash\n",
            "not a bcrypt hash",
        ),
        (
            "tls_server_config:\n  cert_file: x\n",
            "tls_server_config is not supported",
        ),
        ("basic_auth_userz:\n  prom: x\n", "basic_auth_userz"),
        ("", "basic_auth_users is empty"),
    ] {
        std::fs::write(&web, bad).unwrap();
        let (code, err) = serve_briefly(&["--web-config", web.to_str().unwrap()]);
        assert_eq!(code, Some(2), "{bad:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
        assert!(
            err.contains("--web-config") && err.contains(says),
            "{bad:?}: {err}"
        );
    }
    let (code, err) = serve_briefly(&["--web-config", "/nonexistent/web.yml"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("/nonexistent/web.yml"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

/// `GET /debug/pprof/profile?seconds=N` (#29): `go tool pprof` fetches a node-wide CPU profile
/// from serve as from a Go service, and it holds the samples of a shell spinning beside it; a
/// second request while one runs gets 429, a bad `seconds` 400; the run leaves no file behind
/// and no program loaded, and nothing is loaded before it is asked for.
#[test]
fn pprof_endpoint_profiles_the_node_on_demand() {
    require_root();
    let _g = serial();
    let serve = Serve::start(&[]);
    let before = program_ids_named("tk_prof");
    assert!(
        before.is_empty(),
        "profile programs loaded before any request: {before:?}"
    );
    let dir = scratch("serve-pprof");
    let mut spin = Command::new("sh")
        .args(["-c", "while :; do :; done"])
        .spawn()
        .unwrap();
    let url = format!("http://{}/debug/pprof/profile?seconds=3", serve.addr);
    let go = {
        let (url, dir) = (url.clone(), dir.clone());
        std::thread::spawn(move || {
            Command::new("go")
                .args(["tool", "pprof", "-raw", "-symbolize=none", &url])
                .env("HOME", &dir)
                .env("PPROF_TMPDIR", &dir)
                .output()
                .expect("go tool pprof (Debian package golang-go)")
        })
    };
    // The first request is running: its programs are loaded, and a second one is refused.
    let deadline = Instant::now() + Duration::from_secs(15);
    while program_ids_named("tk_prof").is_empty() {
        assert!(Instant::now() < deadline, "no profile program loaded");
        std::thread::sleep(Duration::from_millis(50));
    }
    let busy = try_get(
        &serve.addr,
        "/debug/pprof/profile?seconds=1",
        Duration::from_secs(5),
    );
    assert_eq!(busy, Ok(429));
    let out = go.join().unwrap();
    let spin_pid = spin.id();
    let _ = spin.kill();
    let _ = spin.wait();
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "go tool pprof: {err}");
    // `-raw`: each sample's `count ns: locations`, then its labels (`pid:[1234]`). The
    // spinner's samples: at 99 Hz for 3 s, up to ~300 on its CPU.
    let (mut count, mut spinner) = (0u64, 0u64);
    for l in text.lines() {
        let t = l.trim();
        if let Some((values, _)) = t.split_once(':').filter(|(v, _)| {
            v.split_whitespace().count() == 2
                && v.split_whitespace().all(|n| n.parse::<u64>().is_ok())
        }) {
            count = values.split_whitespace().next().unwrap().parse().unwrap();
        } else if t == format!("pid:[{spin_pid}]") {
            spinner += count;
        }
    }
    eprintln!("{spinner} samples of the spinner (pid {spin_pid})");
    assert!(
        spinner >= 100,
        "{spinner} samples of the spinner (pid {spin_pid}) in 3 s:\n{text}"
    );
    assert_eq!(
        try_get(
            &serve.addr,
            "/debug/pprof/profile?seconds=0",
            Duration::from_secs(5)
        ),
        Ok(400)
    );
    let left: Vec<String> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("tracekit-serve-pprof-"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    assert_eq!(
        wait_unloaded(&program_ids_named("tk_prof")),
        Vec::<u32>::new()
    );
    serve.stop();
    let _ = std::fs::remove_dir_all(dir);
}
