//! Root property test over the command line itself: random combinations of tools, flags and
//! hostile values. Every run ends with a documented exit code (0, 2, 3, 4 or 5; doctor may say
//! 6), never 1, never a panic or an internal error, and leaves no program in the kernel: the
//! programs each case holds (its `/proc/<pid>/fdinfo`) are all gone at the end, and a leftover
//! names the case that loaded it (only this run's programs are looked at, so tests running
//! beside it cannot disturb it). Every tool gets its own flags too.
//! Reproduce a failure with `TK_FUZZ_SEED=<seed printed>`.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use tracekit_tests::*;

/// xorshift64*: deterministic, so a failing seed reproduces.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.next() as usize % v.len()]
    }
    fn chance(&mut self, pct: u64) -> bool {
        self.next() % 100 < pct
    }
}

/// The BPF programs process `pid` holds now (a program's or a link's `prog_id` in
/// `/proc/<pid>/fdinfo`): the ids one case loaded, without listing anyone else's.
fn held_programs(pid: u32, into: &mut std::collections::BTreeSet<u32>) {
    let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return;
    };
    for e in rd.filter_map(Result::ok) {
        let Ok(t) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        for l in t.lines() {
            if let Some(id) = l.strip_prefix("prog_id:") {
                if let Ok(id) = id.trim().parse() {
                    into.insert(id);
                }
            }
        }
    }
}

/// Values of one flag: well-formed ones and malformed ones (none: a switch; `OUT`: an
/// `--output`-like path from the outputs list).
type Flag = (
    &'static str,
    &'static [&'static str],
    &'static [&'static str],
);

const NUM: &[&str] = &["0", "1", "16", "1000000", "3"];
const BAD_NUM: &[&str] = &["15", "1000001", "-1", "abc", "99999999999999999999"];
const OUT: &[&str] = &["OUT"];

/// Each tool's own flags with their values.
fn own_flags(tool: &str) -> &'static [Flag] {
    match tool {
        "fsync-lat" => &[
            ("--rows", NUM, BAD_NUM),
            ("--by-file", &[], &[]),
            ("--top-files", NUM, BAD_NUM),
        ],
        "memstall" | "runq-lat" => &[("--rows", NUM, BAD_NUM)],
        "ctxsw" => &[
            ("--rows", NUM, BAD_NUM),
            ("--top", &[], &[]),
            ("--top-preemptors", NUM, BAD_NUM),
        ],
        "io-lat" => &[
            ("--rows", NUM, BAD_NUM),
            (
                "--dev",
                &["vda", "loop0", "vda1", "nosuch0"],
                &["", "../../etc", "a/b"],
            ),
            (
                "--attach",
                &["tp-btf", "raw_tp", "tracepoint"],
                &["tp_btf_", "bogus", ""],
            ),
        ],
        "net-rx" => &[
            ("--rows", NUM, BAD_NUM),
            (
                "--attach",
                &["tp_btf", "raw-tp", "tracepoint"],
                &["tpbtf", "kprobe", ""],
            ),
            ("--consume", &[], &[]),
            ("--drops-only", &[], &[]),
        ],
        "numa" => &[
            ("--rows", NUM, BAD_NUM),
            ("--maps", NUM, BAD_NUM),
            ("--force", &[], &[]),
        ],
        "profile" => &[
            ("--rows", NUM, BAD_NUM),
            ("--top", NUM, BAD_NUM),
            (
                "--freq",
                &["1", "99", "10000"],
                &["0", "10001", "-5", "fast"],
            ),
            ("--unwind", &["auto", "fp", "dwarf"], &["lbr", ""]),
            ("--folded", OUT, OUT),
            ("--svg", OUT, OUT),
            ("--pprof", OUT, OUT),
            ("--no-python", &[], &[]),
        ],
        _ => &[],
    }
}

/// One random command line: mostly well-formed (so that most runs reach the kernel and the
/// hostile values meet the code that acts on them), sometimes malformed.
fn argv(r: &mut Rng, scratch: &str, tid: &str) -> Vec<String> {
    let me = std::process::id().to_string();
    let bad = |r: &mut Rng| r.chance(15);
    // Well-formed but hostile: huge, tiny, the longest allowed.
    let durations = [
        "300ms",
        "200ms",
        "1ns",
        "18446744073709551615s",
        "300000000000y",
        "10y",
        "1h",
    ];
    let bad_durations = ["0s", "-1s", "10x", "", "5", "99999999999999999999999s"];
    let pids = ["1", &me, tid, "4000000", "1,2"];
    let bad_pids = ["0", "-5", "abc", "4194305", ""];
    let comms = ["x", "tk-workload", "sh", "\u{1b}[2J\n", "a\\b"];
    let bad_comms = ["", "a-very-long-process-name"];
    let out_new = format!("{scratch}/out.ndjson");
    let out_slash = format!("{scratch}/dir/");
    let outputs = [
        out_new.as_str(),
        "/",
        ".",
        "/nonexistent/x",
        "/dev/null",
        scratch,
        out_slash.as_str(),
        "",
    ];
    let tools = tools_and_commands();
    let mut a = vec![if bad(r) {
        r.pick(&["no-such-tool", "--json", "", "bench-floor"])
            .to_string()
    } else {
        r.pick(&tools).to_string()
    }];
    let common = [
        "--duration",
        "--interval",
        "--pid",
        "--comm",
        "--threads",
        "--json",
        "--output",
        "--hist",
        "--max-keys",
    ];
    let own = own_flags(&a[0]);
    for _ in 0..(r.next() % 5) {
        let value = |r: &mut Rng, good: &[&str], badv: &[&str]| {
            if bad(r) {
                r.pick(badv).to_string()
            } else {
                r.pick(good).to_string()
            }
        };
        if !own.is_empty() && a[0] != "doctor" && r.chance(40) {
            let &(flag, good, badv) = r.pick(own);
            a.push(flag.into());
            match good {
                [] => {}
                ["OUT"] => a.push(r.pick(&outputs).to_string()),
                _ => a.push(value(r, good, badv)),
            }
            continue;
        }
        let flag = if bad(r) {
            *r.pick(&[
                "--bogus",
                "-d",
                "-p",
                "positional",
                "--top",
                "--by-file",
                "--attach",
                "--unwind",
            ])
        } else if a[0] == "doctor" {
            *r.pick(&["--json", "--output"])
        } else {
            *r.pick(&common)
        };
        match flag {
            "--duration" | "--interval" | "-d" => {
                a.push(flag.into());
                a.push(value(r, &durations, &bad_durations));
            }
            "--pid" | "-p" => {
                a.push(flag.into());
                a.push(value(r, &pids, &bad_pids));
            }
            "--comm" => {
                a.push(flag.into());
                a.push(value(r, &comms, &bad_comms));
            }
            "--output" => {
                a.push(flag.into());
                a.push(r.pick(&outputs).to_string());
            }
            "--max-keys" => {
                a.push(flag.into());
                a.push(value(r, NUM, BAD_NUM));
            }
            "--top" => {
                a.push(flag.into());
                if r.chance(50) {
                    a.push(value(r, NUM, BAD_NUM));
                }
            }
            other => a.push(other.into()),
        }
    }
    // Most runs get a short duration so that they trace, report and end by themselves.
    if r.chance(60) && a[0] != "doctor" && !a.iter().any(|x| x == "--duration" || x == "-d") {
        a.extend(["--duration".into(), "300ms".into()]);
    }
    a
}

#[test]
fn random_command_lines_end_with_documented_codes() {
    require_root();
    let seed: u64 = std::env::var("TK_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x7ac3_61a5_0b5e_ed01);
    let cases: usize = std::env::var("TK_FUZZ_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(160);
    eprintln!("cli fuzz: seed {seed}, {cases} cases");
    let dir = scratch("cli-fuzz");
    std::fs::create_dir_all(dir.join("dir")).unwrap();
    // A thread of this process, for --pid.
    let idle = IdleThread::start();
    let tid = idle.tid.clone();
    let mut r = Rng(seed | 1);
    let mut codes = std::collections::BTreeMap::new();
    // The programs each case was seen holding, to find which case left one behind.
    let mut held: Vec<(usize, Vec<String>, std::collections::BTreeSet<u32>)> = Vec::new();
    let mut per_tool: std::collections::BTreeMap<String, usize> = Default::default();
    for case in 0..cases {
        let args = argv(&mut r, dir.to_str().unwrap(), &tid);
        let mut child = Command::new(tracekit_bin())
            .args(&args)
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let start = Instant::now();
        let mut interrupted = false;
        let mut ids = std::collections::BTreeSet::new();
        let mut polls = 0u32;
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            if polls.is_multiple_of(10) {
                held_programs(child.id(), &mut ids);
            }
            polls += 1;
            if !interrupted && start.elapsed() > Duration::from_millis(800) {
                // Runs without a duration end on Ctrl-C, like a user would end them.
                // SAFETY: plain syscall on our child's pid.
                unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
                interrupted = true;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "case {case} (seed {seed}) {args:?}: did not end after SIGINT"
            );
            std::thread::sleep(Duration::from_millis(5));
        };
        let err = take_stderr(&mut child);
        let code = status.code();
        let allowed: &[i32] = if args[0] == "doctor" {
            &[0, 2, 3, 4, 5, 6]
        } else {
            &[0, 2, 3, 4, 5]
        };
        assert!(
            code.is_some_and(|c| allowed.contains(&c)),
            "case {case} (seed {seed}) {args:?}: exit {status}: {err}"
        );
        assert!(
            !err.contains("panicked") && !err.contains("internal error"),
            "case {case} (seed {seed}) {args:?}: {err}"
        );
        if code != Some(0) && args[0] != "doctor" && !args[0].is_empty() {
            // A refusal is one line (clap's help for a bare command aside).
            assert!(
                err.trim_end().lines().count() == 1 || err.contains("Usage:"),
                "case {case} (seed {seed}) {args:?}: {err}"
            );
        }
        *codes.entry(code.unwrap()).or_insert(0) += 1;
        *per_tool.entry(args[0].clone()).or_insert(0) += 1;
        if !ids.is_empty() {
            held.push((case, args, ids));
        }
    }
    idle.stop();
    eprintln!("cli fuzz: exit codes {codes:?}; cases per tool {per_tool:?}");
    // Every program a case held is gone (the detach child of the last cases may still be
    // closing theirs: waited for, bounded).
    let all: Vec<u32> = held.iter().flat_map(|h| h.2.iter().copied()).collect();
    eprintln!(
        "cli fuzz: {} cases seen holding {} programs",
        held.len(),
        all.len()
    );
    assert!(!all.is_empty(), "no case was seen holding a program");
    let left = wait_unloaded(&all);
    let culprits: Vec<String> = held
        .iter()
        .filter(|h| h.2.iter().any(|i| left.contains(i)))
        .map(|(case, args, ids)| format!("case {case} {args:?}: {ids:?}"))
        .collect();
    assert!(
        culprits.is_empty(),
        "programs {left:?} left loaded by: {culprits:#?}"
    );
    assert!(
        codes.get(&0).copied().unwrap_or(0) > 5,
        "too few runs traced: {codes:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
