//! Builds the kernel programs in `probes-ebpf` (one object per tool) so the binary embeds them:
//! `target/release/tracekit` is one file that runs on a node with no toolchain.

use std::{env, path::PathBuf};

fn main() -> anyhow::Result<()> {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let root = manifest.parent().expect("cli/ has a parent").to_path_buf();
    let ebpf_dir = root.join("probes-ebpf");
    let common_dir = root.join("probes-common");
    println!(
        "cargo:rerun-if-changed={}",
        common_dir.join("src").display()
    );
    println!(
        "cargo:rerun-if-changed={}",
        common_dir.join("Cargo.toml").display()
    );

    // Build the BPF side with the same toolchain as the host side (stable), allowing
    // `-Z build-std=core` through RUSTC_BOOTSTRAP rather than requiring a nightly toolchain.
    let toolchain = env::var("RUSTUP_TOOLCHAIN").unwrap_or_else(|_| "stable".to_string());
    // SAFETY: build scripts are single-threaded; the variable is read by aya-build and the
    // cargo it spawns.
    unsafe { env::set_var("RUSTC_BOOTSTRAP", "1") };
    let ebpf_dir_str = ebpf_dir.to_str().expect("UTF-8 path");
    // probes-ebpf is its own workspace (it only builds for the BPF target); aya-build runs
    // `cargo build --package probes-ebpf` in the current directory, so run it from there.
    env::set_current_dir(&ebpf_dir)?;
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "probes-ebpf",
            root_dir: ebpf_dir_str,
            ..Default::default()
        }],
        aya_build::Toolchain::Custom(&toolchain),
    )
}
