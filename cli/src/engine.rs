//! The run loop every tool shares: intervals, duration, signals, output, and the final summary.
//!
//! The loop ends when `--duration` elapses or on SIGINT, SIGTERM or SIGHUP; in every case the
//! last window is still collected and printed (as runqlat and bpftrace do on Ctrl-C), the output
//! file is completed, and the caller then drops the session, which detaches everything.

use std::{
    os::fd::RawFd,
    time::{Duration, Instant, SystemTime},
};

use anyhow::Context as _;
use tokio::{
    io::{unix::AsyncFd, Interest},
    signal::unix::{signal, SignalKind},
};

use crate::{
    options::Common,
    output::Sink,
    render::{self, Report},
};

/// Why the run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    Running,
    Duration,
    Signal(&'static str),
}

impl Stop {
    pub fn as_str(self) -> &'static str {
        match self {
            Stop::Running => "running",
            Stop::Duration => "duration elapsed",
            Stop::Signal(s) => s,
        }
    }
}

/// One collection window.
#[derive(Clone, Debug)]
pub struct Window {
    /// 0 for the first window.
    pub index: u32,
    pub start: SystemTime,
    pub end: SystemTime,
    /// Measured on the monotonic clock.
    pub elapsed: Duration,
    /// The last window of the run.
    pub last: bool,
    /// Whether the run has intervals (so the window must be drained and reset).
    pub interval: bool,
    pub stop: Stop,
}

impl Window {
    pub fn secs(&self) -> f64 {
        self.elapsed.as_secs_f64().max(1e-9)
    }

    /// End of the window as RFC 3339 text and as Unix nanoseconds, for JSON.
    pub fn end_json(&self) -> (String, u64) {
        let ns = self
            .end
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        (humantime::format_rfc3339_millis(self.end).to_string(), ns)
    }
}

/// The `"type":"stats"` JSON line closing every window: the window, why it ended, the kernel
/// counters of what could not be recorded (named as in `probes_common::stats`), tracekit's own
/// memory, plus the tool's `extra` keys.
pub fn stats_line(
    tool: &str,
    w: &Window,
    stats: &[u64; probes_common::stats::NSTATS as usize],
    extra: serde_json::Value,
) -> serde_json::Value {
    let (end, end_ns) = w.end_json();
    let mut v = serde_json::json!({
        "tool": tool,
        "type": "stats",
        "interval_ns": w.elapsed.as_nanos() as u64,
        "interval_end": end,
        "interval_end_ns": end_ns,
        "stop": w.stop.as_str(),
    });
    for (name, value) in probes_common::stats::NAMES.iter().zip(stats) {
        if !name.starts_with("reserved") {
            v[*name] = (*value).into();
        }
    }
    let (rss, hwm) = crate::procinfo::self_rss_kib();
    v["rss_kib"] = rss.into();
    v["rss_peak_kib"] = hwm.into();
    if let serde_json::Value::Object(m) = extra {
        for (k, x) in m {
            v[k] = x;
        }
    }
    v
}

/// What a tool provides to the loop.
pub trait Collector {
    /// A file descriptor (ring buffer) to watch for streamed events, if the tool streams any.
    fn event_fd(&self) -> Option<RawFd> {
        None
    }
    /// Called when `event_fd` is readable.
    fn on_events(&mut self) -> anyhow::Result<()> {
        Ok(())
    }
    /// Everything recorded in `window`, as a report.
    fn collect(&mut self, window: &Window) -> anyhow::Result<Report>;
    /// Lines printed once after attaching (JSON: a meta object), before any window.
    fn preamble(&self) -> Option<Report> {
        None
    }
}

/// Test hook for the reliability suite: `TRACEKIT_FAULT=panic` or `=error` makes the run fail
/// right after attaching, to prove that no exit path leaves programs in the kernel.
fn fault_injection() -> anyhow::Result<()> {
    match std::env::var("TRACEKIT_FAULT").as_deref() {
        Ok("panic") => panic!("fault injected by TRACEKIT_FAULT=panic"),
        Ok("error") => anyhow::bail!("fault injected by TRACEKIT_FAULT=error"),
        _ => Ok(()),
    }
}

struct Fd(RawFd);
impl std::os::fd::AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// Runs `collector` until the duration elapses or a signal arrives, writing each window's
/// report to stdout or `--output`.
pub fn drive(common: &Common, collector: &mut dyn Collector) -> anyhow::Result<Stop> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .context("starting the event loop")?;
    rt.block_on(drive_async(common, collector))
}

async fn drive_async(common: &Common, collector: &mut dyn Collector) -> anyhow::Result<Stop> {
    let mut sink = Sink::open(common.output.as_deref())?;
    let emit = |sink: &mut Sink, r: &Report| -> anyhow::Result<()> {
        let s = if common.json {
            render::json(r)
        } else {
            render::text(r, common.hist)
        };
        sink.write(&s)?;
        Ok(())
    };
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut sighup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    let events = match collector.event_fd() {
        // SAFETY: the fd belongs to a map the collector owns, and the collector outlives this
        // function and so the AsyncFd registration.
        Some(fd) => Some(
            unsafe { AsyncFd::register_with_interest(Fd(fd), Interest::READABLE) }
                .map_err(|e| anyhow::anyhow!("watching the ring buffer: {e}"))?,
        ),
        None => None,
    };

    if let Some(p) = collector.preamble() {
        emit(&mut sink, &p)?;
    }
    fault_injection()?;

    let run_start = Instant::now();
    let deadline = common.duration.map(|d| run_start + d);
    let mut win_start = (Instant::now(), SystemTime::now());
    let mut index = 0u32;
    loop {
        let next_tick = common.interval.map(|i| win_start.0 + i);
        let wake = match (next_tick, deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let sleep = async {
            match wake {
                Some(t) => tokio::time::sleep_until(t.into()).await,
                None => std::future::pending().await,
            }
        };
        let readable = async {
            match &events {
                Some(fd) => match fd.readable().await {
                    Ok(mut g) => {
                        g.clear_ready();
                        true
                    }
                    Err(_) => std::future::pending().await,
                },
                None => std::future::pending().await,
            }
        };
        let stop = tokio::select! {
            _ = sleep => {
                if deadline.is_some_and(|d| Instant::now() >= d) { Stop::Duration } else { Stop::Running }
            }
            true = readable => {
                collector.on_events()?;
                continue;
            }
            _ = sigint.recv() => Stop::Signal("SIGINT"),
            _ = sigterm.recv() => Stop::Signal("SIGTERM"),
            _ = sighup.recv() => Stop::Signal("SIGHUP"),
        };
        if events.is_some() {
            collector.on_events()?;
        }
        let now = (Instant::now(), SystemTime::now());
        let window = Window {
            index,
            start: win_start.1,
            end: now.1,
            elapsed: now.0 - win_start.0,
            last: stop != Stop::Running,
            interval: common.interval.is_some(),
            stop,
        };
        let report = collector.collect(&window)?;
        emit(&mut sink, &report)?;
        if stop != Stop::Running {
            sink.finish()?;
            return Ok(stop);
        }
        index += 1;
        win_start = now;
    }
}
