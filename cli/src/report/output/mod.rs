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
        fd::AsRawFd,
        unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt},
    },
    path::{Path, PathBuf},
    sync::atomic::Ordering,
    time::Duration,
};

mod pace;

use pace::{stall_error, STDOUT, STDOUT_PACED};
pub use pace::{Pace, DRAIN_GRACE, PENDING_CAP, STALL_CHECK};

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
            if !STDOUT.closed() {
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
mod tests;
