//! The writers that never block a run: [`Pace`] for a non-blocking device or FIFO (what the
//! reader has not taken waits in a bounded buffer, whole writes dropped and counted past it),
//! and the stdout queue with its own thread ([`STDOUT`], see `Sink::pace_stdout`).

use std::{
    io,
    os::fd::RawFd,
    sync::{atomic::AtomicBool, Condvar, Mutex},
    time::{Duration, Instant},
};

/// Most bytes a device or FIFO may hold back before writes are dropped: far more than a run
/// writes between two reads of any reader that is reading at all.
pub const PENDING_CAP: usize = 4 << 20;

/// How long the end of the run waits for a stalled reader to take what is still held back.
pub const DRAIN_GRACE: Duration = Duration::from_secs(1);

/// What a non-blocking device or FIFO has not taken yet, and what was dropped.
#[derive(Debug, Default)]
pub struct Pace {
    pub(super) pending: Vec<u8>,
    pub(super) lost: u64,
}

impl Pace {
    /// Writes what `fd` takes now (it is `O_NONBLOCK`) from `pending`, then from `s`; keeps the
    /// rest while it fits in `cap`, else drops all of `s` (whole writes only, so what the reader
    /// gets is whole lines). Never waits.
    pub(super) fn put(&mut self, fd: RawFd, s: &[u8], cap: usize) -> io::Result<()> {
        self.flush(fd)?;
        let mut rest = s;
        if self.pending.is_empty() {
            let n = write_some(fd, rest)?;
            rest = &rest[n..];
        }
        if rest.is_empty() {
            return Ok(());
        }
        if self.pending.len() + rest.len() <= cap {
            self.pending.extend_from_slice(rest);
        } else if rest.len() == s.len() {
            self.lost += s.len() as u64;
        } else {
            // Part of `s` is out: the rest must follow, or the reader gets half a line.
            self.pending.extend_from_slice(rest);
        }
        Ok(())
    }

    /// Writes what `fd` takes now of `pending`.
    pub(super) fn flush(&mut self, fd: RawFd) -> io::Result<()> {
        if !self.pending.is_empty() {
            let n = write_some(fd, &self.pending)?;
            self.pending.drain(..n);
        }
        Ok(())
    }

    /// Waits at most `grace` for the reader to take `pending`; then the bytes never written
    /// (dropped during the run, and still held back), 0 when all arrived.
    pub(super) fn drain(&mut self, fd: RawFd, grace: Duration) -> io::Result<u64> {
        let deadline = Instant::now() + grace;
        self.flush(fd)?;
        while !self.pending.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLOUT,
                revents: 0,
            };
            // SAFETY: poll on one pollfd we own, for at most `left`.
            unsafe { libc::poll(&mut p, 1, left.as_millis().clamp(1, 1000) as libc::c_int) };
            self.flush(fd)?;
        }
        Ok(self.lost + self.pending.len() as u64)
    }
}

/// One `write(2)` loop on a non-blocking fd: the bytes it took before it would block.
fn write_some(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &buf[done..];
        // SAFETY: writes from a live slice to an fd the caller owns.
        let n = unsafe { libc::write(fd, rest.as_ptr().cast(), rest.len()) };
        if n > 0 {
            done += n as usize;
            continue;
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => break,
            _ if n == 0 => break,
            _ => return Err(e),
        }
    }
    Ok(done)
}

/// Whether stdout goes through [`STDOUT`]'s thread ([`Sink::pace_stdout`]).
pub(super) static STDOUT_PACED: AtomicBool = AtomicBool::new(false);

/// The stdout writer: its queue, shared with its thread, and the thread to join.
pub(super) static STDOUT: Queue = Queue {
    state: Mutex::new(QueueState {
        chunks: std::collections::VecDeque::new(),
        queued: 0,
        lost: 0,
        closed: false,
        exited: false,
        failed: None,
        started: false,
    }),
    cv: Condvar::new(),
};
static STDOUT_THREAD: Mutex<Option<std::thread::JoinHandle<()>>> = Mutex::new(None);

pub(super) struct Queue {
    state: Mutex<QueueState>,
    cv: Condvar,
}

struct QueueState {
    chunks: std::collections::VecDeque<Vec<u8>>,
    /// Bytes queued and not yet taken by the reader (the chunk being written included).
    queued: usize,
    /// Bytes of whole writes dropped because the queue was full.
    lost: u64,
    /// No more writes: the thread exits once the queue is empty.
    closed: bool,
    exited: bool,
    /// Why the thread stopped writing (EPIPE: the reader went away).
    failed: Option<io::ErrorKind>,
    started: bool,
}

impl Queue {
    /// Whether the queue was closed (by `Sink::stalled` or `Sink::finish`).
    pub(super) fn closed(&self) -> bool {
        self.lock().closed
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `s` for the writer thread (started on first use); never waits for the reader.
    pub(super) fn put(&'static self, s: &[u8], cap: usize) -> io::Result<()> {
        let mut st = self.lock();
        if let Some(kind) = st.failed {
            return Err(kind.into());
        }
        if st.queued + s.len() > cap {
            st.lost += s.len() as u64;
            return Ok(());
        }
        if !st.started {
            st.started = true;
            let h = std::thread::Builder::new()
                .name("tracekit-stdout".into())
                .spawn(move || self.write_out())?;
            *STDOUT_THREAD.lock().unwrap_or_else(|e| e.into_inner()) = Some(h);
        }
        st.queued += s.len();
        st.chunks.push_back(s.to_vec());
        self.cv.notify_all();
        Ok(())
    }

    /// The writer thread: blocking writes to fd 1, in order, until closed and empty or a write
    /// fails.
    pub(super) fn write_out(&self) {
        loop {
            let chunk = {
                let mut st = self.lock();
                while st.chunks.is_empty() && !st.closed {
                    st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
                }
                match st.chunks.pop_front() {
                    Some(c) => c,
                    None => {
                        st.exited = true;
                        self.cv.notify_all();
                        return;
                    }
                }
            };
            let mut done = 0;
            while done < chunk.len() {
                let rest = &chunk[done..];
                // SAFETY: writes from a live slice to stdout, which lives as long as the process.
                let n = unsafe { libc::write(1, rest.as_ptr().cast(), rest.len()) };
                let mut st = self.lock();
                if n > 0 {
                    done += n as usize;
                    st.queued -= n as usize;
                    self.cv.notify_all();
                    continue;
                }
                let e = io::Error::last_os_error();
                if n < 0 && e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                st.failed = Some(if n == 0 {
                    io::ErrorKind::WriteZero
                } else {
                    e.kind()
                });
                st.exited = true;
                self.cv.notify_all();
                return;
            }
        }
    }

    /// Closes the queue and waits for the thread to write it all: at most `grace` in all, or
    /// (with `progress`) until `grace` passes without the reader taking anything. Then the
    /// bytes never written (0 when all arrived), or the write error.
    pub(super) fn close_within(&self, grace: Duration, progress: bool) -> io::Result<u64> {
        let mut st = self.lock();
        if !st.started {
            return Ok(st.lost);
        }
        st.closed = true;
        self.cv.notify_all();
        let mut deadline = Instant::now() + grace;
        let mut last = st.queued;
        while !st.exited {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            st = self
                .cv
                .wait_timeout(st, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            if progress && st.queued < last {
                last = st.queued;
                deadline = Instant::now() + grace;
            }
        }
        let res = match st.failed {
            Some(kind) => Err(kind.into()),
            None => Ok(st.lost + st.queued as u64),
        };
        if st.exited {
            drop(st);
            // It has returned or is about to: joined, so the process is single-threaded again
            // (the background detach forks only then).
            if let Some(h) = STDOUT_THREAD
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
            {
                let _ = h.join();
            }
        }
        res
    }
}

/// How long [`Sink::stalled`] lets the stdout writer finish what the run's last window queued:
/// a reader that is reading takes it in microseconds.
pub const STALL_CHECK: Duration = Duration::from_millis(50);

pub(super) fn stall_error(lost: u64) -> io::Error {
    io::Error::other(format!(
        "output stalled: the reader stopped reading; {lost} bytes of the report were not written"
    ))
}
