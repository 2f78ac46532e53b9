//! The run loop every tool shares: one loop driving one or several collectors (a tool, or all
//! of them under `triage`), with one clock, one set of windows, signals and output.
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

use tokio::io::{unix::AsyncFd, Interest};

use crate::error::{Context as _, Error, Result};
use crate::host::facts::Facts;

pub mod collector;
pub mod emit;
pub mod live;
pub mod scope;

pub use collector::{Collector, Meta, Output, Stats};
pub use emit::{Emitter, Stream};
pub use scope::{RunOpts, Scope};

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

    /// What a title line says of the window: `2.00s (duration elapsed)`, preceded in an
    /// interval run by `interval 3 ending 2026-11-30T11:27:00.123Z, `.
    pub fn span(&self) -> String {
        let when = if self.interval {
            format!("interval {} ending {}, ", self.index + 1, self.end_json().0)
        } else {
            String::new()
        };
        format!("{when}{:.2}s ({})", self.secs(), self.stop.as_str())
    }
}

/// Test hook for the reliability suite: `TRACEKIT_FAULT=panic` or `=error` makes the run fail
/// 300 ms after attaching, to prove that no exit path leaves programs in the kernel. The delay
/// lets the suite see the programs loaded first (a fault at once raced its check in CI).
fn fault_injection() -> Result<()> {
    let fault = std::env::var("TRACEKIT_FAULT");
    if fault.is_ok() {
        std::thread::sleep(Duration::from_millis(300));
    }
    match fault.as_deref() {
        Ok("panic") => panic!("fault injected by TRACEKIT_FAULT=panic"),
        Ok("error") => Err(Error::other("fault injected by TRACEKIT_FAULT=error")),
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

/// How often `--children` looks for new descendants.
const CHILDREN_EVERY: Duration = Duration::from_millis(500);

/// How long programs may still be writing the generation that was just flipped away from: they
/// run for microseconds, so 2 ms is ample (one wait for every collector of the run).
const FLIP_SETTLE: Duration = Duration::from_millis(2);

/// Runs `collectors` until the duration elapses, a signal arrives or the emitter's reader goes
/// away, handing each window's outputs to `emit`.
pub fn run(
    collectors: &mut [Box<dyn Collector>],
    opts: &RunOpts,
    facts: &Facts,
    emit: &mut dyn Emitter,
) -> Result<Stop> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(|source| Error::Io {
            what: "starting the event loop".into(),
            source,
        })?;
    rt.block_on(run_async(collectors, opts, facts, emit))
}

/// One readiness future per collector event fd, and which collector it belongs to.
fn register(collectors: &[Box<dyn Collector>]) -> Result<Vec<(usize, AsyncFd<Fd>)>> {
    let mut out = Vec::new();
    for (i, c) in collectors.iter().enumerate() {
        for fd in c.event_fds() {
            // SAFETY: the fd belongs to a map the collector owns, and the collectors outlive
            // the run loop and so the AsyncFd registration.
            let afd = unsafe { AsyncFd::register_with_interest(Fd(fd), Interest::READABLE) }
                .map_err(|e| Error::Io {
                    what: format!("watching the ring buffer of {}", c.name()),
                    source: std::io::Error::other(e.to_string()),
                })?;
            out.push((i, afd));
        }
    }
    Ok(out)
}

/// The first ring buffer with records, by collector index.
async fn any_readable(fds: &[(usize, AsyncFd<Fd>)]) -> usize {
    if fds.is_empty() {
        return std::future::pending().await;
    }
    let futs = fds.iter().map(|(i, fd)| {
        Box::pin(async move {
            match fd.readable().await {
                Ok(mut g) => {
                    g.clear_ready();
                    *i
                }
                Err(_) => std::future::pending().await,
            }
        })
    });
    futures_select_all(futs).await
}

/// When each collector's [`Collector::on_events`] is next due, at its own
/// [`Collector::poll_interval`]: at the shortest one (memstall's 10 ms) for all, runq-lat's and
/// net-rx's walks of their maps' keys took 46 % of serve's CPU on an idle node.
struct Polls {
    every: Vec<Option<Duration>>,
    due: Vec<Option<Instant>>,
}

impl Polls {
    fn new(every: impl Iterator<Item = Option<Duration>>, now: Instant) -> Polls {
        let every: Vec<_> = every.collect();
        let due = every.iter().map(|p| p.map(|p| now + p)).collect();
        Polls { every, due }
    }

    /// The earliest deadline, `None` when no collector polls.
    fn next(&self) -> Option<Instant> {
        self.due.iter().flatten().min().copied()
    }

    /// The collectors due at `now`, each given its next deadline one interval from `now`.
    fn due(&mut self, now: Instant) -> Vec<usize> {
        let mut out = Vec::new();
        for (i, (due, every)) in self.due.iter_mut().zip(&self.every).enumerate() {
            if let (Some(t), Some(p)) = (*due, every) {
                if t <= now {
                    out.push(i);
                    *due = Some(now + *p);
                }
            }
        }
        out
    }
}

/// `select_all` over boxed futures without pulling in the futures crate: polls each in turn.
async fn futures_select_all<F>(futs: impl Iterator<Item = std::pin::Pin<Box<F>>>) -> usize
where
    F: std::future::Future<Output = usize>,
{
    let mut futs: Vec<_> = futs.collect();
    std::future::poll_fn(move |cx| {
        for f in futs.iter_mut() {
            if let std::task::Poll::Ready(v) = f.as_mut().poll(cx) {
                return std::task::Poll::Ready(v);
            }
        }
        std::task::Poll::Pending
    })
    .await
}

async fn run_async(
    collectors: &mut [Box<dyn Collector>],
    opts: &RunOpts,
    facts: &Facts,
    emit: &mut dyn Emitter,
) -> Result<Stop> {
    let wake = match SIGNALS.get() {
        // SAFETY: the pipe's read end lives in a static for the life of the process.
        Some(s) => Some(
            unsafe { AsyncFd::register_with_interest(Fd(s.wake.as_raw_fd()), Interest::READABLE) }
                .map_err(|e| Error::Io {
                    what: "watching for signals".into(),
                    source: std::io::Error::other(e.to_string()),
                })?,
        ),
        None => None,
    };
    let events = register(collectors)?;
    let mut polls = Polls::new(collectors.iter().map(|c| c.poll_interval()), Instant::now());
    let metas: Vec<Meta> = collectors.iter().map(|c| c.meta()).collect();
    tracing::debug!("metas built");
    if !emit.begin(&metas, opts)? {
        return Ok(Stop::ReaderGone);
    }
    tracing::debug!("metas written");
    fault_injection()?;

    let run_start = Instant::now();
    let deadline = opts.duration.and_then(|d| run_start.checked_add(d));
    let mut win_start = (Instant::now(), SystemTime::now());
    let mut index = 0u32;
    // Polls and the children check keep their own deadlines across iterations: a timer made
    // anew each time round would never fire while ring-buffer records arrive more often than
    // its period (under triage the announcements of new processes did, and net-rx learnt no
    // socket owner until the window's end, when a receiver that had exited was gone).
    let mut next_follow = tokio::time::Instant::now() + CHILDREN_EVERY;
    let early = emit.early();
    loop {
        let next_tick = opts.interval.and_then(|i| win_start.0.checked_add(i));
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
        let polled = async {
            match polls.next() {
                Some(t) => tokio::time::sleep_until(t.into()).await,
                None => std::future::pending().await,
            }
        };
        let follow = async {
            if opts.children_of.is_empty() {
                std::future::pending::<()>().await
            }
            tokio::time::sleep_until(next_follow).await
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
        let ended_early = async {
            match &early {
                Some(n) => n.notified().await,
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
                i = any_readable(&events) => {
                    collectors[i].on_events()?;
                    continue;
                }
                _ = polled => {
                    for i in polls.due(Instant::now()) {
                        collectors[i].on_events()?;
                    }
                    continue;
                }
                quit = emit.input() => {
                    if quit { Stop::Signal("q") } else { continue }
                }
                _ = ended_early => Stop::Running,
                _ = follow => {
                    next_follow = tokio::time::Instant::now() + CHILDREN_EVERY;
                    let pids = opts.followed_pids();
                    for c in collectors.iter_mut() {
                        c.set_filter_pids(&pids)?;
                    }
                    continue;
                }
                _ = signalled => match stop_signal() {
                    Some(sig) => Stop::Signal(sig),
                    None => continue,
                },
            }
        };
        // Every collector starts its next generation, then one settle wait for all.
        for c in collectors.iter_mut() {
            c.flip()
                .with_context(|| format!("starting a new window of {}", c.name()))?;
        }
        std::thread::sleep(FLIP_SETTLE);
        let now = (Instant::now(), SystemTime::now());
        let window = Window {
            index,
            start: win_start.1,
            end: now.1,
            elapsed: now.0 - win_start.0,
            last: stop != Stop::Running,
            interval: opts.interval.is_some(),
            stop,
        };
        let mut outs = Vec::with_capacity(collectors.len());
        let rows = emit.wants_rows();
        for c in collectors.iter_mut() {
            c.on_events()?;
            let mut out = c.collect(&window)?;
            if !rows {
                out.sections = Vec::new();
            }
            outs.push(out);
        }
        // Once, after every collector has named its processes for this window.
        facts.lock().end_window();
        if !emit.window(&window, &outs)? {
            return Ok(Stop::ReaderGone);
        }
        if stop != Stop::Running {
            emit.finish()?;
            return Ok(stop);
        }
        index += 1;
        win_start = now;
    }
}

/// Gives the process's last references to its BPF programs and links to a short-lived child,
/// so tracekit itself exits at once.
///
/// Closing a classic tracepoint's (or kprobe's) perf event waits for an RCU grace period under
/// the kernel-wide `event_mutex` (`perf_trace_destroy` -> `tracepoint_synchronize_unregister`),
/// 35–90 ms per event here: twelve hooks took ~0.9 s to detach, in this process or from many
/// threads alike. Whoever drops the last reference pays, so the child holds copies of every
/// descriptor, waits until this process is gone (EOF on a pipe whose write end only this process
/// holds), and only then closes them, detaching everything within about a second. Nothing
/// outlives that: if the child is killed, the kernel closes its descriptors the same way. Done
/// whenever there is something slow to close (one classic tracepoint, io-lat's writeback hook,
/// took io-lat's exit from 2.8 ms to 68 ms when only two or more were handed over), and only
/// from a single-threaded process (fork copies one thread).
pub fn detach_in_background(slow_links: usize) {
    if slow_links == 0 || crate::host::proc::threads() != Some(1) {
        return;
    }
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two fds into `fds`.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return;
    }
    let (rd, wr) = (fds[0], fds[1]);
    // SAFETY: the process is single-threaded (checked above), so the child is a full copy; it
    // then only makes async-signal-safe syscalls and _exits.
    match unsafe { libc::fork() } {
        0 => {
            // SAFETY: plain syscalls in the child on descriptors it owns. The name says what
            // the process is in ps; closing 0-2 first lets readers of tracekit's output see EOF
            // at once; read() returns 0 once the parent (the only other holder of `wr`) exits.
            unsafe {
                libc::prctl(libc::PR_SET_NAME, c"tracekit-detach".as_ptr());
                libc::close(0);
                libc::close(1);
                libc::close(2);
                libc::close(wr);
                let mut b = 0u8;
                while libc::read(rd, (&raw mut b).cast(), 1) < 0
                    && *libc::__errno_location() == libc::EINTR
                {}
                libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
                libc::_exit(0);
            }
        }
        -1 => {
            tracing::debug!(
                "fork for background detach failed: {}",
                std::io::Error::last_os_error()
            );
            // SAFETY: closing the pipe this function made.
            unsafe {
                libc::close(rd);
                libc::close(wr);
            }
        }
        _ => {
            // The write end stays open until this process exits.
            // SAFETY: closing the read end this function made; the child has its own copy.
            unsafe { libc::close(rd) };
        }
    }
}

#[cfg(test)]
mod polls_tests {
    use super::*;

    #[test]
    fn each_collector_is_polled_at_its_own_interval() {
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        let mut p = Polls::new([Some(ms(10)), None, Some(ms(1000))].into_iter(), t0);
        assert_eq!(p.next(), Some(t0 + ms(10)));
        assert!(p.due(t0 + ms(5)).is_empty());
        // A hundred ticks of the 10 ms one: the 1 s one is due once, the other never.
        let mut calls = [0; 3];
        for k in 1..=100 {
            for i in p.due(t0 + ms(10 * k)) {
                calls[i] += 1;
            }
        }
        assert_eq!(calls, [100, 0, 1]);
        assert_eq!(p.next(), Some(t0 + ms(1010)));
        // A late tick (the loop was busy) runs each due one once, from then on.
        assert_eq!(p.due(t0 + ms(5000)), vec![0, 2]);
        assert_eq!(p.next(), Some(t0 + ms(5010)));
    }

    #[test]
    fn nothing_to_poll_never_wakes() {
        let mut p = Polls::new([None, None].into_iter(), Instant::now());
        assert_eq!(p.next(), None);
        assert!(p.due(Instant::now() + Duration::from_secs(60)).is_empty());
    }
}
