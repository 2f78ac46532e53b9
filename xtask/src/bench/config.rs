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
    for tool in ["ctxsw", "runq-lat"] {
        if tracekit_has(tk, tool) {
            sched.push(Tracer {
                name: format!("tracekit {tool}"),
                argv: tkj(tool, &[]),
                ready: Ready::JsonMeta,
            });
        }
    }
    sched.push(Tracer {
        name: "libbpf-tools runqlat".into(),
        argv: s(&["stdbuf", "-oL", "runqlat"]),
        ready: Ready::Line("Tracing"),
    });
    sched.push(Tracer {
        name: "bpftrace count by comm".into(),
        argv: s(&[
            "stdbuf",
            "-oL",
            "bpftrace",
            "-e",
            "tracepoint:sched:sched_switch { @[comm] = count(); }",
        ]),
        ready: Ready::Line("Attaching"),
    });
    let fsync: Vec<Tracer> = vec![
        // The floor on the same hooks as fsync-lat (enter and exit), so per-call kernel time
        // compares like for like (it used to be on sys_enter_fsync only: one run per call
        // against fsync-lat's two).
        Tracer { name: "floor: Aya counter, tracepoints sys_enter_fsync + sys_exit_fsync".into(), argv: tkj("bench-floor", &["--hook", "fsync-pair"]), ready: Ready::JsonMeta },
        Tracer { name: "floor: Aya counter, tp_btf sys_enter".into(), argv: tkj("bench-floor", &["--hook", "sys-enter"]), ready: Ready::JsonMeta },
        Tracer { name: "tracekit fsync-lat".into(), argv: tkj("fsync-lat", &[]), ready: Ready::JsonMeta },
        Tracer {
            name: "bpftrace fsync latency hist".into(),
            argv: s(&[
                "stdbuf",
                "-oL",
                "bpftrace",
                "-e",
                "tracepoint:syscalls:sys_enter_fsync { @s[tid] = nsecs; } tracepoint:syscalls:sys_exit_fsync /@s[tid]/ { @ns = hist(nsecs - @s[tid]); delete(@s[tid]); }",
            ]),
            ready: Ready::Line("Attaching"),
        },
    ];

    let compaction: Vec<Tracer> = vec![
        Tracer { name: "tracekit memstall".into(), argv: tkj("memstall", &[]), ready: Ready::JsonMeta },
        Tracer {
            name: "bpftrace compaction latency hist".into(),
            argv: s(&[
                "stdbuf",
                "-oL",
                "bpftrace",
                "-e",
                "tracepoint:compaction:mm_compaction_begin { @s[tid] = nsecs; } tracepoint:compaction:mm_compaction_end /@s[tid]/ { @ns[comm] = hist(nsecs - @s[tid]); delete(@s[tid]); }",
            ]),
            ready: Ready::Line("Attaching"),
        },
    ];
    let loops = pipe_loops(quick);
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
            sched
                .iter()
                .filter(|t| !t.name.contains("classic"))
                .cloned()
                .collect(),
        ),
        (
            Workload::SwitchStorm {
                secs: if quick { 1 } else { 3 },
            },
            sched
                .iter()
                .filter(|t| !t.name.contains("classic"))
                .cloned()
                .collect(),
        ),
        (
            Workload::Fsync {
                n: if quick { 300 } else { 2000 },
            },
            fsync.clone(),
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
    ];
    cases
}

/// Loops of the sched pipe workload.
pub(super) fn pipe_loops(quick: bool) -> u32 {
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
