//! The run loop every tool shares: intervals, duration, signals, output, and the final summary.
//!
//! The loop ends when `--duration` elapses or on SIGINT, SIGTERM or SIGHUP; in every case the
//! last window is still collected and printed (as runqlat and bpftrace do on Ctrl-C), the output
//! file is completed, and the caller then drops the session, which detaches everything. It also
//! ends, quietly and with exit code 0, when the reader of stdout goes away (`| head`), like any
//! Unix filter.
//!
//! Signals are caught from the first instructions of `main` ([`install_signal_handlers`]), so a
//! Ctrl-C during start-up is not lost: the run then ends right after attaching, with a summary.

use std::{
    os::fd::{AsRawFd, OwnedFd, RawFd},
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, OnceLock,
    },
    time::{Duration, Instant, SystemTime},
};

use anyhow::Context as _;
use tokio::io::{unix::AsyncFd, Interest};

use crate::{
    options::Common,
    report::output::Sink,
    report::render::{self, Report},
};

/// Why the run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    Running,
    Duration,
    Signal(&'static str),
    /// The reader of stdout (or of the `--output` FIFO) went away.
    ReaderGone,
}

impl Stop {
    pub fn as_str(self) -> &'static str {
        match self {
            Stop::Running => "running",
            Stop::Duration => "duration elapsed",
            Stop::Signal(s) => s,
            Stop::ReaderGone => "reader went away",
        }
    }
}

/// The stop signals: the number of the last one received (0: none yet), and a pipe the
/// handler writes a byte to so the event loop wakes up.
struct Signals {
    last: Arc<AtomicUsize>,
    wake: OwnedFd,
}

static SIGNALS: OnceLock<Signals> = OnceLock::new();

/// Whether `sig` was ignored when tracekit started (a shell sets SIGINT and SIGQUIT to ignored
/// for background jobs of scripts, `nohup` sets SIGHUP).
fn inherited_ignored(sig: libc::c_int) -> bool {
    // SAFETY: sigaction with a null new action only reads the current one into `old`.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}

/// Catches SIGINT, SIGTERM and SIGHUP for the whole run. Called first thing in `main`. An
/// inherited "ignored" SIGINT or SIGTERM is replaced (tracekit started as a background job of a
/// script must still end, with its summary, when signalled); an ignored SIGHUP is left ignored,
/// because that is what `nohup` asks for.
pub fn install_signal_handlers() -> std::io::Result<()> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two fds into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both fds were just created and are owned by nothing else.
    let (read, write): (OwnedFd, OwnedFd) = unsafe {
        use std::os::fd::FromRawFd;
        (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1]))
    };
    let last = Arc::new(AtomicUsize::new(0));
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        if sig == libc::SIGHUP && inherited_ignored(sig) {
            continue;
        }
        // Recorded first, then the wake-up byte: the loop reads the number after waking.
        signal_hook::flag::register_usize(sig, Arc::clone(&last), sig as usize)?;
        signal_hook::low_level::pipe::register_raw(sig, write.as_raw_fd())?;
    }
    // The write end stays open for the life of the process (the handlers write to it).
    std::mem::forget(write);
    let _ = SIGNALS.set(Signals { last, wake: read });
    Ok(())
}

/// The stop signal received so far, if any (by name, as the report says it).
pub fn stop_signal() -> Option<&'static str> {
    let n = SIGNALS.get()?.last.load(Ordering::Relaxed);
    match n as libc::c_int {
        libc::SIGINT => Some("SIGINT"),
        libc::SIGTERM => Some("SIGTERM"),
        libc::SIGHUP => Some("SIGHUP"),
        _ => None,
    }
}

/// Empties the wake-up pipe.
fn drain_wake(fd: RawFd) {
    let mut buf = [0u8; 64];
    // SAFETY: reads into a local buffer from a non-blocking pipe we own.
    while unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
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
    let (rss, hwm) = crate::host::proc::self_rss_kib();
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

/// Longest single sleep of the loop: far deadlines (`--duration 10y`) are reached in steps, so
/// no timer ever holds an instant the clock cannot represent.
const MAX_SLEEP: Duration = Duration::from_secs(3600);

/// Runs `collector` until the duration elapses, a signal arrives or the reader goes away,
/// writing each window's report to `sink` (stdout or `--output`, opened before attaching).
pub fn drive(common: &Common, sink: Sink, collector: &mut dyn Collector) -> anyhow::Result<Stop> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .context("starting the event loop")?;
    rt.block_on(drive_async(common, sink, collector))
}

async fn drive_async(
    common: &Common,
    mut sink: Sink,
    collector: &mut dyn Collector,
) -> anyhow::Result<Stop> {
    // Ok(false): the reader went away.
    let emit = |sink: &mut Sink, r: &Report| -> anyhow::Result<bool> {
        let s = if common.json {
            render::json(r)
        } else {
            render::text(r, common.hist)
        };
        match sink.write(&s) {
            Ok(()) => Ok(true),
            Err(e) if e.is_broken_pipe() => Ok(false),
            Err(e) => Err(e.into()),
        }
    };
    let wake = match SIGNALS.get() {
        // SAFETY: the pipe's read end lives in a static for the life of the process.
        Some(s) => Some(
            unsafe { AsyncFd::register_with_interest(Fd(s.wake.as_raw_fd()), Interest::READABLE) }
                .map_err(|e| anyhow::anyhow!("watching for signals: {e}"))?,
        ),
        None => None,
    };
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
        if !emit(&mut sink, &p)? {
            return Ok(Stop::ReaderGone);
        }
    }
    fault_injection()?;

    let run_start = Instant::now();
    let deadline = common.duration.and_then(|d| run_start.checked_add(d));
    let mut win_start = (Instant::now(), SystemTime::now());
    let mut index = 0u32;
    loop {
        let next_tick = common.interval.and_then(|i| win_start.0.checked_add(i));
        let wake_at = match (next_tick, deadline) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let sleep = async {
            let step = match wake_at {
                Some(t) => t.saturating_duration_since(Instant::now()).min(MAX_SLEEP),
                None => MAX_SLEEP,
            };
            tokio::time::sleep(step).await
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
        let signalled = async {
            match &wake {
                Some(fd) => match fd.readable().await {
                    Ok(mut g) => {
                        drain_wake(fd.get_ref().0);
                        g.clear_ready();
                    }
                    Err(_) => std::future::pending().await,
                },
                None => std::future::pending().await,
            }
        };
        // A signal that arrived before the loop started (during start-up) ends it at once.
        let stop = if let Some(sig) = stop_signal() {
            Stop::Signal(sig)
        } else {
            tokio::select! {
                _ = sleep => {
                    let now = Instant::now();
                    if deadline.is_some_and(|d| now >= d) {
                        Stop::Duration
                    } else if wake_at.is_some_and(|t| now >= t) {
                        Stop::Running
                    } else {
                        // A step towards a far deadline, or no deadline at all.
                        continue;
                    }
                }
                true = readable => {
                    collector.on_events()?;
                    continue;
                }
                _ = signalled => match stop_signal() {
                    Some(sig) => Stop::Signal(sig),
                    None => continue,
                },
            }
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
        if !emit(&mut sink, &report)? {
            return Ok(Stop::ReaderGone);
        }
        if stop != Stop::Running {
            sink.finish()?;
            return Ok(stop);
        }
        index += 1;
        win_start = now;
    }
}
