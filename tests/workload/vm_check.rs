//! `tk-workload vm-check`: the checks `cargo xtask vm-test` runs inside the VM (Debian's 6.1
//! kernel). Each tool `tracekit doctor` lists gets a verdict on the serial console:
//!
//! - `ok`: the tool loaded, attached, saw its culprit triggered by the same workload as the root
//!   test, and its numbers match the guest kernel's own (or the workload's own) counts;
//! - `degraded`: doctor says the tool cannot run on this kernel, and the tool itself refuses with
//!   one clear line and exit code 4 (what "detect, degrade, explain" means for a whole tool);
//! - `known-fail`: the tool gets something wrong on this kernel and the detail names the change it
//!   waits for (accepted only where `cargo xtask vm-test`'s kernel list expects it);
//! - `FAIL`: anything else, including a tool that has no check here.
//!
//! Every check also holds the tool to doctor's word ([`attach_policy`]): each program attaches
//! to the hooks doctor listed for the tool, in the mode doctor said, and to every hook doctor
//! said attaches. One attach policy, whichever of the two a user asks.
//!
//! A new tool joins by adding one line to [`CHECKS`].
//!
//! `cargo xtask vm-test` runs this on the host kernel too (without `TKVM_GUEST`), so every
//! kernel gets the same verdicts.

use std::{
    collections::{BTreeMap, BTreeSet},
    panic::{catch_unwind, AssertUnwindSafe},
    process::Command,
    sync::OnceLock,
    time::Duration,
};

use serde_json::Value;
use tracekit_tests::*;

type Check = fn() -> Result<String, String>;

/// Per-tool checks, by the tool's subcommand name.
const CHECKS: &[(&str, Check)] = &[
    ("fsync-lat", fsync_lat),
    ("ctxsw", ctxsw),
    ("runq-lat", runq_lat),
    ("memstall", memstall),
    ("bench-floor", bench_floor),
];

/// Tools hidden from `--help` and from doctor's list, checked without doctor's verdict.
const HIDDEN: &[&str] = &["bench-floor"];

const PREFIX: &str = "TKVM|";

/// Tools run on one of their hooks only, as asked on the command line: doctor's other hooks
/// for them may go unattached.
const PARTIAL: &[&str] = &["bench-floor"];

/// A check's error starting with this is a known failure of the tool on this kernel, pending the
/// change it names: verdict `known-fail`, which `cargo xtask vm-test` accepts only on the kernels
/// its list says (`Spec::known_failures`).
const KNOWN: &str = "known failure pending a change in ";

/// This kernel's `doctor --json` lines, for [`attach_policy`].
static DOCTOR: OnceLock<Vec<Value>> = OnceLock::new();

fn verdict(name: &str, v: &str, detail: &str) {
    // One line each: the console is the only channel back to the host.
    let detail: String = detail
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    println!("{PREFIX}check {name} {v} {detail}");
}

pub fn main() -> i32 {
    let mut failed = 0;
    // In the VM only (init sets TKVM_GUEST): unmount tracefs so doctor's own mount is tested.
    let unmounted = std::env::var_os("TKVM_GUEST").is_some()
        // SAFETY: plain syscall with a NUL-terminated path.
        && unsafe { libc::umount2(c"/sys/kernel/tracing".as_ptr(), 0) } == 0;
    let t = std::time::Instant::now();
    let doctor = Command::new(tracekit_bin())
        .args(["doctor", "--json"])
        .output();
    let doctor = match doctor {
        Ok(o) => o,
        Err(e) => {
            verdict(
                "doctor",
                "FAIL",
                &format!("cannot run tracekit doctor: {e}"),
            );
            return 1;
        }
    };
    let text = String::from_utf8_lossy(&doctor.stdout);
    let lines: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    for l in &lines {
        println!("{PREFIX}doctor {l}");
    }
    let _ = DOCTOR.set(lines.clone());
    let tools: Vec<(String, bool, String)> = lines
        .iter()
        .filter(|l| l["type"] == "tool")
        .map(|l| {
            (
                l["name"].as_str().unwrap_or("").to_string(),
                l["can_run"] == true,
                l["why"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    if unmounted {
        let sys = lines.iter().find(|l| l["type"] == "system");
        let by_doctor = sys.map(|s| s["tracefs"]["mounted_by_doctor"] == true);
        if by_doctor == Some(true) {
            verdict(
                "tracefs-mount",
                "ok",
                "doctor found tracefs unmounted, mounted it and said so",
            );
        } else {
            failed += 1;
            verdict(
                "tracefs-mount",
                "FAIL",
                &format!(
                    "tracefs was unmounted but doctor says {:?}",
                    sys.map(|s| &s["tracefs"])
                ),
            );
        }
    }
    let all_run = tools.iter().all(|t| t.1);
    let code = doctor.status.code().unwrap_or(-1);
    let want = if all_run { 0 } else { 6 };
    if tools.is_empty() || code != want {
        failed += 1;
        verdict(
            "doctor",
            "FAIL",
            &format!(
                "exit {code}, expected {want} for {} tool(s); stderr: {}",
                tools.len(),
                String::from_utf8_lossy(&doctor.stderr).trim()
            ),
        );
    } else {
        verdict(
            "doctor",
            "ok",
            &format!(
                "exit {code}, {} tool(s) ({:.1}s)",
                tools.len(),
                t.elapsed().as_secs_f64()
            ),
        );
    }

    for (name, can_run, why) in &tools {
        let t = std::time::Instant::now();
        let check = CHECKS.iter().find(|(n, _)| n == name).map(|(_, c)| *c);
        let res = if !can_run {
            refuses_clearly(name, why).map(|d| ("degraded", d))
        } else if let Some(check) = check {
            match catch_unwind(AssertUnwindSafe(check)) {
                Ok(r) => r.map(|d| ("ok", d)),
                Err(p) => Err(p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "panicked".into())),
            }
        } else {
            Err("no VM check for this tool: add one to CHECKS in tests/workload/vm_check.rs".into())
        };
        let took = format!(" ({:.1}s)", t.elapsed().as_secs_f64());
        let res = res.map(|(v, d)| (v, d + &took)).map_err(|e| e + &took);
        match res {
            Ok((v, d)) => verdict(name, v, &d),
            Err(e) if e.starts_with(KNOWN) => verdict(name, "known-fail", &e),
            Err(e) => {
                failed += 1;
                verdict(name, "FAIL", &e);
            }
        }
    }
    for (n, check) in CHECKS {
        if tools.iter().any(|t| t.0 == *n) {
            continue;
        }
        if !HIDDEN.contains(n) {
            failed += 1;
            verdict(n, "FAIL", "has a VM check but doctor does not list it");
            continue;
        }
        // Hidden from --help and doctor (benchmark controls), checked all the same.
        let t = std::time::Instant::now();
        let took = || format!(" ({:.1}s)", t.elapsed().as_secs_f64());
        match catch_unwind(AssertUnwindSafe(*check)) {
            Ok(Ok(d)) => verdict(n, "ok", &(d + &took())),
            Ok(Err(e)) => {
                failed += 1;
                verdict(n, "FAIL", &(e + &took()));
            }
            Err(_) => {
                failed += 1;
                verdict(n, "FAIL", "panicked");
            }
        }
    }
    i32::from(failed > 0)
}

/// A tool doctor says cannot run must say so itself: exit 4, one line on stderr.
fn refuses_clearly(tool: &str, why: &str) -> Result<String, String> {
    let out = Command::new(tracekit_bin())
        .args([tool, "--json", "--duration", "1s"])
        .output()
        .map_err(|e| e.to_string())?;
    let err = String::from_utf8_lossy(&out.stderr);
    let err = err.trim();
    if out.status.code() != Some(4) || err.lines().count() != 1 {
        return Err(format!(
            "doctor says it cannot run ({why}) but `tracekit {tool}` exited {:?} with stderr {err:?}",
            out.status.code()
        ));
    }
    Ok(format!("cannot run here ({why}); the tool says: {err}"))
}

/// fsync-lat: exact counts N and M for the workload's pid (the root test's workload, smaller).
fn fsync_lat() -> Result<String, String> {
    const N: u64 = 40;
    const M: u64 = 20;
    let (lines, w, modes) = traced(
        &["fsync-lat"],
        &["fsync", "/tmp/tk-fsync", &N.to_string(), &M.to_string()],
    )?;
    let pid = w["pid"].as_u64().ok_or("workload printed no pid")? as u32;
    let rows = rows_for(&lines, "fsync-lat", pid);
    let mut got = Vec::new();
    for (syscall, key, n) in [("fsync", "fsync_ns", N), ("fdatasync", "fdatasync_ns", M)] {
        let row = rows
            .iter()
            .find(|r| r["syscall"] == syscall)
            .ok_or_else(|| format!("no {syscall} row for pid {pid}"))?;
        if row["count"] != n || row["errors"] != 0 {
            return Err(format!(
                "{syscall}: count {} errors {}, expected {n} and 0",
                row["count"], row["errors"]
            ));
        }
        // The kernel times inside the syscall, the workload around it.
        let own: u64 = w[key]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_u64)
            .sum();
        let total = row["total_ns"].as_u64().unwrap_or(u64::MAX);
        if total > own {
            return Err(format!(
                "{syscall}: total {total} ns exceeds the workload's own {own} ns"
            ));
        }
        got.push(format!("{syscall} {n}/{n}"));
    }
    Ok(format!(
        "{} exact for pid {pid}; {modes}; programs unloaded",
        got.join(", ")
    ))
}

/// Runs `tracekit ARGS --json` around `workload`; returns its JSON lines, the workload's report
/// and the attach modes; checks exit status and that the programs are unloaded afterwards.
fn traced(args: &[&str], workload: &[&str]) -> Result<(Vec<Value>, Value, String), String> {
    let mut a = args.to_vec();
    a.push("--json");
    let mut tk = Tracer::spawn(&a);
    let meta = tk.wait_attached();
    let ids = program_ids(&meta);
    let tool = args[0];
    let policy = attach_policy(
        tool,
        DOCTOR.get().map_or(&[][..], Vec::as_slice),
        &meta,
        !PARTIAL.contains(&tool),
    );
    let modes: Vec<String> = meta["programs"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            format!(
                "{}={}",
                p["name"].as_str().unwrap_or("?"),
                p["attach"].as_str().unwrap_or("?")
            )
        })
        .collect();
    let w = run_workload(workload);
    tk.signal(libc::SIGINT);
    let (status, lines, stderr) = tk.finish(Duration::from_secs(60));
    if !status.success() {
        return Err(format!("exit {status}: {stderr}"));
    }
    let left = wait_unloaded(&ids);
    if !left.is_empty() {
        return Err(format!("programs {left:?} still loaded after exit"));
    }
    let policy = policy?;
    Ok((lines, w, format!("{}; {policy}", modes.join(" "))))
}

/// The name part of an event or attach target: `sched:sched_switch` and `sched_switch` are the
/// same hook (raw and BTF tracepoints are named without their category).
fn event_name(e: &str) -> &str {
    e.rsplit_once(':').map_or(e, |(_, n)| n)
}

/// Checks what a tool attached (its meta line's `programs`: name, `attach` mode, `targets`)
/// against what doctor said for it on the same kernel: every target is one of doctor's hooks
/// for the tool, attached in the mode doctor chose; with `all_hooks`, every hook doctor says
/// attaches was attached, so a hook doctor calls usable is never silently skipped.
pub fn attach_policy(
    tool: &str,
    doctor: &[Value],
    meta: &Value,
    all_hooks: bool,
) -> Result<String, String> {
    let said: BTreeMap<&str, Option<&str>> = doctor
        .iter()
        .filter(|l| l["type"] == "hook" && l["for"] == tool)
        .filter_map(|l| Some((event_name(l["event"].as_str()?), l["mode"].as_str())))
        .collect();
    if said.is_empty() {
        return Err(format!("doctor lists no hooks for {tool}"));
    }
    let mut errors = Vec::new();
    let mut attached = BTreeSet::new();
    for p in meta["programs"].as_array().into_iter().flatten() {
        let prog = p["name"].as_str().unwrap_or("?");
        let mode = p["attach"].as_str().unwrap_or("?");
        for t in p["targets"].as_array().into_iter().flatten() {
            let t = event_name(t.as_str().unwrap_or("?"));
            attached.insert(t);
            match said.get(t) {
                None => errors.push(format!(
                    "{prog} attached to {t}, a hook doctor does not list"
                )),
                Some(None) => errors.push(format!(
                    "{prog} attached to {t} ({mode}) where doctor says it cannot attach"
                )),
                Some(Some(m)) if *m != mode => {
                    errors.push(format!("{prog} attached to {t} as {mode}, doctor said {m}"))
                }
                Some(Some(_)) => {}
            }
        }
    }
    if all_hooks {
        for (e, m) in &said {
            if let (Some(m), false) = (m, attached.contains(e)) {
                errors.push(format!(
                    "doctor says {e} attaches ({m}) but {tool} did not attach it"
                ));
            }
        }
    }
    if errors.is_empty() {
        Ok(format!(
            "{} hook(s) attached as doctor said",
            attached.len()
        ))
    } else {
        Err(format!("attach policy: {}", errors.join("; ")))
    }
}

fn sum(lines: &[Value], tool: &str, pid: u32, key: &str) -> u64 {
    rows_for(lines, tool, pid)
        .iter()
        .filter_map(|r| r[key].as_u64())
        .sum()
}

/// ctxsw: per-pid voluntary/involuntary equal the children's own /proc deltas (+ the exit).
fn ctxsw() -> Result<String, String> {
    let (lines, w, modes) = traced(&["ctxsw"], &["pingpong", "2000"])?;
    let mut got = Vec::new();
    for p in w["procs"].as_array().ok_or("no procs")? {
        let pid = p["pid"].as_u64().unwrap_or(0) as u32;
        for k in ["voluntary", "involuntary"] {
            let (tk, own) = (sum(&lines, "ctxsw", pid, k), p[k].as_u64().unwrap_or(0));
            if tk < own || tk > own + (own / 100).max(5) {
                return Err(format!("pid {pid} {k}: tracekit {tk}, /proc {own}"));
            }
            got.push(format!("{k} {tk}/{own}"));
        }
    }
    Ok(format!("{}; {modes}", got.join(", ")))
}

/// runq-lat: total wait per pid agrees with the children's schedstat run_delay since fork (10 %).
fn runq_lat() -> Result<String, String> {
    let (lines, w, modes) = traced(&["runq-lat"], &["pingpong", "2000"])?;
    let mut got = Vec::new();
    for p in w["procs"].as_array().ok_or("no procs")? {
        let pid = p["pid"].as_u64().unwrap_or(0) as u32;
        let (tk, own) = (
            sum(&lines, "runq-lat", pid, "total_ns"),
            p["run_delay_life_ns"].as_u64().unwrap_or(0),
        );
        if (tk as f64 - own as f64).abs() > own as f64 * 0.10 + 1e6 {
            return Err(format!(
                "pid {pid}: total wait {tk} ns, schedstat run_delay since fork {own} ns"
            ));
        }
        got.push(format!("{tk}/{own} ns"));
    }
    Ok(format!("run_delay {}; {modes}", got.join(", ")))
}

/// memstall: compaction requested through /proc/sys/vm/compact_memory is attributed to the
/// writer, with total stall time no larger than its wall time; then THP collapse by
/// `MADV_COLLAPSE` ([`memstall_collapse`]).
fn memstall() -> Result<String, String> {
    let (lines, w, modes) = traced(&["memstall"], &["compact"])?;
    let pid = w["pid"].as_u64().ok_or("no pid")? as u32;
    let rows: Vec<&Value> = rows_for(&lines, "memstall", pid)
        .into_iter()
        .filter(|r| r["kind"] == "compaction")
        .collect();
    let count: u64 = rows.iter().filter_map(|r| r["count"].as_u64()).sum();
    let total: u64 = rows.iter().filter_map(|r| r["total_ns"].as_u64()).sum();
    let wall = w["wall_ns"].as_u64().unwrap_or(0);
    if count == 0 || total > wall {
        return Err(format!(
            "compaction count {count}, total {total} ns, writer wall {wall} ns"
        ));
    }
    let compaction = format!("{count} compactions, {total} ns <= wall {wall} ns; {modes}");
    match memstall_collapse() {
        Ok(c) => Ok(format!("{compaction}; {c}")),
        Err(e) => Err(format!("{e}; {compaction}")),
    }
}

const THP_ENABLED: &str = "/sys/kernel/mm/transparent_hugepage/enabled";

/// `/proc/vmstat` counter `key`.
fn vmstat(key: &str) -> u64 {
    std::fs::read_to_string("/proc/vmstat")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0)
}

/// Sets THP `enabled` for the life of the value, then restores it.
struct ThpMode(String);

impl ThpMode {
    fn set(mode: &str) -> Result<ThpMode, String> {
        let text =
            std::fs::read_to_string(THP_ENABLED).map_err(|e| format!("{THP_ENABLED}: {e}"))?;
        let old = text
            .split_whitespace()
            .find_map(|w| w.strip_prefix('[')?.strip_suffix(']'))
            .ok_or_else(|| format!("{THP_ENABLED}: no selected mode in {text:?}"))?
            .to_string();
        std::fs::write(THP_ENABLED, mode).map_err(|e| format!("{THP_ENABLED} <- {mode}: {e}"))?;
        Ok(ThpMode(old))
    }
}

impl Drop for ThpMode {
    fn drop(&mut self) {
        let _ = std::fs::write(THP_ENABLED, &self.0);
    }
}

/// memstall, THP collapse: 4 MiB of small pages collapsed with one `madvise(MADV_COLLAPSE)`
/// (6.1+) are 2 collapse attempts, both successful, in the caller, as `thp_collapse_alloc` says.
/// Needs THP `enabled=madvise` (at `always` the pages are huge at fault, nothing to collapse):
/// set in the guest (Debian's kernels default to `always`) and restored; the host's setting is
/// never changed.
///
/// KERNEL-NOTES: before 6.1 (commit 7d8faaf15545, "mm/madvise: introduce MADV_COLLAPSE sync
/// hugepage collapse") the call fails with EINVAL at once; the tool must then not present the
/// failed call as a collapse stall without saying the kernel has no `MADV_COLLAPSE`.
fn memstall_collapse() -> Result<String, String> {
    const N: u64 = 2;
    let _thp = if std::env::var_os("TKVM_GUEST").is_some() {
        Some(ThpMode::set("madvise")?)
    } else {
        let text = std::fs::read_to_string(THP_ENABLED).unwrap_or_default();
        if !text.contains("[madvise]") {
            return Ok(format!(
                "collapse not checked: THP enabled is {:?} here, not madvise",
                text.trim()
            ));
        }
        None
    };
    let before = vmstat("thp_collapse_alloc");
    let (lines, w, _) = traced(&["memstall"], &["collapse", &N.to_string()])?;
    let delta = vmstat("thp_collapse_alloc") - before;
    let pid = w["pid"]
        .as_u64()
        .ok_or("collapse workload printed no pid")? as u32;
    let row = rows_for(&lines, "memstall", pid)
        .into_iter()
        .find(|r| r["kind"] == "thp_collapse");
    let n = |r: &Value, k: &str| r[k].as_u64().unwrap_or(0);
    if w["rc"] != 0 {
        if w["errno"] != libc::EINVAL {
            return Err(format!("madvise(MADV_COLLAPSE) failed: {w}"));
        }
        // No MADV_COLLAPSE in this kernel.
        let said = lines.iter().any(|l| {
            let t = l.to_string();
            t.contains("MADV_COLLAPSE") && t.contains("6.1")
        });
        return match row {
            Some(r) if n(r, "collapses") == 0 && !said => Err(format!(
                "{KNOWN}cli/src/tools/memstall.rs: MADV_COLLAPSE is 6.1+ and failed here with EINVAL, but memstall shows the failed call as a collapse stall ({} ns, 0 of 0 collapsed, {} MADV_COLLAPSE call(s)) without saying this kernel lacks MADV_COLLAPSE",
                n(r, "total_ns"),
                n(r, "madvise_calls")
            )),
            _ => Ok("MADV_COLLAPSE absent (EINVAL, 6.1+), and memstall says so or shows nothing".into()),
        };
    }
    let r = row.ok_or_else(|| format!("no thp_collapse row for pid {pid}"))?;
    if n(r, "collapsed") != N || n(r, "collapses") != N || delta < N {
        return Err(format!(
            "collapse: tracekit collapsed {} of {} attempts, expected {N} of {N}; thp_collapse_alloc +{delta}",
            n(r, "collapsed"),
            n(r, "collapses")
        ));
    }
    Ok(format!(
        "MADV_COLLAPSE {N}/{N} collapsed, thp_collapse_alloc +{delta}, stall {} ns",
        n(r, "total_ns")
    ))
}

/// bench-floor: the cheapest sched_switch program attaches and counts.
fn bench_floor() -> Result<String, String> {
    let (lines, _, modes) = traced(
        &["bench-floor", "--hook", "sched-switch"],
        &["pingpong", "200"],
    )?;
    let events: u64 = lines
        .iter()
        .filter(|l| l["type"] == "stats")
        .filter_map(|l| l["events"].as_u64())
        .sum();
    if events < 400 {
        return Err(format!(
            "only {events} sched_switch events for 400 pipe hops"
        ));
    }
    Ok(format!("{events} events; {modes}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn doctor() -> Vec<Value> {
        let hook = |tool: &str, event: &str, mode: Option<&str>| json!({"type": "hook", "for": tool, "event": event, "mode": mode});
        vec![
            json!({"type": "system"}),
            hook("ctxsw", "sched:sched_switch", Some("tp_btf")),
            hook("ctxsw", "sched:sched_process_free", Some("tp_btf")),
            hook("fsync-lat", "syscalls:sys_enter_fsync", Some("tracepoint")),
            hook("fsync-lat", "syscalls:sys_enter_syncfs", None),
            hook("bench-floor", "sched:sched_switch", Some("tp_btf")),
            hook(
                "bench-floor",
                "syscalls:sys_enter_fsync",
                Some("tracepoint"),
            ),
        ]
    }

    fn meta(progs: &[(&str, &str, &[&str])]) -> Value {
        let p: Vec<Value> = progs
            .iter()
            .map(|(n, m, t)| json!({"name": n, "id": 1, "attach": m, "targets": t}))
            .collect();
        json!({"type": "meta", "programs": p})
    }

    #[test]
    fn tools_attach_as_doctor_said() {
        let d = doctor();
        let ok = meta(&[
            ("sw", "tp_btf", &["sched_switch"]),
            ("free", "tp_btf", &["sched_process_free"]),
        ]);
        assert_eq!(
            attach_policy("ctxsw", &d, &ok, true),
            Ok("2 hook(s) attached as doctor said".into())
        );
        // The 5.10 failure mode: doctor predicts tp_btf, the tool falls back to raw_tp.
        let fell_back = meta(&[
            ("sw_raw", "raw_tp", &["sched_switch"]),
            ("free", "tp_btf", &["sched_process_free"]),
        ]);
        let e = attach_policy("ctxsw", &d, &fell_back, true).unwrap_err();
        assert!(
            e.contains("sched_switch as raw_tp, doctor said tp_btf"),
            "{e}"
        );
        // A hook doctor calls usable but the tool skipped.
        let skipped = meta(&[("sw", "tp_btf", &["sched_switch"])]);
        let e = attach_policy("ctxsw", &d, &skipped, true).unwrap_err();
        assert!(
            e.contains("sched_process_free attaches (tp_btf) but ctxsw did not"),
            "{e}"
        );
        // Classic tracepoint targets carry their category.
        let fs = meta(&[("enter", "tracepoint", &["syscalls:sys_enter_fsync"])]);
        assert!(attach_policy("fsync-lat", &d, &fs, true).is_ok());
        let fs = meta(&[(
            "enter",
            "tracepoint",
            &["syscalls:sys_enter_fsync", "syscalls:sys_enter_syncfs"],
        )]);
        let e = attach_policy("fsync-lat", &d, &fs, true).unwrap_err();
        assert!(e.contains("where doctor says it cannot attach"), "{e}");
        let e = attach_policy(
            "fsync-lat",
            &d,
            &meta(&[("x", "tracepoint", &["a:b"])]),
            true,
        )
        .unwrap_err();
        assert!(e.contains("a hook doctor does not list"), "{e}");
        // A tool run on one hook by request.
        let floor = meta(&[("f", "tp_btf", &["sched_switch"])]);
        assert!(attach_policy("bench-floor", &d, &floor, false).is_ok());
        assert!(attach_policy("bench-floor", &d, &floor, true).is_err());
        assert!(attach_policy("nope", &d, &floor, false).is_err());
    }
}
