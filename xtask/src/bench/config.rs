//! What the benchmark runs: the workloads, and for each the tracers measured on it (tracekit's
//! tools, the floor programs, the libbpf-tools and bpftrace references).

use std::path::Path;

use super::{
    tracer::{tracekit_has, Ready, Tracer},
    workload::Workload,
};

pub(super) fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

const TRIAGE: &str = "tracekit triage (every collector, one process)";

/// A bpftrace one-liner as a reference tracer.
fn bpftrace(name: &str, script: &str) -> Tracer {
    Tracer {
        name: name.into(),
        argv: s(&["stdbuf", "-oL", "bpftrace", "-e", script]),
        ready: Ready::Line("Attaching"),
    }
}

/// Every workload with its tracers, in the order they run and are reported.
pub(super) fn cases(tk: &Path, quick: bool) -> Vec<(Workload, Vec<Tracer>)> {
    let tk_s = tk.to_string_lossy().into_owned();
    let tkj = |tool: &str, extra: &[&str]| {
        let mut a = vec![tk_s.clone(), tool.to_string(), "--json".to_string()];
        a.extend(extra.iter().map(|x| x.to_string()));
        a
    };
    let mut sched: Vec<Tracer> = vec![
        Tracer {
            name: "floor: Aya per-CPU counter, tp_btf sched_switch".into(),
            argv: tkj("bench-floor", &["--hook", "sched-switch"]),
            ready: Ready::JsonMeta,
        },
        Tracer {
            name: "floor: same, classic tracepoint".into(),
            argv: tkj("bench-floor", &["--hook", "sched-switch-tp"]),
            ready: Ready::JsonMeta,
        },
    ];
    // numa adds a sched_switch program of its own; triage runs every collector in one process.
    for tool in ["ctxsw", "runq-lat", "numa"] {
        if tracekit_has(tk, tool) {
            // On one node numa has nothing to misplace and loads nothing (and says so at exit).
            let one_node = !Path::new("/sys/devices/system/node/node1").exists();
            sched.push(Tracer {
                name: format!("tracekit {tool}"),
                argv: tkj(tool, &[]),
                ready: if tool == "numa" && one_node {
                    Ready::NotHere("one NUMA node here: numa loads no program")
                } else {
                    Ready::JsonMeta
                },
            });
        }
    }
    let triage = tracekit_has(tk, "triage").then(|| Tracer {
        name: TRIAGE.into(),
        argv: s(&[&tk_s, "triage", "--duration", "1h"]),
        ready: Ready::Line("Triage: watching"),
    });
    sched.extend(triage.clone());
    sched.push(Tracer {
        name: "libbpf-tools runqlat".into(),
        argv: s(&["stdbuf", "-oL", "runqlat"]),
        ready: Ready::Line("Tracing"),
    });
    sched.push(bpftrace(
        "bpftrace count by comm",
        "tracepoint:sched:sched_switch { @[comm] = count(); }",
    ));
    let fsync: Vec<Tracer> = vec![
        // The floor on the same hooks as fsync-lat (enter and exit), so per-call kernel time
        // compares like for like (it used to be on sys_enter_fsync only: one run per call
        // against fsync-lat's two).
        Tracer { name: "floor: Aya counter, tracepoints sys_enter_fsync + sys_exit_fsync".into(), argv: tkj("bench-floor", &["--hook", "fsync-pair"]), ready: Ready::JsonMeta },
        Tracer { name: "floor: Aya counter, tp_btf sys_enter".into(), argv: tkj("bench-floor", &["--hook", "sys-enter"]), ready: Ready::JsonMeta },
        Tracer { name: "tracekit fsync-lat".into(), argv: tkj("fsync-lat", &[]), ready: Ready::JsonMeta },
        bpftrace("bpftrace fsync latency hist", "tracepoint:syscalls:sys_enter_fsync { @s[tid] = nsecs; } tracepoint:syscalls:sys_exit_fsync /@s[tid]/ { @ns = hist(nsecs - @s[tid]); delete(@s[tid]); }"),
    ];

    let compaction: Vec<Tracer> = vec![
        Tracer { name: "tracekit memstall".into(), argv: tkj("memstall", &[]), ready: Ready::JsonMeta },
        bpftrace("bpftrace compaction latency hist", "tracepoint:compaction:mm_compaction_begin { @s[tid] = nsecs; } tracepoint:compaction:mm_compaction_end /@s[tid]/ { @ns[comm] = hist(nsecs - @s[tid]); delete(@s[tid]); }"),
    ];
    let mut fsync_loop = fsync.clone();
    fsync_loop.extend(triage);

    // Receive drops: kfree_skb by reason. bench-floor has no kfree_skb hook (yet): the
    // untraced run is the floor here.
    let mut net = Vec::new();
    if tracekit_has(tk, "net-rx") {
        net.push(Tracer {
            name: "tracekit net-rx".into(),
            argv: tkj("net-rx", &[]),
            ready: Ready::JsonMeta,
        });
    }
    net.push(bpftrace(
        "bpftrace kfree_skb count by reason",
        "tracepoint:skb:kfree_skb { @[args->reason] = count(); }",
    ));

    // Block I/O latency: io-lat (when merged) beside libbpf-tools biolatency and bpftrace.
    let mut block = Vec::new();
    if tracekit_has(tk, "io-lat") {
        block.push(Tracer {
            name: "tracekit io-lat".into(),
            argv: tkj("io-lat", &[]),
            ready: Ready::JsonMeta,
        });
    }
    block.push(Tracer {
        name: "libbpf-tools biolatency".into(),
        argv: s(&["stdbuf", "-oL", "biolatency"]),
        ready: Ready::Line("Tracing"),
    });
    block.push(bpftrace(
        "bpftrace block_rq issue→complete hist",
        "tracepoint:block:block_rq_issue { @s[args->dev, args->sector] = nsecs; } tracepoint:block:block_rq_complete /@s[args->dev, args->sector]/ { @us = hist((nsecs - @s[args->dev, args->sector]) / 1000); delete(@s[args->dev, args->sector]); }",
    ));

    let loops = pipe_loops(quick);
    // The unpinned pipe and the switch storm: the same tracers without the classic floor,
    // numa and triage (measured on the pinned pipe).
    let sched_few: Vec<Tracer> = sched
        .iter()
        .filter(|t| !t.name.contains("classic") && t.name != "tracekit numa" && t.name != TRIAGE)
        .cloned()
        .collect();
    let cases: Vec<(Workload, Vec<Tracer>)> = vec![
        (
            Workload::Pipe {
                loops,
                pinned: true,
            },
            sched.clone(),
        ),
        (
            Workload::Pipe {
                loops,
                pinned: false,
            },
            sched_few.clone(),
        ),
        (
            Workload::SwitchStorm {
                secs: if quick { 1 } else { 3 },
            },
            sched_few,
        ),
        (
            Workload::Fsync {
                n: if quick { 300 } else { 2000 },
            },
            fsync_loop,
        ),
        (
            Workload::Syscalls {
                loops: if quick { 2_000_000 } else { 10_000_000 },
            },
            fsync.clone(),
        ),
        (
            Workload::Compaction {
                n: if quick { 3 } else { 10 },
            },
            compaction,
        ),
        (
            Workload::UdpDrops {
                n: if quick { 20_000 } else { 100_000 },
            },
            net,
        ),
        (
            Workload::BlockRead {
                n: if quick { 2_000 } else { 10_000 },
            },
            block,
        ),
    ];
    cases
}

/// Loops of the sched pipe workload.
fn pipe_loops(quick: bool) -> u32 {
    if quick {
        50_000
    } else {
        200_000
    }
}

/// Start-up and exit cases: each tool's command line, run under strace.
pub(super) fn startup_cases(tk: &Path) -> Vec<(String, Vec<String>)> {
    let tk_s = tk.to_string_lossy().into_owned();
    let mut st_cases: Vec<(String, Vec<String>)> = vec![(
        "tracekit fsync-lat".into(),
        s(&[&tk_s, "fsync-lat", "--duration", "300ms"]),
    )];
    for tool in ["memstall", "ctxsw", "runq-lat"] {
        if tracekit_has(tk, tool) {
            st_cases.push((
                format!("tracekit {tool}"),
                s(&[&tk_s, tool, "--duration", "300ms"]),
            ));
        }
    }
    st_cases.push(("libbpf-tools runqlat".into(), s(&["runqlat", "1", "1"])));
    st_cases.push((
        "bpftrace one-probe script".into(),
        s(&[
            "bpftrace",
            "-e",
            "tracepoint:sched:sched_switch { @[comm] = count(); } interval:ms:300 { exit(); }",
        ]),
    ));
    st_cases
}
