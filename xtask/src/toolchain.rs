//! The kernel-side toolchain, installed idempotently:
//! - `rust-src` for the active toolchain (`-Z build-std=core` for bpfel-unknown-none);
//! - Debian's LLVM 22 development packages (bpf-linker links against libLLVM);
//! - `bpf-linker` 0.13.0 built against them (links the BPF objects).
//!
//! Each check is a file test or one quick command, so a second run installs nothing and costs
//! well under a second.

use std::{env, path::PathBuf, process::Command};

use anyhow::{bail, Context as _, Result};

const LLVM_PACKAGES: [&str; 3] = ["llvm-22-dev", "libpolly-22-dev", "libclang-22-dev"];
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";
const BPF_LINKER_VERSION: &str = "0.13.0";

fn cargo_home() -> PathBuf {
    env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env::var("HOME").unwrap_or_else(|_| "/root".into())).join(".cargo")
        })
}

/// PATH with `$CARGO_HOME/bin` first, where `cargo install` puts bpf-linker.
pub fn path_with_cargo_bin() -> String {
    let bin = cargo_home().join("bin");
    match env::var("PATH") {
        Ok(p) => format!("{}:{p}", bin.display()),
        Err(_) => format!("{}:/usr/local/bin:/usr/bin:/bin", bin.display()),
    }
}

fn output(cmd: &mut Command) -> Option<String> {
    let o = cmd.output().ok()?;
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).into_owned())
}

fn run(cmd: &mut Command) -> Result<()> {
    let s = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !s.success() {
        bail!("{cmd:?} failed: {s}");
    }
    Ok(())
}

pub fn ensure() -> Result<()> {
    ensure_rust_src()?;
    ensure_llvm()?;
    ensure_bpf_linker()?;
    Ok(())
}

fn ensure_rust_src() -> Result<()> {
    let toolchain = env::var("RUSTUP_TOOLCHAIN").unwrap_or_else(|_| "stable".into());
    let installed = output(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        &toolchain,
    ]))
    .unwrap_or_default();
    if installed.lines().any(|l| l.starts_with("rust-src")) {
        return Ok(());
    }
    eprintln!(
        "xtask: installing rust-src for {toolchain}: the BPF target builds `core` from source"
    );
    run(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", &toolchain]))
}

fn ensure_llvm() -> Result<()> {
    ensure_debian(
        &LLVM_PACKAGES,
        &format!("bpf-linker {BPF_LINKER_VERSION} links against LLVM 22"),
    )
}

/// Installs those of `packages` (Debian) that are missing, saying `why`; a no-op when all are
/// installed.
pub fn ensure_debian(packages: &[&str], why: &str) -> Result<()> {
    let status = output(
        Command::new("dpkg-query")
            .args(["-W", "-f=${Package} ${Status}\n"])
            .args(packages),
    )
    .unwrap_or_default();
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| {
            !status
                .lines()
                .any(|l| l.starts_with(&format!("{p} ")) && l.ends_with("install ok installed"))
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("xtask: installing {} (Debian): {why}", missing.join(" "));
    run(Command::new("apt-get").args(["update", "-q"]))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-q", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

fn ensure_bpf_linker() -> Result<()> {
    let bin = cargo_home().join("bin/bpf-linker");
    let version = output(Command::new(&bin).arg("--version")).unwrap_or_default();
    if version.contains(BPF_LINKER_VERSION) {
        return Ok(());
    }
    eprintln!(
        "xtask: installing bpf-linker {BPF_LINKER_VERSION} against {LLVM_PREFIX}: it links tracekit's kernel programs (takes a few minutes, once)"
    );
    run(
        Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args([
                "install",
                "bpf-linker",
                "--locked",
                "--version",
                BPF_LINKER_VERSION,
            ])
            .args(["--no-default-features", "--features", "llvm-22"])
            .env("LLVM_PREFIX", LLVM_PREFIX)
            .env("PATH", path_with_cargo_bin()),
    )
}
