//! A check of every embedded kernel object: no tunable is handed to a helper as data.
//!
//! Tunables are named read-only globals (`NUMA_START_NS`) that userspace patches before load
//! and programs read with `ro()`. rustc makes `&0` an unnamed constant, and LLVM merges such a
//! constant with any read-only global of the same value: numa's `get_or_insert(.., &0)` became
//! `r3 = NUMA_START_NS ll; call bpf_map_update_elem`, and a window's first task move counted
//! the attach time in nanoseconds (56,593,020,161 moves in a 5.10 guest). The verifier accepts
//! it (a read-only map value is a valid helper argument), so only the object shows it.
//!
//! The scan is linear from each load of a tunable's address to the next jump: enough for what
//! LLVM emits for an argument, and it never flags a plain `ro()` read.

use object::{Object as _, ObjectSection as _, ObjectSymbol as _, RelocationTarget};

/// BPF instruction classes and fields (include/uapi/linux/bpf.h, bpf_common.h).
const CLASS_LD: u8 = 0x00;
const CLASS_LDX: u8 = 0x01;
const CLASS_ALU: u8 = 0x04;
const CLASS_JMP: u8 = 0x05;
const CLASS_JMP32: u8 = 0x06;
const CLASS_ALU64: u8 = 0x07;
const OP_MOV: u8 = 0xb0;
const OP_CALL: u8 = 0x80;
const SRC_REG: u8 = 0x08;

/// Helpers that take no argument (include/uapi/linux/bpf.h): `bpf_ktime_get_ns` (5),
/// `bpf_get_prandom_u32` (7), `bpf_get_smp_processor_id` (8), `bpf_get_current_pid_tgid` (14),
/// `bpf_get_current_uid_gid` (15), `bpf_get_current_task` (35), `bpf_get_current_cgroup_id`
/// (80), `bpf_jiffies64` (118), `bpf_ktime_get_boot_ns` (125), `bpf_get_current_task_btf`
/// (158).
const NO_ARGS: [i32; 10] = [5, 7, 8, 14, 15, 35, 80, 118, 125, 158];

/// Whether the address loaded into a register by the `lddw` at `insns[at]` reaches a call in
/// an argument register (r1–r5) before the straight-line code ends.
pub fn reaches_call(insns: &[u8], at: usize) -> bool {
    let insn = |i: usize| insns.get(i * 8..i * 8 + 8);
    let Some(first) = insn(at) else { return false };
    // A bit per register holding the address.
    let mut held: u16 = 1 << (first[1] & 0xf);
    let mut i = at + 2; // lddw takes two slots
    while let Some(x) = insn(i) {
        let (code, dst, src) = (x[0], x[1] & 0xf, x[1] >> 4);
        let class = code & 0x07;
        match class {
            CLASS_JMP | CLASS_JMP32 if class == CLASS_JMP && code & 0xf0 == OP_CALL => {
                let imm = i32::from_le_bytes([x[4], x[5], x[6], x[7]]);
                // A helper without arguments reads none of r1–r5, whatever they hold (LLVM
                // leaves a tunable's address in r1 across `bpf_get_current_task()`).
                if held & 0b11_1110 != 0 && !NO_ARGS.contains(&imm) {
                    return true;
                }
                // r0–r5 are the callee's.
                held &= !0b11_1111;
            }
            CLASS_JMP | CLASS_JMP32 => return false,
            CLASS_ALU | CLASS_ALU64 if code & 0xf0 == OP_MOV => {
                if class == CLASS_ALU64 && code & SRC_REG != 0 && held & (1 << src) != 0 {
                    held |= 1 << dst;
                } else {
                    held &= !(1 << dst);
                }
            }
            CLASS_LD => {
                held &= !(1 << dst);
                i += 1;
            }
            CLASS_LDX => held &= !(1 << dst),
            // Pointer arithmetic keeps the address; stores define no register.
            _ => {}
        }
        if held == 0 {
            return false;
        }
        i += 1;
    }
    false
}

/// `object section: tunable` for each tunable of the object `name` whose address reaches a
/// helper call.
pub fn passed_to_helpers(name: &str, bytes: &[u8]) -> Result<Vec<String>, object::Error> {
    let file = object::File::parse(bytes)?;
    let mut found = Vec::new();
    for sec in file.sections() {
        let Ok(insns) = sec.data() else { continue };
        for (off, r) in sec.relocations() {
            let RelocationTarget::Symbol(si) = r.target() else {
                continue;
            };
            let Ok(sym) = file.symbol_by_index(si) else {
                continue;
            };
            let in_rodata = sym
                .section_index()
                .and_then(|s| file.section_by_index(s).ok())
                .and_then(|s| s.name().ok().map(|n| n.starts_with(".rodata")))
                .unwrap_or(false);
            if !in_rodata || !sym.is_global() || off % 8 != 0 {
                continue;
            }
            let at = off as usize / 8;
            if insns.get(at * 8) == Some(&0x18) && reaches_call(insns, at) {
                found.push(format!(
                    "{name} {}: {}",
                    sec.name().unwrap_or("?"),
                    sym.name().unwrap_or("?")
                ));
            }
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One instruction: opcode, dst, src, offset, immediate.
    fn ins(code: u8, dst: u8, src: u8, imm: i32) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[0] = code;
        b[1] = dst | (src << 4);
        b[4..].copy_from_slice(&imm.to_le_bytes());
        b
    }

    fn prog(parts: &[[u8; 8]]) -> Vec<u8> {
        parts.concat()
    }

    const LDDW: u8 = 0x18;
    const CALL: u8 = 0x85;
    const MOV_IMM: u8 = 0xb7;
    const MOV_REG: u8 = 0xbf;
    const LDX_DW: u8 = 0x79;
    const JA: u8 = 0x05;

    #[test]
    fn an_address_in_an_argument_register_at_a_call_is_found() {
        // What numa's object held: r3 = NUMA_START_NS ll; r4 = 1; call bpf_map_update_elem.
        let p = prog(&[
            ins(LDDW, 3, 0, 0),
            [0; 8],
            ins(MOV_IMM, 4, 0, 1),
            ins(CALL, 0, 0, 2),
        ]);
        assert!(reaches_call(&p, 0));
        // Copied first.
        let p = prog(&[
            ins(LDDW, 7, 0, 0),
            [0; 8],
            ins(MOV_REG, 2, 7, 0),
            ins(CALL, 0, 0, 1),
        ]);
        assert!(reaches_call(&p, 0));
    }

    #[test]
    fn a_read_of_the_value_is_not() {
        // ro(): r1 = X ll; r1 = *(u64 *)(r1 + 0); call.
        let p = prog(&[
            ins(LDDW, 1, 0, 0),
            [0; 8],
            ins(LDX_DW, 1, 1, 0),
            ins(CALL, 0, 0, 1),
        ]);
        assert!(!reaches_call(&p, 0));
        // Left in r1 across a helper that takes no argument (bpf_get_current_task), then
        // overwritten: not passed.
        let p = prog(&[
            ins(LDDW, 1, 0, 0),
            [0; 8],
            ins(CALL, 0, 0, 35),
            ins(CALL, 0, 0, 1),
        ]);
        assert!(!reaches_call(&p, 0));
        // The same in r2 across a helper that takes arguments: passed.
        let p = prog(&[ins(LDDW, 2, 0, 0), [0; 8], ins(CALL, 0, 0, 1)]);
        assert!(reaches_call(&p, 0));
        // Held in a callee-saved register across a call, then overwritten.
        let p = prog(&[
            ins(LDDW, 6, 0, 0),
            [0; 8],
            ins(CALL, 0, 0, 5),
            ins(MOV_IMM, 6, 0, 0),
            ins(CALL, 0, 0, 1),
        ]);
        assert!(!reaches_call(&p, 0));
        // The straight line ends at a jump.
        let p = prog(&[
            ins(LDDW, 3, 0, 0),
            [0; 8],
            ins(JA, 0, 0, 0),
            ins(CALL, 0, 0, 2),
        ]);
        assert!(!reaches_call(&p, 0));
        // Truncated text.
        assert!(!reaches_call(&[LDDW, 3], 0));
    }

    #[test]
    fn no_embedded_object_hands_a_tunable_to_a_helper() {
        // Every object cli/build.rs embedded, as the doctor's program check finds them.
        let mut found = Vec::new();
        let mut objects = 0;
        for e in std::fs::read_dir(env!("OUT_DIR")).unwrap().flatten() {
            let bytes = match std::fs::read(e.path()) {
                Ok(b) if b.starts_with(b"\x7fELF") => b,
                _ => continue,
            };
            let name = e.file_name().to_string_lossy().into_owned();
            found.extend(passed_to_helpers(&name, &bytes).expect("an embedded object parses"));
            objects += 1;
        }
        assert!(objects >= 8, "embedded objects: {objects}");
        assert!(
            found.is_empty(),
            "tunables passed to helpers (a constant like `&0` merged into them): {found:?}"
        );
    }
}
