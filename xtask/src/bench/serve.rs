//! `serve`'s own cost with findings (triage's judgement of every window, exported as series)
//! and without (`--no-findings`: the windows' data only, what serve did before it judged them).
//! Both run at once over the same process churn (short-lived `dd … conv=fsync` and `sleep`
//! processes, one of each every 150 ms) beside an fsync loop (a finding every window),
//! scraped every 15 s as a Prometheus would: CPU per
//! window (utime + stime over the windows after the first) and RSS after the first window, at
//! one minute, at the end and at its highest (sampled every 10 s).

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{anyhow, Context, Result};
use serde_json::{json, Value};

/// How often the two are scraped (a common Prometheus scrape interval).
const SCRAPE: Duration = Duration::from_secs(15);
/// How often RSS and CPU time are read.
const SAMPLE: Duration = Duration::from_secs(10);

/// One `tracekit serve` under measurement.
struct Served {
    name: String,
    child: Child,
    listen: String,
    /// (seconds since the churn began, VmRSS KiB, utime + stime in clock ticks, windows).
    samples: Vec<(f64, u64, u64, u64)>,
    windows: u64,
    findings_max: Option<u64>,
}

impl Served {
    fn start(tk: &Path, extra: &[&str], secs: u64) -> Result<Served> {
        let mut args = vec![
            "serve".to_string(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--duration".into(),
            format!("{}s", secs + 120),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut child = Command::new(tk)
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {} {args:?}", tk.display()))?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped"))
            .read_line(&mut line)
            .context("serve's meta line")?;
        let meta: Value = serde_json::from_str(&line)
            .with_context(|| format!("serve's meta line is not JSON: {line:?}"))?;
        let listen = meta["listen"]
            .as_str()
            .ok_or_else(|| anyhow!("no listen address in serve's meta line: {line}"))?
            .to_string();
        Ok(Served {
            name: format!("tracekit serve {}", extra.join(" "))
                .trim()
                .to_string(),
            child,
            listen,
            samples: Vec::new(),
            windows: 0,
            findings_max: None,
        })
    }

    fn scrape(&mut self) -> Result<()> {
        let body = get_metrics(&self.listen)?;
        if let Some(w) = metric(&body, "tracekit_windows_total") {
            self.windows = w as u64;
        }
        if let Some(f) = metric(&body, "tracekit_findings") {
            self.findings_max = Some(self.findings_max.unwrap_or(0).max(f as u64));
        }
        Ok(())
    }

    fn sample(&mut self, t: f64) -> Result<()> {
        let pid = self.child.id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let rss = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .ok_or_else(|| anyhow!("no VmRSS for serve (pid {pid})"))?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        // Fields after the comm's closing parenthesis: utime and stime are the 12th and 13th.
        let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        let f: Vec<u64> = rest
            .split_whitespace()
            .skip(11)
            .take(2)
            .filter_map(|x| x.parse().ok())
            .collect();
        self.samples.push((t, rss, f.iter().sum(), self.windows));
        Ok(())
    }

    fn report(&self, hz: f64) -> Value {
        let s = &self.samples;
        // The first window ends at 10 s: its ramp (maps drained, names and containers
        // resolved) is start-up, not steady cost.
        let first = s.iter().find(|x| x.3 >= 1).copied();
        let last = s.last().copied();
        let at = |secs: f64| s.iter().find(|x| x.0 >= secs).map(|x| x.1);
        let cpu_ms_per_window = match (first, last) {
            (Some(a), Some(b)) if b.3 > a.3 => {
                Some((b.2 - a.2) as f64 * 1000.0 / hz / (b.3 - a.3) as f64)
            }
            _ => None,
        };
        json!({
            "config": self.name,
            "windows": self.windows,
            "cpu_ms_per_window": cpu_ms_per_window,
            "rss_kib_first_window": first.map(|x| x.1),
            "rss_kib_1min": at(60.0),
            "rss_kib_end": last.map(|x| x.1),
            "rss_kib_max": s.iter().map(|x| x.1).max(),
            "findings_max": self.findings_max,
        })
    }
}

impl Drop for Served {
    /// Ended as an operator would (SIGTERM: it detaches and exits), a failed pass included.
    fn drop(&mut self) {
        // SAFETY: kill(2) of the child this pass started and has not reaped yet.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let _ = self.child.wait();
    }
}

/// The value of an unlabelled sample `name` in a Prometheus text page.
fn metric(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

fn get_metrics(addr: &str) -> Result<String> {
    let mut s = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: bench\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)
        .with_context(|| format!("reading /metrics from {addr}"))?;
    Ok(out)
}

/// Both configurations over `secs` of churn; the table's rows, or why the pass could not run.
pub(super) fn cost(tk: &Path, wl: &Path, scratch: &Path, secs: u64) -> Value {
    eprintln!("bench: serve with and without findings, {secs} s of process churn");
    match run(tk, wl, scratch, secs) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("bench: serve: {e:#}");
            json!({"status": format!("N/A: {e:#}")})
        }
    }
}

fn run(tk: &Path, wl: &Path, scratch: &Path, secs: u64) -> Result<Value> {
    let mut served = vec![
        Served::start(tk, &[], secs)?,
        Served::start(tk, &["--no-findings"], secs)?,
    ];
    let file = scratch.join("serve-churn");
    // A WAL-like fsync loop for the whole run: a finding every window, so the judged
    // configuration exports series as it would on a node with a culprit.
    let wal = scratch.join("serve-wal");
    let mut fsyncs = Command::new(wl)
        .args([
            "triage-fsync",
            &wal.display().to_string(),
            &(secs * 1000).to_string(),
        ])
        .stdout(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", wl.display()))?;
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs(secs);
    let (mut next_scrape, mut next_sample) = (t0 + SCRAPE, t0);
    let (mut dds, mut sleeps) = (0u64, Vec::new());
    while Instant::now() < end {
        Command::new("dd")
            .args([
                "if=/dev/zero",
                &format!("of={}", file.display()),
                "bs=4k",
                "count=1",
                "conv=fsync",
                "status=none",
            ])
            .status()
            .context("dd")?;
        dds += 1;
        sleeps.push(Command::new("sleep").arg("0.05").spawn().context("sleep")?);
        sleeps.retain_mut(|c| !matches!(c.try_wait(), Ok(Some(_))));
        std::thread::sleep(Duration::from_millis(150));
        let now = Instant::now();
        if now >= next_scrape {
            for s in &mut served {
                s.scrape()?;
            }
            next_scrape += SCRAPE;
        }
        if now >= next_sample {
            for s in &mut served {
                s.sample(now.duration_since(t0).as_secs_f64())?;
            }
            next_sample += SAMPLE;
        }
    }
    for mut c in sleeps {
        let _ = c.wait();
    }
    let _ = fsyncs.wait();
    let _ = std::fs::remove_file(&wal);
    let t = t0.elapsed().as_secs_f64();
    for s in &mut served {
        s.scrape()?;
        s.sample(t)?;
    }
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let _ = std::fs::remove_file(&file);
    Ok(json!({
        "date": super::humantime_now(),
        "seconds": secs,
        "churn_processes": dds * 2,
        "rows": served.iter().map(|s| s.report(hz)).collect::<Vec<_>>(),
    }))
}

#[cfg(test)]
mod tests {
    use super::metric;

    #[test]
    fn unlabelled_samples_are_read_and_prefixes_are_not_confused() {
        let page = "# HELP tracekit_windows_total Windows.\ntracekit_windows_total 42\ntracekit_findings_dropped_total 3\ntracekit_findings 2\n";
        assert_eq!(metric(page, "tracekit_windows_total"), Some(42.0));
        assert_eq!(metric(page, "tracekit_findings"), Some(2.0));
        assert_eq!(metric(page, "tracekit_finding_score"), None);
    }
}
