//! What the benchmark runs: the workloads, and for each the tracers measured on it (tracekit's
//! tools, the floor programs, the libbpf-tools and bpftrace references).

use std::path::Path;

use super::{
    tracer::{tracekit_has, Ready, Tracer},
    workload::{Workload, CPU_COMM},
};

pub(super) fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

const TRIAGE: &str = "tracekit triage (every collector, one process)";
const TRIAGE_NUMA: &str = "tracekit triage, numa forced (as on a NUMA node)";

/// The tracers attached together on the pinned pipe (issue 30: triage against runqlat, and
/// ctxsw against its floor, with every one of them on every switch).
pub(super) const AT_ONCE: [&str; 4] = [
    "libbpf-tools runqlat",
    TRIAGE,
    "tracekit ctxsw",
    "floor: wake-wait lower bound + a per-process count",
];

/// A bpftrace one-liner as a reference tracer.
fn bpftrace(name: &str, script: &str) -> Tracer {
    Tracer {
        name: name.into(),
        argv: s(&["stdbuf", "-oL", "bpftrace", "-e", script]),
        ready: Ready::Line("Attaching"),
    }
}

/// A tracekit tool as a tracer; where this build has no such tool (`tracekit TOOL --help`
/// fails), a row that says so instead of no row at all.
fn tk_tool(tk: &Path, name: &str, tool: &str, argv: Vec<String>) -> Tracer {
    Tracer {
        name: name.into(),
        argv,
        ready: if tracekit_has(tk, tool) {
            Ready::JsonMeta
        } else {
            Ready::NotHere(format!(
                "not in this build (`tracekit {tool} --help` failed)"
            ))
        },
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
        // The least any wall-clock wakeup-wait tool does (issue 17's cost goal is measured
        // against it): a timestamp at sched_waking, a histogram bucket at sched_switch.
        Tracer {
            name: "floor: wake-wait lower bound (timestamp at waking, bucket at switch)".into(),
            argv: tkj("bench-floor", &["--hook", "wake-wait"]),
            ready: Ready::JsonMeta,
        },
        Tracer {
            name: "floor: wake-wait lower bound + a per-process count".into(),
            argv: tkj("bench-floor", &["--hook", "wake-wait-proc"]),
            ready: Ready::JsonMeta,
        },
        // Issue 30's control for ctxsw: the same bound counting from the kernel's own switch
        // counters (a baseline by tid, four deltas per process), as ctxsw does to be exact.
        Tracer {
            name: "floor: wake-wait + the kernel's switch counters by task and process".into(),
            argv: tkj("bench-floor", &["--hook", "wake-wait-counters"]),
            ready: Ready::JsonMeta,
        },
        // Issue 30's control for runq-lat: the counters control plus each wait's culprit (the
        // task switched out charged in a pair hash) and its steal (the queue's steal clock at
        // the enqueue and at the switch-in), as runq-lat records them.
        Tracer {
            name: "floor: wake-wait + switch counters + each wait's culprit and steal".into(),
            argv: tkj("bench-floor", &["--hook", "wake-wait-culprits"]),
            ready: Ready::JsonMeta,
        },
        // Issue 30's control for numa: its switch work at its least (this CPU's switch-in
        // swapped, the outgoing task's run added to its process's row for the CPU's node).
        Tracer {
            name: "floor: on-CPU time per process and node (numa's switch work)".into(),
            argv: tkj("bench-floor", &["--hook", "switch-node"]),
            ready: Ready::JsonMeta,
        },
    ];
    // numa adds a sched_switch program of its own (issue 13: its cost per switch beside ctxsw's,
    // same run). On one node it loads nothing unless forced (`--force`, hidden: for tests and
    // this measurement), so it is forced here on every host.
    for (tool, extra) in [
        ("ctxsw", &[][..]),
        ("runq-lat", &[]),
        ("numa", &["--force"]),
    ] {
        let name = format!("tracekit {tool} {}", extra.join(" "));
        sched.push(tk_tool(tk, name.trim_end(), tool, tkj(tool, extra)));
    }
    // triage says on stderr when it watches (it has no --json meta line).
    let mut triage = tk_tool(
        tk,
        TRIAGE,
        "triage",
        s(&[&tk_s, "triage", "--duration", "1h"]),
    );
    if matches!(triage.ready, Ready::JsonMeta) {
        triage.ready = Ready::Line("Triage: watching");
    }
    sched.push(triage.clone());
    // The same on a NUMA node, where triage runs numa too: forced here, it joins the shared
    // sched_switch program (issue 30) instead of adding its own.
    sched.push(Tracer {
        name: TRIAGE_NUMA.into(),
        argv: s(&[
            "env",
            "TRACEKIT_NUMA_FORCE=1",
            &tk_s,
            "triage",
            "--duration",
            "1h",
        ]),
        ..triage.clone()
    });
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
        // The least a latency tool does per call: a timestamp by thread at enter, the lookup,
        // delete and a histogram bucket at exit.
        Tracer { name: "floor: fsync timed (timestamp by thread, bucket)".into(), argv: tkj("bench-floor", &["--hook", "fsync-timed"]), ready: Ready::JsonMeta },
        Tracer { name: "tracekit fsync-lat".into(), argv: tkj("fsync-lat", &[]), ready: Ready::JsonMeta },
        bpftrace("bpftrace fsync latency hist", "tracepoint:syscalls:sys_enter_fsync { @s[tid] = nsecs; } tracepoint:syscalls:sys_exit_fsync /@s[tid]/ { @ns = hist(nsecs - @s[tid]); delete(@s[tid]); }"),
    ];

    let compaction: Vec<Tracer> = vec![
        tk_tool(tk, "tracekit memstall", "memstall", tkj("memstall", &[])),
        bpftrace("bpftrace compaction latency hist", "tracepoint:compaction:mm_compaction_begin { @s[tid] = nsecs; } tracepoint:compaction:mm_compaction_end /@s[tid]/ { @ns[comm] = hist(nsecs - @s[tid]); delete(@s[tid]); }"),
    ];
    let mut fsync_loop = fsync.clone();
    fsync_loop.push(triage);

    // The receive path. The floor is the counter alone on the four hooks net-rx needs (on a
    // loopback flood each datagram is its own softirq and NAPI poll). Issue 11's reference is the one-liner counting kfree_skb by reason; the second
    // bpftrace script does what net-rx does in the kernel (drops by reason, NET_RX softirq time
    // per CPU, NAPI polls and budget exhaustion), its softirq programs also run on every softirq.
    let net = vec![
        Tracer {
            name: "floor: counter on kfree_skb, napi_poll, softirq_entry/exit".into(),
            argv: tkj("bench-floor", &["--hook", "net-rx-path"]),
            ready: Ready::JsonMeta,
        },
        // Issue 30's control for net-rx: the same hooks doing what net-rx records, at its least
        // (drops by reason, place and socket in per-CPU hashes, softirq time, NAPI polls).
        Tracer {
            name: "floor: drops by reason, place and socket; softirq time; NAPI polls".into(),
            argv: tkj("bench-floor", &["--hook", "net-rx-keyed"]),
            ready: Ready::JsonMeta,
        },
        tk_tool(tk, "tracekit net-rx", "net-rx", tkj("net-rx", &[])),
        bpftrace(
            "bpftrace kfree_skb count by reason",
            "tracepoint:skb:kfree_skb { @[args->reason] = count(); }",
        ),
        bpftrace(
            "bpftrace net-rx equivalent (drops, NET_RX softirq, NAPI)",
            "tracepoint:skb:kfree_skb { @drops[args->reason] = count(); } tracepoint:irq:softirq_entry /args->vec == 3/ { @s[cpu] = nsecs; } tracepoint:irq:softirq_exit /args->vec == 3 && @s[cpu]/ { @softirq_ns[cpu] = sum(nsecs - @s[cpu]); delete(@s[cpu]); } tracepoint:napi:napi_poll { @polls[cpu] = count(); if (args->work >= args->budget) { @squeezed[cpu] = count(); } }",
        ),
    ];
    // IRQ and softirq time: irq-lat (a histogram per CPU and IRQ or vector, every softirq and
    // hard IRQ) beside libbpf-tools softirqs and hardirqs with -d (a log2 histogram per vector
    // or IRQ name, all CPUs together). On the loopback flood every datagram is a NET_RX run, on
    // the TCP stream most of the work is NET_RX too; hard IRQs are the machine's own.
    let irq = vec![
        tk_tool(tk, "tracekit irq-lat", "irq-lat", tkj("irq-lat", &[])),
        Tracer {
            name: "libbpf-tools softirqs -d".into(),
            argv: s(&["stdbuf", "-oL", "softirqs", "-d"]),
            ready: Ready::Line("Tracing"),
        },
        Tracer {
            name: "libbpf-tools hardirqs -d".into(),
            argv: s(&["stdbuf", "-oL", "hardirqs", "-d"]),
            ready: Ready::Line("Tracing"),
        },
    ];
    let net: Vec<Tracer> = net.into_iter().chain(irq).collect();

    // Block I/O latency: io-lat beside libbpf-tools biolatency and bpftrace. `biolatency -D`
    // (per disk, issue → complete: two hooks) is what issue 12 names; `-Q -D` adds the insert
    // hook (queued time included), which is what io-lat needs to split queue from device time:
    // the like-for-like peer. The floor is the least a per-process queue/device split costs
    // (timestamps and issuer by request, two buckets per process): a lower bound for io-lat.
    // io-lat also times each request from its first bio's submission (issue 33): the second
    // floor adds that hook with the least it can do (the clock into a per-CPU slot), so the
    // cost of the fourth hook per request is shown apart from how io-lat uses it. `io-lat
    // --from request` leaves that hook out and starts where biolatency -Q does: the same
    // work as `-Q -D`, hook for hook.
    let block = vec![
        Tracer {
            name: "floor: queue/device split per process (insert, issue, complete)".into(),
            argv: tkj("bench-floor", &["--hook", "io-split"]),
            ready: Ready::JsonMeta,
        },
        Tracer {
            name: "floor: the split + a submission stamp per bio (block_bio_queue)".into(),
            argv: tkj("bench-floor", &["--hook", "io-split-submit"]),
            ready: Ready::JsonMeta,
        },
        tk_tool(tk, "tracekit io-lat", "io-lat", tkj("io-lat", &[])),
        tk_tool(
            tk,
            "tracekit io-lat --from request",
            "io-lat",
            tkj("io-lat", &["--from", "request"]),
        ),
        Tracer {
            name: "libbpf-tools biolatency -D".into(),
            argv: s(&["stdbuf", "-oL", "biolatency", "-D"]),
            ready: Ready::Line("Tracing"),
        },
        Tracer {
            name: "libbpf-tools biolatency -Q -D".into(),
            argv: s(&["stdbuf", "-oL", "biolatency", "-Q", "-D"]),
            ready: Ready::Line("Tracing"),
        },
        bpftrace(
            "bpftrace block_rq issue→complete hist",
            "tracepoint:block:block_rq_issue { @s[args->dev, args->sector] = nsecs; } tracepoint:block:block_rq_complete /@s[args->dev, args->sector]/ { @us = hist((nsecs - @s[args->dev, args->sector]) / 1000); delete(@s[args->dev, args->sector]); }",
        ),
    ];

    let profilers = profilers(tk, &tkj);
    let py_profilers = py_profilers(tk, &tkj);

    let loops = pipe_loops(quick);
    // The unpinned pipe and the switch storm: the same tracers without the classic floor, the
    // counters control, numa and triage (measured on the pinned pipe).
    let sched_few: Vec<Tracer> = sched
        .iter()
        .filter(|t| {
            !t.name.contains("classic")
                && !t.name.contains("switch counters")
                && !t.name.contains("numa's switch work")
                && !t.name.starts_with("tracekit numa")
                && t.name != TRIAGE
                && t.name != TRIAGE_NUMA
        })
        .cloned()
        .collect();
    // `why` (issue 27) on the pinned pipe only: on the switches of the process it follows
    // (`--comm sched-pipe`: both ends of the pipe, every switch of the run), and on everyone else's
    // (`--pid 1`: the filter first, in the kernel), beside libbpf-tools' offcputime and
    // runqlat filtered the same way and offcputime on every thread.
    let mut pinned = sched.clone();
    pinned.extend([
        tk_tool(
            tk,
            "tracekit why --comm sched-pipe (the traced process's switches)",
            "why",
            tkj("why", &["--comm", "sched-pipe"]),
        ),
        tk_tool(
            tk,
            "tracekit why --pid 1 (every switch another process's)",
            "why",
            tkj("why", &["--pid", "1"]),
        ),
        Tracer {
            name: "libbpf-tools offcputime (every thread)".into(),
            argv: s(&["offcputime"]),
            ready: Ready::Programs,
        },
        Tracer {
            name: "libbpf-tools offcputime -p 1".into(),
            argv: s(&["offcputime", "-p", "1"]),
            ready: Ready::Programs,
        },
        Tracer {
            name: "libbpf-tools runqlat -p 1".into(),
            argv: s(&["stdbuf", "-oL", "runqlat", "-p", "1"]),
            ready: Ready::Line("Tracing"),
        },
    ]);
    let mut cases: Vec<(Workload, Vec<Tracer>)> = vec![
        (
            Workload::Pipe {
                loops,
                pinned: true,
            },
            pinned,
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
            net.clone(),
        ),
        (
            Workload::TcpStream {
                mib: if quick { 512 } else { 2048 },
            },
            net,
        ),
        (
            Workload::BlockRead {
                n: if quick { 20_000 } else { 50_000 },
                sched: "none",
            },
            block.clone(),
        ),
        (
            Workload::BlockRead {
                n: if quick { 20_000 } else { 50_000 },
                sched: "mq-deadline",
            },
            block,
        ),
        (
            Workload::Cpu {
                ops: if quick { 1_000 } else { 2_000 },
            },
            profilers,
        ),
        (
            Workload::Python {
                loops: if quick { 6_000 } else { 10_000 },
            },
            py_profilers,
        ),
    ];
    if let Some(base) = std::env::var_os("TK_BENCH_BASELINE") {
        with_baseline(&mut cases, &tk_s, &base.to_string_lossy());
    }
    cases
}

/// `TK_BENCH_BASELINE=PATH` (another build of tracekit, e.g. the parent commit's): each
/// tracekit row gets a twin right after it running that binary, named `… (baseline)`, so a
/// change is measured against what it replaces in the same run, round for round.
fn with_baseline(cases: &mut [(Workload, Vec<Tracer>)], tk: &str, base: &str) {
    for (_, tracers) in cases.iter_mut() {
        let mut out = Vec::new();
        for t in tracers.drain(..) {
            let twin = (t.argv.first().map(String::as_str) == Some(tk)).then(|| Tracer {
                name: format!("{} (baseline)", t.name),
                argv: std::iter::once(base.to_string())
                    .chain(t.argv[1..].iter().cloned())
                    .collect(),
                ready: t.ready.clone(),
            });
            out.push(t);
            out.extend(twin);
        }
        *tracers = out;
    }
}

/// `tracekit profile` beside `perf record` at 99 and 999 Hz (issue 19): frame pointers on every
/// CPU against `perf record -a -g`; DWARF unwinding (scoped to the workload's comm, how it is
/// meant to be used: one record per sample) against `perf record -a --call-graph dwarf`, which
/// only copies the stacks (perf unwinds at `perf report` time, not measured here). perf writes
/// perf.data into the tracer's own temporary directory, removed after each run.
fn profilers(tk: &Path, tkj: &dyn Fn(&str, &[&str]) -> Vec<String>) -> Vec<Tracer> {
    let mut out = Vec::new();
    for hz in ["99", "999"] {
        out.push(tk_tool(
            tk,
            &format!("tracekit profile --freq {hz} --unwind fp"),
            "profile",
            tkj("profile", &["--freq", hz, "--unwind", "fp"]),
        ));
        out.push(Tracer {
            name: format!("perf record -F {hz} -a -g"),
            argv: s(&["perf", "record", "-F", hz, "-a", "-g", "-o", "perf.data"]),
            ready: Ready::PerfEvents,
        });
    }
    for hz in ["99", "999"] {
        out.push(tk_tool(
            tk,
            &format!("tracekit profile --freq {hz} --unwind dwarf --comm {CPU_COMM}"),
            "profile",
            tkj(
                "profile",
                &["--freq", hz, "--unwind", "dwarf", "--comm", CPU_COMM],
            ),
        ));
        out.push(Tracer {
            name: format!("perf record -F {hz} -a --call-graph dwarf"),
            argv: s(&[
                "perf",
                "record",
                "-F",
                hz,
                "-a",
                "--call-graph",
                "dwarf",
                "-o",
                "perf.data",
            ]),
            ready: Ready::PerfEvents,
        });
    }
    out
}

/// `tracekit profile` on a Python workload (issue 29), per sample with and without Python
/// frames, beside `perf record -g` and py-spy, which reads the interpreter's frames from
/// outside with process_vm_readv (`--native`: merged with native stacks, as tracekit does).
/// py-spy attaches by pid: a shell waits for the workload's process and execs it, so its
/// start-up is in its CPU but not in the workload's.
fn py_profilers(tk: &Path, tkj: &dyn Fn(&str, &[&str]) -> Vec<String>) -> Vec<Tracer> {
    let Some(py) = super::workload::python_exe() else {
        return vec![Tracer {
            name: "Python profilers".into(),
            argv: Vec::new(),
            ready: Ready::NotHere("no python3 on PATH".into()),
        }];
    };
    let comm: String = py
        .file_name()
        .map(|n| n.to_string_lossy().chars().take(15).collect())
        .unwrap_or_default();
    let mut out = Vec::new();
    for (name, extra) in [
        ("--unwind dwarf", &["--unwind", "dwarf"][..]),
        (
            "--unwind dwarf --no-python",
            &["--unwind", "dwarf", "--no-python"],
        ),
        ("--unwind fp", &["--unwind", "fp"]),
    ] {
        let mut a = vec!["--freq", "99", "--comm", &comm];
        a.extend_from_slice(extra);
        out.push(tk_tool(
            tk,
            &format!("tracekit profile --freq 99 {name} --comm {comm}"),
            "profile",
            tkj("profile", &a),
        ));
    }
    out.push(Tracer {
        name: "perf record -F 99 -a -g".into(),
        argv: s(&["perf", "record", "-F", "99", "-a", "-g", "-o", "perf.data"]),
        ready: Ready::PerfEvents,
    });
    let py_spy = super::workload::py_spy();
    out.push(Tracer {
        name: "py-spy record --native -r 99".into(),
        argv: s(&[
            "sh",
            "-c",
            &format!(
                "echo py-spy waiting; while ! p=$(pgrep -n -x {comm}); do sleep 0.002; done; exec {} record --native -r 99 -f raw -o py-spy.txt -p $p",
                py_spy.as_deref().unwrap_or(Path::new("py-spy")).display()
            ),
        ]),
        ready: match py_spy {
            Some(_) => Ready::Line("py-spy waiting"),
            None => Ready::NotHere("py-spy is not installed (pip install py-spy)".into()),
        },
    });
    out
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
    // Every tool, whether this build has it or not: one that never attaches gets a row saying
    // so (a silent gap hid a whole run's missing tools once).
    for (tool, extra) in [
        ("memstall", &[][..]),
        ("ctxsw", &[]),
        ("runq-lat", &[]),
        ("io-lat", &[]),
        ("net-rx", &[]),
        ("numa", &["--force"]),
    ] {
        let mut argv = s(&[&tk_s, tool, "--duration", "300ms"]);
        argv.extend(s(extra));
        let name = format!("tracekit {tool} {}", extra.join(" "));
        st_cases.push((name.trim_end().to_string(), argv));
    }
    for unwind in ["fp", "dwarf"] {
        st_cases.push((
            format!("tracekit profile --unwind {unwind}"),
            s(&[
                &tk_s,
                "profile",
                "--unwind",
                unwind,
                "--comm",
                CPU_COMM,
                "--duration",
                "300ms",
            ]),
        ));
    }
    // perf record's attach is its last PERF_EVENT_IOC_ENABLE; it writes perf.data into the
    // run's temporary directory.
    for (name, cg) in [
        ("perf record -a -g", "fp"),
        ("perf record -a --call-graph dwarf", "dwarf"),
    ] {
        st_cases.push((
            name.into(),
            s(&[
                "perf",
                "record",
                "-F",
                "99",
                "-a",
                "--call-graph",
                cg,
                "-o",
                "perf.data",
                "--",
                "sleep",
                "0.3",
            ]),
        ));
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
    if let Some(base) = std::env::var_os("TK_BENCH_BASELINE") {
        // Start-up twins too: the same command line on the other build, measured in the same
        // rounds, so a start-up change has its before and after side by side.
        let twins: Vec<_> = st_cases
            .iter()
            .filter(|(_, argv)| argv.first() == Some(&tk_s))
            .map(|(name, argv)| {
                let mut argv = argv.clone();
                argv[0] = base.to_string_lossy().into_owned();
                (format!("{name} (baseline)"), argv)
            })
            .collect();
        for twin in twins {
            let at = st_cases
                .iter()
                .position(|(n, _)| format!("{n} (baseline)") == twin.0)
                .map_or(st_cases.len(), |i| i + 1);
            st_cases.insert(at, twin);
        }
    }
    st_cases
}
