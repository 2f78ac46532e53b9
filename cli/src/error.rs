//! The exit codes, and the one error type every layer's errors fold into.
//!
//! Library modules return their own `thiserror` enums naming the file, event or program
//! involved (`TracefsError`, `BtfError`, `LoadError`, `OutputError`, `HostError`); none of them
//! imports this module. Here each folds into [`Error`] by `From`, and [`Error::exit`] maps every
//! variant to its documented exit code: the binary's edge prints [`one_line`] and exits with
//! that code, with no downcasting.

use std::{fmt::Display, process::ExitCode};

use crate::{
    host::HostError,
    kernel::{btf::BtfError, loader::LoadError, tracefs::TracefsError},
    report::output::OutputError,
};

/// Exit codes, documented in `tracekit --help`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// Ran and reported, or the reader of stdout went away (`| head`).
    Ok = 0,
    /// Any other failure (I/O while writing the report, an unexpected kernel answer).
    Failure = 1,
    /// Bad command line: unknown subcommand, malformed value, an `--output` that cannot be
    /// written, a `--pid` that is a thread.
    Usage = 2,
    /// A capability is missing (not root); the message names it.
    Permission = 3,
    /// The kernel lacks something the tool needs: tracefs, BTF, a tracepoint, a field.
    KernelFeature = 4,
    /// A `--pid` names no running process.
    NoSuchProcess = 5,
    /// `doctor`: at least one tool cannot run on this kernel (the report says which and why).
    ToolsUnavailable = 6,
    /// `compare --fail-on-regression`: a significant change for the worse.
    Regression = 7,
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> Self {
        ExitCode::from(e as u8)
    }
}

/// Text for `--help`.
pub const EXIT_CODES_HELP: &str = "Exit codes:
  0  ran and reported (also when the reader of stdout went away, as with `| head`)
  1  other failure (e.g. writing the report failed mid-run)
  2  bad command line, including an --output that cannot be written and a --pid that is a thread
  3  not permitted: a capability is missing (the message names it)
  4  the kernel lacks something needed (tracefs, BTF, a tracepoint or field)
  5  a --pid names no running process
  6  doctor: some tool cannot run on this kernel (the report says which and why)
  7  compare --fail-on-regression: a significant change for the worse

Environment:
  TRACEKIT_TRACEFS=PATH  use the tracefs mounted at PATH (e.g. /host/sys/kernel/tracing in a container)
  TRACEKIT_BTF=FILE  read the kernel's BTF from FILE instead of /sys/kernel/btf/vmlinux
  TRACEKIT_PROC=DIR, TRACEKIT_SYS=DIR  read the host's /proc and /sys from DIR (a container with them mounted elsewhere)
  RUST_LOG=tracekit=debug  log attach decisions and start-up timings to stderr";

/// Every error tracekit reports.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Permission(String),
    #[error("{0}")]
    KernelFeature(String),
    #[error("no process with pid {0} (it may have exited)")]
    NoSuchProcess(u32),
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    ToolsUnavailable(String),
    #[error("{0}")]
    Regression(String),
    #[error(transparent)]
    Tracefs(#[from] TracefsError),
    #[error(transparent)]
    Btf(#[from] BtfError),
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Output(#[from] OutputError),
    #[error(transparent)]
    Host(#[from] HostError),
    /// A map operation the kernel refused (an unexpected answer: exit 1).
    #[error(transparent)]
    Map(#[from] aya::maps::MapError),
    /// An operation that failed at the OS level, named by what it was doing.
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    /// `source`, with what tracekit was doing when it happened.
    #[error("{context}")]
    Context { context: String, source: Box<Error> },
    /// Anything else (unexpected kernel answers): exit code 1.
    #[error("{0}")]
    Other(String),
}

/// Results of everything above the module level.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn other(msg: impl Display) -> Error {
        Error::Other(msg.to_string())
    }

    /// The documented exit code of this error.
    pub fn exit(&self) -> Exit {
        use std::io::ErrorKind::PermissionDenied;
        match self {
            Error::Permission(_) => Exit::Permission,
            Error::KernelFeature(_) => Exit::KernelFeature,
            Error::NoSuchProcess(_) => Exit::NoSuchProcess,
            Error::Usage(_) => Exit::Usage,
            Error::ToolsUnavailable(_) => Exit::ToolsUnavailable,
            Error::Regression(_) => Exit::Regression,
            Error::Tracefs(e) => match e {
                TracefsError::Permission { .. } | TracefsError::MountPermission { .. } => {
                    Exit::Permission
                }
                TracefsError::Io { .. } | TracefsError::Parse { .. } => Exit::Failure,
                _ => Exit::KernelFeature,
            },
            // A file that is not usable BTF is a missing kernel feature; failing to read it is
            // too, unless the reason is a permission.
            Error::Btf(BtfError::Io { source, .. }) if source.kind() == PermissionDenied => {
                Exit::Permission
            }
            Error::Btf(_) => Exit::KernelFeature,
            Error::Load(e) if e.is_permission() => Exit::Permission,
            Error::Load(LoadError::NoMode {
                permission: true, ..
            }) => Exit::Permission,
            Error::Load(LoadError::NoMode { .. }) => Exit::KernelFeature,
            Error::Load(_) => Exit::Failure,
            Error::Output(e) => match e {
                OutputError::Target { .. }
                | OutputError::Symlink { .. }
                | OutputError::Open { .. } => Exit::Usage,
                OutputError::Io { .. } => Exit::Failure,
                OutputError::BrokenPipe { .. } => Exit::Ok,
            },
            Error::Host(e) => match e {
                HostError::NoSuchProcess(_) => Exit::NoSuchProcess,
                HostError::NotAProcess(_) => Exit::Usage,
                HostError::Privilege(_) => Exit::Permission,
                HostError::Read { source, .. } if source.kind() == PermissionDenied => {
                    Exit::Permission
                }
                _ => Exit::Failure,
            },
            Error::Io { .. } | Error::Map(_) | Error::Other(_) => Exit::Failure,
            Error::Context { source, .. } => source.exit(),
        }
    }

    /// The reader of the report went away (`| head`): the run ends quietly, exit 0.
    pub fn is_broken_pipe(&self) -> bool {
        match self {
            Error::Output(e) => e.is_broken_pipe(),
            Error::Context { source, .. } => source.is_broken_pipe(),
            _ => false,
        }
    }

    fn inner(&self) -> Option<&Error> {
        match self {
            Error::Context { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Adds what tracekit was doing to an error (`.context("reading FSYNC_HIST")`).
pub trait Context<T> {
    fn context(self, what: impl Display) -> Result<T>;
    fn with_context<D: Display>(self, what: impl FnOnce() -> D) -> Result<T>;
}

impl<T, E: Into<Error>> Context<T> for std::result::Result<T, E> {
    fn context(self, what: impl Display) -> Result<T> {
        self.map_err(|e| Error::Context {
            context: what.to_string(),
            source: Box::new(e.into()),
        })
    }

    fn with_context<D: Display>(self, what: impl FnOnce() -> D) -> Result<T> {
        self.map_err(|e| Error::Context {
            context: what().to_string(),
            source: Box::new(e.into()),
        })
    }
}

/// One line, no backtrace: the context chain joined by ": ", each cause once (an error that
/// embeds its source's text, as thiserror messages often do, would otherwise print the OS
/// error twice), control characters escaped.
pub fn one_line(err: &Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut e = Some(err);
    while let Some(cur) = e {
        parts.push(cur.to_string());
        e = cur.inner();
    }
    // The innermost error's own sources (an io::Error inside an OutputError, …).
    let mut src = std::error::Error::source(parts_last(err));
    while let Some(s) = src {
        parts.push(s.to_string());
        src = s.source();
    }
    let mut line = String::new();
    for t in parts {
        if t.is_empty() || line.contains(&t) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&t);
    }
    crate::report::sanitize::text(line.as_bytes())
}

fn parts_last(err: &Error) -> &Error {
    let mut e = err;
    while let Some(i) = e.inner() {
        e = i;
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_names_each_cause_once() {
        let io = std::io::Error::from_raw_os_error(libc::ENOENT);
        let inner = OutputError::Io {
            path: "/x/y".into(),
            source: io,
        };
        let err: Result<()> = Err(inner).context("writing the report");
        let err = err.unwrap_err();
        let line = one_line(&err);
        assert_eq!(
            line.matches("No such file or directory").count(),
            1,
            "{line}"
        );
        assert!(
            line.starts_with("writing the report: cannot write /x/y"),
            "{line}"
        );
        assert!(!line.contains('\n'));
        assert_eq!(err.exit(), Exit::Failure);
    }

    #[test]
    fn exit_codes_follow_the_innermost_cause() {
        let e: Result<()> = Err(HostError::NoSuchProcess(42)).context("checking --pid");
        assert_eq!(e.unwrap_err().exit(), Exit::NoSuchProcess);
        let e = Error::from(TracefsError::Permission {
            path: "/sys/kernel/tracing/events".into(),
        });
        assert_eq!(e.exit(), Exit::Permission);
        let e = Error::from(TracefsError::MissingField {
            event: "a:b".into(),
            field: "c".into(),
        });
        assert_eq!(e.exit(), Exit::KernelFeature);
        let e: Result<()> = Err(OutputError::BrokenPipe {
            path: "<stdout>".into(),
        })
        .context("x");
        let e = e.unwrap_err();
        assert!(e.is_broken_pipe());
        assert_eq!(e.exit(), Exit::Ok);
    }
}
