//! `profile --off-cpu`: blocked time by stack against the thread's own schedstat, the fsync
//! path, `--min-block`, a frame-pointer caller, bad values; and the workloads these tests run.

use super::*;

/// Runs the workload `args` under one `profile --off-cpu --json --comm tk-workload` per entry of
/// `extra` (each tracer's own further arguments), all attached first; returns the workload's
/// line and each tracer's JSON lines, after checking its programs are unloaded.
fn off_cpu_runs(extra: &[&[&str]], args: &[&str]) -> (Value, Vec<Vec<Value>>) {
    let mut tracers = Vec::new();
    for e in extra {
        let mut a = vec![
            "profile",
            "--off-cpu",
            "--json",
            "--comm",
            "tk-workload",
            "--top",
            "30",
        ];
        a.extend_from_slice(e);
        let mut tk = Tracer::spawn(&a);
        let meta = tk.wait_attached();
        tracers.push((tk, program_ids(&meta)));
    }
    let w = run_workload(args);
    let mut out = Vec::new();
    for (tk, ids) in tracers {
        tk.signal(libc::SIGINT);
        let (status, lines, stderr) = tk.finish(Duration::from_secs(30));
        assert!(status.success(), "{stderr}");
        assert!(!ids.is_empty(), "the meta line lists no programs");
        assert_eq!(
            wait_unloaded(&ids),
            Vec::<u32>::new(),
            "programs left loaded"
        );
        out.push(lines);
    }
    (w, out)
}

/// (blocked ns, blocks) on the stacks of `pid` that have a function `pred` accepts.
fn blocked_under(lines: &[Value], pid: u64, pred: impl Fn(&str) -> bool) -> (u64, u64) {
    let fns = rows(lines, "function_total", pid);
    fns.iter()
        .filter(|r| r["function"].as_str().is_some_and(&pred))
        .map(|r| {
            (
                r["total_ns"].as_u64().unwrap(),
                r["blocks"].as_u64().unwrap(),
            )
        })
        .max()
        .unwrap_or((0, 0))
}

fn nanosleep_fn(f: &str) -> bool {
    f == "do_nanosleep" || f == "hrtimer_nanosleep"
}

/// A thread that sleeps 10 ms 100 times: its blocked time under `do_nanosleep` is within 10 %
/// of what the kernel's own counters say it spent neither running nor runnable (wall time minus
/// `/proc/<tid>/schedstat` run time and run-queue time over the same span), and its largest
/// stack waits in the nanosleep path. (The workload binary is stripped: its user frames are
/// named in the C test below.)
#[test]
fn off_cpu_sleeps_match_schedstat() {
    require_root();
    let (w, runs) = off_cpu_runs(&[&[]], &["offcpu-sleep", "100", "10000"]);
    let pid = w["pid"].as_u64().unwrap();
    let lines = &runs[0];
    let own = w["wall_ns"].as_u64().unwrap()
        - w["run_ns"].as_u64().unwrap()
        - w["delay_ns"].as_u64().unwrap();
    let (ns, blocks) = blocked_under(lines, pid, nanosleep_fn);
    eprintln!("off-CPU under do_nanosleep: {ns} ns in {blocks} blocks; schedstat: {own} ns neither running nor runnable ({w})");
    assert!((95..=100).contains(&blocks), "{blocks} blocks");
    let off = (ns as f64 - own as f64).abs() / own as f64;
    assert!(
        off <= 0.10,
        "tracekit {ns} ns, schedstat {own} ns: {:.1} % apart",
        off * 100.0
    );
    let stacks = rows(lines, "stack", pid);
    let top = stacks
        .iter()
        .max_by_key(|r| r["blocked_ns"].as_u64().unwrap_or(0))
        .expect("stack rows");
    assert!(top["wait"].as_str().is_some_and(nanosleep_fn), "{top}");
}

const SLEEPER_C: &str = r#"
#include <unistd.h>
/* Frame pointers lose the direct caller of a libc function built without them (its return
   address is on the stack, not in the frame chain): tk_sleep_once is that caller. */
__attribute__((noinline)) void tk_sleep_once(void) { usleep(10000); __asm__ volatile(""); }
__attribute__((noinline)) void tk_block_sleep(void) { tk_sleep_once(); __asm__ volatile(""); }
int main(void) { for (int i = 0; i < 100; i++) tk_block_sleep(); return 0; }
"#;

/// A C program built with frame pointers that sleeps under `tk_block_sleep`: its blocking stack
/// has that user frame above the kernel's nanosleep path, in the table (as the caller that
/// blocked), the folded file and the flame graph (in ns).
#[test]
fn off_cpu_user_stack_names_the_sleeping_function() {
    require_root();
    let dir = scratch("offcpu-c");
    let bin = build_c(&dir, "tk_sleeper", SLEEPER_C);
    let (svg, folded) = (dir.join("off.svg"), dir.join("off.folded"));
    let mut tk = Tracer::spawn(&[
        "profile",
        "--off-cpu",
        "--json",
        "--comm",
        "tk_sleeper",
        "--svg",
        svg.to_str().unwrap(),
        "--folded",
        folded.to_str().unwrap(),
    ]);
    tk.wait_attached();
    let child = Command::new(&bin).spawn().unwrap();
    let pid = child.id() as u64;
    assert!(child.wait_with_output().unwrap().status.success());
    tk.signal(libc::SIGINT);
    let (status, lines, stderr) = tk.finish(Duration::from_secs(30));
    assert!(status.success(), "{stderr}");
    let top = rows(&lines, "stack", pid)
        .into_iter()
        .max_by_key(|r| r["blocked_ns"].as_u64().unwrap_or(0))
        .expect("stack rows");
    let frames: Vec<&str> = top["frames"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f.as_str())
        .collect();
    eprintln!(
        "{} blocks, {} ns: {frames:?}",
        top["blocks"], top["blocked_ns"]
    );
    assert!(top["blocks"].as_u64().unwrap() >= 95, "{top}");
    assert_eq!(top["caller"], "tk_block_sleep", "{top}");
    let kernel = frames
        .iter()
        .position(|f| f.starts_with("do_nanosleep "))
        .expect("do_nanosleep");
    let user = frames
        .iter()
        .position(|f| f.starts_with("tk_block_sleep "))
        .unwrap();
    assert!(kernel < user, "innermost first: {frames:?}");
    let text = std::fs::read_to_string(&folded).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains(";tk_block_sleep;"))
        .expect("folded line");
    let ns: u64 = line.rsplit_once(' ').unwrap().1.parse().unwrap();
    assert!(ns >= 95 * 10_000_000, "{line}");
    let svg_text = std::fs::read_to_string(&svg).unwrap();
    assert!(
        svg_text.contains("tk_block_sleep") && svg_text.contains(" ns"),
        "SVG"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// An fsync loop on a real file: every fsync's blocking lands under the fsync path.
#[test]
fn off_cpu_fsync_blocks_are_under_the_fsync_path() {
    require_root();
    let dir = scratch("offcpu-fsync");
    let file = dir.join("f.dat");
    let (w, runs) = off_cpu_runs(
        &[&["--min-block", "0"]],
        &["offcpu-fsync", "50", file.to_str().unwrap()],
    );
    let pid = w["pid"].as_u64().unwrap();
    let n = w["n"].as_u64().unwrap();
    let fsync_path = |f: &str| {
        matches!(
            f,
            "do_fsync" | "vfs_fsync_range" | "file_write_and_wait_range" | "__x64_sys_fsync"
        )
    };
    let (ns, blocks) = blocked_under(&runs[0], pid, fsync_path);
    eprintln!("{n} fsyncs: {blocks} blocks, {ns} ns under the fsync path");
    assert!(
        blocks + 3 >= n,
        "{blocks} blocks under the fsync path for {n} fsyncs"
    );
    assert!(ns > 0);
    let _ = std::fs::remove_dir_all(dir);
}

/// --min-block: a 100 µs sleeper is left out at 1 ms and reported at 50 µs (same run).
#[test]
fn off_cpu_min_block_filters_short_blocks() {
    require_root();
    let (w, runs) = off_cpu_runs(
        &[&["--min-block", "1ms"], &["--min-block", "50us"]],
        &["offcpu-sleep", "200", "100"],
    );
    let pid = w["pid"].as_u64().unwrap();
    let (_, long) = blocked_under(&runs[0], pid, nanosleep_fn);
    let (ns, short) = blocked_under(&runs[1], pid, nanosleep_fn);
    // A block is shorter than the sleep around it, so --min-block 1ms keeps at most the
    // sleeps the workload itself timed at 1 ms or more (0 on a quiet host).
    let over = w["over_1ms"].as_u64().unwrap();
    eprintln!("200 sleeps of 100 us: {long} blocks at --min-block 1ms ({over} sleeps of 1 ms or more by the workload's clock), {short} ({ns} ns) at 50us");
    assert!(
        long <= over,
        "1ms kept {long} sleeps of 100 us; {over} took 1 ms or more"
    );
    // The filter is only seen to work if most sleeps stayed short; a busy CI host (CPU steal,
    // the other test binaries) stretched 16 of 200 past 1 ms, which still leaves 184 to drop.
    assert!(
        over <= 100,
        "{over} of 200 sleeps of 100 us took 1 ms or more: the host is too busy to tell"
    );
    assert!(short >= 190, "50us kept {short} of 200 sleeps of 100 us");
}

/// A bad --min-block is one line on stderr and exit 2, before anything loads.
#[test]
fn off_cpu_bad_min_block_is_a_usage_error() {
    for bad in ["fast", "1x", "2h"] {
        let out = Command::new(tracekit_bin())
            .args([
                "profile",
                "--off-cpu",
                "--min-block",
                bad,
                "--duration",
                "1s",
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{bad}: {err}");
        assert!(err.contains("--min-block"), "{err}");
    }
}

/// Whether this kernel's symbols are readable (kallsyms with addresses): then kernel frames are
/// named and the sleep's blocks are found under the nanosleep path.
fn kernel_symbols() -> bool {
    std::fs::read_to_string("/proc/kallsyms").is_ok_and(|t| {
        t.lines().filter(|l| l.ends_with(" do_nanosleep")).any(|l| {
            l.split(' ')
                .next()
                .is_some_and(|a| a.bytes().any(|b| b != b'0'))
        })
    })
}

/// The VM check of `profile --off-cpu`: the workload thread sleeps 10 ms 100 times (1 s in all,
/// nominally); tracekit's blocked time for it (under the nanosleep path where kernel symbols are
/// readable, else the whole process's) is within 10 % of what its own schedstat says it spent
/// neither running nor runnable, with 95 to 103 blocks, and its largest stack waits in the
/// nanosleep path. A kernel where off-CPU cannot run is doctor's and the tool's to say (the
/// check runs only where doctor says it can).
pub fn vm_check() -> Result<String, String> {
    let (lines, w, modes) = tracekit_tests::vm::traced(
        &[
            "profile",
            "--off-cpu",
            "--comm",
            "tk-workload",
            "--top",
            "30",
        ],
        &["offcpu-sleep", "100", "10000"],
    )?;
    let num = |k: &str| w[k].as_u64().ok_or(format!("workload printed no {k}: {w}"));
    let pid = num("pid")?;
    let own = num("wall_ns")? - num("run_ns")? - num("delay_ns")?;
    let named = kernel_symbols();
    let (ns, blocks) = if named {
        blocked_under(&lines, pid, nanosleep_fn)
    } else {
        let p = rows(&lines, "process", pid);
        let sum = |k: &str| p.iter().filter_map(|r| r[k].as_u64()).sum::<u64>();
        (sum("blocked_ns"), sum("blocks"))
    };
    let off = (ns as f64 - own as f64).abs() / own.max(1) as f64;
    let what = format!(
        "100 sleeps of 10 ms (1.000 s nominal): {:.3} s in {blocks} blocks {}, schedstat {:.3} s off-CPU ({:.1} % apart)",
        ns as f64 / 1e9,
        if named { "under do_nanosleep" } else { "(no kernel symbols: the process's total)" },
        own as f64 / 1e9,
        off * 100.0
    );
    // Up to 103 blocks: under TCG a guest once showed 101 blocks for the 100 sleeps (1.059 s
    // blocked against schedstat's 1.049 s, 1.0 % apart), a sleep cut in two by a wakeup that
    // did not end it; counting a block twice would show ~200.
    if !(95..=103).contains(&blocks) || off > 0.10 {
        return Err(what);
    }
    if named {
        let stacks = rows(&lines, "stack", pid);
        let top = stacks
            .iter()
            .max_by_key(|r| r["blocked_ns"].as_u64().unwrap_or(0))
            .ok_or("no stack rows")?;
        if !top["wait"].as_str().is_some_and(nanosleep_fn) {
            return Err(format!(
                "{what}; the largest stack waits in {}",
                top["wait"]
            ));
        }
    }
    Ok(format!("{what}; {modes}; programs unloaded"))
}

/// A kernel without BTF (`TRACEKIT_BTF` naming no file): doctor says `profile --off-cpu` cannot
/// run and why, while `profile` can; the tool itself refuses in one line naming the BTF it
/// needs, exit 4 (the VM checks hold such a kernel to the same: verdict `degraded`).
#[test]
fn off_cpu_without_btf_says_so_as_doctor_predicts() {
    require_root();
    let run = |args: &[&str]| {
        Command::new(tracekit_bin())
            .args(args)
            .env("TRACEKIT_BTF", "/nonexistent/vmlinux")
            .output()
            .unwrap()
    };
    let doctor = run(&["doctor", "--json"]);
    let entry = |name: &str| -> Value {
        String::from_utf8_lossy(&doctor.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|l| l["type"] == "tool" && l["name"] == name)
            .unwrap_or_else(|| panic!("doctor has no entry {name}"))
    };
    let off = entry("profile --off-cpu");
    assert_eq!(off["can_run"], false, "{off}");
    assert!(off["why"].as_str().unwrap().contains("BTF"), "{off}");
    assert_eq!(entry("profile")["can_run"], true);
    let out = run(&["profile", "--off-cpu", "--json", "--duration", "1s"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("needs the kernel's BTF") && err.contains("/nonexistent/vmlinux"),
        "{err}"
    );
}

/// (run ns, run-queue ns) of the calling thread, from `/proc/self/task/<tid>/schedstat`.
fn schedstat() -> (u64, u64) {
    // SAFETY: gettid has no arguments.
    let tid = unsafe { libc::gettid() };
    let s = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).unwrap();
    let v: Vec<u64> = s.split_whitespace().map(|x| x.parse().unwrap()).collect();
    (v[0], v[1])
}

pub fn sleep_workload(n: u32, us: u64) {
    let (run0, delay0) = schedstat();
    let t0 = Instant::now();
    // Sleeps that took 1 ms or more by this process's own clock: on a busy host a 100 µs timer
    // now and then fires late, and such a sleep really was a block of over 1 ms.
    let mut over_1ms = 0u32;
    for _ in 0..n {
        let t = Instant::now();
        std::thread::sleep(Duration::from_micros(us));
        over_1ms += u32::from(t.elapsed() >= Duration::from_millis(1));
    }
    let wall = t0.elapsed().as_nanos() as u64;
    let (run1, delay1) = schedstat();
    println!(
        "{}",
        serde_json::json!({"pid": std::process::id(), "n": n, "wall_ns": wall,
            "run_ns": run1 - run0, "delay_ns": delay1 - delay0, "over_1ms": over_1ms})
    );
}

pub fn fsync_workload(n: usize, path: &str) {
    let mut f = open_trunc(path);
    let took = timed_sync(&mut f, "fsync", n);
    println!(
        "{}",
        serde_json::json!({"pid": std::process::id(), "n": n, "fsync_ns": took.iter().sum::<u64>()})
    );
}
