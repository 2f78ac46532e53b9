//! `cargo xtask vm-test`: the suite on a second kernel. Debian's 6.1 kernel boots under qemu
//! (software emulation, 2 vCPUs, two NUMA nodes) with an initramfs holding the static
//! `tracekit` and `tk-workload` binaries, busybox and a small `/init`; `tk-workload vm-check`
//! runs every tool's checks in the guest and prints result lines on the serial console, which
//! are read back here. Then `tracekit doctor` on the host and in the guest are compared.
//!
//! Downloads are cached under ~/.cache/tracekit/vm (shared by every work tree), so a rerun only
//! rebuilds the initramfs and boots.

use std::{
    collections::BTreeMap,
    env, fs,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use serde_json::Value;

use crate::{root, status, HOST_TARGET};

/// Every guest line meant for us starts with this (kernel messages share the console).
const PREFIX: &str = "TKVM|";
/// Boot plus checks take seconds; TCG on a loaded machine can be several times slower.
const BOOT_TIMEOUT: Duration = Duration::from_secs(300);

/// Host tools the VM run needs: (command, Debian package, why).
const HOST_TOOLS: &[(&str, &str, &str)] = &[
    (
        "qemu-system-x86_64",
        "qemu-system-x86",
        "boots Debian's 6.1 kernel for the second-kernel tests",
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
        status(apt(&["update", "-q"]))?;
        install()?;
    }
    Ok(())
}

fn apt(args: &[&str]) -> Command {
    let mut c = Command::new("apt-get");
    c.args(args).env("DEBIAN_FRONTEND", "noninteractive");
    c
}

pub fn cache_dir() -> PathBuf {
    let base = env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| root().join("target"));
    base.join("tracekit/vm")
}

/// The kernel image package `linux-image-amd64` depends on today, e.g. `linux-image-6.1.0-57-amd64`.
fn kernel_package() -> Result<String> {
    let query = || -> Option<String> {
        let out = Command::new("apt-cache")
            .args(["depends", "linux-image-amd64"])
            .output()
            .ok()?;
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.trim().strip_prefix("Depends:"))
            .map(|p| p.trim().to_string())
            .find(|p| p.starts_with("linux-image-") && !p.contains("amd64-unsigned"))
    };
    if let Some(p) = query() {
        return Ok(p);
    }
    status(apt(&["update", "-q"]))?;
    query().context("`apt-cache depends linux-image-amd64` names no linux-image package")
}

/// Path of the cached vmlinuz, downloading and unpacking the package when absent.
fn kernel() -> Result<PathBuf> {
    let cache = cache_dir();
    fs::create_dir_all(&cache)?;
    let pkg = match kernel_package() {
        Ok(p) => p,
        Err(e) => {
            // Offline with a cached kernel: use it rather than fail.
            if let Some(k) = cached_kernels(&cache).pop().map(|k| uncompressed(&k)) {
                eprintln!(
                    "xtask: cannot ask apt for the current kernel ({e:#}); using cached {}",
                    k.display()
                );
                return Ok(k);
            }
            return Err(e);
        }
    };
    let image = cache.join(format!("{pkg}.vmlinuz"));
    if image.exists() {
        return Ok(uncompressed(&image));
    }
    eprintln!("xtask: downloading {pkg} (Debian's current 6.1 kernel, for the VM tests)");
    // Per process: work trees may run vm-test at the same time; renames publish atomically.
    let dl = cache.join(format!("download-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dl);
    fs::create_dir_all(&dl)?;
    let mut c = apt(&["download", &pkg]);
    c.current_dir(&dl);
    if status(c).is_err() {
        status(apt(&["update", "-q"]))?;
        let mut c = apt(&["download", &pkg]);
        c.current_dir(&dl);
        status(c)?;
    }
    let deb = fs::read_dir(&dl)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .context("apt-get download left no .deb")?;
    let unpacked = dl.join("root");
    let mut c = Command::new("dpkg");
    c.arg("-x").arg(&deb).arg(&unpacked);
    status(c)?;
    let boot = unpacked.join("boot");
    let vmlinuz = fs::read_dir(&boot)
        .with_context(|| format!("{} missing in {}", boot.display(), deb.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
        })
        .context("no vmlinuz in the kernel package")?;
    let tmp = cache.join(format!(".vmlinuz.{}.tmp", std::process::id()));
    fs::copy(&vmlinuz, &tmp)?;
    fs::rename(&tmp, &image)?;
    // Only the image is kept: the modules are not needed (the initramfs loads none).
    let _ = fs::remove_dir_all(&dl);
    // Older kernels Debian has since replaced are of no further use.
    for old in cached_kernels(&cache) {
        if old != image {
            let _ = fs::remove_file(&old);
            let _ = fs::remove_file(old.with_extension("vmlinux"));
        }
    }
    Ok(uncompressed(&image))
}

/// The ELF `vmlinux` inside a bzImage, cached beside it, else the bzImage itself. qemu boots
/// the ELF directly (PVH entry, CONFIG_PVH), skipping the xz decompression that takes about
/// 10 s under TCG.
fn uncompressed(bzimage: &Path) -> PathBuf {
    let elf = bzimage.with_extension("vmlinux");
    if elf.exists() {
        return elf;
    }
    let try_xz = || -> Option<()> {
        let data = fs::read(bzimage).ok()?;
        let magic = b"\xfd7zXZ\0";
        let at = data.windows(magic.len()).position(|w| w == magic)?;
        let tmp = elf.with_extension(format!("{}.tmp", std::process::id()));
        let out = fs::File::create(&tmp).ok()?;
        let mut child = Command::new("xz")
            .arg("-dc")
            .stdin(Stdio::piped())
            .stdout(out)
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        {
            use std::io::Write;
            let mut stdin = child.stdin.take()?;
            // xz complains about the bytes after the stream ("trailing garbage"), after having
            // written all of it: its exit status is not the test, the ELF header is.
            let _ = stdin.write_all(&data[at..]);
        }
        let _ = child.wait();
        let head = fs::read(&tmp).ok()?;
        if head.len() < 1 << 20 || &head[..4] != b"\x7fELF" {
            let _ = fs::remove_file(&tmp);
            return None;
        }
        fs::rename(&tmp, &elf).ok()
    };
    match try_xz() {
        Some(()) => elf,
        None => {
            eprintln!(
                "xtask: could not extract vmlinux from {} (no xz stream, or xz missing); booting the bzImage (slower under TCG)",
                bzimage.display()
            );
            bzimage.to_path_buf()
        }
    }
}

fn cached_kernels(cache: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(cache)
        .map(|d| {
            d.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.to_string_lossy().ends_with(".vmlinuz"))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

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
echo "TKVM|boot $(cat /proc/uptime)"
TKVM_GUEST=1 TRACEKIT_BIN=/bin/tracekit TK_WORKLOAD=/bin/tk-workload /bin/tk-workload vm-check
echo "TKVM|exit $?"
poweroff -f
"#;

/// Builds the initramfs (newc cpio, uncompressed: decompression is slow under TCG).
fn initramfs(tracekit: &Path, workload: &Path) -> Result<PathBuf> {
    let dir = root().join("target/vm");
    let tree = dir.join("initramfs");
    let _ = fs::remove_dir_all(&tree);
    for d in [
        "bin", "proc", "sys", "dev", "tmp", "sbin", "usr/bin", "usr/sbin",
    ] {
        fs::create_dir_all(tree.join(d))?;
    }
    fs::copy("/bin/busybox", tree.join("bin/busybox"))?;
    fs::copy(tracekit, tree.join("bin/tracekit"))?;
    fs::copy(workload, tree.join("bin/tk-workload"))?;
    // Research switch (perf-research branch): pass TRACEKIT_FS_MODE through to the guest so
    // fsync-lat's kernel-side variants can be checked on the 6.1 verifier.
    let init = match env::var("TRACEKIT_FS_MODE") {
        Ok(m) => INIT.replace(
            "TKVM_GUEST=1",
            &format!("TKVM_GUEST=1 TRACEKIT_FS_MODE={m}"),
        ),
        Err(_) => INIT.to_string(),
    };
    fs::write(tree.join("init"), init)?;
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

/// What the guest printed, by kind.
#[derive(Debug, Default)]
pub struct GuestRun {
    pub checks: Vec<(String, String, String)>,
    pub doctor: Vec<Value>,
    pub exit: Option<i32>,
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
                let name = it.next().unwrap_or("").to_string();
                let verdict = it.next().unwrap_or("").to_string();
                let detail = it.next().unwrap_or("").to_string();
                run.checks.push((name, verdict, detail));
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

fn qemu_runs() -> Result<(), String> {
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

/// Boots the guest and returns its console lines.
fn boot(kernel: &Path, initrd: &Path) -> Result<Vec<String>> {
    let mut c = Command::new("qemu-system-x86_64");
    c.args(["-accel", "tcg", "-cpu", "max", "-smp", "2", "-m", "1024"])
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
    let out = child.stdout.take().unwrap();
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
    let deadline = start + BOOT_TIMEOUT;
    let mut lines = Vec::new();
    // Host-side phase times: first console byte (firmware), init running, checks done.
    let mut marks: Vec<(&str, Duration)> = Vec::new();
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
                    eprintln!("guest: {}", l.trim_end());
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
                "the VM did not power off within {BOOT_TIMEOUT:?}; last console lines:\n{}",
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
    eprintln!(
        "xtask: VM timeline: {}",
        marks
            .iter()
            .map(|(k, d)| format!("{k} {:.1}s", d.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if !st.success() {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            use std::io::Read;
            let _ = e.read_to_string(&mut err);
        }
        bail!("qemu exited with {st}: {}", err.trim());
    }
    Ok(lines)
}

/// `cargo xtask vm-test`. `tracekit` is the static release binary `build()` made.
pub fn vm_test(tracekit: &Path) -> Result<()> {
    let t0 = Instant::now();
    if let Err(e) = ensure_host_tools() {
        if let Err(why) = qemu_runs() {
            eprintln!("xtask: vm-test SKIPPED: qemu cannot run on this machine ({why}; installing it failed: {e:#})");
            return Ok(());
        }
        return Err(e);
    }
    if let Err(why) = qemu_runs() {
        eprintln!("xtask: vm-test SKIPPED: qemu cannot run on this machine ({why})");
        return Ok(());
    }
    let kernel = kernel()?;
    let workload = root()
        .join("target")
        .join(HOST_TARGET)
        .join("release/tk-workload");
    let initrd = initramfs(tracekit, &workload)?;
    let t_prep = t0.elapsed();
    let t1 = Instant::now();
    eprintln!(
        "xtask: booting {} under qemu (TCG, 2 vCPUs, 2 NUMA nodes)",
        kernel.file_name().unwrap_or_default().to_string_lossy()
    );
    let lines = match boot(&kernel, &initrd) {
        // A kernel without a PVH entry cannot boot as an ELF: the bzImage can.
        Err(e) if kernel.extension().is_some_and(|x| x == "vmlinux") => {
            eprintln!("xtask: booting the ELF kernel failed ({e:#}); retrying with the bzImage");
            boot(&kernel.with_extension("vmlinuz"), &initrd)?
        }
        r => r?,
    };
    let t_vm = t1.elapsed();
    let run = parse_console(&lines);
    fs::write(root().join("target/vm/console.log"), lines.join("\n"))?;

    let mut failures = Vec::new();
    for (name, verdict, detail) in &run.checks {
        if verdict != "ok" {
            failures.push(format!("guest check {name}: {verdict} {detail}"));
        }
    }
    if run.checks.is_empty() {
        failures.push("the guest reported no checks (see target/vm/console.log)".into());
    }
    match run.exit {
        Some(0) => {}
        Some(n) => failures.push(format!("tk-workload vm-check exited with {n} in the guest")),
        None => failures.push("the guest never reported the end of its checks".into()),
    }
    let host = host_doctor(tracekit)?;
    failures.extend(compare_doctor(&host, &run.doctor));
    eprintln!(
        "xtask: vm-test: {} guest checks, prepare {:.1}s, VM {:.1}s (kernel up at {:.1}s of guest time)",
        run.checks.len(),
        t_prep.as_secs_f64(),
        t_vm.as_secs_f64(),
        run.boot_s.unwrap_or(f64::NAN),
    );
    if !failures.is_empty() {
        bail!("vm-test failed:\n  {}", failures.join("\n  "));
    }
    eprintln!("xtask: vm-test passed");
    Ok(())
}

fn host_doctor(tracekit: &Path) -> Result<Vec<Value>> {
    let out = Command::new(tracekit)
        .args(["doctor", "--json"])
        .output()
        .context("running tracekit doctor on the host")?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect())
}

fn system(lines: &[Value]) -> Option<&Value> {
    lines.iter().find(|l| l["type"] == "system")
}

/// Prints what differs between host and guest `doctor`, and checks what must: the guest
/// (Debian 6.1, configured here with two NUMA nodes) has kprobes, fentry and two nodes; the host
/// reports its own facts as its kernel shows them.
pub fn compare_doctor(host: &[Value], guest: &[Value]) -> Vec<String> {
    let mut failures = Vec::new();
    let (Some(h), Some(g)) = (system(host), system(guest)) else {
        return vec!["a doctor system line is missing (host or guest)".into()];
    };
    let keys = [
        ("kernel", "/kernel"),
        ("BTF", "/btf"),
        ("kprobes", "/kprobes/available"),
        ("fentry", "/fentry/available"),
        ("raw_tp", "/raw_tp/available"),
        ("NUMA nodes", "/numa_nodes"),
        ("cgroup", "/cgroup"),
        ("THP enabled", "/thp/enabled"),
        ("THP defrag", "/thp/defrag"),
        ("lockdown", "/lockdown"),
    ];
    let mut diff = BTreeMap::new();
    for (label, ptr) in keys {
        let (hv, gv) = (h.pointer(ptr), g.pointer(ptr));
        if hv != gv {
            diff.insert(label, (hv.cloned(), gv.cloned()));
        }
    }
    // Attach modes per hook.
    let modes = |lines: &[Value]| -> BTreeMap<String, String> {
        lines
            .iter()
            .filter(|l| l["type"] == "hook")
            .map(|l| {
                (
                    format!(
                        "{} {}",
                        l["for"].as_str().unwrap_or(""),
                        l["event"].as_str().unwrap_or("")
                    ),
                    l["mode"].as_str().unwrap_or("none").to_string(),
                )
            })
            .collect()
    };
    let (hm, gm) = (modes(host), modes(guest));
    eprintln!("xtask: doctor, host vs guest (only what differs):");
    for (label, (hv, gv)) in &diff {
        eprintln!(
            "  {label:12} host {:30} guest {}",
            hv.as_ref().map(Value::to_string).unwrap_or("-".into()),
            gv.as_ref().map(Value::to_string).unwrap_or("-".into())
        );
    }
    for (hook, m) in &hm {
        let other = gm.get(hook).map(String::as_str).unwrap_or("absent");
        if other != m {
            eprintln!("  hook {hook}: host {m}, guest {other}");
        }
    }
    // Field layouts (offset, size) of the tracepoints tools read.
    let layouts = |lines: &[Value]| -> BTreeMap<String, Value> {
        lines
            .iter()
            .filter(|l| l["type"] == "hook")
            .map(|l| {
                (
                    format!(
                        "{} {}",
                        l["for"].as_str().unwrap_or(""),
                        l["event"].as_str().unwrap_or("")
                    ),
                    l["layout"].clone(),
                )
            })
            .collect()
    };
    let (hl, gl) = (layouts(host), layouts(guest));
    let mut same = 0;
    for (hook, l) in &hl {
        match gl.get(hook) {
            Some(g) if g == l => same += 1,
            Some(g) => eprintln!("  layout {hook}: host {l}, guest {g}"),
            None => {}
        }
    }
    eprintln!("  ({same} hook(s) read the same fields at the same offsets on both kernels)");
    for (what, ptr, want) in [
        ("kprobes", "/kprobes/available", Value::Bool(true)),
        ("fentry", "/fentry/available", Value::Bool(true)),
        ("NUMA nodes", "/numa_nodes", Value::from(2)),
    ] {
        if g.pointer(ptr) != Some(&want) {
            failures.push(format!(
                "guest doctor: {what} is {:?}, expected {want} (Debian 6.1 under qemu with two nodes)",
                g.pointer(ptr)
            ));
        }
    }
    // The host's answers against what its kernel shows directly.
    let kprobe_pmu = Path::new("/sys/bus/event_source/devices/kprobe/type").exists();
    if h.pointer("/kprobes/available") != Some(&Value::Bool(kprobe_pmu)) {
        failures.push(format!(
            "host doctor: kprobes {:?} but the kprobe PMU {}",
            h.pointer("/kprobes/available"),
            if kprobe_pmu { "exists" } else { "is absent" }
        ));
    }
    let nodes = fs::read_dir("/sys/devices/system/node")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| {
                    let n = e.file_name().to_string_lossy().into_owned();
                    n.strip_prefix("node")
                        .is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()))
                })
                .count()
        })
        .unwrap_or(1);
    if h.pointer("/numa_nodes") != Some(&Value::from(nodes)) {
        failures.push(format!(
            "host doctor: numa_nodes {:?}, sysfs has {nodes}",
            h.pointer("/numa_nodes")
        ));
    }
    for (label, ptr) in [
        ("kprobes", "/kprobes/available"),
        ("fentry", "/fentry/available"),
    ] {
        if !diff.contains_key(label) && h.pointer(ptr) == Some(&Value::Bool(false)) {
            failures.push(format!(
                "{label}: host and guest doctor agree although they should differ"
            ));
        }
    }
    failures
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doctor_comparison_demands_what_the_guest_has() {
        // Host facts as this machine's sysfs shows them, so only the guest side decides.
        let kp = Path::new("/sys/bus/event_source/devices/kprobe/type").exists();
        let nodes = fs::read_dir("/sys/devices/system/node")
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter(|e| {
                        let n = e.file_name().to_string_lossy().into_owned();
                        n.strip_prefix("node")
                            .is_some_and(|r| r.parse::<u32>().is_ok())
                    })
                    .count()
            })
            .unwrap_or(1);
        let host = vec![
            serde_json::json!({"type": "system", "kprobes": {"available": kp},
            "fentry": {"available": false}, "numa_nodes": nodes}),
        ];
        let good = vec![
            serde_json::json!({"type": "system", "kprobes": {"available": true},
            "fentry": {"available": true}, "numa_nodes": 2}),
        ];
        assert_eq!(compare_doctor(&host, &good), Vec::<String>::new());
        let bad = vec![
            serde_json::json!({"type": "system", "kprobes": {"available": true},
            "fentry": {"available": false}, "numa_nodes": 1}),
        ];
        let f = compare_doctor(&host, &bad);
        assert!(f.iter().any(|m| m.contains("fentry")), "{f:?}");
        assert!(f.iter().any(|m| m.contains("NUMA nodes")), "{f:?}");
        assert!(!compare_doctor(&host, &[]).is_empty());
    }

    #[test]
    fn console_lines_with_kernel_noise() {
        let lines: Vec<String> = [
            "[    1.2] random: crng init done",
            "TKVM|boot 1.53 0.90\r",
            "[    2.0] foo TKVM|check fsync-lat ok 40 fsync, 20 fdatasync",
            "TKVM|check ctxsw FAIL count 3 != 4",
            "TKVM|doctor {\"type\":\"system\",\"numa_nodes\":2}",
            "TKVM|exit 1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let r = parse_console(&lines);
        assert_eq!(r.boot_s, Some(1.53));
        assert_eq!(r.checks.len(), 2);
        assert_eq!(r.checks[0].0, "fsync-lat");
        assert_eq!(r.checks[0].1, "ok");
        assert_eq!(r.checks[1].2, "count 3 != 4");
        assert_eq!(r.doctor[0]["numa_nodes"], 2);
        assert_eq!(r.exit, Some(1));
    }
}
