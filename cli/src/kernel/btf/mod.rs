//! A small, fast reader for the kernel's BTF (`/sys/kernel/btf/vmlinux`): find a struct by name
//! and the byte offset and size of a member, nested members included (`sched_info.run_delay`).
//!
//! Why not aya's `Btf`: `Btf::from_sys_fs` fixes up and indexes every type (≈30 ms here, most
//! of tracekit's start-up) and its public API does not expose member offsets. This reader only
//! records where each type record starts (one linear pass over ~5 MB, a few ms) and decodes
//! the handful of types a tool asks about. Rust BPF code has no CO-RE, so this is how kernel
//! struct offsets reach the programs (as read-only globals).
//!
//! Format: `include/uapi/linux/btf.h` (header, then type records, then a string section).

use data::Data;

mod data;
mod enums;
mod members;
mod protos;
mod stub;
mod table;

#[cfg(test)]
pub(crate) mod fixture;

pub const VMLINUX: &str = "/sys/kernel/btf/vmlinux";

const MAGIC: u16 = 0xeb9f;

const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FWD: u32 = 7;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_FLOAT: u32 = 16;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error("reading {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is larger than {limit_mib} MiB: not a kernel BTF file")]
    TooLarge { path: String, limit_mib: u64 },
    /// Not a regular file (a FIFO, a device).
    #[error(transparent)]
    Host(crate::host::HostError),
    #[error("{0}: not BTF (bad magic or truncated header)")]
    BadHeader(String),
    #[error("{what}: truncated or corrupt BTF at byte {at}")]
    Corrupt { what: String, at: usize },
    #[error("{what}: unknown BTF kind {kind} (type {id})")]
    UnknownKind { what: String, kind: u32, id: u32 },
    #[error("kernel BTF has no struct {0}")]
    NoStruct(String),
    #[error("kernel BTF: struct {strukt} has no member {member}")]
    NoMember { strukt: String, member: String },
    #[error("kernel BTF: {strukt}.{member} is a bitfield or not byte-aligned")]
    Bitfield { strukt: String, member: String },
}

/// Where a member lives inside its outermost struct.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member {
    /// Byte offset from the start of the outermost struct.
    pub offset: u32,
    /// Size in bytes of the member's type (0 if unknown, e.g. a forward declaration).
    pub size: u32,
}

/// The running kernel's BTF, parsed once per process and shared (tools read struct offsets
/// from it, the loader tp_btf attach ids).
pub fn vmlinux() -> Result<&'static Btf, BtfError> {
    static V: std::sync::OnceLock<Btf> = std::sync::OnceLock::new();
    if let Some(b) = V.get() {
        return Ok(b);
    }
    let b = Btf::from_file(&vmlinux_path())?;
    Ok(V.get_or_init(|| b))
}

/// Where the kernel's BTF is read from: `TRACEKIT_BTF` when set (a kernel built without
/// CONFIG_DEBUG_INFO_BTF can be given a BTF file generated for it, as BTFHub provides), else
/// /sys/kernel/btf/vmlinux.
pub fn vmlinux_path() -> std::path::PathBuf {
    std::env::var_os("TRACEKIT_BTF")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(VMLINUX))
}

/// Upper bound on a BTF file tracekit reads (vmlinux BTF is 5–10 MiB, 6 MiB here):
/// `TRACEKIT_BTF` may name anything, `/dev/zero` included.
pub const MAX_BTF_BYTES: u64 = 64 << 20;

pub struct Btf {
    name: String,
    data: Data,
    type_start: usize,
    type_end: usize,
    str_start: usize,
    str_end: usize,
    /// Byte offset of each type record; index = type id - 1.
    types: Vec<u32>,
    /// Type ids by kind (index = `BTF_KIND_*`), in id order: a lookup by name scans only the
    /// records of its kind (~9k structs, not ~130k types in vmlinux).
    by_kind: Vec<Vec<u32>>,
}
