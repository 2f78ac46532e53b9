//! Root tests for `tracekit profile`: a C program whose time goes to one known function (built
//! here with frame pointers), profiled by tracekit and by `perf record -F 99 -g -e cpu-clock` on
//! the same run; and a "JIT" workload (machine code in an anonymous mapping, named in
//! `/tmp/perf-<pid>.map`), which is also the VM check: guests have no compiler, and the test
//! binaries are stripped and built without frame pointers, so a JIT with a perf map is the
//! hot function a guest can name. Beside it: `profile/container.rs` (a binary that exists only
//! in a podman container's root), `profile/exited.rs` (the same, symbolised after the process
//! exited), `profile/offcpu.rs` (`--off-cpu` against schedstat) and `profile/python.rs` (CPython
//! frames on every interpreter of the host, on-CPU and off-CPU).

use std::{
    collections::HashMap,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use serde_json::Value;
use tracekit_tests::*;

#[path = "profile/container.rs"]
mod container;
#[path = "profile/exited.rs"]
mod exited;
#[path = "profile/offcpu.rs"]
mod offcpu;
#[path = "profile/python.rs"]
mod python;

/// The hot function of the C program.
const HOT: &str = "tk_hot_spin";
/// The JIT workload's function, as its perf map names it.
const JIT: &str = "tk_jit_hot_loop";

/// The hot function and a monotonic clock, for the C programs of these tests.
const SPIN_C: &str = r#"
#include <stdlib.h>
#include <time.h>
__attribute__((noinline)) unsigned long tk_hot_spin(unsigned long n) {
    volatile unsigned long x = 0;
    for (unsigned long i = 0; i < n; i++) x += i * i;
    return x;
}
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
"#;

/// Spins in the hot function for `argv[1]` seconds (2 by default).
fn hot_c() -> String {
    format!(
        "{SPIN_C}{}",
        r#"
int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 2.0, t0 = now();
    unsigned long s = 0;
    while (now() - t0 < secs) s += tk_hot_spin(2000000);
    return (int)(s & 1) * 0;
}
"#
    )
}

/// Builds C program `name` from `source` in `dir`, with frame pointers.
fn build_c(dir: &Path, name: &str, source: &str) -> std::path::PathBuf {
    build_c_with(dir, name, source, &[])
}

/// [`build_c`] with more compiler flags (`-static`: a binary that runs in an image without
/// libc).
fn build_c_with(dir: &Path, name: &str, source: &str, flags: &[&str]) -> std::path::PathBuf {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    let bin = dir.join(name);
    let cc = Command::new("gcc")
        .args(["-O1", "-fno-omit-frame-pointer"])
        .args(flags)
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("gcc");
    assert!(
        cc.success(),
        "gcc {flags:?} (libc6-dev ships libc.a for -static)"
    );
    bin
}

/// `tracekit profile --json --unwind fp --comm COMM EXTRA…`, attached.
fn profile_fp(comm: &str, extra: &[&str]) -> Tracer {
    let mut args = vec!["profile", "--json", "--unwind", "fp", "--comm", comm];
    args.extend_from_slice(extra);
    let mut tk = Tracer::spawn(&args);
    tk.wait_attached();
    tk
}

/// Rows of `kind` for `pid` in tracekit's JSON lines.
fn rows<'a>(lines: &'a [Value], kind: &str, pid: u64) -> Vec<&'a Value> {
    lines
        .iter()
        .filter(|l| l["tool"] == "profile" && l["type"] == kind && l["pid"] == pid)
        .collect()
}

/// (process samples, the function's self samples, the top function by self samples).
fn shares(lines: &[Value], pid: u64, function: &str) -> Result<(u64, u64, String), String> {
    let procs = rows(lines, "process", pid);
    let samples: u64 = procs.iter().filter_map(|r| r["samples"].as_u64()).sum();
    let fns = rows(lines, "function", pid);
    let of = |f: &str| -> u64 {
        fns.iter()
            .filter(|r| r["function"] == f)
            .filter_map(|r| r["self_samples"].as_u64())
            .sum()
    };
    let top = fns
        .iter()
        .max_by_key(|r| r["self_samples"].as_u64().unwrap_or(0))
        .and_then(|r| r["function"].as_str())
        .ok_or_else(|| format!("no function rows for pid {pid}"))?;
    Ok((samples, of(function), top.to_string()))
}

/// The share check both cases make: at least 90 % of the process's samples in `function`.
fn check_hot(lines: &[Value], pid: u64, function: &str) -> Result<String, String> {
    let (samples, hot, top) = shares(lines, pid, function)?;
    if samples < 20 {
        return Err(format!("only {samples} samples for pid {pid}"));
    }
    if (hot as f64) < 0.9 * samples as f64 || top != function {
        return Err(format!(
            "{hot} of {samples} samples in {function} (top function {top})"
        ));
    }
    Ok(format!(
        "{hot} of {samples} samples ({:.1} %) in {function}",
        hot as f64 * 100.0 / samples as f64
    ))
}

/// perf's samples per pid and its leaf functions, from `perf script`.
fn perf_samples(data: &Path) -> HashMap<u64, HashMap<String, u64>> {
    let out = output_ok(
        Command::new("perf")
            .args(["script", "-F", "pid,ip,sym", "--hide-call-graph", "-i"])
            .arg(data),
        "perf script",
    );
    let mut m: HashMap<u64, HashMap<String, u64>> = HashMap::new();
    for l in String::from_utf8_lossy(&out).lines() {
        let t: Vec<&str> = l.split_whitespace().collect();
        let Some(pid) = t.first().and_then(|p| p.parse().ok()) else {
            continue;
        };
        let sym = t.get(2).copied().unwrap_or("[unknown]").to_string();
        *m.entry(pid).or_default().entry(sym).or_default() += 1;
    }
    m
}

#[test]
fn hot_function_matches_perf_and_is_in_the_flame_graph() {
    require_root();
    let dir = scratch("profile-c");
    let bin = build_c(&dir, "tk_hot", &hot_c());
    let (svg, folded, data) = (
        dir.join("cpu.svg"),
        dir.join("cpu.folded"),
        dir.join("perf.data"),
    );
    let tk = profile_fp(
        "tk_hot",
        &[
            "--svg",
            svg.to_str().unwrap(),
            "--folded",
            folded.to_str().unwrap(),
        ],
    );
    let perf = Command::new("perf")
        .args(["record", "-F", "99", "-g", "-e", "cpu-clock", "-q", "-o"])
        .arg(&data)
        .arg("--")
        .arg(&bin)
        .arg("5")
        .status()
        .expect("perf record (Debian package linux-perf)");
    assert!(perf.success());
    tk.signal(libc::SIGINT);
    let (status, lines, stderr) = tk.finish(Duration::from_secs(30));
    assert!(status.success(), "{stderr}");

    let by_pid = perf_samples(&data);
    let (&pid, perf_fns) = by_pid
        .iter()
        .max_by_key(|(_, f)| f.values().sum::<u64>())
        .expect("perf recorded samples");
    let perf_total: u64 = perf_fns.values().sum();
    let perf_top = perf_fns.iter().max_by_key(|(_, n)| **n).unwrap().0.clone();
    let verdict = check_hot(&lines, pid, HOT).unwrap();
    let (tk_total, _, tk_top) = shares(&lines, pid, HOT).unwrap();
    eprintln!("tracekit: {verdict}; perf: {perf_total} samples, top {perf_top} ({perf_fns:?})");
    assert_eq!(tk_top, perf_top, "top function");
    let off = (tk_total as f64 - perf_total as f64).abs() / perf_total as f64;
    assert!(
        off <= 0.10,
        "tracekit {tk_total} samples, perf {perf_total}: {:.1} % apart",
        off * 100.0
    );
    // Frame pointers: the hot function's callers are on the stack, up to main.
    let main_total: u64 = rows(&lines, "function_total", pid)
        .iter()
        .filter(|r| r["function"] == "main")
        .filter_map(|r| r["total_samples"].as_u64())
        .sum();
    assert!(
        main_total as f64 >= 0.9 * tk_total as f64,
        "main on {main_total} of {tk_total} stacks"
    );
    let f = findings_for(&lines, pid);
    assert!(f.iter().any(|s| s.contains(HOT)), "findings: {f:?}");

    let folded_text = std::fs::read_to_string(&folded).unwrap();
    assert!(
        folded_text
            .lines()
            .any(|l| l.contains(&format!(";main;{HOT}"))),
        "{folded_text}"
    );
    let svg_text = std::fs::read_to_string(&svg).unwrap();
    assert!(svg_text.contains(HOT));
    let xml = Command::new("python3")
        .args([
            "-c",
            "import sys, xml.etree.ElementTree as E; E.parse(sys.argv[1])",
        ])
        .arg(&svg)
        .status()
        .expect("python3");
    assert!(xml.success(), "the SVG is not well-formed XML");
    let _ = std::fs::remove_dir_all(dir);
}

/// `--pprof`: `go tool pprof -top` (Debian's golang-go) reads the file and lists the same
/// functions with the same self counts as tracekit's own table, over the same total.
#[test]
fn pprof_output_reads_in_go_tool_pprof_as_the_table_says() {
    require_root();
    let dir = scratch("profile-pprof");
    let bin = build_c(&dir, "tk_hot", &hot_c());
    let pb = dir.join("cpu.pb.gz");
    let tk = profile_fp("tk_hot", &["--pprof", pb.to_str().unwrap()]);
    let run = Command::new(&bin).arg("3").status().expect("tk_hot");
    assert!(run.success());
    tk.signal(libc::SIGINT);
    let (status, lines, stderr) = tk.finish(Duration::from_secs(30));
    assert!(status.success(), "{stderr}");
    let out = output_ok(
        Command::new("go")
            .args([
                "tool",
                "pprof",
                "-top",
                "-nodecount=1000",
                "-sample_index=samples",
                "-symbolize=none",
            ])
            .arg(&pb)
            .env("HOME", &dir),
        "go tool pprof -top (Debian package golang-go)",
    );
    let text = String::from_utf8_lossy(&out);
    // `flat flat% sum% cum cum% name`, one function per line after the header.
    let mut flat: HashMap<String, u64> = HashMap::new();
    for l in text.lines() {
        let t: Vec<&str> = l.split_whitespace().collect();
        if t.len() >= 6 && t[1].ends_with('%') && t[2].ends_with('%') {
            if let Ok(n) = t[0].parse::<u64>() {
                flat.insert(t[5..].join(" "), n);
            }
        }
    }
    let procs: Vec<&Value> = lines
        .iter()
        .filter(|l| l["tool"] == "profile" && l["type"] == "process")
        .collect();
    let total: u64 = procs.iter().filter_map(|r| r["samples"].as_u64()).sum();
    let mut table: HashMap<String, u64> = HashMap::new();
    for r in lines
        .iter()
        .filter(|l| l["tool"] == "profile" && l["type"] == "function")
    {
        *table
            .entry(r["function"].as_str().unwrap_or("").to_string())
            .or_default() += r["self_samples"].as_u64().unwrap_or(0);
    }
    eprintln!("pprof: {flat:?}\ntracekit: {table:?}, {total} samples\n{text}");
    assert!(total >= 100, "{total} samples: {lines:?}");
    assert!(
        text.contains(&format!("of {total} total")),
        "pprof's total is tracekit's {total}: {text}"
    );
    // The table lists each process's top functions: each is in pprof with the same count.
    assert!(table.contains_key(HOT), "{table:?}");
    // (`[unknown]` of several binaries is one name in both: not comparable line by line.)
    for (f, n) in table.iter().filter(|(f, _)| !f.starts_with('[')) {
        assert_eq!(flat.get(f), Some(n), "{f}: pprof {flat:?}");
    }
    // The binary's mapping carries its range, path and GNU build id (as readelf reads it), and
    // the hot function's location an address inside that range.
    let notes = output_ok(
        Command::new("readelf").arg("-n").arg(&bin),
        "readelf (binutils)",
    );
    let notes = String::from_utf8_lossy(&notes);
    let build_id = notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .unwrap_or_else(|| panic!("no build id in {notes}"))
        .trim()
        .to_string();
    let raw = output_ok(
        Command::new("go")
            .args(["tool", "pprof", "-raw", "-symbolize=none"])
            .arg(&pb)
            .env("HOME", &dir),
        "go tool pprof -raw",
    );
    let raw = String::from_utf8_lossy(&raw);
    // `1: 0x5600…/0x5600…/0x1000 /path/tk_hot 3f2a… [FN]`
    let mapping = raw
        .lines()
        .find(|l| l.contains(bin.to_str().unwrap()) && l.contains(&build_id))
        .unwrap_or_else(|| {
            panic!(
                "no mapping of {} with build id {build_id}:\n{raw}",
                bin.display()
            )
        });
    let (id, range) = mapping.trim().split_once(": ").unwrap();
    let bounds: Vec<u64> = range
        .split_whitespace()
        .next()
        .unwrap()
        .split('/')
        .map(|h| u64::from_str_radix(h.trim_start_matches("0x"), 16).unwrap())
        .collect();
    let hot_addrs: Vec<u64> = raw
        .lines()
        .filter(|l| l.contains(&format!(" M={id} {HOT} ")))
        .filter_map(|l| l.split_whitespace().nth(1))
        .map(|h| u64::from_str_radix(h.trim_start_matches("0x"), 16).unwrap())
        .collect();
    assert!(
        !hot_addrs.is_empty(),
        "no location of {HOT} in mapping {id}:\n{raw}"
    );
    for a in hot_addrs {
        assert!(bounds[0] <= a && a < bounds[1], "{a:#x} outside {mapping}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// A stripped binary has no symbols: its frames are `[unknown]`, but in that binary (as perf
/// names the DSO), not in an unknown object (Debian's stripped /usr/bin/python3 showed ~60 %
/// `[unknown] ([unknown])` before).
#[test]
fn a_stripped_binarys_frames_name_the_binary() {
    require_root();
    let dir = scratch("profile-stripped");
    let bin = build_c(&dir, "tk_stripped", &hot_c());
    let strip = Command::new("strip")
        .arg("--strip-all")
        .arg(&bin)
        .status()
        .expect("strip (binutils)");
    assert!(strip.success());
    let tk = profile_fp("tk_stripped", &[]);
    let child = Command::new(&bin).arg("2").spawn().unwrap();
    let pid = u64::from(child.id());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    tk.signal(libc::SIGINT);
    let (status, lines, stderr) = tk.finish(Duration::from_secs(30));
    assert!(status.success(), "{stderr}");
    let fns = rows(&lines, "function", pid);
    let self_of = |pred: &dyn Fn(&Value) -> bool| -> u64 {
        fns.iter()
            .filter(|r| pred(r))
            .filter_map(|r| r["self_samples"].as_u64())
            .sum()
    };
    let all = self_of(&|_| true);
    let in_bin = self_of(&|r| r["function"] == "[unknown]" && r["module"] == "tk_stripped");
    // What this test is about: a frame of the stripped binary put in no object. A sample
    // without any stack (`[no stack]`: both stack ids missing, a collision in the stack map
    // or a failed walk, counted in the stats line) names no frame at all, so it is not one.
    let no_stack = self_of(&|r| r["function"] == "[no stack]");
    let nowhere = self_of(&|r| r["module"] == "[unknown]" && r["function"] != "[no stack]");
    let stats = lines.iter().rev().find(|l| l["type"] == "stats");
    eprintln!(
        "{in_bin} of {all} samples [unknown] in tk_stripped, {nowhere} in no object, {no_stack} without a stack; stats {stats:?}"
    );
    assert!(all >= 20, "only {all} samples: {fns:?}");
    assert!(
        in_bin as f64 >= 0.9 * all as f64,
        "{fns:?}; stats {stats:?}"
    );
    assert_eq!(nowhere, 0, "{fns:?}");
    let _ = std::fs::remove_dir_all(dir);
}

/// The Python case of the issue: `json.dumps` of a large dict in a loop, on this host's Python
/// (built without frame pointers).
const PY_JSON: &str = "import json\nd = {\"k%d\" % i: [i, str(i), {\"x\": i}] for i in range(2000)}\nwhile True: json.dumps(d)";

/// Share of the folded samples of `pid` whose stack has a frame that `pred` accepts.
fn folded_share(folded: &str, pid: u64, pred: impl Fn(&str) -> bool) -> (u64, u64) {
    let (mut hit, mut all) = (0, 0);
    for l in folded.lines() {
        let Some((stack, n)) = l.rsplit_once(' ') else {
            continue;
        };
        let n: u64 = n.parse().unwrap_or(0);
        let mut frames = stack.split(';');
        let head = frames.next().unwrap_or("");
        if !head.ends_with(&format!("-{pid}")) {
            continue;
        }
        all += n;
        if frames.any(&pred) {
            hit += n;
        }
    }
    (hit, all)
}

/// Python's `json.dumps` loop profiled at once with DWARF and with frame-pointer unwinding:
/// with DWARF most samples have the `_json` C encoder on the stack and reach `Py_RunMain` or
/// `main`; the frame-pointer run is printed beside it (its stacks stop after a frame or two).
#[test]
fn python_json_stacks_unwind_with_dwarf() {
    require_root();
    let dir = scratch("profile-py");
    let mut py = Command::new("python3")
        .args(["-c", PY_JSON])
        .spawn()
        .expect("python3");
    let pid = py.id() as u64;
    let run = |mode: &str| {
        let folded = dir.join(format!("{mode}.folded"));
        let mut tk = Tracer::spawn(&[
            "profile",
            "--json",
            "--pid",
            &pid.to_string(),
            "--unwind",
            mode,
            "--duration",
            "5s",
            "--top",
            "10",
            "--folded",
            folded.to_str().unwrap(),
        ]);
        tk.wait_attached();
        (tk, folded)
    };
    let (dwarf, dwarf_folded) = run("dwarf");
    let (fp, fp_folded) = run("fp");
    let (status, lines, stderr) = dwarf.finish(Duration::from_secs(60));
    let (fp_status, _, fp_stderr) = fp.finish(Duration::from_secs(60));
    let _ = py.kill();
    let _ = py.wait();
    assert!(status.success(), "{stderr}");
    assert!(fp_status.success(), "{fp_stderr}");

    eprintln!("DWARF: top functions of python3 (pid {pid}) by self samples:");
    eprintln!(
        "{:<40} {:<14} {:>6} {:>7} {:>7}",
        "FUNCTION", "MODULE", "SELF", "SELF%", "TOTAL%"
    );
    for r in rows(&lines, "function", pid) {
        eprintln!(
            "{:<40} {:<14} {:>6} {:>6.1}% {:>6.1}%",
            r["function"].as_str().unwrap_or(""),
            r["module"].as_str().unwrap_or(""),
            r["self_samples"].as_u64().unwrap_or(0),
            r["self_ppm"].as_f64().unwrap_or(0.0) / 1e4,
            r["total_ppm"].as_f64().unwrap_or(0.0) / 1e4,
        );
    }
    let reaches_main = |f: &str| f.starts_with("Py_RunMain") || f == "main";
    let encoder = |f: &str| f.starts_with("encoder_listencode_");
    let mut verdict = Vec::new();
    for (mode, path) in [("dwarf", &dwarf_folded), ("fp", &fp_folded)] {
        let text = std::fs::read_to_string(path).unwrap();
        let (main, all) = folded_share(&text, pid, reaches_main);
        let (enc, _) = folded_share(&text, pid, encoder);
        let pct = |n: u64| n as f64 * 100.0 / all.max(1) as f64;
        eprintln!(
            "{mode}: {all} samples; {main} ({:.1} %) reach Py_RunMain/main; {enc} ({:.1} %) have encoder_listencode_* on the stack",
            pct(main),
            pct(enc)
        );
        verdict.push((mode, all, main, enc));
    }
    let (_, all, main, enc) = verdict[0];
    assert!(all >= 100, "only {all} DWARF samples of python3");
    assert!(
        2 * enc > all,
        "encoder_listencode_* on {enc} of {all} DWARF stacks"
    );
    assert!(
        2 * main > all,
        "Py_RunMain/main on {main} of {all} DWARF stacks"
    );
    let _ = std::fs::remove_dir_all(dir);
}

fn findings_for(lines: &[Value], pid: u64) -> Vec<String> {
    lines
        .iter()
        .filter(|l| l["tool"] == "profile" && l["type"] == "finding" && l["pid"] == pid)
        .filter_map(|l| l["summary"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn jit_code_is_named_from_its_perf_map() {
    require_root();
    let (w, lines) = trace_workload(
        &["profile", "--json", "--comm", "tk-workload"],
        &["profile-jit", "3"],
    );
    let pid = w["pid"].as_u64().unwrap();
    check_hot(&lines, pid, JIT).unwrap();
}

// ---------------------------------------------------------------------------------------------
// The workload `tk-workload` runs for these tests and for the VM check (tests/workload/build.rs
// finds it), and the check each guest kernel of `cargo xtask vm-test` runs.

/// `profile-jit SECS`: runs a hot loop generated at run time for SECS seconds.
/// `offcpu-sleep N US`: sleeps US microseconds N times; prints its wall time and, from
/// `/proc/self/task/<tid>/schedstat`, its run and run-queue time over the same span.
/// `offcpu-fsync N PATH`: writes 4 KiB and fsyncs PATH, N times.
pub fn workload(args: &[String]) -> Option<i32> {
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    match a.as_slice() {
        ["profile-jit", secs] => jit_workload(secs.parse().ok()?),
        ["offcpu-sleep", n, us] => offcpu::sleep_workload(n.parse().ok()?, us.parse().ok()?),
        ["offcpu-fsync", n, path] => offcpu::fsync_workload(n.parse().ok()?, path),
        _ => return None,
    }
    Some(0)
}

/// x86_64: `mov rax, rdi; 1: dec rax; jnz 1b; ret`: counts its argument down to zero.
const LOOP: [u8; 9] = [0x48, 0x89, 0xf8, 0x48, 0xff, 0xc8, 0x75, 0xfb, 0xc3];

/// Copies [`LOOP`] into an executable anonymous mapping, names it in `/tmp/perf-<pid>.map` as a
/// JIT does, and calls it until `secs` have passed.
fn jit_workload(secs: f64) {
    let pid = std::process::id();
    // SAFETY: a fresh private anonymous mapping, written before it is made executable and only
    // called as the function LOOP encodes (System V: argument in rdi, result in rax).
    let f: extern "C" fn(u64) -> u64 = unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED, "mmap");
        std::ptr::copy_nonoverlapping(LOOP.as_ptr(), p.cast(), LOOP.len());
        assert_eq!(
            libc::mprotect(p, 4096, libc::PROT_READ | libc::PROT_EXEC),
            0
        );
        std::mem::transmute::<*mut libc::c_void, extern "C" fn(u64) -> u64>(p)
    };
    let map = format!("/tmp/perf-{pid}.map");
    std::fs::write(&map, format!("{:x} {:x} {JIT}\n", f as usize, LOOP.len())).expect("perf map");
    let t0 = Instant::now();
    let mut n = 0u64;
    while t0.elapsed().as_secs_f64() < secs {
        n = n.wrapping_add(f(std::hint::black_box(50_000_000)));
    }
    let _ = std::fs::remove_file(&map);
    println!("{}", serde_json::json!({"pid": pid, "left": n}));
}

/// profile --off-cpu (its own entry in doctor): a thread sleeping 10 ms 100 times, against the
/// kernel's own schedstat (`profile/offcpu.rs`).
pub fn vm_check_off_cpu() -> Result<String, String> {
    offcpu::vm_check()
}

/// profile: at least 90 % of the JIT workload's samples in its hot loop, named from its perf map.
pub fn vm_check() -> Result<String, String> {
    let (lines, w, modes) = tracekit_tests::vm::traced(
        &["profile", "--unwind", "fp", "--comm", "tk-workload"],
        &["profile-jit", "3"],
    )?;
    let pid = w["pid"].as_u64().ok_or("workload printed no pid")?;
    let v = check_hot(&lines, pid, JIT)?;
    Ok(format!("{v} (perf map); {modes}; programs unloaded"))
}
