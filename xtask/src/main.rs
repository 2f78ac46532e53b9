//! Project tasks: `cargo xtask setup | build | run -- ARGS | test`.
//!
//! Every task first makes sure the toolchain pieces for the kernel side are present, installing
//! what is missing (and saying what and why), so a fresh machine needs nothing by hand.

use std::{
    env,
    path::{Path, PathBuf},
    process::{Command, ExitCode},
};

use anyhow::{bail, Context as _, Result};

mod bench;
mod toolchain;
mod vm;

const HOST_TARGET: &str = "x86_64-unknown-linux-gnu";

fn usage() -> &'static str {
    "usage: cargo xtask <setup | build | run -- ARGS | test [-- CARGO-TEST-ARGS] | vm-test [KERNEL...] | bench [--quick] [--only PAT,...] | bench --render>\n\
     \n  setup   install the kernel-side toolchain (rust-src, LLVM 22, bpf-linker 0.13.0) if missing\
     \n  build   build target/release/tracekit: one static file with its kernel programs embedded\
     \n  run     build, then run tracekit with ARGS (as root)\
     \n  test    build, then run every test: unit tests, the root tests against this kernel, and vm-test\
     \n  vm-test build, then run the checks on Debian's 5.10, 6.1 and 6.12 kernels (two NUMA nodes) under qemu;\
     \n          KERNEL... (or TRACEKIT_VM_KERNELS=5.10,6.12) picks some, TRACEKIT_VM_JOBS how many boot at once\
     \n  bench   overhead, start-up and memory beside libbpf-tools and bpftrace -> docs/benchmarks.md;\
     \n          --only PAT,... runs the tracers whose name holds a pattern (into target/bench-scratch/)"
}

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let res = match args.first().map(String::as_str) {
        Some("setup") => toolchain::ensure().map(|_| ()),
        Some("build") => build().map(|_| ()),
        Some("run") => run(&args[1..]),
        Some("test") => test(&args[1..]),
        Some("bench") => bench::run(&args[1..]),
        Some("vm-test") => build().and_then(|bin| vm::vm_test(&bin, &args[1..].join(","))),
        Some("-h" | "--help" | "help") => {
            println!("{}", usage());
            Ok(())
        }
        _ => {
            eprintln!("{}", usage());
            return ExitCode::from(2);
        }
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// `cargo` with the environment every build shares: ~/.cargo/bin on PATH (bpf-linker), and a
/// statically linked host binary so `tracekit` runs on any x86_64 node whatever its libc.
/// `--target` is explicit so the static flag does not reach build scripts and proc macros.
pub fn cargo() -> Command {
    let mut c = Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    c.env("PATH", toolchain::path_with_cargo_bin());
    c.env(
        "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS",
        "-C target-feature=+crt-static",
    );
    c
}

pub fn status(mut c: Command) -> Result<()> {
    let s = c.status().with_context(|| format!("running {c:?}"))?;
    if !s.success() {
        bail!("{c:?} failed: {s}");
    }
    Ok(())
}

/// Builds the release binary and copies it to `target/release/tracekit`.
pub fn build() -> Result<PathBuf> {
    toolchain::ensure()?;
    let mut c = cargo();
    c.args([
        "build",
        "--release",
        "--target",
        HOST_TARGET,
        "-p",
        "tracekit",
        "-p",
        "tracekit-tests",
    ]);
    status(c)?;
    let built = root()
        .join("target")
        .join(HOST_TARGET)
        .join("release/tracekit");
    let dest_dir = root().join("target/release");
    std::fs::create_dir_all(&dest_dir)?;
    let dest = dest_dir.join("tracekit");
    // Replace, never write through: a running copy keeps its inode.
    let tmp = dest_dir.join(".tracekit.tmp");
    std::fs::copy(&built, &tmp).with_context(|| format!("copying {}", built.display()))?;
    std::fs::rename(&tmp, &dest)?;
    eprintln!("xtask: built {}", dest.display());
    Ok(dest)
}

fn run(args: &[String]) -> Result<()> {
    let bin = build()?;
    let args = match args.first().map(String::as_str) {
        Some("--") => &args[1..],
        _ => args,
    };
    let s = Command::new(&bin).args(args).status()?;
    if !s.success() {
        bail!("tracekit exited with {s}");
    }
    Ok(())
}

fn test(extra: &[String]) -> Result<()> {
    let bin = build()?;
    toolchain::ensure_debian(
        &["tmux"],
        "the `ctxsw --top` test drives the live view in a tmux pseudo-terminal",
    )?;
    toolchain::ensure_debian(
        &["fio", "bpftrace", "nftables"],
        "the root tests compare with fio and bpftrace, and count drops against an nft rule's counter",
    )?;
    toolchain::ensure_debian(
        &["podman", "runc", "busybox-static"],
        "the container tests run named podman containers (runc: crun refuses the v1 hybrid) from an image built offline with busybox",
    )?;
    toolchain::ensure_debian(
        &["prometheus", "prometheus-alertmanager", "python3-yaml"],
        "the exporter test has a real Prometheus scrape `tracekit serve`, and the fleet test a real Alertmanager send the shipped alerts to a webhook; the deploy/ manifests are parsed",
    )?;
    toolchain::ensure_debian(
        &["nginx", "apache2-utils", "postgresql", "iperf3"],
        "real software staged into incidents: nginx's accept queue overflowed with ab, PostgreSQL's WAL flushes under pgbench, iperf3's UDP receiver overrun (each the test's own instance on loopback or a Unix socket)",
    )?;
    toolchain::ensure_debian(
        &["chromium"],
        "the compare test renders its --html page in headless Chromium",
    )?;
    toolchain::ensure_debian(
        &["linux-perf", "gcc", "libc6-dev"],
        "the profile tests compare with `perf record` on a C program the test builds (libc6-dev: crt files and libc.a, which gcc does not pull in without recommends)",
    )?;
    toolchain::ensure_debian(
        &["golang-go"],
        "the profile test reads `--pprof`'s file with `go tool pprof`, the reader Pyroscope and Grafana follow",
    )?;
    toolchain::ensure_debian(
        &["util-linux"],
        "the capability tests run tracekit as nobody with exact capabilities (setpriv), the --output tests mount small tmpfs",
    )?;
    let mut c = cargo();
    // Every failing test file is reported in one run, not just the first.
    c.args([
        "test",
        "--release",
        "--target",
        HOST_TARGET,
        "--workspace",
        "--no-fail-fast",
    ]);
    c.env("TRACEKIT_BIN", &bin);
    let extra = match extra.first().map(String::as_str) {
        Some("--") => &extra[1..],
        _ => extra,
    };
    if !extra.is_empty() {
        c.arg("--").args(extra);
    }
    let host = status(c);
    // The same suite's checks on the other kernels, even when a host test failed, so one run
    // shows both; a filtered run (extra args) skips them.
    let vms = if extra.is_empty() {
        vm::vm_test(&bin, "")
    } else {
        Ok(())
    };
    match (host, vms) {
        (Ok(()), vms) => vms.context("the VM checks failed"),
        (Err(h), Ok(())) => Err(h).context("the tests on this host failed"),
        // Both, so neither hides the other.
        (Err(h), Err(v)) => {
            bail!("the tests on this host failed: {h:#}\nand the VM checks failed: {v:#}")
        }
    }
}
