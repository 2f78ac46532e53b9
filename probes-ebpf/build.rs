fn main() {
    // Emits `bpf_target_arch` so aya-ebpf's architecture-specific code compiles.
    aya_build::emit_bpf_target_arch_cfg().expect("emit bpf_target_arch cfg");
    // bpf-linker asks LLVM for `--bpf-expand-memcpy-in-order` by default, which sets the BPF
    // backend's stores-per-memset/memcpy limits to zero: every zeroed array or struct copy,
    // 12 bytes or 80, became a call to aya-ebpf's byte-at-a-time `memset`/`memcpy` loop (five
    // instructions per byte; io-lat's new request entry and net-rx's drop key paid for two or
    // three per event). Without it LLVM stores the bytes inline, a word at a time where the
    // alignment allows. The flag only exists for JITs that pattern-match in-order copies.
    println!("cargo:rustc-link-arg=--disable-expand-memcpy-in-order");
}
