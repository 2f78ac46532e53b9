//! Options every tool shares, flattened into each subcommand.

use std::{path::PathBuf, time::Duration};

use clap::Args;

/// Common options.
#[derive(Args, Clone, Debug, Default)]
pub struct Common {
    /// How long to trace (humantime: 10s, 2m, 500ms; at most 10 years). Default: until Ctrl-C.
    #[arg(long, short = 'd', value_parser = parse_duration, value_name = "DURATION")]
    pub duration: Option<Duration>,

    /// Print and reset every INTERVAL (humantime), like `iostat 1`. With --output, each
    /// interval is appended to FILE as it ends (`tail -f FILE` follows it).
    #[arg(long, short = 'i', value_parser = parse_duration, value_name = "INTERVAL")]
    pub interval: Option<Duration>,

    /// Trace only this process (repeatable; also comma-separated). A thread id is refused with
    /// the process id to use (add --threads for per-thread rows).
    #[arg(long = "pid", short = 'p', value_parser = parse_pid, value_delimiter = ',', value_name = "PID")]
    pub pids: Vec<u32>,

    /// With --pid: also trace every descendant of those processes, those running at start and
    /// each one forked while tracing (added in the kernel at fork), so `--pid <nginx master>
    /// --children` covers the workers.
    #[arg(long, requires = "pids")]
    pub children: bool,

    /// Trace only the processes of this container (podman/docker name or id, an id prefix,
    /// a Kubernetes container name or namespace/pod/container, a systemd unit): those running
    /// at start and every one they fork.
    #[arg(long, value_name = "NAME|ID", conflicts_with = "pids")]
    pub container: Option<String>,

    /// `--by container`: one row per container (processes outside any in a `[host]` row),
    /// counts summed and percentiles from the merged histograms.
    #[arg(long, value_enum, value_name = "WHAT")]
    pub by: Option<By>,

    /// Trace only tasks whose comm is exactly COMM (the kernel keeps 15 bytes).
    #[arg(long, value_parser = parse_comm, value_name = "COMM")]
    pub comm: Option<String>,

    /// Report per thread instead of per process.
    #[arg(long)]
    pub threads: bool,

    /// NDJSON output: one JSON object per line, integers in nanoseconds.
    #[arg(long)]
    pub json: bool,

    /// Write the report to FILE: replaced atomically when the run ends (owner and mode kept),
    /// or appended to as each --interval ends; a device or FIFO is written directly, never
    /// replaced. Checked before tracing starts.
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Also print bpftrace-style bar histograms.
    #[arg(long)]
    pub hist: bool,

    /// Cap on the distinct keys (processes × kinds) the kernel holds at once, 16 to 1000000;
    /// default from pid_max. With --interval the interval being read and the next share it.
    /// What does not fit is counted and reported as `[other]`.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(16..=1_000_000))]
    pub max_keys: Option<u32>,
}

/// What `--by` folds rows by.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum By {
    Container,
}

/// Longest `--duration` or `--interval` accepted. Longer ones cannot be waited for (the clock
/// overflows near 2^63 ns) and no trace runs that long. (humantime's year is 365.25 days.)
pub const MAX_DURATION: Duration = Duration::from_secs(10 * 31_557_600);

/// `10s`, `2m`, `1h30m`, `500ms`; positive and at most [`MAX_DURATION`].
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s)
        .map_err(|e| format!("invalid duration '{s}': {e} (examples: 10s, 2m, 500ms)"))?;
    if d.is_zero() {
        return Err(format!("invalid duration '{s}': must be greater than zero"));
    }
    if d > MAX_DURATION {
        return Err(format!(
            "invalid duration '{s}': longer than the maximum of 10 years (omit --duration to trace until Ctrl-C)"
        ));
    }
    Ok(d)
}

pub fn parse_pid(s: &str) -> Result<u32, String> {
    match s.trim().parse::<u32>() {
        Ok(p) if p > 0 && p <= 1 << 22 => Ok(p),
        _ => Err(format!(
            "invalid pid '{s}': expected a process id such as 1234"
        )),
    }
}

pub fn parse_comm(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Err("invalid comm '': must not be empty".to_string());
    }
    if s.len() > 15 {
        // The kernel's comm is 15 bytes plus NUL: a longer name can never match.
        let cut: String = s
            .char_indices()
            .take_while(|(i, c)| i + c.len_utf8() <= 15)
            .map(|(_, c)| c)
            .collect();
        return Err(format!(
            "invalid comm '{s}': the kernel keeps only 15 bytes of a task name; use '{cut}'"
        ));
    }
    Ok(s.to_string())
}

impl Common {
    /// What to trace, for the engine and the tools.
    pub fn scope(&self) -> crate::engine::Scope {
        crate::engine::Scope {
            pids: self.traced_pids(),
            comm: self.comm.clone(),
            threads: self.threads,
            max_keys: self.max_keys,
            children: self.children || self.container.is_some(),
            container: self.container.clone(),
            by_container: self.by == Some(By::Container),
        }
    }

    /// `--pid`, or the processes of `--container` now.
    fn traced_pids(&self) -> Vec<u32> {
        match &self.container {
            // A container gone since the check matches nothing (an empty list would be all).
            Some(c) => Some(crate::host::container::pids_of(c).0)
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| vec![u32::MAX]),
            None => self.pids.clone(),
        }
    }

    /// A `--container` that names no running container is a usage error.
    pub fn check_container(&self) -> crate::error::Result<()> {
        match &self.container {
            Some(c) if crate::host::container::pids_of(c).0.is_empty() => {
                Err(crate::error::Error::Usage(format!(
                    "--container {}: no running container has that name or id",
                    crate::report::sanitize::text(c.as_bytes())
                )))
            }
            _ => Ok(()),
        }
    }

    /// How to run and render.
    pub fn run_opts(&self) -> crate::engine::RunOpts {
        crate::engine::RunOpts {
            duration: self.duration,
            interval: self.interval,
            json: self.json,
            hist: self.hist,
            children_of: if self.children || self.container.is_some() {
                self.traced_pids()
            } else {
                Vec::new()
            },
            follow_container: self.container.clone(),
        }
    }
}

/// A tool's options parsed from `args` (without the program name), for unit tests of flags.
#[cfg(test)]
pub fn parse_args<A: clap::Args + clap::FromArgMatches>(args: &[&str]) -> Result<A, clap::Error> {
    let m = A::augment_args(clap::Command::new("t"))
        .try_get_matches_from(std::iter::once(&"t").chain(args))?;
    A::from_arg_matches(&m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s").unwrap(), Duration::from_secs(10));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        let e = parse_duration("10x").unwrap_err();
        assert!(e.starts_with("invalid duration '10x'"), "{e}");
        assert!(!e.contains('\n'));
        assert!(parse_duration("0s")
            .unwrap_err()
            .contains("greater than zero"));
        assert!(parse_duration("").is_err());
        for huge in ["18446744073709551615s", "300000000000y", "11y"] {
            let e = parse_duration(huge).unwrap_err();
            assert!(e.contains("maximum of 10 years"), "{huge}: {e}");
        }
        assert!(parse_duration("99999999999999999999999s").is_err());
        assert_eq!(parse_duration("10y").unwrap(), MAX_DURATION);
    }

    #[test]
    fn pids() {
        assert_eq!(parse_pid("1234").unwrap(), 1234);
        assert!(parse_pid("0").is_err());
        assert!(parse_pid("-5").is_err());
        assert!(parse_pid("abc").unwrap_err().contains("invalid pid 'abc'"));
    }

    #[test]
    fn comms() {
        assert_eq!(parse_comm("postgres").unwrap(), "postgres");
        let e = parse_comm("a-very-long-process-name").unwrap_err();
        assert!(e.contains("use 'a-very-long-pro'"), "{e}");
        assert!(parse_comm("").is_err());
        let c = Common {
            comm: Some("abc".into()),
            ..Default::default()
        };
        assert_eq!(&c.scope().comm_bytes().unwrap()[..4], b"abc\0");
    }
}
