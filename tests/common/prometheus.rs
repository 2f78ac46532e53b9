//! A real Prometheus (Debian's `prometheus`, installed with apt-get when missing) and a
//! `tracekit serve` to scrape, shared by the serve and fleet tests; plain HTTP/1.1 over
//! loopback to read them.

use std::{
    io::{Read, Write},
    net::TcpStream,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{program_ids, scratch, wait_unloaded, Tracer};

/// `tracekit serve` on a free port (`--listen 127.0.0.1:0`, the port read from its meta line).
pub struct Serve {
    pub tk: Tracer,
    pub addr: String,
    pub meta: Value,
}

impl Serve {
    /// `serve --interval 1s` (or the `--interval` of `extra`) with `extra`.
    pub fn start(extra: &[&str]) -> Serve {
        let mut args = vec!["serve"];
        if !extra.contains(&"--interval") {
            args.extend(["--interval", "1s"]);
        }
        if !extra.contains(&"--listen") {
            args.extend(["--listen", "127.0.0.1:0"]);
        }
        args.extend_from_slice(extra);
        let mut tk = Tracer::spawn(&args);
        let meta = tk.wait_attached();
        let addr = meta["listen"].as_str().expect("listen in meta").to_string();
        Serve { tk, addr, meta }
    }

    pub fn metrics(&self) -> String {
        let (code, body) = http_get(&self.addr, "/metrics");
        assert_eq!(code, 200, "{body}");
        body
    }

    /// Scrapes until `pred` holds (at most 30 s); the last scrape.
    pub fn metrics_until(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let m = self.metrics();
            if pred(&m) {
                return m;
            }
            assert!(Instant::now() < deadline, "{what}: never seen in\n{m}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// SIGTERM: exit 0 and every program it loaded gone.
    pub fn stop(self) {
        let ids = program_ids(&self.meta);
        assert!(!ids.is_empty(), "serve attached no program: {}", self.meta);
        self.tk.signal(libc::SIGTERM);
        let (status, _, stderr) = self.tk.finish(Duration::from_secs(20));
        assert!(status.success(), "SIGTERM: exit {status}: {stderr}");
        assert_eq!(
            wait_unloaded(&ids),
            Vec::<u32>::new(),
            "programs left loaded"
        );
    }
}

/// One HTTP/1.1 GET over loopback: status and body.
pub fn http_get(addr: &str, path: &str) -> (u16, String) {
    http_get_as(addr, path, None)
}

/// [`http_get`] with basic auth (`user:password`).
pub fn http_get_as(addr: &str, path: &str, basic: Option<&str>) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let auth = basic.map_or(String::new(), |b| {
        format!("Authorization: Basic {}\r\n", base64(b.as_bytes()))
    });
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let out = String::from_utf8_lossy(&out).into_owned();
    let code = out
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {out:?}"));
    let body = out.split_once("\r\n\r\n").map_or("", |b| b.1).to_string();
    (code, body)
}

/// The value of sample `name` whose labels include every pair of `labels`, summed over matches.
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut found = None;
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = l.rsplit_once(' ')?;
        let (n, ls) = series.split_once('{').unwrap_or((series, ""));
        if n == name
            && labels
                .iter()
                .all(|(k, v)| ls.contains(&format!("{k}=\"{v}\"")))
        {
            *found.get_or_insert(0.0) += value.parse::<f64>().unwrap();
        }
    }
    found
}

/// Standard base64 with padding (the Authorization header's encoding).
pub fn base64(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in data.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A daemon of the Prometheus project (Prometheus, Alertmanager) run by a test: its process,
/// address and scratch directory (config, data, `log`), killed and removed on drop.
pub struct Daemon {
    pub child: Child,
    pub addr: String,
    pub dir: PathBuf,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Daemon {
    /// Starts `bin` with `args` and `--web.listen-address` on a free loopback port, its stderr
    /// in `dir/log`, and waits (at most 60 s) until it answers `/-/ready`.
    pub fn start(bin: &str, dir: PathBuf, args: &[String]) -> Daemon {
        let addr = format!("127.0.0.1:{}", free_port());
        let log = std::fs::File::create(dir.join("log")).unwrap();
        let child = Command::new(bin)
            .args(args)
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {bin}: {e}"));
        let d = Daemon { child, addr, dir };
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(&d.addr).is_err() || http_get(&d.addr, "/-/ready").0 != 200 {
            assert!(
                Instant::now() < deadline,
                "{bin} not ready in 60 s: {}",
                std::fs::read_to_string(d.dir.join("log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        d
    }
}

/// A real Prometheus scraping every second.
pub struct Prometheus(pub Daemon);

/// Installs Debian's `prometheus` (which brings `promtool`) when it is missing.
pub fn ensure_prometheus() {
    ensure_daemon("prometheus", "prometheus");
}

/// Installs Debian's `package` when `bin` is missing, and stops the system instance the package
/// starts (on the port the tests' own instances would use).
pub fn ensure_daemon(bin: &str, package: &str) {
    if Command::new(bin).arg("--version").output().is_ok() {
        return;
    }
    eprintln!("installing Debian's {package} package (apt-get install {package})");
    let ok = Command::new("apt-get")
        .args(["install", "-y", "-q", "--no-install-recommends", package])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "these tests need Debian's {package} package: apt-get install {package} failed"
    );
    let _ = Command::new("systemctl").args(["stop", package]).status();
}

impl Prometheus {
    pub fn start(target: &str) -> Prometheus {
        Prometheus::start_jobs(&format!(
            "  - job_name: tracekit\n    static_configs:\n      - targets: [\"{target}\"]\n"
        ))
    }

    /// Scrapes every second with `jobs`, the YAML list under `scrape_configs:`.
    pub fn start_jobs(jobs: &str) -> Prometheus {
        Prometheus::start_with(jobs, "")
    }

    /// As [`Prometheus::start_jobs`], evaluating rules every second, with `more` (top-level
    /// YAML: `rule_files:`, `alerting:`) after the scrape configs.
    pub fn start_with(jobs: &str, more: &str) -> Prometheus {
        ensure_prometheus();
        let dir = scratch("prometheus");
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\nscrape_configs:\n{jobs}{more}"
            ),
        )
        .unwrap();
        Prometheus(Daemon::start(
            "prometheus",
            dir.clone(),
            &[
                format!("--config.file={}", config.display()),
                format!("--storage.tsdb.path={}", dir.join("data").display()),
            ],
        ))
    }

    /// An instant PromQL query: the result vector.
    pub fn query(&self, q: &str) -> Vec<Value> {
        let enc: String = q
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        let (code, body) = http_get(&self.0.addr, &format!("/api/v1/query?query={enc}"));
        assert_eq!(code, 200, "{q}: {body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["status"], "success", "{q}: {body}");
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// The single value of `q`, if it has one.
    pub fn value(&self, q: &str) -> Option<f64> {
        let r = self.query(q);
        r.first()
            .and_then(|s| s["value"][1].as_str())
            .and_then(|v| v.parse().ok())
    }

    /// Waits (at most 60 s) until `q` has the value `want`; the last value seen.
    pub fn wait_value(&self, q: &str, want: f64) -> Option<f64> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let v = self.value(q);
            if v == Some(want) || Instant::now() > deadline {
                return v;
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}
