//! Errors the user can act on, and the exit code each maps to. `main` prints one line and exits
//! with the code; everything else is exit code 1.

use std::process::ExitCode;

/// Exit codes, documented in `tracekit --help`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// Ran and reported.
    Ok = 0,
    /// Any other failure (I/O, an unexpected kernel answer).
    Failure = 1,
    /// Bad command line: unknown subcommand, malformed value (clap's own code).
    Usage = 2,
    /// Not root and lacking CAP_BPF + CAP_PERFMON (or CAP_SYS_ADMIN).
    Permission = 3,
    /// The kernel lacks something the tool needs: tracefs, BTF, a tracepoint, a field.
    KernelFeature = 4,
    /// A `--pid` names no running process.
    NoSuchProcess = 5,
    /// `doctor`: at least one tool cannot run on this kernel (the report says which and why).
    ToolsUnavailable = 6,
}

impl From<Exit> for ExitCode {
    fn from(e: Exit) -> Self {
        ExitCode::from(e as u8)
    }
}

/// Text for `--help`.
pub const EXIT_CODES_HELP: &str = "Exit codes:\n  0  ran and reported\n  1  other failure\n  2  bad command line\n  3  not permitted: run as root, or with CAP_BPF and CAP_PERFMON\n  4  the kernel lacks something needed (tracefs, BTF, a tracepoint or field)\n  5  a --pid names no running process\n  6  doctor: some tool cannot run on this kernel (the report says which and why)\n\nEnvironment:\n  TRACEKIT_TRACEFS=PATH  use the tracefs mounted at PATH (e.g. /host/sys/kernel/tracing in a container)\n  TRACEKIT_BTF=FILE  read the kernel's BTF from FILE instead of /sys/kernel/btf/vmlinux\n  RUST_LOG=tracekit=debug  log attach decisions and start-up timings to stderr";

/// An error whose cause the user can fix; carries its exit code.
#[derive(Debug, thiserror::Error)]
pub enum UserError {
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
}

impl UserError {
    pub fn exit(&self) -> Exit {
        match self {
            UserError::Permission(_) => Exit::Permission,
            UserError::KernelFeature(_) => Exit::KernelFeature,
            UserError::NoSuchProcess(_) => Exit::NoSuchProcess,
            UserError::Usage(_) => Exit::Usage,
            UserError::ToolsUnavailable(_) => Exit::ToolsUnavailable,
        }
    }
}

/// Exit code for any error chain: the first [`UserError`] in it decides.
pub fn exit_for(err: &anyhow::Error) -> Exit {
    for cause in err.chain() {
        if let Some(u) = cause.downcast_ref::<UserError>() {
            return u.exit();
        }
        if let Some(t) = cause.downcast_ref::<crate::tracefs::TracefsError>() {
            return t.exit();
        }
    }
    Exit::Failure
}

/// One line, no backtrace: the whole context chain joined by ": ", control characters escaped.
pub fn one_line(err: &anyhow::Error) -> String {
    crate::sanitize::text(format!("{err:#}").as_bytes())
}
