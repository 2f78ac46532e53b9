//! Errors the user can act on, and the exit code each maps to. `main` prints one line and exits
//! with the code; everything else is exit code 1.

use std::process::ExitCode;

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

Environment:
  TRACEKIT_TRACEFS=PATH  use the tracefs mounted at PATH (e.g. /host/sys/kernel/tracing in a container)
  TRACEKIT_BTF=FILE  read the kernel's BTF from FILE instead of /sys/kernel/btf/vmlinux
  RUST_LOG=tracekit=debug  log attach decisions and start-up timings to stderr";

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

/// Exit code for any error chain: the first error in it that knows its code decides.
pub fn exit_for(err: &anyhow::Error) -> Exit {
    for cause in err.chain() {
        if let Some(u) = cause.downcast_ref::<UserError>() {
            return u.exit();
        }
        if let Some(t) = cause.downcast_ref::<crate::kernel::tracefs::TracefsError>() {
            return t.exit();
        }
        if let Some(b) = cause.downcast_ref::<crate::kernel::btf::BtfError>() {
            return b.exit();
        }
        if let Some(o) = cause.downcast_ref::<crate::report::output::OutputError>() {
            return o.exit();
        }
    }
    Exit::Failure
}

/// One line, no backtrace: the context chain joined by ": ", each cause once (an error that
/// embeds its source's text, as thiserror messages often do, would otherwise print the OS
/// error twice), control characters escaped.
pub fn one_line(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let t = cause.to_string();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_names_each_cause_once() {
        let io = std::io::Error::from_raw_os_error(libc::ENOENT);
        let inner = crate::report::output::OutputError::Io {
            path: "/x/y".into(),
            source: io,
        };
        let err = anyhow::Error::new(inner).context("writing the report");
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
    }
}
