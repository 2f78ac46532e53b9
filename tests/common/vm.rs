//! What every tool's VM check shares (`tests/<tool>.rs` `pub fn vm_check()`, run by
//! `tk-workload vm-check` in each guest kernel of `cargo xtask vm-test` and on the host): run
//! the tool around its workload, hold it to doctor's word on attach modes, check it detached.

use std::{
    collections::{BTreeMap, BTreeSet},
    process::Command,
    sync::OnceLock,
    time::Duration,
};

use serde_json::Value;

use crate::*;

/// A check's error starting with this is a known failure of the tool on this kernel, pending the
/// change it names: verdict `known-fail`, which `cargo xtask vm-test` accepts only on the kernels
/// its list says (`Spec::known_failures`).
pub const KNOWN: &str = "known failure pending a change in ";

/// This kernel's `doctor --json` lines, for [`attach_policy`] (set by `tk-workload vm-check`).
pub static DOCTOR: OnceLock<Vec<Value>> = OnceLock::new();

/// A tool doctor says cannot run must say so itself: exit 4, one line on stderr.
pub fn refuses_clearly(tool: &str, why: &str) -> Result<String, String> {
    let out = Command::new(tracekit_bin())
        // A mode doctor lists apart (`profile --off-cpu`) is the tool and its flag.
        .args(tool.split(' '))
        .args(["--json", "--duration", "1s"])
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

/// Runs `tracekit ARGS --json` around `workload`; returns its JSON lines, the workload's report
/// and the attach modes; checks exit status and that the programs are unloaded afterwards.
pub fn traced(args: &[&str], workload: &[&str]) -> Result<(Vec<Value>, Value, String), String> {
    traced_with(args, workload, true)
}

/// [`traced`] for a tool run on some of its hooks by request (`all_hooks` false: doctor's
/// other hooks for it may go unattached).
pub fn traced_with(
    args: &[&str],
    workload: &[&str],
    all_hooks: bool,
) -> Result<(Vec<Value>, Value, String), String> {
    let mut a = args.to_vec();
    a.push("--json");
    let mut tk = Tracer::spawn(&a);
    let meta = tk.wait_attached();
    let ids = program_ids(&meta);
    // A mode doctor lists apart (`tools::MODES`: `profile --off-cpu`) is held to that entry.
    let mode = args.get(1).map(|flag| format!("{} {flag}", args[0]));
    let tool = tracekit::tools::MODES
        .iter()
        .find(|m| Some(m.name) == mode.as_deref())
        .map_or(args[0], |m| m.name);
    // Hidden tools (benchmark controls) are not in doctor's list; outside `tk-workload
    // vm-check` (a root test) there is no doctor report to hold the tool to.
    let hidden = tracekit::tools::TOOLS
        .iter()
        .any(|t| t.name == tool && t.hidden);
    let policy = match DOCTOR.get() {
        Some(d) if !hidden => attach_policy(tool, d, &meta, all_hooks),
        _ => Ok("attach policy not checked (no doctor report for it)".to_string()),
    };
    let modes = attach_modes(&meta);
    let w = run_workload(workload);
    tk.signal(libc::SIGINT);
    let (status, lines, stderr) = tk.finish(Duration::from_secs(60));
    if !status.success() {
        return Err(format!("exit {status}: {stderr}"));
    }
    all_unloaded(&ids)?;
    let policy = policy?;
    Ok((lines, w, format!("{modes}; {policy}")))
}

/// The attach mode of each program in a meta line: `name=mode` joined by spaces.
pub fn attach_modes(meta: &Value) -> String {
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
    modes.join(" ")
}

/// Waits for the programs `ids` to be unloaded; an error names those still loaded.
pub fn all_unloaded(ids: &[u32]) -> Result<(), String> {
    let left = wait_unloaded(ids);
    if !left.is_empty() {
        return Err(format!("programs {left:?} still loaded after exit"));
    }
    Ok(())
}

/// The name part of an event or attach target: `sched:sched_switch` and `sched_switch` are the
/// same hook (raw and BTF tracepoints are named without their category).
pub fn event_name(e: &str) -> &str {
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
    // Hooks doctor marks as attached only under a condition (`when`) that the tool says it
    // left out, with its reason: only those may be missing.
    let conditional: BTreeSet<&str> = doctor
        .iter()
        .filter(|l| l["type"] == "hook" && l["for"] == tool && l["when"].is_string())
        .filter_map(|l| Some(event_name(l["event"].as_str()?)))
        .collect();
    let left_out: BTreeSet<&str> = meta["left_out"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|l| Some(event_name(l["hook"].as_str()?)))
        .collect();
    for e in &left_out {
        if attached.contains(e) {
            errors.push(format!("{tool} says it left {e} out but attached it"));
        } else if !conditional.contains(e) {
            errors.push(format!(
                "{tool} left {e} out, a hook doctor does not mark as conditional"
            ));
        }
    }
    if all_hooks {
        for (e, m) in &said {
            if let (Some(m), false) = (m, attached.contains(e) || left_out.contains(e)) {
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

/// Sum of `key` over `tool`'s summary rows for `pid`.
pub fn sum(lines: &[Value], tool: &str, pid: u32, key: &str) -> u64 {
    rows_for(lines, tool, pid)
        .iter()
        .filter_map(|r| r[key].as_u64())
        .sum()
}

/// Brings the loopback device up where it is down (the VM guest's init does not), as
/// `ip link set lo up` would.
pub fn lo_up() -> Result<(), String> {
    // SAFETY: a plain socket for the ioctls, closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(format!("socket: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: ifreq is plain data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    req.ifr_name[..2].copy_from_slice(&[b'l' as libc::c_char, b'o' as libc::c_char]);
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read the name and read/write the flags of `req`, which
    // outlives the calls.
    let rc = unsafe {
        let mut rc = libc::ioctl(fd, libc::SIOCGIFFLAGS as _, &raw mut req);
        let flags = req.ifr_ifru.ifru_flags;
        if rc == 0 && flags & libc::IFF_UP as libc::c_short == 0 {
            req.ifr_ifru.ifru_flags = flags | libc::IFF_UP as libc::c_short;
            rc = libc::ioctl(fd, libc::SIOCSIFFLAGS as _, &raw mut req);
        }
        rc
    };
    let err = std::io::Error::last_os_error();
    // SAFETY: closing the socket made above.
    unsafe { libc::close(fd) };
    if rc != 0 {
        return Err(format!("bringing lo up: {err}"));
    }
    Ok(())
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
        // A conditional hook the tool says it left out, and one it leaves out unasked.
        let mut d2 = d.clone();
        d2[2]["when"] = json!("a node with steal");
        let mut left = skipped.clone();
        left["left_out"] = json!([{"hook": "sched:sched_process_free", "reason": "no steal"}]);
        assert!(attach_policy("ctxsw", &d2, &left, true).is_ok());
        let e = attach_policy("ctxsw", &d, &left, true).unwrap_err();
        assert!(e.contains("does not mark as conditional"), "{e}");
        let e = attach_policy("ctxsw", &d2, &skipped, true).unwrap_err();
        assert!(e.contains("did not attach it"), "{e}");
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
