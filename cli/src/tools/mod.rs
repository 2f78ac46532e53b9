//! The tool registry: adding a tool is one line in `registry!` plus its own module.

use crate::{host::proc, options::Common, report::output::Sink};

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

        /// Every listed tool's name, kernel hooks and whether it needs kernel BTF whatever the
        /// attach mode, for `doctor` and the docs; tools hidden from `--help` (`bench-floor`)
        /// are left out.
        pub fn all_hooks() -> Vec<(&'static str, &'static [Hook], bool)> {
            let cmd = <Tool as clap::Subcommand>::augment_subcommands(clap::Command::new("tracekit"));
            let hidden = |name: &str| {
                cmd.find_subcommand(name).is_some_and(|c| c.is_hide_set())
            };
            vec![$(($module::NAME, $module::HOOKS, $module::REQUIRES_BTF),)*]
                .into_iter()
                .filter(|(name, _, _)| !hidden(name))
                .collect()
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
    /// The raw tracepoint the tp_btf and raw_tp modes attach to, when it is not the event's own
    /// name (`sys_enter` for `syscalls:sys_enter_fsync`: one program filters by syscall number).
    pub raw: Option<&'static str>,
    /// Fields read from the event's format (classic tracepoint mode).
    pub fields: &'static [&'static str],
    /// Attach modes the tool can use for it, cheapest first.
    pub modes: &'static [crate::kernel::loader::AttachMode],
    /// The tool still runs without this hook (it reports what is missing).
    pub optional: bool,
}

/// Checks every tool makes before touching the kernel, in the order a user would fix them:
/// privileges, then the target processes, then the output (opened here, so a path that cannot
/// be written costs no data). Tracefs is opened later, only by the tools that fall back to
/// classic tracepoints.
pub fn preflight(tool: &str, common: &Common) -> anyhow::Result<Sink> {
    proc::check_privileges(tool)?;
    proc::check_pids(&common.pids)?;
    // BTF that exists but is unusable (a corrupt file, `TRACEKIT_BTF=/dev/zero`) is an error
    // with its reason, not a silent fall-back; a missing one means a kernel without BTF.
    if crate::kernel::features::btf_present() {
        crate::kernel::btf::vmlinux()?;
    }
    Ok(Sink::open(
        common.output.as_deref(),
        common.interval.is_some(),
    )?)
}

/// Entries of an aggregation map: `--max-keys`, else half of pid_max within [2048, 32768]
/// (a node rarely runs more processes than that doing one kind of thing; both generations of
/// an interval boundary share it).
pub fn key_cap(common: &Common) -> u32 {
    common
        .max_keys
        .unwrap_or_else(|| (proc::pid_max() / 2).clamp(2048, 32768))
}

/// What every tool's `--help` ends with: its examples, the privileges it needs, the exit codes.
pub fn help_footer(examples: &str, needs: &str) -> String {
    format!(
        "Examples:\n{examples}\n\nPrivileges: {needs}\n\n{}",
        crate::error::EXIT_CODES_HELP
    )
}

/// Entries for per-thread in-flight maps: one per thread that can be inside the traced call at
/// once, bounded by pid_max.
pub fn inflight_cap() -> u32 {
    proc::pid_max().clamp(1024, 16384)
}

/// The `"type":"meta"` line every tool prints in `--json` mode once attached (tests and scripts
/// wait for it): the tool, its scope and the attached programs with their ids, plus `extra`.
pub fn meta_report(
    tool: &str,
    common: &Common,
    session: &crate::kernel::loader::Session,
    extra: serde_json::Value,
) -> Option<crate::report::render::Report> {
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
    Some(crate::report::render::Report {
        json: vec![v],
        ..Default::default()
    })
}

/// Text mode: one line on stderr saying what was attached, what was skipped and why, and how
/// the run ends.
pub fn announce<A: std::fmt::Display, B: std::fmt::Display>(
    what: &str,
    common: &Common,
    session: &crate::kernel::loader::Session,
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
    let end = match common.duration {
        Some(d) => format!("Ending after {}.", humantime::format_duration(d)),
        None => "Ctrl-C to end.".to_string(),
    };
    use std::io::Write;
    // A closed stderr is no reason to stop tracing.
    let _ = writeln!(
        std::io::stderr(),
        "Tracing {what} in {} ({}){skipped}. {end}",
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

/// Name of a row's process or thread: from /proc while it lives (the process's own name, not
/// that of whichever thread created the key), else what the kernel recorded.
pub fn row_comm(id: u32, tgid: u32, threads: bool, kernel_comm: &[u8]) -> Vec<u8> {
    let live = if threads {
        crate::host::read_capped(
            std::path::Path::new(&format!("/proc/{tgid}/task/{id}/comm")),
            crate::host::SMALL_FILE,
        )
        .ok()
        .map(|mut b| {
            if b.last() == Some(&b'\n') {
                b.pop();
            }
            b
        })
    } else {
        proc::comm(id)
    };
    live.unwrap_or_else(|| crate::report::sanitize::comm_bytes(kernel_comm).to_vec())
}
