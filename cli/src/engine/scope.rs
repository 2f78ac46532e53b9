//! What to trace and how to run, as the engine and the tools see it (the clap options of
//! `crate::options` convert into these).

use std::time::Duration;

use crate::kernel::loader::Filter;

/// Which tasks a run traces and how it keys them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scope {
    /// Processes (tgids) to trace; empty: every process.
    pub pids: Vec<u32>,
    /// Only tasks whose comm is exactly this (the kernel keeps 15 bytes).
    pub comm: Option<String>,
    /// Rows per thread instead of per process.
    pub threads: bool,
    /// Cap on distinct keys the kernel holds at once (`--max-keys`), else from pid_max.
    pub max_keys: Option<u32>,
    /// `--children`: the processes of `pids` and their descendants, refreshed while running.
    pub children: bool,
    /// `--container`: the container whose processes `pids` holds (with `children`).
    pub container: Option<String>,
    /// `--by container`: one row per container instead of per process.
    pub by_container: bool,
}

impl Scope {
    /// The `--comm` value as the kernel stores it.
    pub fn comm_bytes(&self) -> Option<[u8; 16]> {
        self.comm.as_ref().map(|c| {
            let mut b = [0u8; 16];
            let n = c.len().min(15);
            b[..n].copy_from_slice(&c.as_bytes()[..n]);
            b
        })
    }

    /// With `--children`: `pids` becomes the processes and their descendants now (the run loop
    /// follows new ones through [`RunOpts::children_of`]).
    pub fn expand_children(&mut self) {
        if self.children && !self.pids.is_empty() {
            self.pids = crate::host::proc::with_descendants(&self.pids);
        }
    }

    /// What every program filters on.
    pub fn filter(&self) -> Filter<'_> {
        Filter {
            pids: &self.pids,
            comm: self.comm_bytes(),
            children: self.children,
        }
    }

    /// `all processes`, `pid 42,43 and comm postgres`.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(c) = &self.container {
            parts.push(format!(
                "container {}",
                crate::report::sanitize::text(c.as_bytes())
            ));
        } else if !self.pids.is_empty() {
            let p: Vec<String> = self.pids.iter().map(u32::to_string).collect();
            parts.push(format!("pid {}", p.join(",")));
        }
        if let Some(c) = &self.comm {
            parts.push(format!(
                "comm {}",
                crate::report::sanitize::text(c.as_bytes())
            ));
        }
        if parts.is_empty() {
            "all processes".to_string()
        } else {
            parts.join(" and ")
        }
    }

    /// Entries of an aggregation map: `--max-keys`, else half of pid_max within [2048, 32768]
    /// (a node rarely runs more processes than that doing one kind of thing; both generations
    /// of an interval boundary share it).
    pub fn key_cap(&self) -> u32 {
        self.max_keys
            .unwrap_or_else(|| (crate::host::proc::pid_max() / 2).clamp(2048, 32768))
    }

    /// Entries for per-thread in-flight maps: one per thread that can be inside the traced
    /// call at once, bounded by pid_max.
    pub fn inflight_cap(&self) -> u32 {
        crate::host::proc::pid_max().clamp(1024, 16384)
    }
}

/// How long a run lasts, how it is windowed and rendered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RunOpts {
    pub duration: Option<Duration>,
    pub interval: Option<Duration>,
    /// NDJSON instead of text.
    pub json: bool,
    /// bpftrace-style bars after the tables.
    pub hist: bool,
    /// `--pid … --children`: the processes whose descendants the loop adds to every
    /// collector's pid filter as they appear (checked every half second).
    pub children_of: Vec<u32>,
    /// `--container`: the container whose processes joining later (`podman exec`, `docker
    /// exec`, `kubectl exec`: children of the runtime, not of the container's processes) the
    /// loop adds too, with their descendants, at the same pace.
    pub follow_container: Option<String>,
}

impl RunOpts {
    /// The processes to trace now with `--children` or `--container`: those of `children_of`,
    /// the container's processes now, and all their descendants.
    pub fn followed_pids(&self) -> Vec<u32> {
        let mut roots = self.children_of.clone();
        if let Some(c) = &self.follow_container {
            roots.extend(crate::host::container::pids_of(c).0);
        }
        roots.sort_unstable();
        roots.dedup();
        crate::host::proc::with_descendants(&roots)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_and_filters() {
        let s = Scope {
            pids: vec![42, 43],
            comm: Some("postgres".into()),
            ..Default::default()
        };
        assert_eq!(s.describe(), "pid 42,43 and comm postgres");
        assert_eq!(&s.comm_bytes().unwrap()[..9], b"postgres\0");
        assert_eq!(s.filter().pids, [42, 43]);
        assert_eq!(Scope::default().describe(), "all processes");
        let capped = Scope {
            max_keys: Some(16),
            ..Default::default()
        };
        assert_eq!(capped.key_cap(), 16);
    }
}
