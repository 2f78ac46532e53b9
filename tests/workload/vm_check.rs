//! `tk-workload vm-check`: the checks `cargo xtask vm-test` runs in each guest kernel (and on
//! the host). Each tool `tracekit doctor` lists gets a verdict on the serial console:
//!
//! - `ok`: the tool loaded, attached, saw its culprit triggered by the same workload as the root
//!   test, and its numbers match the guest kernel's own (or the workload's own) counts;
//! - `degraded`: doctor says the tool cannot run on this kernel, and the tool itself refuses with
//!   one clear line and exit code 4 (what "detect, degrade, explain" means for a whole tool);
//! - `known-fail`: the tool gets something wrong on this kernel and the detail names the change it
//!   waits for (accepted only where `cargo xtask vm-test`'s kernel list expects it);
//! - `FAIL`: anything else, including a tool that has no check.
//!
//! Every check also holds the tool to doctor's word (`tracekit_tests::vm::attach_policy`): each
//! program attaches to the hooks doctor listed for the tool, in the mode doctor said, and to
//! every hook doctor said attaches. One attach policy, whichever of the two a user asks.
//!
//! A tool's check is `pub fn vm_check()` in `tests/<tool>.rs`, found by `tests/workload/build.rs`
//! ([`crate::VM_CHECKS`]); the registry's tools without one fail here.
//!
//! `cargo xtask vm-test` runs this on the host kernel too (without `TKVM_GUEST`), so every
//! kernel gets the same verdicts.

use std::{
    panic::{catch_unwind, AssertUnwindSafe},
    process::Command,
};

use serde_json::Value;
use tracekit_tests::{
    vm::{refuses_clearly, DOCTOR, KNOWN},
    *,
};

type Check = fn() -> Result<String, String>;

/// Every check: each tool's own, from its root-test file (`tests/<tool>.rs`).
fn checks() -> Vec<(&'static str, Check)> {
    crate::VM_CHECKS.to_vec()
}

/// Checks doctor has no verdict on: tools hidden from `--help` and doctor's list
/// (`bench-floor`), and commands that drive the tools (`triage`); checked all the same.
fn hidden() -> Vec<&'static str> {
    let tools = tracekit::tools::TOOLS.iter().filter(|t| t.hidden);
    tools
        .chain(tracekit::tools::COMMANDS)
        .map(|t| t.name)
        .collect()
}

const PREFIX: &str = "TKVM|";

fn verdict(name: &str, v: &str, detail: &str) {
    // One line each: the console is the only channel back to the host.
    let detail: String = detail
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    // The name is one word: a mode's (`profile --off-cpu`) is written `profile--off-cpu`.
    let name = name.replace(' ', "");
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
        let check = checks().iter().find(|(n, _)| n == name).map(|(_, c)| *c);
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
            Err("no VM check for this tool: add `pub fn vm_check()` to its tests/<tool>.rs".into())
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
    let hidden = hidden();
    for (n, check) in checks() {
        if tools.iter().any(|t| t.0 == n) {
            continue;
        }
        // Without doctor's list (doctor itself failed, reported above) every check still runs,
        // so one broken tool does not hide the others' verdicts.
        if !hidden.contains(&n) && !tools.is_empty() {
            failed += 1;
            verdict(n, "FAIL", "has a VM check but doctor does not list it");
            continue;
        }
        // Hidden from --help and doctor (benchmark controls), or a command: checked all the same.
        let t = std::time::Instant::now();
        let took = || format!(" ({:.1}s)", t.elapsed().as_secs_f64());
        match catch_unwind(AssertUnwindSafe(check)) {
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
