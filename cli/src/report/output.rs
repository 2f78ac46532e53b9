//! Where a report goes: stdout, or `--output FILE`. The target is checked (and the temporary
//! file created) before anything is attached, so a bad path costs no data; and tracekit never
//! replaces anything it did not create:
//!
//! - a regular file (or a new one), without `--interval`: written to a temporary file in the
//!   same directory (`.NAME.tracekit-PID.tmp`), renamed over FILE when the run ends, so FILE is
//!   never truncated before its replacement is complete; an existing FILE's owner and mode are
//!   kept. The temporary file is removed on every exit path tracekit controls (an error, a
//!   panic, a signal); one left by SIGKILL is removed by the next run writing to the same FILE.
//! - a regular file with `--interval`: opened for appending (created if absent, never
//!   truncated), each interval written as it ends, so `tail -f FILE` follows the run.
//! - a character device, a FIFO (which must have a reader) or a terminal: written directly,
//!   never renamed over (`--output /dev/null` stays a device), and without ever blocking: a
//!   reader that holds the FIFO open and stops reading must not hold the run (and its programs
//!   in the kernel) past `--duration` or a signal. What the reader does not take at once waits
//!   in a bounded buffer ([`PENDING_CAP`]); past that, whole writes are dropped and counted. At
//!   the end the buffer gets [`DRAIN_GRACE`] to drain, then the run fails with one line naming
//!   the stall and how many bytes were not written.
//! - stdout, in a tracing run ([`Sink::pace_stdout`]): written by a thread of its own from a
//!   bounded queue ([`PENDING_CAP`], whole writes dropped and counted past it), so a reader
//!   that holds the pipe open and never reads cannot hold the run in write(). stdout is not
//!   made non-blocking: its file description is shared with the shell that started tracekit.
//!   Elsewhere (reports written once, such as `compare`) stdout is written directly.
//!
//! A tracing run ends its output in two steps: [`Sink::end_run`] before the programs detach
//! (nothing waits there), and [`Sink::finish`] after, which gives a stalled reader its bounded
//! grace: the reader holds only tracekit, never the programs in the kernel.
//!
//! - refused: a directory (`.`, `/`, a path ending in `/`), a block device, a socket, a
//!   symbolic link to a regular file or to nothing (a link to a device or FIFO, such as
//!   `/dev/stdout`, is written through).

use std::{
    fs::{self, File, OpenOptions},
    io::{self, Write},
    os::{
        fd::{AsRawFd, RawFd},
        unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt},
    },
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Condvar, Mutex,
    },
    time::{Duration, Instant},
};

#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// The `--output` target cannot be used: found before the run.
    #[error("cannot use --output {}: {why}", path.display())]
    Target { path: PathBuf, why: String },
    #[error("refusing to write {}: it is a symbolic link {why}", path.display())]
    Symlink { path: PathBuf, why: &'static str },
    /// Opening the target failed (no such directory, permission, read-only filesystem).
    #[error("cannot use --output {}: {source}", path.display())]
    Open { path: PathBuf, source: io::Error },
    /// Writing failed mid-run (a full filesystem, an I/O error).
    #[error("cannot write {}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    /// The reader of stdout (or of the FIFO) went away: the run ends quietly.
    #[error("the reader of {} went away", path.display())]
    BrokenPipe { path: PathBuf },
}

impl OutputError {
    pub fn is_broken_pipe(&self) -> bool {
        matches!(self, OutputError::BrokenPipe { .. })
    }
}

pub enum Sink {
    Stdout,
    /// A temporary file renamed over `dest` at the end.
    Replace {
        tmp: PathBuf,
        dest: PathBuf,
        file: File,
        done: bool,
    },
    /// Written as produced: appended to a regular file, or straight into a device or FIFO
    /// (`pace`: the file is non-blocking, see [`Pace`]).
    Direct {
        dest: PathBuf,
        file: File,
        pace: Option<Pace>,
    },
}

/// Most bytes a device or FIFO may hold back before writes are dropped: far more than a run
/// writes between two reads of any reader that is reading at all.
pub const PENDING_CAP: usize = 4 << 20;

/// How long the end of the run waits for a stalled reader to take what is still held back.
pub const DRAIN_GRACE: Duration = Duration::from_secs(1);

/// What a non-blocking device or FIFO has not taken yet, and what was dropped.
#[derive(Debug, Default)]
pub struct Pace {
    pending: Vec<u8>,
    lost: u64,
}

impl Pace {
    /// Writes what `fd` takes now (it is `O_NONBLOCK`) from `pending`, then from `s`; keeps the
    /// rest while it fits in `cap`, else drops all of `s` (whole writes only, so what the reader
    /// gets is whole lines). Never waits.
    fn put(&mut self, fd: RawFd, s: &[u8], cap: usize) -> io::Result<()> {
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
    fn flush(&mut self, fd: RawFd) -> io::Result<()> {
        if !self.pending.is_empty() {
            let n = write_some(fd, &self.pending)?;
            self.pending.drain(..n);
        }
        Ok(())
    }

    /// Waits at most `grace` for the reader to take `pending`; then the bytes never written
    /// (dropped during the run, and still held back), 0 when all arrived.
    fn drain(&mut self, fd: RawFd, grace: Duration) -> io::Result<u64> {
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
static STDOUT_PACED: AtomicBool = AtomicBool::new(false);

/// The stdout writer: its queue, shared with its thread, and the thread to join.
static STDOUT: Queue = Queue {
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

struct Queue {
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
    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `s` for the writer thread (started on first use); never waits for the reader.
    fn put(&'static self, s: &[u8], cap: usize) -> io::Result<()> {
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
    fn write_out(&self) {
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
    fn close_within(&self, grace: Duration, progress: bool) -> io::Result<u64> {
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

fn stall_error(lost: u64) -> io::Error {
    io::Error::other(format!(
        "output stalled: the reader stopped reading; {lost} bytes of the report were not written"
    ))
}

/// Prefix and suffix of tracekit's temporary files: `.NAME.tracekit-PID.tmp`.
const TMP_MARK: &str = ".tracekit-";
const TMP_SUFFIX: &str = ".tmp";

fn target(path: &Path, why: impl Into<String>) -> OutputError {
    OutputError::Target {
        path: path.to_path_buf(),
        why: why.into(),
    }
}

fn kind_of(ft: &fs::FileType) -> &'static str {
    if ft.is_dir() {
        "a directory"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_symlink() {
        "a symbolic link"
    } else {
        "a regular file"
    }
}

impl Sink {
    /// Checks `path` and opens it as described in the module docs. `interval`: each interval
    /// is written as it ends (append), instead of atomically at the end.
    pub fn open(path: Option<&Path>, interval: bool) -> Result<Sink, OutputError> {
        let Some(dest) = path else {
            return Ok(Sink::Stdout);
        };
        if dest.as_os_str().is_empty() {
            return Err(target(dest, "empty path"));
        }
        if dest.as_os_str().as_encoded_bytes().ends_with(b"/") {
            return Err(target(
                dest,
                "names a directory (it ends in /); give a file name",
            ));
        }
        let open_err = |source| OutputError::Open {
            path: dest.to_path_buf(),
            source,
        };
        match fs::symlink_metadata(dest) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Sink::regular(dest, None, interval),
            Err(e) => Err(open_err(e)),
            Ok(meta) => {
                let ft = meta.file_type();
                if ft.is_symlink() {
                    return match fs::metadata(dest) {
                        Err(_) => Err(OutputError::Symlink {
                            path: dest.to_path_buf(),
                            why: "to nothing",
                        }),
                        Ok(m) if m.file_type().is_file() => Err(OutputError::Symlink {
                            path: dest.to_path_buf(),
                            why: "to a regular file (give the file's own path)",
                        }),
                        Ok(m) => Sink::special(dest, &m.file_type(), true),
                    };
                }
                if ft.is_file() {
                    Sink::regular(dest, Some(&meta), interval)
                } else {
                    Sink::special(dest, &ft, false)
                }
            }
        }
    }

    /// A device, FIFO, directory, socket: written directly where that is safe, else refused.
    fn special(dest: &Path, ft: &fs::FileType, via_link: bool) -> Result<Sink, OutputError> {
        if !(ft.is_char_device() || ft.is_fifo()) {
            return Err(target(
                dest,
                format!("it is {}; give a file name", kind_of(ft)),
            ));
        }
        let mut flags = libc::O_NOCTTY | libc::O_CLOEXEC;
        if !via_link {
            flags |= libc::O_NOFOLLOW;
        }
        // Non-blocking for good: without a reader a blocking open would hang before tracing
        // starts, and a reader that stops reading must not hold the run in write().
        flags |= libc::O_NONBLOCK;
        let file = OpenOptions::new()
            .write(true)
            .custom_flags(flags)
            .open(dest)
            .map_err(|e| {
                if e.raw_os_error() == Some(libc::ENXIO) && ft.is_fifo() {
                    target(dest, "the FIFO has no reader")
                } else {
                    OutputError::Open {
                        path: dest.to_path_buf(),
                        source: e,
                    }
                }
            })?;
        // What was opened is what was checked (the path may have changed in between).
        let got = file
            .metadata()
            .map_err(|source| OutputError::Open {
                path: dest.to_path_buf(),
                source,
            })?
            .file_type();
        if !(got.is_char_device() || got.is_fifo()) {
            return Err(target(
                dest,
                format!("it changed to {} while being opened", kind_of(&got)),
            ));
        }
        Ok(Sink::Direct {
            dest: dest.to_path_buf(),
            file,
            pace: Some(Pace::default()),
        })
    }

    /// A regular file (`existing`), or a new one (`None`).
    fn regular(
        dest: &Path,
        existing: Option<&fs::Metadata>,
        interval: bool,
    ) -> Result<Sink, OutputError> {
        let open_err = |source| OutputError::Open {
            path: dest.to_path_buf(),
            source,
        };
        if interval {
            let file = OpenOptions::new()
                .append(true)
                .create(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NOCTTY)
                .mode(0o644)
                .open(dest)
                .map_err(open_err)?;
            let ft = file.metadata().map_err(open_err)?.file_type();
            if !ft.is_file() {
                return Err(target(dest, format!("it changed to {}", kind_of(&ft))));
            }
            return Ok(Sink::Direct {
                dest: dest.to_path_buf(),
                file,
                pace: None,
            });
        }
        let dir = match dest.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = dest
            .file_name()
            .ok_or_else(|| target(dest, "has no file name"))?
            .to_string_lossy()
            .into_owned();
        remove_stale_temps(&dir, &name);
        let tmp = dir.join(format!(
            ".{name}{TMP_MARK}{}{TMP_SUFFIX}",
            std::process::id()
        ));
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .mode(if existing.is_some() { 0o600 } else { 0o644 })
            .open(&tmp)
            .map_err(open_err)?;
        let sink = Sink::Replace {
            tmp: tmp.clone(),
            dest: dest.to_path_buf(),
            file,
            done: false,
        };
        if let (Some(m), Sink::Replace { file, .. }) = (existing, &sink) {
            // The replacement takes the place of the old file: same owner, same mode.
            let fd = file.as_raw_fd();
            // SAFETY: fchown/fchmod on an fd we own.
            let owner_ok = (m.uid() == unsafe { libc::geteuid() }
                && m.gid() == unsafe { libc::getegid() })
                || unsafe { libc::fchown(fd, m.uid(), m.gid()) } == 0;
            if !owner_ok {
                let e = io::Error::last_os_error();
                return Err(target(
                    dest,
                    format!(
                        "cannot give the new report the existing file's owner (uid {} gid {}): {e}; write it elsewhere",
                        m.uid(),
                        m.gid()
                    ),
                ));
            }
            // SAFETY: as above.
            if unsafe { libc::fchmod(fd, m.mode() & 0o7777) } != 0 {
                return Err(open_err(io::Error::last_os_error()));
            }
        }
        Ok(sink)
    }

    /// [`write`](Sink::write), with `Ok(false)` when the reader went away (`| head`).
    pub fn put(&mut self, s: &str) -> Result<bool, OutputError> {
        match self.write(s) {
            Ok(()) => Ok(true),
            Err(e) if e.is_broken_pipe() => Ok(false),
            Err(e) => Err(e),
        }
    }

    pub fn write(&mut self, s: &str) -> Result<(), OutputError> {
        self.write_bytes(s.as_bytes())
    }

    pub fn write_bytes(&mut self, s: &[u8]) -> Result<(), OutputError> {
        let (res, path) = match self {
            Sink::Stdout if STDOUT_PACED.load(Ordering::Relaxed) => {
                (STDOUT.put(s, PENDING_CAP), Path::new("<stdout>"))
            }
            Sink::Stdout => {
                let mut out = io::stdout().lock();
                (
                    out.write_all(s).and_then(|_| out.flush()),
                    Path::new("<stdout>"),
                )
            }
            Sink::Replace { tmp, file, .. } => (file.write_all(s), tmp.as_path()),
            Sink::Direct {
                dest,
                file,
                pace: Some(pace),
            } => (pace.put(file.as_raw_fd(), s, PENDING_CAP), dest.as_path()),
            Sink::Direct {
                dest,
                file,
                pace: None,
            } => (file.write_all(s), dest.as_path()),
        };
        res.map_err(|e| {
            if e.kind() == io::ErrorKind::BrokenPipe {
                OutputError::BrokenPipe {
                    path: path.to_path_buf(),
                }
            } else {
                OutputError::Io {
                    path: path.to_path_buf(),
                    source: e,
                }
            }
        })
    }

    /// A tracing run's stdout goes through a writer thread (see the module docs): called by
    /// the run, before its first write; a no-op for other sinks.
    pub fn pace_stdout(&self) {
        if matches!(self, Sink::Stdout) {
            STDOUT_PACED.store(true, Ordering::Relaxed);
        }
    }

    /// The end of a tracing run, before its programs detach: completes what needs no reader
    /// (a replacement is renamed over its destination) and hands a device, FIFO or stdout
    /// what it takes at once; never waits. [`finish`](Sink::finish) follows, after the detach.
    pub fn end_run(&mut self) -> Result<(), OutputError> {
        match self {
            Sink::Replace { .. } => self.finish_within(DRAIN_GRACE),
            Sink::Direct {
                dest,
                file,
                pace: Some(pace),
            } => pace.flush(file.as_raw_fd()).map_err(|e| io_error(dest, e)),
            _ => Ok(()),
        }
    }

    /// After [`end_run`](Sink::end_run): whether a reader has not taken everything (or some
    /// was dropped), so the programs should detach before [`finish`](Sink::finish) waits for
    /// it. stdout's writer gets [`STALL_CHECK`] to write the last window. A write error is
    /// `false`: `finish` reports it.
    pub fn stalled(&mut self) -> bool {
        match self {
            Sink::Direct {
                file,
                pace: Some(pace),
                ..
            } => {
                pace.flush(file.as_raw_fd()).is_ok() && (!pace.pending.is_empty() || pace.lost > 0)
            }
            Sink::Stdout if STDOUT_PACED.load(Ordering::Relaxed) => {
                matches!(STDOUT.close_within(STALL_CHECK, false), Ok(n) if n > 0)
            }
            _ => false,
        }
    }

    /// Makes the output complete: for a replacement, fsync and rename over the destination
    /// (once: after [`end_run`](Sink::end_run) nothing is left to do); for a device, FIFO or
    /// a tracing run's stdout, what its reader has not taken gets [`DRAIN_GRACE`] (stdout's:
    /// until the reader takes nothing for that long), and an error says how much never
    /// arrived.
    pub fn finish(&mut self) -> Result<(), OutputError> {
        self.finish_within(DRAIN_GRACE)
    }

    fn finish_within(&mut self, grace: Duration) -> Result<(), OutputError> {
        if matches!(self, Sink::Stdout) && STDOUT_PACED.load(Ordering::Relaxed) {
            let path = Path::new("<stdout>");
            return match STDOUT.close_within(grace, true) {
                Ok(0) => Ok(()),
                Ok(lost) => Err(io_error(path, stall_error(lost))),
                Err(e) => Err(io_error(path, e)),
            };
        }
        if let Sink::Direct {
            dest,
            file,
            pace: Some(pace),
        } = self
        {
            let res = pace.drain(file.as_raw_fd(), grace).and_then(|lost| {
                if lost == 0 {
                    return Ok(());
                }
                Err(stall_error(lost))
            });
            return res.map_err(|e| io_error(dest, e));
        }
        if let Sink::Replace {
            tmp,
            dest,
            file,
            done: done @ false,
        } = self
        {
            let io = |path: &Path| {
                let path = path.to_path_buf();
                move |source| OutputError::Io { path, source }
            };
            file.sync_all().map_err(io(tmp))?;
            // Checked again: only a regular file (or nothing) is ever replaced.
            if let Ok(meta) = fs::symlink_metadata(&*dest) {
                if !meta.file_type().is_file() {
                    return Err(OutputError::Target {
                        path: dest.clone(),
                        why: format!(
                            "it became {} during the run; not replaced",
                            kind_of(&meta.file_type())
                        ),
                    });
                }
            }
            fs::rename(&*tmp, &*dest).map_err(io(dest))?;
            *done = true;
        }
        Ok(())
    }
}

/// A write error on `path`: the reader going away is [`OutputError::BrokenPipe`].
fn io_error(path: &Path, e: io::Error) -> OutputError {
    if e.kind() == io::ErrorKind::BrokenPipe {
        OutputError::BrokenPipe {
            path: path.to_path_buf(),
        }
    } else {
        OutputError::Io {
            path: path.to_path_buf(),
            source: e,
        }
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        if matches!(self, Sink::Stdout) && STDOUT_PACED.load(Ordering::Relaxed) {
            // A run that ends in an error: what it wrote before still reaches a reader that
            // reads.
            // After `stalled` or `finish` (the queue closed), the grace was had already.
            if !STDOUT.lock().closed {
                let _ = STDOUT.close_within(DRAIN_GRACE, true);
            }
        }
        if let Sink::Replace {
            tmp, done: false, ..
        } = self
        {
            let _ = fs::remove_file(tmp);
        }
    }
}

/// Removes `.NAME.tracekit-PID.tmp` files in `dir` left by a tracekit that was killed
/// (SIGKILL, power loss): only those of processes that no longer exist, and only regular files
/// owned by us, so nothing tracekit did not create is touched.
fn remove_stale_temps(dir: &Path, name: &str) {
    let prefix = format!(".{name}{TMP_MARK}");
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    // SAFETY: plain syscall.
    let me = unsafe { libc::geteuid() };
    for e in entries.flatten() {
        let file_name = e.file_name();
        let Some(pid) = file_name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(|n| n.strip_suffix(TMP_SUFFIX))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == std::process::id() || crate::host::proc::exists(pid) {
            continue;
        }
        match e.metadata() {
            Ok(m) if m.file_type().is_file() && m.uid() == me => {
                let _ = fs::remove_file(e.path());
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A FIFO at `f`.
    fn mkfifo(f: &Path) {
        let c = std::ffi::CString::new(f.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: plain syscall with a valid path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    }

    /// The FIFO `f` opened for reading (non-blocking, so no writer is needed yet).
    fn idle_reader(f: &Path) -> File {
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(f)
            .unwrap()
    }

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tk-out-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn existing_file_survives_until_finish() {
        let d = tmpdir("atomic");
        let dest = d.join("report.json");
        fs::write(&dest, "old\n").unwrap();
        let mut s = Sink::open(Some(&dest), false).unwrap();
        s.write("new\n").unwrap();
        assert_eq!(fs::read_to_string(&dest).unwrap(), "old\n");
        s.finish().unwrap();
        assert_eq!(fs::read_to_string(&dest).unwrap(), "new\n");
        assert_eq!(
            fs::read_dir(&d).unwrap().count(),
            1,
            "temporary file left behind"
        );
    }

    #[test]
    fn replacement_keeps_mode() {
        use std::os::unix::fs::PermissionsExt;
        let d = tmpdir("mode");
        let dest = d.join("r.txt");
        fs::write(&dest, "old").unwrap();
        fs::set_permissions(&dest, fs::Permissions::from_mode(0o600)).unwrap();
        let mut s = Sink::open(Some(&dest), false).unwrap();
        s.write("new").unwrap();
        s.finish().unwrap();
        let m = fs::metadata(&dest).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o600);
    }

    #[test]
    fn abandoned_output_leaves_old_file_and_no_temp() {
        let d = tmpdir("abandon");
        let dest = d.join("r.txt");
        fs::write(&dest, "old").unwrap();
        {
            let mut s = Sink::open(Some(&dest), false).unwrap();
            s.write("partial").unwrap();
        }
        assert_eq!(fs::read_to_string(&dest).unwrap(), "old");
        assert_eq!(fs::read_dir(&d).unwrap().count(), 1);
    }

    #[test]
    fn stale_temps_of_dead_processes_are_removed_others_kept() {
        let d = tmpdir("stale");
        let dest = d.join("r.txt");
        // pid_max is at most 2^22: this pid cannot exist.
        let dead = d.join(format!(".r.txt{TMP_MARK}{}{TMP_SUFFIX}", 1u32 << 23));
        let alive = d.join(format!(".r.txt{TMP_MARK}1{TMP_SUFFIX}"));
        let other = d.join(format!(".other{TMP_MARK}{}{TMP_SUFFIX}", 1u32 << 23));
        for f in [&dead, &alive, &other] {
            fs::write(f, "x").unwrap();
        }
        let mut s = Sink::open(Some(&dest), false).unwrap();
        s.write("r").unwrap();
        s.finish().unwrap();
        assert!(!dead.exists());
        assert!(alive.exists(), "pid 1 lives: its file is not stale");
        assert!(other.exists(), "another report's file is not touched");
    }

    #[test]
    fn interval_mode_appends_as_it_goes() {
        let d = tmpdir("append");
        let dest = d.join("r.ndjson");
        fs::write(&dest, "kept\n").unwrap();
        let mut s = Sink::open(Some(&dest), true).unwrap();
        s.write("one\n").unwrap();
        assert_eq!(fs::read_to_string(&dest).unwrap(), "kept\none\n");
        s.write("two\n").unwrap();
        s.finish().unwrap();
        assert_eq!(fs::read_to_string(&dest).unwrap(), "kept\none\ntwo\n");
    }

    #[test]
    fn refuses_symlinks_directories_and_block_devices() {
        let d = tmpdir("symlink");
        let target = d.join("target");
        fs::write(&target, "precious").unwrap();
        let link = d.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = Sink::open(Some(&link), false).err().unwrap();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert_eq!(fs::read_to_string(&target).unwrap(), "precious");
        let dangling = d.join("dangling");
        std::os::unix::fs::symlink(d.join("nothing"), &dangling).unwrap();
        assert!(Sink::open(Some(&dangling), false).is_err());
        assert!(!d.join("nothing").exists());
        for p in [d.as_path(), Path::new("."), Path::new("/")] {
            let e = Sink::open(Some(p), false).err().unwrap();
            assert!(e.to_string().contains("directory"), "{e}");
            assert_eq!(
                crate::error::Error::from(e).exit(),
                crate::error::Exit::Usage
            );
        }
        let slash = PathBuf::from(format!("{}/new/", d.display()));
        let e = Sink::open(Some(&slash), false).err().unwrap();
        assert!(e.to_string().contains("ends in /"), "{e}");
        assert!(!d.join("new").exists());
    }

    #[test]
    fn devices_are_written_not_replaced() {
        let mut s = Sink::open(Some(Path::new("/dev/null")), false).unwrap();
        assert!(matches!(s, Sink::Direct { .. }));
        s.write("x").unwrap();
        s.finish().unwrap();
        assert!(fs::symlink_metadata("/dev/null")
            .unwrap()
            .file_type()
            .is_char_device());
        let mut full = Sink::open(Some(Path::new("/dev/full")), false).unwrap();
        let e = full.write("x").unwrap_err();
        let text = e.to_string();
        assert_eq!(
            crate::error::Error::from(e).exit(),
            crate::error::Exit::Failure
        );
        assert_eq!(text.matches("No space left").count(), 1, "{text}");
    }

    #[test]
    fn fifo_without_reader_is_refused_at_once() {
        let d = tmpdir("fifo");
        let f = d.join("fifo");
        mkfifo(&f);
        let e = Sink::open(Some(&f), false).err().unwrap();
        assert!(e.to_string().contains("no reader"), "{e}");
        assert!(fs::symlink_metadata(&f).unwrap().file_type().is_fifo());
    }

    /// A FIFO whose reader never reads: writes return at once, what does not fit is held back
    /// up to the cap and then dropped, and finishing says how much never arrived.
    #[test]
    fn stalled_fifo_reader_never_blocks_the_writer() {
        let d = tmpdir("stall");
        let f = d.join("fifo");
        mkfifo(&f);
        // The reader: open, never read.
        let reader = idle_reader(&f);
        let mut s = Sink::open(Some(&f), false).unwrap();
        let line = format!("{}\n", "x".repeat(1023));
        let n = 2 * PENDING_CAP / line.len();
        for _ in 0..n {
            s.write(&line).unwrap();
        }
        let Sink::Direct {
            pace: Some(pace), ..
        } = &s
        else {
            panic!("a FIFO is paced");
        };
        assert!(pace.pending.len() <= PENDING_CAP, "{}", pace.pending.len());
        assert!(
            pace.lost > 0 && pace.lost % line.len() as u64 == 0,
            "{}",
            pace.lost
        );
        let e = s.finish_within(Duration::from_millis(50)).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("stalled") && text.contains("bytes"), "{text}");
        let pipe_took = (n * line.len()) as u64 - pace_lost(&text);
        assert!(pipe_took > 0 && pipe_took <= 1 << 20, "{text}");
        assert_eq!(
            crate::error::Error::from(e).exit(),
            crate::error::Exit::Failure
        );
        drop(reader);
    }

    /// The byte count of a stall error.
    fn pace_lost(text: &str) -> u64 {
        let before = text.split(" bytes").next().unwrap();
        before.rsplit(' ').next().unwrap().parse().unwrap()
    }

    /// A reader that is reading gets every byte, in order, held-back ones included.
    #[test]
    fn slow_fifo_reader_gets_everything() {
        let d = tmpdir("slow");
        let f = d.join("fifo");
        mkfifo(&f);
        let reader = idle_reader(&f);
        let mut s = Sink::open(Some(&f), false).unwrap();
        let mut want = String::new();
        for i in 0..20_000 {
            let l = format!("line {i}\n");
            s.write(&l).unwrap();
            want.push_str(&l);
        }
        let t = std::thread::spawn(move || {
            // SAFETY: fcntl on an fd this thread owns; reads block from here on.
            unsafe { libc::fcntl(reader.as_raw_fd(), libc::F_SETFL, 0) };
            let mut got = String::new();
            io::Read::read_to_string(&mut { reader }, &mut got).unwrap();
            got
        });
        s.finish_within(Duration::from_secs(30)).unwrap();
        drop(s);
        assert_eq!(t.join().unwrap(), want);
    }
}
