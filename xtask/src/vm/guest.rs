//! One guest: the initramfs every kernel boots, the qemu command line, and what the guest prints
//! on its serial console.

use std::{
    env, fs,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use serde_json::Value;

use crate::{root, status};

/// Every guest line meant for us starts with this (kernel messages share the console).
const PREFIX: &str = "TKVM|";

const INIT: &str = r#"#!/bin/busybox sh
# tracekit VM test init: mount what a node has, run the checks, power off.
/bin/busybox mkdir -p /usr/bin /usr/sbin /sbin
/bin/busybox --install -s
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tracefs nodev /sys/kernel/tracing
mount -t securityfs securityfs /sys/kernel/security 2>/dev/null
# Production nodes mostly run pure cgroup v2 (the host here is a v1 hybrid).
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
mkdir -p /tmp
# The guest kernel's own modules, if xtask found them in its package (loop, for the I/O checks).
for m in /lib/modules/*.ko; do [ -e "$m" ] && insmod "$m" 2>/dev/null; done
echo "TKVM|boot $(cat /proc/uptime)"
TKVM_GUEST=1 TRACEKIT_BIN=/bin/tracekit TK_WORKLOAD=/bin/tk-workload /bin/tk-workload vm-check
echo "TKVM|exit $?"
poweroff -f
"#;

/// Builds the initramfs every kernel boots (newc cpio, uncompressed: decompression is slow
/// under TCG). Nothing in it depends on the kernel: no modules are loaded.
pub fn initramfs(tracekit: &Path, workload: &Path) -> Result<PathBuf> {
    let dir = root().join("target/vm");
    let tree = dir.join("initramfs");
    let _ = fs::remove_dir_all(&tree);
    for d in [
        "bin", "proc", "sys", "dev", "tmp", "sbin", "usr/bin", "usr/sbin",
    ] {
        fs::create_dir_all(tree.join(d))?;
    }
    fs::copy("/bin/busybox", tree.join("bin/busybox")).context("copying /bin/busybox")?;
    fs::copy(tracekit, tree.join("bin/tracekit"))
        .with_context(|| format!("copying {}", tracekit.display()))?;
    fs::copy(workload, tree.join("bin/tk-workload"))
        .with_context(|| format!("copying {}", workload.display()))?;
    fs::write(tree.join("init"), INIT)?;
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(tree.join("init"), fs::Permissions::from_mode(0o755))?;
    let out = dir.join("initramfs.cpio");
    let sh = format!(
        "cd '{}' && find . | cpio --quiet -o -H newc -R 0:0 > '{}'",
        tree.display(),
        out.display()
    );
    let mut c = Command::new("sh");
    c.args(["-c", &sh]);
    status(c)?;
    Ok(out)
}

/// `shared` plus a second archive holding the kernel's guest `modules` in /lib/modules (the
/// kernel unpacks concatenated newc archives in order), for one kernel.
pub fn initramfs_with(shared: &Path, modules: Option<&Path>, label: &str) -> Result<PathBuf> {
    let Some(modules) = modules else {
        return Ok(shared.to_path_buf());
    };
    let dir = root().join("target/vm");
    let tree = dir.join(format!("modules-{label}"));
    let _ = fs::remove_dir_all(&tree);
    fs::create_dir_all(tree.join("lib/modules"))?;
    for e in fs::read_dir(modules)?.filter_map(|e| e.ok()) {
        fs::copy(e.path(), tree.join("lib/modules").join(e.file_name()))?;
    }
    let extra = dir.join(format!("modules-{label}.cpio"));
    let sh = format!(
        "cd '{}' && find . | cpio --quiet -o -H newc -R 0:0 > '{}'",
        tree.display(),
        extra.display()
    );
    let mut c = Command::new("sh");
    c.args(["-c", &sh]);
    status(c)?;
    let out = dir.join(format!("initramfs-{label}.cpio"));
    let mut bytes = fs::read(shared)?;
    bytes.extend(fs::read(&extra)?);
    fs::write(&out, bytes)?;
    Ok(out)
}

/// One `check` line: tool (or check) name, verdict, detail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckLine {
    pub name: String,
    pub verdict: String,
    pub detail: String,
}

impl CheckLine {
    /// The check's own duration, from the `(1.2s)` the guest appends to its detail.
    pub fn seconds(&self) -> Option<f64> {
        let d = self.detail.trim_end();
        let open = d.rfind('(')?;
        d[open + 1..].strip_suffix("s)")?.parse().ok()
    }
}

/// What the guest printed, by kind.
#[derive(Debug, Default)]
pub struct GuestRun {
    pub checks: Vec<CheckLine>,
    pub doctor: Vec<Value>,
    pub exit: Option<i32>,
    /// Guest uptime when init started (seconds).
    pub boot_s: Option<f64>,
    pub raw: Vec<String>,
}

/// Parses the console: every line holding `TKVM|` (kernel messages may precede it on the line).
pub fn parse_console(lines: &[String]) -> GuestRun {
    let mut run = GuestRun::default();
    for l in lines {
        let Some(pos) = l.find(PREFIX) else { continue };
        let rest = l[pos + PREFIX.len()..].trim_end_matches(['\r', '\n']);
        run.raw.push(rest.to_string());
        let (kind, body) = rest.split_once(' ').unwrap_or((rest, ""));
        match kind {
            "check" => {
                let mut it = body.splitn(3, ' ');
                run.checks.push(CheckLine {
                    name: it.next().unwrap_or("").to_string(),
                    verdict: it.next().unwrap_or("").to_string(),
                    detail: it.next().unwrap_or("").to_string(),
                });
            }
            "doctor" => {
                if let Ok(v) = serde_json::from_str(body) {
                    run.doctor.push(v);
                }
            }
            "exit" => run.exit = body.trim().parse().ok(),
            "boot" => run.boot_s = body.split_whitespace().next().and_then(|s| s.parse().ok()),
            _ => {}
        }
    }
    run
}

pub fn qemu_runs() -> Result<(), String> {
    match Command::new("qemu-system-x86_64")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("qemu-system-x86_64 --version exited with {s}")),
        Err(e) => Err(format!("cannot run qemu-system-x86_64: {e}")),
    }
}

/// Console lines and host-side phase times of one boot.
pub struct Boot {
    pub lines: Vec<String>,
    /// (phase, time since qemu started): first output, init started, checks done, qemu exited.
    pub marks: Vec<(&'static str, Duration)>,
}

/// Boots `kernel` with `initrd` (2 vCPUs, two NUMA nodes of 512 MiB) and returns its console.
/// `label` prefixes the guest lines echoed to stderr, so parallel guests can be told apart.
pub fn boot(label: &str, kernel: &Path, initrd: &Path, timeout: Duration) -> Result<Boot> {
    let mut c = Command::new("qemu-system-x86_64");
    // One TCG thread for both vCPUs: with multi-threaded TCG a 6.12 guest died twice in CI while
    // the kernel patched its own code (static keys, `text_poke_bp`): RIP in the middle of a nop
    // in `sched_clock_tick` at 2.3 s, and a power-off in the middle of a check. Not slower here:
    // the three guests already share two host CPUs (61.6 s and 67.1 s against 72 s and 82 s).
    c.args([
        "-accel",
        "tcg,thread=single",
        "-cpu",
        "max",
        "-smp",
        "2",
        "-m",
        "1024",
    ])
    .args(["-object", "memory-backend-ram,id=m0,size=512M"])
    .args(["-object", "memory-backend-ram,id=m1,size=512M"])
    .args(["-numa", "node,nodeid=0,memdev=m0,cpus=0"])
    .args(["-numa", "node,nodeid=1,memdev=m1,cpus=1"])
    // No NIC: its iPXE option ROM alone costs seconds under TCG.
    .args(["-nic", "none", "-nographic", "-no-reboot", "-kernel"])
    .arg(kernel)
    .arg("-initrd")
    .arg(initrd)
    .args(["-append", "console=ttyS0 panic=-1 quiet"])
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = c.spawn().context("starting qemu-system-x86_64")?;
    let out = child.stdout.take().context("qemu stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).split(b'\n').map_while(Result::ok) {
            if tx
                .send(String::from_utf8_lossy(&line).into_owned())
                .is_err()
            {
                break;
            }
        }
    });
    let start = Instant::now();
    let deadline = start + timeout;
    let mut lines = Vec::new();
    let mut marks: Vec<(&'static str, Duration)> = Vec::new();
    let verbose = env::var_os("TRACEKIT_VM_VERBOSE").is_some();
    loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(l) => {
                if marks.is_empty() {
                    marks.push(("first output", start.elapsed()));
                }
                if l.contains("TKVM|boot") {
                    marks.push(("init started", start.elapsed()));
                }
                if l.contains("TKVM|exit") {
                    marks.push(("checks done", start.elapsed()));
                }
                if verbose || l.contains("TKVM|check") {
                    eprintln!("guest {label}: {}", l.trim_end());
                }
                lines.push(l);
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let tail: Vec<&String> = lines.iter().rev().take(30).collect();
            bail!(
                "the {label} VM did not power off within {timeout:?}; last console lines:\n{}",
                tail.into_iter()
                    .rev()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("\n")
            );
        }
    }
    let st = child.wait()?;
    marks.push(("qemu exited", start.elapsed()));
    if !st.success() {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            use std::io::Read;
            let _ = e.read_to_string(&mut err);
        }
        bail!("qemu ({label}) exited with {st}: {}", err.trim());
    }
    Ok(Boot { lines, marks })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_lines_with_kernel_noise() {
        let lines: Vec<String> = [
            "[    1.2] random: crng init done",
            "TKVM|boot 1.53 0.90\r",
            "[    2.0] foo TKVM|check fsync-lat ok 40 fsync, 20 fdatasync (2.5s)",
            "TKVM|check ctxsw FAIL count 3 != 4",
            "TKVM|check memstall degraded",
            "TKVM|doctor {\"type\":\"system\",\"numa_nodes\":2}",
            "TKVM|doctor {not json",
            "TKVM|exit 1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let r = parse_console(&lines);
        assert_eq!(r.boot_s, Some(1.53));
        assert_eq!(r.checks.len(), 3);
        assert_eq!(r.checks[0].name, "fsync-lat");
        assert_eq!(r.checks[0].verdict, "ok");
        assert_eq!(r.checks[0].seconds(), Some(2.5));
        assert_eq!(r.checks[1].detail, "count 3 != 4");
        assert_eq!(r.checks[1].seconds(), None);
        assert_eq!(r.checks[2].verdict, "degraded");
        assert_eq!(r.checks[2].detail, "");
        assert_eq!(r.doctor.len(), 1);
        assert_eq!(r.doctor[0]["numa_nodes"], 2);
        assert_eq!(r.exit, Some(1));
        assert_eq!(parse_console(&[]).exit, None);
    }
}
