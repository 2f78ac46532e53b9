//! A containerised binary, symbolised through the process's own root (issue 19): it exists
//! only inside a podman container's root filesystem.

use std::path::PathBuf;

use tracekit_tests::podman::Pod;

use super::*;

/// Where the hot program lives inside the container's image, and nowhere on the host.
const CTR_BIN: &str = "/opt/tk/tk_ctr_hot";

/// perf's top symbol for `pid`'s samples in `data` (`perf report --stdio --sort sym`), if
/// perf named one.
fn perf_top_symbol(data: &Path) -> Option<String> {
    let out = Command::new("perf")
        .args(["report", "--stdio", "--sort", "sym", "--no-children", "-i"])
        .arg(data)
        .output()
        .ok()?;
    // `    97.50%  [.] tk_hot_spin`: the first row is the top one.
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim_start().starts_with('#') && l.contains('%'))
        .find_map(|l| l.split_once("] ").map(|(_, s)| s.trim().to_string()))
}

/// A statically linked C program (frame pointers on) whose time goes to `tk_hot_spin`, run in a
/// podman container from an image imported offline; the binary exists only in the container's
/// root filesystem. tracekit, run twice at once (DWARF unwinding, the default with `--comm`,
/// which reads the binary's CFI; and frame pointers), names the hot function for ≥ 80 % of the
/// process's samples and puts the container's name on its rows; `perf record -p` beside them
/// names the same top function where it resolves it.
#[test]
fn container_binary_is_symbolised_through_its_root() {
    let (mut pod, name, dir) = image_of("tk-prof-ctr", &hot_c(), CTR_BIN);
    let built = dir.join("tk_ctr_hot");
    let pid = pod.run(&name, &[CTR_BIN, "60"]);

    // The binary is the container's only: not at that path on the host, nor left where it was
    // built; the process runs it from its own root.
    assert!(!Path::new(CTR_BIN).exists(), "{CTR_BIN} exists on the host");
    assert!(!built.exists());
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    assert_eq!(exe, Path::new(CTR_BIN));
    assert!(Path::new(&format!("/proc/{pid}/root{CTR_BIN}")).exists());

    let data = dir.join("perf.data");
    let mut dwarf = Tracer::spawn(&["profile", "--json", "--comm", "tk_ctr_hot"]);
    let mut fp = Tracer::spawn(&[
        "profile",
        "--json",
        "--unwind",
        "fp",
        "--comm",
        "tk_ctr_hot",
    ]);
    assert_eq!(dwarf.wait_attached()["unwind"], "dwarf");
    assert_eq!(fp.wait_attached()["unwind"], "fp");
    let perf = Command::new("perf")
        .args([
            "record",
            "-F",
            "99",
            "-g",
            "-q",
            "-p",
            &pid.to_string(),
            "-o",
        ])
        .arg(&data)
        .args(["--", "sleep", "4"])
        .status()
        .expect("perf record (Debian package linux-perf)");
    assert!(perf.success());
    for (mode, tk) in [("dwarf", dwarf), ("fp", fp)] {
        tk.signal(libc::SIGINT);
        let (status, lines, stderr) = tk.finish(Duration::from_secs(30));
        assert!(status.success(), "{stderr}");
        check_container_row(&lines, pid, &name, mode);
    }
    match perf_top_symbol(&data) {
        // perf names it: the same top function.
        Some(sym) if !sym.starts_with("0x") => {
            eprintln!("perf report: top symbol {sym}");
            assert_eq!(sym, HOT, "perf's top symbol");
        }
        other => eprintln!("perf did not resolve the container's binary: {other:?}"),
    }
    drop(pod);
    let _ = std::fs::remove_dir_all(dir);
}

/// An image holding C program `source`, built static (frame pointers on), at `path` only: the
/// binary built is removed once imported. Returns the pod, a container name for it (`prefix`
/// and this test process's pid) and the scratch directory.
pub fn image_of(prefix: &str, source: &str, path: &str) -> (Pod, String, PathBuf) {
    require_root();
    tracekit_tests::podman::podman_ready();
    let name = format!("{prefix}-{}", std::process::id());
    let dir = scratch(prefix);
    let file = path.rsplit('/').next().unwrap();
    let built = build_c_with(&dir, file, source, &["-static"]);
    let pod = Pod::import(&format!("localhost/{name}:latest"), &dir, &[(&built, path)]);
    std::fs::remove_file(&built).unwrap();
    (pod, name, dir)
}

/// `pid`'s rows name container `name`, and ≥ 80 % of its samples are in the hot function.
fn check_container_row(lines: &[Value], pid: u32, name: &str, mode: &str) {
    let pid64 = u64::from(pid);
    let procs = rows(lines, "process", pid64);
    assert!(!procs.is_empty(), "no process row for pid {pid}");
    for r in &procs {
        assert_eq!(r["container"], name, "{mode}: the row's container: {r}");
    }
    let (samples, hot, top) = shares(lines, pid64, HOT).unwrap();
    let share = hot as f64 / samples.max(1) as f64;
    eprintln!(
        "tracekit --unwind {mode}: {hot} of {samples} samples ({:.1} %) in {HOT}, top {top}",
        share * 100.0
    );
    assert!(samples >= 20, "{mode}: only {samples} samples");
    assert!(
        share >= 0.8,
        "{mode}: {hot} of {samples} samples in {HOT} (top {top})"
    );
    assert_eq!(top, HOT, "{mode}");
}
