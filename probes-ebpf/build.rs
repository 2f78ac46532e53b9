fn main() {
    // Emits `bpf_target_arch` so aya-ebpf's architecture-specific code compiles.
    aya_build::emit_bpf_target_arch_cfg().expect("emit bpf_target_arch cfg");
}
