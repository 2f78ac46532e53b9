//! `profile --off-cpu`'s rows (per process, per function on the blocking stacks, per stack) and
//! its findings: a process that spends a large share of its wall time blocked in an fsync, in
//! block I/O, in reclaim or on a lock, with the call path and the next command.

use crate::report::units::ppm;
use serde::Serialize;

use super::{
    stacks::{label, top, ProcAgg, Sample},
    symbols::Frame,
};
pub use crate::report::render::fmt_ns;
use crate::report::{
    findings::{Cause, Finding, Score},
    rows::Column,
    sanitize,
    who::{Id, Title},
};

/// One process (or thread) in one window.
#[derive(Serialize)]
pub struct OffProcRow {
    #[serde(flatten)]
    pub who: Id,
    pub blocked_ns: u64,
    pub blocks: u64,
    /// Blocked time per second of wall time, parts per million (one thread blocked throughout:
    /// 1e6).
    pub wall_ppm: u64,
}

impl crate::report::rows::Row for OffProcRow {
    fn container(&self) -> Option<&crate::report::who::InContainer> {
        Some(&self.who.container)
    }
}

pub const OFF_PROCS: &[Column<OffProcRow>] = &[
    Column::right("PID", |r, _| r.who.id_text()),
    Column::left("COMM", |r, _| r.who.comm_text()),
    Column::right("BLOCKED", |r, _| fmt_ns(r.blocked_ns)),
    Column::right("BLOCKS", |r, _| r.blocks.to_string()),
    Column::right("%WALL", |r, _| format!("{:.1}", r.wall_ppm as f64 / 1e4)),
];

pub fn off_proc_row(
    p: &ProcAgg,
    id: u32,
    threads: bool,
    blocks: u64,
    secs: f64,
    title: Title,
) -> OffProcRow {
    OffProcRow {
        who: Id::new(id, p.tgid, threads, p.comm.clone(), title),
        blocked_ns: p.samples,
        blocks,
        wall_ppm: ppm(p.samples, secs * 1e9),
    }
}

/// One function on the blocking stacks of one process.
#[derive(Serialize)]
pub struct OffFnRow {
    #[serde(flatten)]
    pub who: Id,
    pub function: String,
    /// The binary's name; for a Python frame its source file.
    pub module: String,
    /// A Python frame's line (absent for native frames).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    /// Blocked time of the stacks this function is on.
    pub total_ns: u64,
    pub blocks: u64,
    /// Share of the process's blocked time, parts per million.
    pub total_ppm: u64,
    #[serde(skip)]
    pub label: String,
}

impl crate::report::rows::Row for OffFnRow {
    fn container(&self) -> Option<&crate::report::who::InContainer> {
        Some(&self.who.container)
    }
}

pub const OFF_FUNCS: &[Column<OffFnRow>] = &[
    Column::right("PID", |r, _| r.who.id_text()),
    Column::left("COMM", |r, _| sanitize::text(&r.who.comm_raw)),
    Column::right("BLOCKED", |r, _| fmt_ns(r.total_ns)),
    Column::right("BLOCKS", |r, _| r.blocks.to_string()),
    Column::right("%BLOCKED", |r, _| {
        format!("{:.1}", r.total_ppm as f64 / 1e4)
    }),
    Column::left("FUNCTION", |r, _| r.label.clone()),
];

/// The scheduler's own frames, on every blocking stack: left out of the function table.
fn scheduler_core(f: &Frame) -> bool {
    &*f.module == "kernel" && matches!(&*f.function, "__schedule" | "schedule" | "schedule_idle")
}

/// The system-call entry, on every blocking stack of a system call: left out of the function
/// table too (it names no wait).
fn syscall_entry(f: &Frame) -> bool {
    &*f.module == "kernel"
        && matches!(
            &*f.function,
            "do_syscall_64" | "entry_SYSCALL_64" | "entry_SYSCALL_64_after_hwframe"
        )
}

/// The `n` functions with the most blocked time on their stacks (0: all).
pub fn off_fn_rows(
    p: &ProcAgg,
    blocks: Option<&ProcAgg>,
    id: u32,
    threads: bool,
    n: usize,
) -> Vec<OffFnRow> {
    let who = Id::new(id, p.tgid, threads, p.comm.clone(), Title::default());
    let mut ranked: Vec<(Frame, u64)> = top(&p.total, 0)
        .into_iter()
        .filter(|(f, _)| !scheduler_core(f) && !syscall_entry(f))
        .collect();
    if n > 0 {
        ranked.truncate(n);
    }
    ranked
        .into_iter()
        .map(|(f, ns)| OffFnRow {
            who: who.clone(),
            function: f.function.to_string(),
            module: f.module.to_string(),
            line: (f.line > 0).then_some(f.line),
            total_ns: ns,
            blocks: blocks.and_then(|b| b.total.get(&f)).copied().unwrap_or(0),
            total_ppm: ppm(ns, p.samples as f64),
            label: label(&f),
        })
        .collect()
}

/// One blocking stack of one process.
#[derive(Serialize)]
pub struct OffStackRow {
    #[serde(flatten)]
    pub who: Id,
    pub blocked_ns: u64,
    pub blocks: u64,
    /// The kernel function the thread waited in (the innermost one below the scheduler).
    pub wait: String,
    /// The innermost user function outside the C library (the caller that blocked), else the
    /// innermost user function, if the stack has one.
    pub caller: Option<String>,
    /// Every frame, innermost first (`function (module)`).
    pub frames: Vec<String>,
}

impl crate::report::rows::Row for OffStackRow {
    fn container(&self) -> Option<&crate::report::who::InContainer> {
        Some(&self.who.container)
    }
}

/// Frames shown in the text table's STACK cell.
const STACK_CELL_FRAMES: usize = 8;

pub const OFF_STACKS: &[Column<OffStackRow>] = &[
    Column::right("PID", |r, _| r.who.id_text()),
    Column::left("COMM", |r, _| sanitize::text(&r.who.comm_raw)),
    Column::right("BLOCKED", |r, _| fmt_ns(r.blocked_ns)),
    Column::right("BLOCKS", |r, _| r.blocks.to_string()),
    Column::left("WAIT", |r, _| r.wait.clone()),
    Column::left("STACK", |r, _| {
        let mut s = r
            .frames
            .iter()
            .take(STACK_CELL_FRAMES)
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(" ← ");
        if r.frames.len() > STACK_CELL_FRAMES {
            s.push_str(" ← …");
        }
        s
    }),
];

/// The wait and the caller of a stack (frames outermost first).
fn wait_and_caller(frames: &[Frame]) -> (String, Option<String>) {
    let wait = frames
        .iter()
        .rev()
        .find(|f| {
            &*f.module == "kernel" && !scheduler_core(f) && !f.function.starts_with("schedule")
        })
        .or_else(|| frames.last())
        .map_or_else(
            || "[no stack]".to_string(),
            |f| sanitize::text(f.function.as_bytes()),
        );
    // The program's own innermost function: the C library's wrappers (the syscall stubs that
    // block) are skipped when a caller above them is known.
    let user: Vec<&Frame> = frames
        .iter()
        .rev()
        .filter(|f| &*f.module != "kernel" && !f.function.starts_with('['))
        .collect();
    let libc = |f: &&Frame| matches!(&*f.module, "libc" | "libpthread" | "ld-linux-x86-64");
    let caller = user
        .iter()
        .find(|f| !libc(f))
        .or(user.first())
        .map(|f| sanitize::text(f.function.as_bytes()));
    (wait, caller)
}

/// The `n` stacks of process `id` with the most blocked time (0: all).
pub fn off_stack_rows(
    by_ns: &[Sample],
    by_blocks: &[Sample],
    p: &ProcAgg,
    id: u32,
    threads: bool,
    n: usize,
) -> Vec<OffStackRow> {
    let who = Id::new(id, p.tgid, threads, p.comm.clone(), Title::default());
    // by_ns and by_blocks are built side by side: the same index is the same key. Two kernel
    // stack ids can name the same functions (a return address elsewhere in `__schedule`): one
    // row per stack as printed, their blocks and time summed.
    let mut merged: Vec<(Vec<String>, &Sample, u64, u64)> = Vec::new();
    for (s, b) in by_ns.iter().zip(by_blocks).filter(|(s, _)| s.id == id) {
        let frames: Vec<String> = s.frames.iter().rev().map(label).collect();
        match merged.iter_mut().find(|m| m.0 == frames) {
            Some(m) => {
                m.2 += s.count;
                m.3 += b.count;
            }
            None => merged.push((frames, s, s.count, b.count)),
        }
    }
    merged.sort_by_key(|m| std::cmp::Reverse(m.2));
    if n > 0 {
        merged.truncate(n);
    }
    merged
        .into_iter()
        .map(|(frames, s, blocked_ns, blocks)| {
            let (wait, caller) = wait_and_caller(&s.frames);
            OffStackRow {
                who: who.clone(),
                blocked_ns,
                blocks,
                wait,
                caller,
                frames,
            }
        })
        .collect()
}

/// What a blocking stack waits on, by the kernel functions on it: the finding's cause, its
/// name, the advice and the next command (`{pid}` replaced). Sleeps, polls and reads of idle
/// sockets and pipes are a program waiting for work: no finding.
struct WaitClass {
    cause: Cause,
    name: &'static str,
    functions: &'static [&'static str],
    advice: &'static str,
    next: &'static str,
}

const CLASSES: &[WaitClass] = &[
    WaitClass {
        cause: crate::tools::fsync_lat::FSYNC,
        name: "fsync",
        functions: &["do_fsync", "vfs_fsync_range", "file_write_and_wait_range", "__x64_sys_fsync", "__x64_sys_fdatasync", "__x64_sys_sync_file_range", "__x64_sys_msync", "__x64_sys_syncfs", "jbd2_log_wait_commit", "jbd2_complete_transaction"],
        advice: "batch writes per fsync (group commit), move the file to faster storage, or fsync off the request path",
        next: "tracekit fsync-lat --pid {pid}",
    },
    WaitClass {
        cause: crate::tools::memstall::RECLAIM,
        name: "memory reclaim",
        functions: &["try_to_free_pages", "try_to_free_mem_cgroup_pages", "mem_cgroup_handle_over_high", "__alloc_pages_slowpath", "throttle_direct_reclaim", "balance_dirty_pages"],
        advice: "give the process (or its cgroup) more memory headroom, or cut its page cache churn",
        next: "tracekit memstall --pid {pid}",
    },
    WaitClass {
        cause: crate::tools::io_lat::IO_LATENCY,
        name: "block I/O",
        functions: &["io_schedule", "io_schedule_timeout", "blk_mq_get_tag", "folio_wait_bit_common", "wait_on_page_bit_common", "bit_wait_io"],
        advice: "read less from disk (a larger cache, an index), or move the data to faster storage",
        next: "tracekit io-lat --pid {pid}",
    },
    WaitClass {
        cause: super::OFF_CPU_WAIT,
        name: "a lock",
        functions: &["futex_wait", "futex_wait_queue", "futex_wait_queue_me", "__mutex_lock", "mutex_lock", "rwsem_down_read_slowpath", "rwsem_down_write_slowpath", "percpu_rwsem_wait"],
        advice: "find the holder (the same flame graph on-CPU shows what runs under the lock), shorten the critical section or shard the lock",
        next: "tracekit profile --off-cpu --pid {pid} --threads --duration 30s --svg offcpu.svg",
    },
];

fn class_of(frames: &[Frame]) -> Option<&'static WaitClass> {
    CLASSES.iter().find(|c| {
        frames
            .iter()
            .any(|f| &*f.module == "kernel" && c.functions.contains(&&*f.function))
    })
}

/// A class worth a finding holds at least this share of one thread's wall time …
const MIN_WALL_SHARE: f64 = 0.05;
/// … and at least this much blocked time in the window.
const MIN_NS: u64 = 100_000_000;

/// One finding per process whose blocked time goes mostly to one wait of a known class: the
/// class, the call path of its largest stack, the time, the next command.
pub fn off_findings(
    tool: &'static str,
    procs: &[(u32, &ProcAgg, Title)],
    by_ns: &[Sample],
    by_blocks: &[Sample],
    secs: f64,
) -> Vec<Finding> {
    let me = std::process::id();
    let mut out = Vec::new();
    for (id, p, title) in procs {
        if p.tgid == me || *id == 0 {
            continue;
        }
        // Blocked time and blocks per class, and the class's largest stack.
        let mut best: Option<(&'static WaitClass, u64, u64, &Sample)> = None;
        let mut per: Vec<(&'static str, u64, u64, &Sample)> = Vec::new();
        for (s, b) in by_ns.iter().zip(by_blocks).filter(|(s, _)| s.id == *id) {
            let Some(c) = class_of(&s.frames) else {
                continue;
            };
            match per.iter_mut().find(|e| e.0 == c.name) {
                Some(e) => {
                    e.1 += s.count;
                    e.2 += b.count;
                    if s.count > e.3.count {
                        e.3 = s;
                    }
                }
                None => per.push((c.name, s.count, b.count, s)),
            }
        }
        for (name, ns, blocks, s) in per {
            let c = CLASSES.iter().find(|c| c.name == name).expect("listed");
            if best.is_none_or(|b| ns > b.1) {
                best = Some((c, ns, blocks, s));
            }
        }
        let Some((c, ns, blocks, s)) = best else {
            continue;
        };
        let share = ns as f64 / (secs * 1e9);
        if ns < MIN_NS || share < MIN_WALL_SHARE {
            continue;
        }
        let subject = Id::new(*id, p.tgid, false, p.comm.clone(), title.clone()).subject();
        let (wait, caller) = wait_and_caller(&s.frames);
        let entry = s
            .frames
            .iter()
            .find(|f| &*f.module == "kernel" && c.functions.contains(&&*f.function))
            .map(|f| sanitize::text(f.function.as_bytes()))
            .unwrap_or_else(|| wait.clone());
        let path = match caller {
            Some(u) => format!("under `{u}` → `{entry}`"),
            None => format!("in `{entry}`"),
        };
        out.push(
            Finding {
                tool,
                cause: c.cause,
                subject: subject.clone(),
                culprit: None,
                score: Score::NsPerS((ns as f64 / secs) as u64),
                summary: format!(
                    "{}: {:.0} % of its wall time blocked in {} {path} (waiting in `{wait}`), {:.1} s over {:.0} s in {blocks} blocks.",
                    subject.text(),
                    share * 100.0,
                    c.name,
                    ns as f64 / 1e9,
                    secs,
                ),
                evidence: vec![],
                advice: c.advice.to_string(),
                next: Some(c.next.replace("{pid}", &p.tgid.to_string())),
                fold: None,
                members: Vec::new(),
            }
            .evidence("blocked_ns", ns)
            .evidence("blocks", blocks)
            .evidence("process_blocked_ns", p.samples),
        );
    }
    crate::report::findings::rank(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::super::stacks::{aggregate, marker};
    use super::*;

    fn stack(user: &[&str], kernel: &[&str]) -> Vec<Frame> {
        let module = |f: &str| if f == "fsync" { "libc" } else { "postgres" };
        let mut v: Vec<Frame> = user.iter().map(|f| marker(f, module(f))).collect();
        v.extend(kernel.iter().map(|f| marker(f, "kernel")));
        v
    }

    fn fixture() -> (Vec<Sample>, Vec<Sample>) {
        let fsync = stack(
            &["main", "XLogFlush", "fsync"],
            &[
                "entry_SYSCALL_64",
                "__x64_sys_fsync",
                "do_fsync",
                "vfs_fsync_range",
                "file_write_and_wait_range",
                "folio_wait_bit_common",
                "io_schedule",
                "schedule",
                "__schedule",
            ],
        );
        let sleep = stack(
            &["main", "pg_usleep"],
            &[
                "hrtimer_nanosleep",
                "do_nanosleep",
                "schedule",
                "__schedule",
            ],
        );
        let s = |frames: Vec<Frame>, count| Sample {
            id: 812,
            tgid: 812,
            comm: b"postgres".to_vec(),
            frames,
            count,
        };
        (
            vec![
                s(fsync.clone(), 6_100_000_000),
                s(sleep.clone(), 1_000_000_000),
            ],
            vec![s(fsync, 2300), s(sleep, 100)],
        )
    }

    #[test]
    fn fsync_finding_names_the_path_and_the_next_command() {
        let (ns, blocks) = fixture();
        let a = aggregate(&ns);
        let procs: Vec<(u32, &ProcAgg, Title)> =
            a.iter().map(|(id, p)| (*id, p, Title::default())).collect();
        let f = off_findings("profile", &procs, &ns, &blocks, 10.0);
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(
            f[0].summary.starts_with("postgres (pid 812): 61 % of its wall time blocked in fsync under `XLogFlush` → `__x64_sys_fsync` (waiting in `io_schedule`), 6.1 s over 10 s in 2300 blocks"),
            "{}",
            f[0].summary
        );
        assert_eq!(f[0].next.as_deref(), Some("tracekit fsync-lat --pid 812"));
    }

    /// Two kernel stack ids that print the same functions (seen: 93 + 7 blocks of one sleep
    /// loop) are one row, their blocks and time summed.
    #[test]
    fn stacks_that_print_alike_are_one_row() {
        let (mut ns, mut blocks) = fixture();
        let (ns2, blocks2) = fixture();
        ns.extend(ns2.into_iter().skip(1));
        blocks.extend(blocks2.into_iter().skip(1));
        ns[2].count = 70_000_000;
        blocks[2].count = 7;
        let a = aggregate(&ns);
        let st = off_stack_rows(&ns, &blocks, &a[&812], 812, false, 0);
        assert_eq!(st.len(), 2);
        let sleep = st.iter().find(|r| r.wait == "do_nanosleep").unwrap();
        assert_eq!((sleep.blocks, sleep.blocked_ns), (107, 1_070_000_000));
    }

    #[test]
    fn sleeps_are_no_finding_and_rows_skip_the_scheduler() {
        let (mut ns, mut blocks) = fixture();
        ns.remove(0);
        blocks.remove(0);
        let a = aggregate(&ns);
        let b = aggregate(&blocks);
        let procs: Vec<(u32, &ProcAgg, Title)> =
            a.iter().map(|(id, p)| (*id, p, Title::default())).collect();
        assert!(off_findings("profile", &procs, &ns, &blocks, 10.0).is_empty());
        let (all, _) = fixture();
        let all = aggregate(&all);
        let listed = off_fn_rows(&all[&812], None, 812, false, 0);
        assert!(listed.iter().all(|r| r.function != "entry_SYSCALL_64"));
        assert!(listed.iter().any(|r| r.function == "do_fsync"));
        let fns = off_fn_rows(&a[&812], b.get(&812), 812, false, 0);
        assert!(fns
            .iter()
            .all(|r| r.function != "__schedule" && r.function != "schedule"));
        assert!(fns
            .iter()
            .any(|r| r.function == "do_nanosleep" && r.blocks == 100 && r.total_ppm == 1_000_000));
        let st = off_stack_rows(&ns, &blocks, &a[&812], 812, false, 5);
        assert_eq!(st.len(), 1);
        assert_eq!(st[0].wait, "do_nanosleep");
        assert_eq!(st[0].caller.as_deref(), Some("pg_usleep"));
        assert_eq!(st[0].frames[0], "__schedule (kernel)");
    }

    #[test]
    fn min_block_parses_humantime_and_refuses_garbage() {
        use super::super::offcpu::parse_min_block;
        use std::time::Duration;
        assert_eq!(parse_min_block("1ms"), Ok(Duration::from_millis(1)));
        assert_eq!(parse_min_block("50us"), Ok(Duration::from_micros(50)));
        assert_eq!(parse_min_block("0"), Ok(Duration::ZERO));
        assert!(parse_min_block("fast")
            .unwrap_err()
            .contains("invalid --min-block 'fast'"));
        assert!(parse_min_block("2h").is_err());
    }
}
