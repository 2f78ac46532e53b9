//! The tool registry: adding a tool is one line in `registry!` plus its own module.

use crate::{options::Common, procinfo, tracefs::Tracefs};

pub mod bench_floor;
pub mod ctxsw;
pub mod doctor;
pub mod fsync_lat;
pub mod memstall;
pub mod runq_lat;
pub mod sched;

macro_rules! registry {
    ($($(#[$doc:meta])* $variant:ident => $module:ident),* $(,)?) => {
        #[derive(clap::Subcommand, Debug)]
        pub enum Tool {
            $($(#[$doc])* $variant($module::Args),)*
        }

        impl Tool {
            pub fn run(self) -> anyhow::Result<()> {
                match self {
                    $(Tool::$variant(args) => $module::run(args),)*
                }
            }
        }

        /// Every tool's name and kernel hooks, for `doctor` and the docs.
        pub fn all_hooks() -> Vec<(&'static str, &'static [Hook])> {
            vec![$(($module::NAME, $module::HOOKS),)*]
        }
    };
}

registry! {
    /// Latency of fsync, fdatasync, sync_file_range, msync, syncfs and sync, per process and syscall.
    FsyncLat => fsync_lat,
    /// Benchmark control: the cheapest program on a hook (used by `cargo xtask bench`).
    #[command(hide = true)]
    BenchFloor => bench_floor,
    /// Time processes lose stalled in direct compaction, direct or memcg reclaim and THP collapse, with the THP settings, /proc/vmstat deltas and a verdict.
    Memstall => memstall,
    /// Context switches per process, voluntary and involuntary as the kernel counts them, with
    /// migrations, run-queue delay and who preempted whom; `--top` for a live view.
    Ctxsw => ctxsw,
    /// Run-queue latency per process: waits after a wakeup and after a preemption.
    RunqLat => runq_lat,
    /// Run first on an unknown node: per tool and hook, the attach mode this kernel allows and why.
    Doctor => doctor,
}

/// One kernel hook a tool uses: which event, the fields it reads, and how it can attach,
/// cheapest first. `doctor` checks each against the running kernel.
#[derive(Clone, Copy, Debug)]
pub struct Hook {
    /// `category:name` of the tracepoint (or the function, for kprobe/fentry hooks).
    pub event: &'static str,
    /// Fields read from the event's format (classic tracepoint mode).
    pub fields: &'static [&'static str],
    /// Attach modes the tool can use for it, cheapest first.
    pub modes: &'static [crate::loader::AttachMode],
    /// The tool still runs without this hook (it reports what is missing).
    pub optional: bool,
}

/// Checks every tool makes before touching the kernel, in the order a user would fix them:
/// privileges, then the target processes, then tracefs.
pub fn preflight(common: &Common) -> anyhow::Result<Tracefs> {
    procinfo::check_privileges()?;
    procinfo::check_pids(&common.pids)?;
    Ok(Tracefs::open()?)
}

/// Cap on aggregation keys per generation: `--max-keys`, else a quarter of pid_max within
/// [1024, 16384] (a node rarely runs more processes than that doing one kind of thing).
pub fn key_cap(common: &Common) -> u32 {
    common
        .max_keys
        .unwrap_or_else(|| (procinfo::pid_max() / 4).clamp(1024, 16384))
}

/// Entries for per-thread in-flight maps: one per thread that can be inside the traced call at
/// once, bounded by pid_max.
pub fn inflight_cap() -> u32 {
    procinfo::pid_max().clamp(1024, 16384)
}

/// The `"type":"meta"` line every tool prints in `--json` mode once attached (tests and scripts
/// wait for it): the tool, its scope and the attached programs with their ids, plus `extra`.
pub fn meta_report(
    tool: &str,
    common: &Common,
    session: &crate::loader::Session,
    extra: serde_json::Value,
) -> Option<crate::render::Report> {
    if !common.json {
        return None;
    }
    let mut v = serde_json::json!({
        "tool": tool,
        "type": "meta",
        "scope": scope(common),
        "per_thread": common.threads,
        "programs": session.programs_json(),
    });
    if let serde_json::Value::Object(m) = extra {
        for (k, x) in m {
            v[k] = x;
        }
    }
    Some(crate::render::Report {
        json: vec![v],
        ..Default::default()
    })
}

/// Text mode: one line on stderr saying what was attached and what was skipped and why.
pub fn announce<A: std::fmt::Display, B: std::fmt::Display>(
    what: &str,
    common: &Common,
    session: &crate::loader::Session,
    skipped: &[(A, B)],
) {
    if common.json {
        return;
    }
    let skipped = if skipped.is_empty() {
        String::new()
    } else {
        let s: Vec<String> = skipped.iter().map(|(n, r)| format!("{n} ({r})")).collect();
        format!("; skipped: {}", s.join(", "))
    };
    eprintln!(
        "Tracing {what} in {} ({}){skipped}. Ctrl-C to end.",
        scope(common),
        session.programs_text()
    );
}

/// Human description of the `--pid` / `--comm` scope.
pub fn scope(common: &Common) -> String {
    let mut parts = Vec::new();
    if !common.pids.is_empty() {
        let p: Vec<String> = common.pids.iter().map(u32::to_string).collect();
        parts.push(format!("pid {}", p.join(",")));
    }
    if let Some(c) = &common.comm {
        parts.push(format!("comm {}", crate::sanitize::text(c.as_bytes())));
    }
    if parts.is_empty() {
        "all processes".to_string()
    } else {
        parts.join(" and ")
    }
}

/// Name of a row's process or thread: from /proc while it lives (the process's own name, not
/// that of whichever thread created the key), else what the kernel recorded.
pub fn row_comm(id: u32, tgid: u32, threads: bool, kernel_comm: &[u8]) -> Vec<u8> {
    let live = if threads {
        std::fs::read(format!("/proc/{tgid}/task/{id}/comm"))
            .ok()
            .map(|mut b| {
                if b.last() == Some(&b'\n') {
                    b.pop();
                }
                b
            })
    } else {
        procinfo::comm(id)
    };
    live.unwrap_or_else(|| crate::sanitize::comm_bytes(kernel_comm).to_vec())
}
