//! `cargo xtask vm-test`: the suite on the kernels production runs. Each kernel of
//! [`kernels::KERNELS`] (Debian's 5.10, 6.1 and 6.12) boots under qemu (software emulation,
//! 2 vCPUs, two NUMA nodes) with one initramfs holding the static `tracekit` and `tk-workload`
//! binaries, busybox and a small `/init`; `tk-workload vm-check` runs every tool's checks in the
//! guest and prints result lines on the serial console, which are read back here. Then
//! `tracekit doctor` on the host and on every guest are compared.
//!
//! Downloads are cached under ~/.cache/tracekit/vm (shared by every work tree), so a rerun only
//! rebuilds the initramfs and boots.

mod doctor;
mod guest;
mod kernels;

use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Command,
    sync::Mutex,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use serde_json::Value;

use crate::{root, status, HOST_TARGET};
use guest::GuestRun;
use kernels::Spec;

/// Boot plus checks take about a minute per kernel; TCG on a loaded machine can be several
/// times slower, and parallel guests share the CPUs.
const BOOT_TIMEOUT: Duration = Duration::from_secs(300);

/// Host tools the VM run needs: (command, Debian package, why).
const HOST_TOOLS: &[(&str, &str, &str)] = &[
    (
        "qemu-system-x86_64",
        "qemu-system-x86",
        "boots Debian's 5.10, 6.1 and 6.12 kernels for the VM tests",
    ),
    ("cpio", "cpio", "packs the test initramfs"),
    (
        "/bin/busybox",
        "busybox-static",
        "the shell and mount/poweroff inside the test VM",
    ),
];

fn have(cmd: &str) -> bool {
    if cmd.starts_with('/') {
        return Path::new(cmd).exists();
    }
    env::var_os("PATH")
        .map(|p| env::split_paths(&p).any(|d| d.join(cmd).is_file()))
        .unwrap_or(false)
}

/// Installs missing host tools (one line each saying what and why); idempotent.
fn ensure_host_tools() -> Result<()> {
    let missing: Vec<_> = HOST_TOOLS.iter().filter(|(c, _, _)| !have(c)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    for (_, pkg, why) in &missing {
        eprintln!("xtask: installing {pkg} ({why})");
    }
    let pkgs: Vec<&str> = missing.iter().map(|(_, p, _)| *p).collect();
    let install = || {
        let mut c = Command::new("apt-get");
        c.args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&pkgs)
            .env("DEBIAN_FRONTEND", "noninteractive");
        status(c)
    };
    if install().is_err() {
        // Stale package lists are the usual cause.
        let mut c = Command::new("apt-get");
        c.args(["update", "-q"])
            .env("DEBIAN_FRONTEND", "noninteractive");
        status(c)?;
        install()?;
    }
    Ok(())
}

/// How many guests boot at once: `TRACEKIT_VM_JOBS`, else two per host CPU, as memory allows
/// (1 GiB each, plus qemu's own).
///
/// TCG is CPU-bound, but a guest's checks run one process at a time, so its second vCPU mostly
/// idles (halted vCPUs cost the host nothing) and a guest keeps about one host CPU busy.
/// Measured on this 2-CPU machine with other builds running (load 5-8), the three kernels took
/// 46-62 s one at a time, 37-45 s two at a time and 25-27 s all three at once; each guest's own
/// wall time grew from 14-22 s to 22-27 s, and every check still passed.
fn jobs(kernels: usize) -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let by_mem = mem_available_gib().map_or(usize::MAX, |g| (g / 2).max(1));
    env::var("TRACEKIT_VM_JOBS")
        .ok()
        .and_then(|j| j.parse().ok())
        .unwrap_or((cpus * 2).min(by_mem))
        .clamp(1, kernels.max(1))
}

/// `MemAvailable` from /proc/meminfo, in GiB.
fn mem_available_gib() -> Option<usize> {
    let text = fs::read_to_string("/proc/meminfo").ok()?;
    let kib: usize = text
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib >> 20)
}

/// One kernel's run: its spec, image, console and host-side timings.
struct KernelRun {
    spec: &'static Spec,
    image: PathBuf,
    result: Result<guest::Boot>,
    wall: Duration,
}

fn boot_one(spec: &'static Spec, image: PathBuf, initrd: &Path, timeout: Duration) -> KernelRun {
    let t = Instant::now();
    let result = match guest::boot(spec.name, &image, initrd, timeout) {
        // A kernel without a PVH entry cannot boot as an ELF: the bzImage can.
        Err(e) if image.extension().is_some_and(|x| x == "vmlinux") => {
            eprintln!(
                "xtask: {}: booting the ELF kernel failed ({e:#}); retrying with the bzImage",
                spec.name
            );
            guest::boot(spec.name, &image.with_extension("vmlinuz"), initrd, timeout)
        }
        r => r,
    };
    KernelRun {
        spec,
        image,
        result,
        wall: t.elapsed(),
    }
}

/// Boots every kernel, `jobs` at a time, in list order.
fn boot_all(images: Vec<(&'static Spec, PathBuf, PathBuf)>, jobs: usize) -> Vec<KernelRun> {
    let timeout = BOOT_TIMEOUT * jobs as u32;
    let queue = Mutex::new(images.into_iter().enumerate());
    let done = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| loop {
                let next = queue.lock().unwrap_or_else(|e| e.into_inner()).next();
                let Some((i, (spec, image, initrd))) = next else {
                    break;
                };
                eprintln!(
                    "xtask: booting {} ({} {}) under qemu (single-threaded TCG, 2 vCPUs, 2 NUMA nodes)",
                    image.file_name().unwrap_or_default().to_string_lossy(),
                    spec.distro,
                    spec.name
                );
                let run = boot_one(spec, image, &initrd, timeout);
                done.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((i, run));
            });
        }
    });
    let mut done = done.into_inner().unwrap_or_else(|e| e.into_inner());
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, r)| r).collect()
}

/// What a kernel may show besides `ok`: (tool, why) per verdict.
#[derive(Clone, Copy, Debug, Default)]
struct Allowed<'a> {
    degraded: &'a [(&'a str, &'a str)],
    known_failures: &'a [(&'a str, &'a str)],
}

/// Failures of one kernel's checks, given what its list entry allows.
fn check_failures(k: &str, allowed: Allowed, run: &GuestRun) -> Vec<String> {
    let mut failures = Vec::new();
    for c in &run.checks {
        let listed = |l: &[(&str, &str)]| l.iter().any(|(t, _)| *t == c.name);
        let (deg, known) = (listed(allowed.degraded), listed(allowed.known_failures));
        match c.verdict.as_str() {
            "ok" if deg || known => failures.push(format!(
                "{k}: {} passed although the kernel list expects it {}: update the list in xtask/src/vm/kernels.rs",
                c.name,
                if deg { "degraded" } else { "to fail" }
            )),
            "ok" => {}
            "degraded" if deg => {}
            "known-fail" if known => {}
            v => failures.push(format!("{k}: check {}: {v} {}", c.name, c.detail)),
        }
    }
    if run.checks.is_empty() {
        failures.push(format!(
            "{k}: no checks reported (see target/vm/console-{k}.log)"
        ));
    }
    match run.exit {
        Some(0) => {}
        Some(n) => failures.push(format!("{k}: tk-workload vm-check exited with {n}")),
        None => failures.push(format!("{k}: the end of the checks was never reported")),
    }
    failures
}

/// The same checks on the host kernel, before any guest boots (they would slow it): the host
/// column of the report, and the attach-policy check on a kernel without kprobes or fentry.
fn host_checks(tracekit: &Path, workload: &Path) -> Result<(GuestRun, Duration)> {
    let t = Instant::now();
    let out = Command::new(workload)
        .arg("vm-check")
        .env("TRACEKIT_BIN", tracekit)
        .env("TK_WORKLOAD", workload)
        .env_remove("TKVM_GUEST")
        .output()
        .with_context(|| format!("running {} vm-check on the host", workload.display()))?;
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect();
    for l in lines.iter().filter(|l| l.starts_with("TKVM|check")) {
        eprintln!("host: {l}");
    }
    let log = root().join("target/vm/console-host.log");
    fs::write(&log, lines.join("\n")).with_context(|| format!("writing {}", log.display()))?;
    let mut run = guest::parse_console(&lines);
    run.exit = out.status.code();
    Ok((run, t.elapsed()))
}

/// Every check's verdict and duration, for the summary.
fn verdicts(run: &GuestRun) -> String {
    run.checks
        .iter()
        .map(|c| match c.seconds() {
            Some(s) => format!("{} {} {s:.1}s", c.name, c.verdict),
            None => format!("{} {}", c.name, c.verdict),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// One line per kernel for the summary: timings and every check's verdict and duration.
fn summary_line(r: &KernelRun, run: &GuestRun) -> String {
    let marks = match &r.result {
        Ok(b) => b
            .marks
            .iter()
            .map(|(k, d)| format!("{k} {:.1}s", d.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(", "),
        Err(_) => "failed".into(),
    };
    format!(
        "{:5} {} ({}): wall {:.1}s ({marks}); kernel up {:.1}s guest time; {}",
        r.spec.name,
        r.spec.distro,
        r.image.file_name().unwrap_or_default().to_string_lossy(),
        r.wall.as_secs_f64(),
        run.boot_s.unwrap_or(f64::NAN),
        verdicts(run)
    )
}

/// `cargo xtask vm-test [KERNEL...]`. `tracekit` is the static release binary `build()` made;
/// `kernels` names the kernels to boot (empty: `TRACEKIT_VM_KERNELS`, else all).
pub fn vm_test(tracekit: &Path, kernels: &str) -> Result<()> {
    let t0 = Instant::now();
    let from_env = env::var("TRACEKIT_VM_KERNELS").unwrap_or_default();
    let specs = kernels::select(if kernels.is_empty() {
        &from_env
    } else {
        kernels
    })?;
    if let Err(e) = ensure_host_tools() {
        if let Err(why) = guest::qemu_runs() {
            eprintln!("xtask: vm-test SKIPPED: qemu cannot run on this machine ({why}; installing it failed: {e:#})");
            return Ok(());
        }
        return Err(e);
    }
    if let Err(why) = guest::qemu_runs() {
        eprintln!("xtask: vm-test SKIPPED: qemu cannot run on this machine ({why})");
        return Ok(());
    }
    let mut images = Vec::new();
    for spec in &specs {
        let image = kernels::kernel(spec)
            .with_context(|| format!("getting the {} kernel ({})", spec.name, spec.distro))?;
        images.push((*spec, image));
    }
    let workload = root()
        .join("target")
        .join(HOST_TARGET)
        .join("release/tk-workload");
    let shared = guest::initramfs(tracekit, &workload)?;
    let mut booted = Vec::new();
    for (spec, image) in images {
        let modules = kernels::modules(spec, &image);
        let initrd = guest::initramfs_with(&shared, modules.as_deref(), spec.name)?;
        booted.push((spec, image, initrd));
    }
    let t_prep = t0.elapsed();

    let mut failures = Vec::new();
    let mut summary = Vec::new();
    eprintln!("xtask: the guest checks on this host's kernel first");
    let (host, host_wall) = host_checks(tracekit, &workload)?;
    failures.extend(check_failures("host", Allowed::default(), &host));
    summary.push(format!(
        "host  this machine ({}): wall {:.1}s; {}",
        doctor::kernel(&host.doctor),
        host_wall.as_secs_f64(),
        verdicts(&host)
    ));

    let jobs = jobs(specs.len());
    let t1 = Instant::now();
    let runs = boot_all(booted, jobs);
    let t_vms = t1.elapsed();

    let mut guests: Vec<(&str, GuestRun)> = Vec::new();
    for r in &runs {
        let k = r.spec.name;
        let lines = match &r.result {
            Ok(b) => &b.lines[..],
            Err(e) => {
                failures.push(format!("{k}: {e:#}"));
                &[][..]
            }
        };
        let log = root().join(format!("target/vm/console-{k}.log"));
        fs::write(&log, lines.join("\n")).with_context(|| format!("writing {}", log.display()))?;
        let run = guest::parse_console(lines);
        if r.result.is_ok() {
            let allowed = Allowed {
                degraded: r.spec.degraded,
                known_failures: r.spec.known_failures,
            };
            let before = failures.len();
            failures.extend(check_failures(k, allowed, &run));
            // CI keeps no files: a guest that stopped early shows its last words here.
            if run.exit != Some(0) && failures.len() > before {
                let tail = lines.len().saturating_sub(40);
                failures.push(format!(
                    "{k}: last console lines:\n    {}",
                    lines[tail..].join("\n    ")
                ));
            }
        }
        summary.push(summary_line(r, &run));
        guests.push((k, run));
    }
    let guest_doctors: Vec<(&str, &[Value])> =
        guests.iter().map(|(k, g)| (*k, &g.doctor[..])).collect();
    let cmp = doctor::compare(&host.doctor, doctor::HostTruth::read(), &guest_doctors);
    eprintln!("xtask: doctor, host and guests (only what differs):");
    for l in &cmp.table {
        eprintln!("  {l}");
    }
    failures.extend(cmp.failures);
    for spec in &specs {
        for (tool, lacks) in spec.degraded {
            eprintln!(
                "xtask: {}: {tool} is degraded there by design: {lacks}",
                spec.name
            );
        }
        for (tool, what) in spec.known_failures {
            eprintln!(
                "xtask: {}: KNOWN FAILURE of {tool}, pending a userspace change: {what}",
                spec.name
            );
        }
    }
    eprintln!("xtask: vm-test per kernel:");
    for l in &summary {
        eprintln!("  {l}");
    }
    eprintln!(
        "xtask: vm-test: {} kernel(s), {jobs} at a time; prepare {:.1}s, VMs {:.1}s, total {:.1}s",
        runs.len(),
        t_prep.as_secs_f64(),
        t_vms.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    if !failures.is_empty() {
        bail!("vm-test failed:\n  {}", failures.join("\n  "));
    }
    eprintln!("xtask: vm-test passed");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use guest::CheckLine;

    fn run(checks: &[(&str, &str)], exit: Option<i32>) -> GuestRun {
        GuestRun {
            checks: checks
                .iter()
                .map(|(n, v)| CheckLine {
                    name: n.to_string(),
                    verdict: v.to_string(),
                    detail: "x (1.0s)".into(),
                })
                .collect(),
            exit,
            ..Default::default()
        }
    }

    #[test]
    fn degraded_only_where_the_kernel_list_allows_it() {
        let allowed = Allowed {
            degraded: &[("net-rx", "kfree_skb reasons (5.17)")],
            known_failures: &[("memstall", "MADV_COLLAPSE")],
        };
        let f = |checks, exit| check_failures("5.10", allowed, &run(checks, exit));
        assert!(f(
            &[
                ("ctxsw", "ok"),
                ("net-rx", "degraded"),
                ("memstall", "known-fail")
            ],
            Some(0)
        )
        .is_empty());
        let e = f(&[("ctxsw", "degraded"), ("net-rx", "ok")], Some(0));
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(e[0].starts_with("5.10: check ctxsw: degraded"), "{e:?}");
        assert!(
            e[1].contains("expects it degraded: update the list"),
            "{e:?}"
        );
        let e = f(&[("memstall", "ok"), ("ctxsw", "known-fail")], Some(0));
        assert_eq!(e.len(), 2, "{e:?}");
        assert!(e[0].contains("expects it to fail"), "{e:?}");
        // A degraded tool is not a known failure, nor the other way round.
        assert_eq!(
            f(
                &[("memstall", "degraded"), ("net-rx", "known-fail")],
                Some(0)
            )
            .len(),
            2
        );
        assert_eq!(f(&[("ctxsw", "FAIL")], Some(1)).len(), 2);
        assert_eq!(f(&[], None).len(), 2);
        // The host allows nothing but ok.
        let e = check_failures(
            "host",
            Allowed::default(),
            &run(&[("net-rx", "degraded")], Some(0)),
        );
        assert_eq!(e.len(), 1, "{e:?}");
    }

    #[test]
    fn parallel_guests_never_exceed_the_kernels() {
        assert_eq!(jobs(0), 1);
        assert!(jobs(1) == 1);
        assert!(jobs(3) >= 1 && jobs(3) <= 3);
    }
}
