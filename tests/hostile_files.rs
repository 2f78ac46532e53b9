//! Root tests: files another user (or an override variable) puts where tracekit, as root, opens
//! them never hang it, never exhaust its memory and never kill it (issue #31). Each reproduces a
//! report as its reporter did: a FIFO as an unprivileged process's perf map; a sparse ELF whose
//! unwind section headers claim 1 GiB, mapped executable; a FIFO as a recording, as
//! `TRACEKIT_BTF` and inside a `TRACEKIT_PROC` tree; a `TRACEKIT_BTF` file rewritten during runs.

use std::{
    ffi::CString,
    os::unix::{ffi::OsStrExt, fs::PermissionsExt, process::ExitStatusExt},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use tracekit_tests::*;

/// A directory under /tmp that user `nobody` can enter, removed on drop (also when the test
/// fails).
struct TmpDir(PathBuf);

impl TmpDir {
    fn new(tag: &str) -> TmpDir {
        let d = std::env::temp_dir().join(format!("tk-hostile-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        TmpDir(d)
    }
}

impl Drop for TmpDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Removes a file on drop (a FIFO left in /tmp).
struct Removed(PathBuf);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A child killed and reaped on drop (also when the test fails).
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn mkfifo(p: &Path) {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path; plain syscall.
    assert_eq!(
        unsafe { libc::mkfifo(c.as_ptr(), 0o644) },
        0,
        "mkfifo {p:?}"
    );
}

/// Spins for `argv[1]` seconds after mapping each further argument whole, PROT_READ|PROT_EXEC.
const SPIN_C: &str = r#"
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
__attribute__((noinline)) unsigned long tk_spin(unsigned long n) {
    volatile unsigned long x = 0;
    for (unsigned long i = 0; i < n; i++) x += i;
    return x;
}
int main(int argc, char **argv) {
    double secs = atof(argv[1]), t0 = now();
    for (int i = 2; i < argc; i++) {
        int fd = open(argv[i], O_RDONLY);
        off_t n = fd < 0 ? -1 : lseek(fd, 0, SEEK_END);
        if (n <= 0 || mmap(0, n, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0) == MAP_FAILED)
            return 2;
    }
    unsigned long s = 0;
    while (now() - t0 < secs) s += tk_spin(1000000);
    return (int)(s & 1) * 0;
}
"#;

/// Builds the spinner (`tkspin`, world-executable) in `dir`.
fn build_spinner(dir: &Path) -> PathBuf {
    let src = dir.join("tkspin.c");
    std::fs::write(&src, SPIN_C).unwrap();
    let bin = dir.join("tkspin");
    output_ok(
        Command::new("gcc").args(["-O1", "-o"]).arg(&bin).arg(&src),
        "gcc",
    );
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

/// Waits at most `timeout` for `child`; past it the child is killed and the test fails naming
/// `what` (the defects were waits that never end). Returns the status, stdout and stderr.
fn bounded(mut child: Child, what: &str, timeout: Duration) -> (ExitStatus, String, String) {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            return (
                st,
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            );
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {timeout:?} (killed)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn tracekit(args: &[&str], env: &[(&str, &Path)]) -> Child {
    let mut cmd = Command::new(tracekit_bin());
    ends_with_the_test(&mut cmd)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn().expect("spawn tracekit")
}

/// Defect 1: an unprivileged process with a FIFO as its perf map, spinning, while root runs
/// `profile` (system-wide, `--pid`, `--unwind fp`): each run ends on time with its report, and
/// the report says why the perf map was ignored.
#[test]
fn a_fifo_as_perf_map_neither_hangs_nor_loses_the_report() {
    require_root();
    let dir = TmpDir::new("perfmap");
    let spin = build_spinner(&dir.0);
    let child = Command::new("setpriv")
        .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
        .arg(&spin)
        .arg("60")
        .spawn()
        .expect("setpriv");
    let spinner = Reaped(child);
    let pid = spinner.0.id();
    // The FIFO the unprivileged user would leave, owned by them (as perf requires of a map).
    let fifo = PathBuf::from(format!("/tmp/perf-{pid}.map"));
    mkfifo(&fifo);
    let _fifo = Removed(fifo.clone());
    let nobody = CString::new(fifo.as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path; plain syscall.
    assert_eq!(unsafe { libc::chown(nobody.as_ptr(), 65534, 65534) }, 0);
    let pid_s = pid.to_string();
    for args in [
        vec!["profile", "--duration", "2s"],
        vec!["profile", "--duration", "2s", "--pid", &pid_s],
        vec![
            "profile",
            "--duration",
            "2s",
            "--unwind",
            "fp",
            "--pid",
            &pid_s,
        ],
        vec!["profile", "--duration", "2s", "--unwind", "fp"],
    ] {
        let what = format!("tracekit {}", args.join(" "));
        let (st, out, err) = bounded(tracekit(&args, &[]), &what, Duration::from_secs(30));
        assert!(st.success(), "{what}: {st}: {err}");
        assert!(
            out.contains("tkspin"),
            "{what}: no row for the spinner:\n{out}"
        );
        let note = format!(
            "perf map ignored: /proc/{pid}/root{} is a FIFO",
            fifo.display()
        );
        assert!(out.contains(&note), "{what}: no note {note:?}:\n{out}");
        eprintln!("{what}: exit 0, report with the spinner and the note");
    }
}

/// Makes `bin`'s `.eh_frame` and `.eh_frame_hdr` section headers claim everything from their
/// offset to the end of a file of `len` bytes, and makes the file that long (sparse: its real
/// bytes stay the few KiB of the binary).
fn hostile_elf(bin: &Path, out: &Path, len: u64) {
    let mut b = std::fs::read(bin).unwrap();
    let u16_at = |b: &[u8], at: usize| u16::from_le_bytes(b[at..at + 2].try_into().unwrap());
    let u32_at = |b: &[u8], at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    let u64_at = |b: &[u8], at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    assert_eq!(&b[..5], b"\x7fELF\x02", "a 64-bit ELF");
    let (shoff, shentsize) = (u64_at(&b, 0x28) as usize, u16_at(&b, 0x3a) as usize);
    let (shnum, shstrndx) = (u16_at(&b, 0x3c) as usize, u16_at(&b, 0x3e) as usize);
    let sh = |i: usize| shoff + i * shentsize;
    let strtab = u64_at(&b, sh(shstrndx) + 0x18) as usize;
    let mut patched = 0;
    for i in 0..shnum {
        let name_at = strtab + u32_at(&b, sh(i)) as usize;
        let name = &b[name_at..];
        let name = &name[..name.iter().position(|&c| c == 0).unwrap()];
        if name == b".eh_frame" || name == b".eh_frame_hdr" {
            let off = u64_at(&b, sh(i) + 0x18);
            let at = sh(i) + 0x20;
            b[at..at + 8].copy_from_slice(&(len - off).to_le_bytes());
            patched += 1;
        }
    }
    assert_eq!(patched, 2, "{bin:?} has .eh_frame and .eh_frame_hdr");
    std::fs::write(out, &b).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(out)
        .unwrap()
        .set_len(len)
        .unwrap();
}

/// Peak RSS (VmHWM) of a running process, in KiB.
fn vm_hwm_kib(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Defect 2: two sparse ELF files whose unwind section headers claim ~1 GiB each, mapped
/// executable by a spinning process, while `profile --unwind dwarf` runs: tracekit's peak RSS
/// stays small (it was 5.3 GB), and the report names both binaries as not unwound.
#[test]
fn sparse_elf_with_huge_unwind_sections_is_skipped_not_read() {
    require_root();
    let dir = TmpDir::new("elf");
    let spin = build_spinner(&dir.0);
    let hostile: Vec<PathBuf> = (0..2)
        .map(|i| dir.0.join(format!("hostile{i}.so")))
        .collect();
    for h in &hostile {
        // 1 GiB: at the cap on a binary's size, so only the section check can refuse it.
        hostile_elf(&spin, h, 1 << 30);
    }
    let spinner = Reaped(
        Command::new(&spin)
            .arg("30")
            .args(&hostile)
            .spawn()
            .expect("spinner"),
    );
    let pid = spinner.0.id().to_string();
    // The spinner maps both files before it spins; wait (bounded) until they are mapped.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap_or_default()
        .contains("hostile1.so")
    {
        assert!(
            Instant::now() < deadline,
            "the spinner did not map its files"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut tk = tracekit(
        &[
            "profile",
            "--duration",
            "3s",
            "--unwind",
            "dwarf",
            "--pid",
            &pid,
        ],
        &[],
    );
    let tk_pid = tk.id();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut peak = 0;
    while tk.try_wait().unwrap().is_none() {
        peak = peak.max(vm_hwm_kib(tk_pid).unwrap_or(0));
        if Instant::now() > deadline {
            let _ = tk.kill();
            let _ = tk.wait();
            panic!("profile --unwind dwarf still running after 60 s (peak RSS {peak} KiB)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let (st, out, err) = bounded(tk, "profile --unwind dwarf", Duration::from_secs(5));
    eprintln!("profile --unwind dwarf beside two hostile ELF files: {st}, peak RSS {peak} KiB");
    assert!(st.success(), "{st}: {err}");
    assert!(peak < 200 * 1024, "peak RSS {peak} KiB");
    for h in &hostile {
        let note = format!("not unwound: {} claims a .eh_frame", h.display());
        assert!(out.contains(&note), "no note {note:?}:\n{out}");
    }
    assert!(out.contains("tkspin"), "no row for the spinner:\n{out}");
}

/// The one line of a refusal: non-zero exit, one line on stderr naming the file as a FIFO.
fn assert_refused(what: &str, st: ExitStatus, err: &str, path: &Path) {
    assert!(st.signal().is_none(), "{what}: killed by a signal: {st}");
    assert!(!st.success(), "{what}: exit 0: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{what}: {err}");
    assert!(
        err.contains(&path.display().to_string()) && err.contains("FIFO"),
        "{what}: {err}"
    );
}

/// Defect 7: `compare FIFO.tkr other.tkr` ends at once with a one-line error.
#[test]
fn compare_refuses_a_fifo_recording_at_once() {
    require_root();
    let dir = TmpDir::new("compare");
    let fifo = dir.0.join("a.tkr");
    mkfifo(&fifo);
    let other = dir.0.join("b.tkr");
    std::fs::write(&other, b"").unwrap();
    let what = "tracekit compare FIFO.tkr b.tkr";
    let args = ["compare", fifo.to_str().unwrap(), other.to_str().unwrap()];
    let (st, _, err) = bounded(tracekit(&args, &[]), what, Duration::from_secs(20));
    eprintln!("{what}: {st}: {}", err.trim_end());
    assert_refused(what, st, &err, &fifo);
}

/// Defect 7: `TRACEKIT_BTF=<FIFO> doctor` ends at once, saying why BTF is unusable; a tool ends
/// with a one-line error.
#[test]
fn a_fifo_as_tracekit_btf_is_refused_at_once() {
    require_root();
    let dir = TmpDir::new("btf");
    let fifo = dir.0.join("vmlinux");
    mkfifo(&fifo);
    let what = "TRACEKIT_BTF=FIFO tracekit doctor --json";
    let child = tracekit(&["doctor", "--json"], &[("TRACEKIT_BTF", &fifo)]);
    let (st, out, err) = bounded(child, what, Duration::from_secs(30));
    assert!(st.signal().is_none(), "{what}: {st}");
    let sys: serde_json::Value = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|l| l["type"] == "system")
        .unwrap_or_else(|| panic!("{what}: no system line: {out} {err}"));
    assert_eq!(sys["btf"], false, "{sys}");
    let why = sys["btf_error"].as_str().unwrap_or("");
    assert_eq!(
        why,
        format!("{} is a FIFO, not a regular file", fifo.display())
    );
    eprintln!("{what}: {st}, btf_error {why:?}");
    let what = "TRACEKIT_BTF=FIFO tracekit ctxsw --duration 1s";
    let child = tracekit(&["ctxsw", "--duration", "1s"], &[("TRACEKIT_BTF", &fifo)]);
    let (st, _, err) = bounded(child, what, Duration::from_secs(30));
    eprintln!("{what}: {st}: {}", err.trim_end());
    assert_refused(what, st, &err, &fifo);
}

/// A `TRACEKIT_PROC` tree: links to everything in /proc, except FIFOs at `stat`,
/// `pressure/cpu` and `sys/kernel/pid_max`.
fn proc_tree_with_fifos(root: &Path) {
    let link_all = |from: &Path, to: &Path, except: &[&str]| {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap().flatten() {
            let name = e.file_name();
            if !except.iter().any(|x| name == *x) {
                std::os::unix::fs::symlink(e.path(), to.join(&name)).unwrap();
            }
        }
    };
    link_all(Path::new("/proc"), root, &["stat", "pressure", "sys"]);
    mkfifo(&root.join("stat"));
    link_all(
        Path::new("/proc/pressure"),
        &root.join("pressure"),
        &["cpu"],
    );
    mkfifo(&root.join("pressure/cpu"));
    link_all(Path::new("/proc/sys"), &root.join("sys"), &["kernel"]);
    link_all(
        Path::new("/proc/sys/kernel"),
        &root.join("sys/kernel"),
        &["pid_max"],
    );
    mkfifo(&root.join("sys/kernel/pid_max"));
}

/// Defect 7: with FIFOs in the `TRACEKIT_PROC` tree, doctor and the tools that read those files
/// (ctxsw: stat and pid_max; triage: pressure) end on time, not by a signal.
#[test]
fn fifos_in_a_tracekit_proc_tree_do_not_hang() {
    require_root();
    let dir = TmpDir::new("proc");
    let root = dir.0.join("proc");
    proc_tree_with_fifos(&root);
    for args in [
        vec!["doctor"],
        vec!["ctxsw", "--duration", "1s"],
        vec!["triage", "--duration", "2s"],
    ] {
        let what = format!("TRACEKIT_PROC=tree tracekit {}", args.join(" "));
        let child = tracekit(&args, &[("TRACEKIT_PROC", &root)]);
        let (st, _, err) = bounded(child, &what, Duration::from_secs(60));
        eprintln!("{what}: {st}: {}", err.trim_end());
        assert!(st.signal().is_none(), "{what}: {st}");
        assert!(err.trim_end().lines().count() <= 1, "{what}: {err}");
    }
}

/// Defect 15b: a `TRACEKIT_BTF` copy of the kernel's BTF, truncated and rewritten in a loop,
/// during 30 `doctor` runs: none dies by a signal (12 of 30 died by SIGBUS while the file was
/// mapped).
#[test]
fn a_tracekit_btf_rewritten_during_runs_never_kills_doctor() {
    require_root();
    let dir = TmpDir::new("btf-rewrite");
    let btf = std::fs::read("/sys/kernel/btf/vmlinux").expect("kernel BTF");
    let path = dir.0.join("vmlinux");
    std::fs::write(&path, &btf).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (stop, path) = (stop.clone(), path.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // Truncate, then write back in pieces: a reader sees the file short and growing.
                let mut f = std::fs::File::create(&path).unwrap();
                for c in btf.chunks(256 << 10) {
                    std::io::Write::write_all(&mut f, c).unwrap();
                }
                n += 1;
                // Whole for a moment between rewrites: some runs read it whole, some mid-write.
                std::thread::sleep(Duration::from_millis(10));
            }
            n
        })
    };
    struct Stop(std::sync::Arc<std::sync::atomic::AtomicBool>);
    impl Drop for Stop {
        fn drop(&mut self) {
            self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    let guard = Stop(stop);
    let mut codes = std::collections::BTreeMap::new();
    for i in 0..30 {
        let what = format!("doctor run {i} with TRACEKIT_BTF rewritten");
        let child = tracekit(&["doctor", "--json"], &[("TRACEKIT_BTF", &path)]);
        let (st, _, err) = bounded(child, &what, Duration::from_secs(60));
        assert!(st.signal().is_none(), "{what}: {st}: {err}");
        *codes.entry(st.code().unwrap()).or_insert(0) += 1;
    }
    drop(guard);
    let rewrites = writer.join().unwrap();
    eprintln!(
        "30 doctor runs, {rewrites} rewrites of the BTF file: no signal; exit codes {codes:?}"
    );
}
