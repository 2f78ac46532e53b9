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

use std::path::Path;

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

/// The BTF bytes: a private read-only mapping of the file where the kernel allows it
/// (/sys/kernel/btf/vmlinux is mmap-able since Linux 6.16: no copy at all), else a heap copy.
enum Data {
    Mmap { ptr: *const u8, len: usize },
    Heap(Vec<u8>),
}

// SAFETY: the mapping is private and read-only, never written or unmapped before drop.
unsafe impl Send for Data {}
// SAFETY: as above; shared access is read-only.
unsafe impl Sync for Data {}

impl std::ops::Deref for Data {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            // SAFETY: `ptr` maps `len` readable bytes for as long as `self` lives.
            Data::Mmap { ptr, len } => unsafe { std::slice::from_raw_parts(*ptr, *len) },
            Data::Heap(v) => v,
        }
    }
}

impl Drop for Data {
    fn drop(&mut self) {
        if let Data::Mmap { ptr, len } = self {
            // SAFETY: unmaps exactly the mapping made in `Data::map`.
            unsafe { libc::munmap(*ptr as *mut libc::c_void, *len) };
        }
    }
}

impl Data {
    /// Maps `file` privately and read-only; `None` where the file does not support mmap
    /// (kernels before 6.16 for /sys/kernel/btf/vmlinux, some file systems).
    fn map(file: &std::fs::File) -> Option<Data> {
        use std::os::fd::AsRawFd;
        let len = file.metadata().ok()?.len() as usize;
        if len == 0 {
            return None;
        }
        // SAFETY: a fresh private read-only mapping of a file we hold open; checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return None;
        }
        Some(Data::Mmap {
            ptr: ptr as *const u8,
            len,
        })
    }
}

pub struct Btf {
    name: String,
    data: Data,
    type_start: usize,
    type_end: usize,
    str_start: usize,
    str_end: usize,
    /// Byte offset of each type record; index = type id - 1.
    types: Vec<u32>,
}

impl Btf {
    /// The running kernel's BTF.
    pub fn from_sys_fs() -> Result<Btf, BtfError> {
        Btf::from_file(Path::new(VMLINUX))
    }

    pub fn from_file(path: &Path) -> Result<Btf, BtfError> {
        let io = |source| BtfError::Io {
            path: path.display().to_string(),
            source,
        };
        let too_large = || BtfError::TooLarge {
            path: path.display().to_string(),
            limit_mib: MAX_BTF_BYTES >> 20,
        };
        // mmap first: reading the 5–6 MB sysfs file costs ~1,300 read() calls of one page each
        // (3–9 ms here, most of tracekit's start-up); the mapping costs ~50 µs. Only regular
        // files within the cap are mapped: `TRACEKIT_BTF` may name a device or a FIFO.
        let file = std::fs::File::open(path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if meta.is_file() && meta.len() > MAX_BTF_BYTES {
            return Err(too_large());
        }
        let data = match meta.is_file().then(|| Data::map(&file)).flatten() {
            Some(d) => d,
            None => Data::Heap(crate::host::read_capped(path, MAX_BTF_BYTES).map_err(
                |e| match e {
                    crate::host::HostError::TooLarge { .. } => too_large(),
                    crate::host::HostError::Read { source, .. } => io(source),
                    other => io(std::io::Error::other(other.to_string())),
                },
            )?),
        };
        Btf::from_data(data, &path.display().to_string())
    }

    /// Parses a raw BTF blob (as in /sys/kernel/btf/vmlinux), in host byte order.
    pub fn parse(data: Vec<u8>, name: &str) -> Result<Btf, BtfError> {
        Btf::from_data(Data::Heap(data), name)
    }

    fn from_data(data: Data, name: &str) -> Result<Btf, BtfError> {
        let bad = || BtfError::BadHeader(name.to_string());
        if data.len() < 24 || u16::from_ne_bytes([data[0], data[1]]) != MAGIC {
            return Err(bad());
        }
        let u = |at: usize| u32::from_ne_bytes(data[at..at + 4].try_into().unwrap()) as usize;
        let hdr_len = u(4);
        let (type_off, type_len, str_off, str_len) = (u(8), u(12), u(16), u(20));
        let type_start = hdr_len.checked_add(type_off).ok_or_else(bad)?;
        let type_end = type_start.checked_add(type_len).ok_or_else(bad)?;
        let str_start = hdr_len.checked_add(str_off).ok_or_else(bad)?;
        let str_end = str_start.checked_add(str_len).ok_or_else(bad)?;
        if hdr_len < 24 || type_end > data.len() || str_end > data.len() {
            return Err(bad());
        }
        let mut btf = Btf {
            name: name.to_string(),
            data,
            type_start,
            type_end,
            str_start,
            str_end,
            types: Vec::new(),
        };
        btf.index()?;
        Ok(btf)
    }

    fn corrupt(&self, at: usize) -> BtfError {
        BtfError::Corrupt {
            what: self.name.clone(),
            at,
        }
    }

    fn u32_at(&self, at: usize) -> Result<u32, BtfError> {
        self.data
            .get(at..at + 4)
            .map(|b| u32::from_ne_bytes(b.try_into().unwrap()))
            .ok_or_else(|| self.corrupt(at))
    }

    /// Records where each type starts; validates record lengths. One tight pass over the type
    /// section (~0.5 ms for vmlinux's ~130k types): only each record's `info` word is read.
    fn index(&mut self) -> Result<(), BtfError> {
        let data: &[u8] = &self.data;
        let end = self.type_end;
        let mut at = self.type_start;
        // A vmlinux type record averages ~24 bytes; reserve accordingly to avoid regrowth.
        let mut types = Vec::with_capacity((end - at) / 20);
        while at < end {
            let Some(w) = data.get(at + 4..at + 8) else {
                return Err(self.corrupt(at));
            };
            if at + 12 > end {
                return Err(self.corrupt(at));
            }
            let info = u32::from_ne_bytes([w[0], w[1], w[2], w[3]]);
            let (kind, vlen) = ((info >> 24) & 0x1f, (info & 0xffff) as usize);
            let extra = match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_PTR | KIND_FWD | KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT
                | KIND_FUNC | KIND_FLOAT | KIND_TYPE_TAG => 0,
                KIND_ARRAY => 12,
                KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
                KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen,
                _ => {
                    return Err(BtfError::UnknownKind {
                        what: self.name.clone(),
                        kind,
                        id: types.len() as u32 + 1,
                    })
                }
            };
            types.push(at as u32);
            at += 12 + extra;
        }
        if at != end {
            return Err(self.corrupt(at));
        }
        self.types = types;
        Ok(())
    }

    /// Ids of the first type of `kind` named after each of `names` (0 where none), in one pass
    /// that compares names only for records of that kind. `nonempty` skips members-less
    /// records (forward-declared structs).
    fn find_kind(&self, kind: u32, names: &[&str], nonempty: bool) -> Vec<u32> {
        let mut found = vec![0u32; names.len()];
        let mut left = names.len();
        let data: &[u8] = &self.data;
        for (i, &at) in self.types.iter().enumerate() {
            let at = at as usize;
            let w = &data[at..at + 8];
            let info = u32::from_ne_bytes([w[4], w[5], w[6], w[7]]);
            if (info >> 24) & 0x1f != kind || (nonempty && info & 0xffff == 0) {
                continue;
            }
            let name = self.str_at(u32::from_ne_bytes([w[0], w[1], w[2], w[3]]));
            for (j, n) in names.iter().enumerate() {
                if found[j] == 0 && name == n.as_bytes() {
                    found[j] = i as u32 + 1;
                    left -= 1;
                }
            }
            if left == 0 {
                break;
            }
        }
        found
    }

    /// Type id of the typedef named `name` (e.g. `btf_trace_sched_switch`).
    pub fn find_typedef(&self, name: &str) -> Option<u32> {
        Some(self.find_kind(KIND_TYPEDEF, &[name], false)[0]).filter(|&id| id != 0)
    }

    /// Type id of the function named `name` (`BTF_KIND_FUNC`: what fentry attaches to).
    pub fn find_func(&self, name: &str) -> Option<u32> {
        Some(self.find_kind(KIND_FUNC, &[name], false)[0]).filter(|&id| id != 0)
    }

    /// An aya `Btf` that is enough to load a tp_btf program on `btf_trace_<tp>` for each `tps`.
    ///
    /// aya's `BtfTracePoint::load` only looks the typedef `btf_trace_<tp>` up by name to learn
    /// its type id (the program's attach_btf_id); parsing all of vmlinux for that with aya costs
    /// about 30 ms, most of a tool's start-up. So this builds a small blob in which those
    /// typedefs sit at their real vmlinux ids, every other id being a placeholder `int`.
    /// `None` when a typedef is missing (the kernel lacks the tracepoint or tp_btf).
    pub fn tp_btf_stub(&self, tps: &[&str]) -> Option<aya::Btf> {
        let names: Vec<String> = tps.iter().map(|tp| format!("btf_trace_{tp}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        self.stub(KIND_TYPEDEF, &refs)
    }

    /// The same kind of stub for fentry/fexit programs on the kernel functions `funcs`: aya's
    /// `FEntry::load` only looks the `FUNC` up by name for its id.
    pub fn func_stub(&self, funcs: &[&str]) -> Option<aya::Btf> {
        self.stub(KIND_FUNC, funcs)
    }

    /// A blob in which the types of `kind` named `names` sit at their real vmlinux ids, pointing
    /// at a placeholder `int` (id 1); every other id is an anonymous pointer to it. `None` when
    /// a name is missing.
    fn stub(&self, kind: u32, names: &[&str]) -> Option<aya::Btf> {
        let ids = self.find_kind(kind, names, false);
        // Id 1 is the stub's placeholder int (in vmlinux it is never a typedef or a function).
        if ids.iter().any(|&id| id <= 1) {
            return None;
        }
        let wanted: Vec<(u32, &str)> = ids.into_iter().zip(names.iter().copied()).collect();
        let max = wanted.iter().map(|w| w.0).max()?;
        let mut strings = vec![0u8];
        let mut name_off = std::collections::HashMap::new();
        for (id, name) in &wanted {
            name_off.insert(*id, strings.len() as u32);
            strings.extend_from_slice(name.as_bytes());
            strings.push(0);
        }
        let mut types = Vec::with_capacity(max as usize * 12);
        let put = |v: &mut Vec<u8>, x: u32| v.extend_from_slice(&x.to_ne_bytes());
        for id in 1..=max {
            match name_off.get(&id) {
                // -> type 1 (the placeholder int): only the name, kind and id matter (a FUNC's
                // vlen is its linkage: global).
                Some(off) => {
                    put(&mut types, *off);
                    put(&mut types, kind << 24 | u32::from(kind == KIND_FUNC));
                    put(&mut types, 1);
                }
                // Type 1 is the placeholder int the named types point at; every other id is an
                // anonymous pointer to it (12 bytes, the smallest record aya accepts).
                None if id == 1 => {
                    put(&mut types, 0);
                    put(&mut types, KIND_INT << 24);
                    put(&mut types, 4);
                    put(&mut types, 32);
                }
                None => {
                    put(&mut types, 0);
                    put(&mut types, KIND_PTR << 24);
                    put(&mut types, 1);
                }
            }
        }
        let mut blob = Vec::with_capacity(24 + types.len() + strings.len());
        blob.extend_from_slice(&MAGIC.to_ne_bytes());
        blob.extend_from_slice(&[1, 0]);
        put(&mut blob, 24);
        put(&mut blob, 0);
        put(&mut blob, types.len() as u32);
        put(&mut blob, types.len() as u32);
        put(&mut blob, strings.len() as u32);
        blob.extend_from_slice(&types);
        blob.extend_from_slice(&strings);
        aya::Btf::parse(&blob, aya::Endianness::default()).ok()
    }

    fn str_at(&self, off: u32) -> &[u8] {
        let start = self.str_start + off as usize;
        if start >= self.str_end {
            return b"";
        }
        let s = &self.data[start..self.str_end];
        let end = s.iter().position(|&b| b == 0).unwrap_or(s.len());
        &s[..end]
    }

    /// (name_off, kind, kind_flag, vlen, size_or_type, record offset) of type `id`.
    fn ty(&self, id: u32) -> Option<(u32, u32, bool, usize, u32, usize)> {
        let at = *self.types.get((id as usize).checked_sub(1)?)? as usize;
        let name = self.u32_at(at).ok()?;
        let info = self.u32_at(at + 4).ok()?;
        let st = self.u32_at(at + 8).ok()?;
        Some((
            name,
            (info >> 24) & 0x1f,
            info >> 31 == 1,
            (info & 0xffff) as usize,
            st,
            at,
        ))
    }

    /// Number of types (ids are 1..=len).
    pub fn len(&self) -> usize {
        self.types.len()
    }

    pub fn is_empty(&self) -> bool {
        self.types.is_empty()
    }

    /// Id of the struct named `name` (the first with members, skipping empty declarations).
    pub fn find_struct(&self, name: &str) -> Option<u32> {
        Some(self.find_kind(KIND_STRUCT, &[name], true)[0]).filter(|&id| id != 0)
    }

    /// Follows typedefs and qualifiers to the underlying type.
    fn resolve(&self, mut id: u32) -> u32 {
        for _ in 0..32 {
            match self.ty(id) {
                Some((
                    _,
                    KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG,
                    _,
                    _,
                    t,
                    _,
                )) => id = t,
                _ => break,
            }
        }
        id
    }

    /// Size in bytes of type `id` (0 when it has none, e.g. void or a forward declaration).
    fn size_of(&self, id: u32) -> u32 {
        let id = self.resolve(id);
        match self.ty(id) {
            Some((
                _,
                KIND_INT | KIND_STRUCT | KIND_UNION | KIND_ENUM | KIND_ENUM64 | KIND_FLOAT,
                _,
                _,
                size,
                _,
            )) => size,
            Some((_, KIND_PTR, ..)) => 8,
            Some((_, KIND_ARRAY, _, _, _, at)) => {
                let elem = self.u32_at(at + 12).unwrap_or(0);
                let n = self.u32_at(at + 20).unwrap_or(0);
                self.size_of(elem).saturating_mul(n)
            }
            _ => 0,
        }
    }

    /// Searches the members of struct/union `id` for `name`, descending into anonymous
    /// structs and unions. Returns (bit offset from the start of `id`, member type, bitfield).
    fn member_in(&self, id: u32, name: &[u8], depth: u32) -> Option<(u32, u32, bool)> {
        if depth > 8 {
            return None;
        }
        let (_, kind, kflag, vlen, _, at) = self.ty(self.resolve(id))?;
        if kind != KIND_STRUCT && kind != KIND_UNION {
            return None;
        }
        for i in 0..vlen {
            let m = at + 12 + 12 * i;
            let (mname, mtype, moff) = (
                self.u32_at(m).ok()?,
                self.u32_at(m + 4).ok()?,
                self.u32_at(m + 8).ok()?,
            );
            let (bit_off, bitfield) = if kflag {
                (moff & 0xff_ffff, moff >> 24 != 0)
            } else {
                (moff, false)
            };
            if mname == 0 {
                if let Some((o, t, b)) = self.member_in(mtype, name, depth + 1) {
                    return Some((bit_off + o, t, b));
                }
            } else if self.str_at(mname) == name {
                return Some((bit_off, mtype, bitfield));
            }
        }
        None
    }

    /// Byte offset and size of `path` (members separated by dots) inside struct `strukt`.
    pub fn member(&self, strukt: &str, path: &str) -> Result<Member, BtfError> {
        let mut id = self
            .find_struct(strukt)
            .ok_or_else(|| BtfError::NoStruct(strukt.to_string()))?;
        let mut bits = 0u32;
        for part in path.split('.') {
            let (o, t, bitfield) =
                self.member_in(id, part.as_bytes(), 0)
                    .ok_or_else(|| BtfError::NoMember {
                        strukt: strukt.to_string(),
                        member: path.to_string(),
                    })?;
            if bitfield || o % 8 != 0 {
                return Err(BtfError::Bitfield {
                    strukt: strukt.to_string(),
                    member: path.to_string(),
                });
            }
            bits += o;
            id = t;
        }
        Ok(Member {
            offset: bits / 8,
            size: self.size_of(id),
        })
    }

    /// Number of parameters of the function prototype behind typedef `name` (a pointer to a
    /// FUNC_PROTO, as `btf_trace_<tracepoint>` typedefs are), if there is one.
    pub fn proto_params(&self, name: &str) -> Option<usize> {
        self.proto_param_sizes(name).map(|p| p.len())
    }

    /// Size in bytes of each parameter of the prototype behind typedef `name` (see
    /// [`Btf::proto_params`]). For `btf_trace_<tp>` the first is the probe's `void *` data, the
    /// rest are the tracepoint's arguments in order.
    pub fn proto_param_sizes(&self, name: &str) -> Option<Vec<u32>> {
        let (vlen, at) = self.proto_of(name)?;
        (0..vlen)
            .map(|i| {
                let ty = self.u32_at(at + 12 + 8 * i + 4).ok()?;
                Some(self.size_of(ty))
            })
            .collect()
    }

    /// Name of the type of parameter `idx` (0 = a tracepoint's `void *__data`) of the
    /// prototype behind typedef `name`, as written: `blk_status_t`, `int`, `struct request *`
    /// (one level of pointer shown as ` *`), so an argument whose type changed between kernels
    /// is told apart. `None` when there is no such parameter.
    pub fn proto_param_type(&self, name: &str, idx: usize) -> Option<String> {
        let (vlen, at) = self.proto_of(name)?;
        if idx >= vlen {
            return None;
        }
        let mut t = self.u32_at(at + 12 + 8 * idx + 4).ok()?;
        let mut suffix = "";
        if let Some((_, KIND_PTR, _, _, p, _)) = self.ty(t) {
            t = p;
            suffix = " *";
        }
        let (n, kind, ..) = self.ty(t)?;
        let prefix = match kind {
            KIND_STRUCT => "struct ",
            KIND_UNION => "union ",
            KIND_ENUM | KIND_ENUM64 => "enum ",
            _ => "",
        };
        Some(format!(
            "{prefix}{}{suffix}",
            String::from_utf8_lossy(self.str_at(n))
        ))
    }

    /// (parameter count, record offset) of the FUNC_PROTO behind typedef `name` (through one
    /// pointer, as `btf_trace_<tracepoint>` typedefs are).
    fn proto_of(&self, name: &str) -> Option<(usize, usize)> {
        let id = self.find_typedef(name)?;
        let (_, kind, _, _, t, _) = self.ty(id)?;
        let mut target = if kind == KIND_TYPEDEF { t } else { id };
        if let Some((_, KIND_PTR, _, _, t, _)) = self.ty(self.resolve(target)) {
            target = t;
        }
        match self.ty(self.resolve(target))? {
            (_, KIND_FUNC_PROTO, _, vlen, _, at) => Some((vlen, at)),
            _ => None,
        }
    }

    /// Whether a function named `name` is in the BTF (what fentry attaches to).
    pub fn has_func(&self, name: &str) -> bool {
        (1..=self.types.len() as u32).any(|id| {
            matches!(self.ty(id), Some((n, KIND_FUNC, ..)) if self.str_at(n) == name.as_bytes())
        })
    }

    /// The value of enumerator `name` (e.g. `SCAN_SUCCEED`) in any enum of the BTF.
    pub fn enum_value(&self, name: &str) -> Option<i64> {
        self.enum_values_where(|n| n == name.as_bytes())
            .into_iter()
            .next()
            .map(|(_, v)| v)
    }

    /// Every enumerator whose name starts with `prefix` (e.g. `COMPACT_`), with its value.
    pub fn enum_values(&self, prefix: &str) -> Vec<(String, i64)> {
        self.enum_values_where(|n| n.starts_with(prefix.as_bytes()))
    }

    fn enum_values_where(&self, want: impl Fn(&[u8]) -> bool) -> Vec<(String, i64)> {
        let mut out = Vec::new();
        for id in 1..=self.types.len() as u32 {
            let Some((_, kind, kflag, vlen, _, at)) = self.ty(id) else {
                continue;
            };
            let (step, wide) = match kind {
                KIND_ENUM => (8, false),
                KIND_ENUM64 => (12, true),
                _ => continue,
            };
            for i in 0..vlen {
                let m = at + 12 + step * i;
                let (Ok(n), Ok(lo)) = (self.u32_at(m), self.u32_at(m + 4)) else {
                    break;
                };
                let name = self.str_at(n);
                if !want(name) {
                    continue;
                }
                let v = if wide {
                    let hi = self.u32_at(m + 8).unwrap_or(0);
                    ((hi as u64) << 32 | lo as u64) as i64
                } else if kflag {
                    lo as i32 as i64
                } else {
                    lo as i64
                };
                out.push((String::from_utf8_lossy(name).into_owned(), v));
            }
        }
        out
    }

    /// The (name, value) pairs of `enum name` (e.g. `skb_drop_reason`, `req_flag_bits`), so
    /// values that change between kernels are named without a rebuild. `None` when absent.
    /// (By the enum's own name; [`Btf::enum_values`] matches enumerators by prefix.)
    pub fn enum_named(&self, name: &str) -> Option<Vec<(String, i64)>> {
        let id = (1..=self.types.len() as u32).find(|&id| {
            matches!(self.ty(id), Some((n, KIND_ENUM | KIND_ENUM64, _, vlen, _, _)) if vlen > 0 && self.str_at(n) == name.as_bytes())
        })?;
        let (_, kind, kflag, vlen, _, at) = self.ty(id)?;
        let mut out = Vec::with_capacity(vlen);
        for i in 0..vlen {
            // ENUM: {name_off, i32 val}; ENUM64: {name_off, lo32, hi32}; kind_flag = signed.
            let (m, val) = if kind == KIND_ENUM {
                let m = at + 12 + 8 * i;
                let raw = self.u32_at(m + 4).ok()?;
                (m, if kflag { raw as i32 as i64 } else { raw as i64 })
            } else {
                let m = at + 12 + 12 * i;
                let lo = self.u32_at(m + 4).ok()? as u64;
                let hi = self.u32_at(m + 8).ok()? as u64;
                (m, ((hi << 32) | lo) as i64)
            };
            let n = self.u32_at(m).ok()?;
            out.push((String::from_utf8_lossy(self.str_at(n)).into_owned(), val));
        }
        Some(out)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Builds BTF blobs for tests: the same bytes the kernel exports, for made-up types.
    pub struct Builder {
        types: Vec<u8>,
        strs: Vec<u8>,
        next_id: u32,
    }

    impl Builder {
        pub fn new() -> Builder {
            Builder {
                types: Vec::new(),
                strs: vec![0],
                next_id: 1,
            }
        }
        fn s(&mut self, name: &str) -> u32 {
            if name.is_empty() {
                return 0;
            }
            let off = self.strs.len() as u32;
            self.strs.extend_from_slice(name.as_bytes());
            self.strs.push(0);
            off
        }
        fn rec(&mut self, name: &str, kind: u32, kflag: bool, vlen: u32, st: u32) -> u32 {
            let n = self.s(name);
            let info = (kind << 24) | vlen | if kflag { 1 << 31 } else { 0 };
            for w in [n, info, st] {
                self.types.extend_from_slice(&w.to_ne_bytes());
            }
            self.next_id += 1;
            self.next_id - 1
        }
        pub fn int(&mut self, name: &str, size: u32) -> u32 {
            let id = self.rec(name, KIND_INT, false, 0, size);
            self.types.extend_from_slice(&(size * 8).to_ne_bytes());
            id
        }
        pub fn typedef(&mut self, name: &str, t: u32) -> u32 {
            self.rec(name, KIND_TYPEDEF, false, 0, t)
        }
        pub fn ptr(&mut self, t: u32) -> u32 {
            self.rec("", KIND_PTR, false, 0, t)
        }
        pub fn array(&mut self, elem: u32, index: u32, n: u32) -> u32 {
            let id = self.rec("", KIND_ARRAY, false, 0, 0);
            for w in [elem, index, n] {
                self.types.extend_from_slice(&w.to_ne_bytes());
            }
            id
        }
        /// Members: (name, type, bit offset, bitfield size).
        pub fn composite(
            &mut self,
            kind: u32,
            name: &str,
            size: u32,
            members: &[(&str, u32, u32, u32)],
        ) -> u32 {
            let kflag = members.iter().any(|m| m.3 != 0);
            let id = self.rec(name, kind, kflag, members.len() as u32, size);
            for (n, t, off, bits) in members {
                let n = self.s(n);
                let off = if kflag { (bits << 24) | off } else { *off };
                for w in [n, *t, off] {
                    self.types.extend_from_slice(&w.to_ne_bytes());
                }
            }
            id
        }
        pub fn proto(&mut self, ret: u32, params: &[u32]) -> u32 {
            let id = self.rec("", KIND_FUNC_PROTO, false, params.len() as u32, ret);
            for p in params {
                self.types.extend_from_slice(&0u32.to_ne_bytes());
                self.types.extend_from_slice(&p.to_ne_bytes());
            }
            id
        }
        pub fn finish(self) -> Vec<u8> {
            let mut out = Vec::new();
            out.extend_from_slice(&MAGIC.to_ne_bytes());
            out.extend_from_slice(&[1, 0]);
            for w in [
                24u32,
                0,
                self.types.len() as u32,
                self.types.len() as u32,
                self.strs.len() as u32,
            ] {
                out.extend_from_slice(&w.to_ne_bytes());
            }
            out.extend_from_slice(&self.types);
            out.extend_from_slice(&self.strs);
            out
        }
    }

    /// A miniature `task_struct` laid out like the kernel's: nested structs, an anonymous
    /// union, a typedef, a bitfield, an array, and a forward-declared twin with no members.
    pub fn fixture() -> Vec<u8> {
        let mut b = Builder::new();
        let u64t = b.int("long long unsigned int", 8);
        let i32t = b.int("int", 4);
        let u8t = b.int("char", 1);
        let pid_t = b.typedef("pid_t", i32t);
        let _fwd = b.composite(KIND_STRUCT, "task_struct", 0, &[]);
        let sched_info = b.composite(
            KIND_STRUCT,
            "sched_info",
            32,
            &[("pcount", u64t, 0, 0), ("run_delay", u64t, 64, 0)],
        );
        let se = b.composite(
            KIND_STRUCT,
            "sched_entity",
            64,
            &[("load", u64t, 0, 0), ("nr_migrations", u64t, 320, 0)],
        );
        let anon = b.composite(
            KIND_UNION,
            "",
            8,
            &[("nvcsw", u64t, 0, 0), ("alias", u64t, 0, 0)],
        );
        let comm = b.array(u8t, i32t, 16);
        let task = b.composite(
            KIND_STRUCT,
            "task_struct",
            256,
            &[
                ("__state", u64t, 0, 0),
                ("flags", i32t, 64, 3),
                ("se", se, 128, 0),
                ("sched_info", sched_info, 640, 0),
                ("pid", pid_t, 896, 0),
                ("tgid", pid_t, 928, 0),
                ("", anon, 960, 0),
                ("nivcsw", u64t, 1024, 0),
                ("comm", comm, 1088, 0),
            ],
        );
        let tp = b.ptr(task);
        let proto = b.proto(0, &[u64t, tp, tp]);
        let pproto = b.ptr(proto);
        b.typedef("btf_trace_sched_switch", pproto);
        b.finish()
    }

    #[test]
    fn finds_members_nested_anonymous_and_typedefed() {
        let btf = Btf::parse(fixture(), "fixture").unwrap();
        assert_eq!(btf.len(), 14);
        let m = |p: &str| btf.member("task_struct", p).unwrap();
        assert_eq!(
            m("pid"),
            Member {
                offset: 112,
                size: 4
            }
        );
        assert_eq!(
            m("tgid"),
            Member {
                offset: 116,
                size: 4
            }
        );
        assert_eq!(
            m("nvcsw"),
            Member {
                offset: 120,
                size: 8
            }
        );
        assert_eq!(
            m("nivcsw"),
            Member {
                offset: 128,
                size: 8
            }
        );
        assert_eq!(
            m("sched_info.run_delay"),
            Member {
                offset: 88,
                size: 8
            }
        );
        assert_eq!(
            m("se.nr_migrations"),
            Member {
                offset: 56,
                size: 8
            }
        );
        assert_eq!(
            m("comm"),
            Member {
                offset: 136,
                size: 16
            }
        );
        assert_eq!(btf.proto_params("btf_trace_sched_switch"), Some(3));
        assert_eq!(btf.proto_params("nope"), None);
        let ty = |i| btf.proto_param_type("btf_trace_sched_switch", i);
        assert_eq!(ty(0).as_deref(), Some("long long unsigned int"));
        assert_eq!(ty(1).as_deref(), Some("struct task_struct *"));
        assert_eq!(ty(3), None);
    }

    #[test]
    fn errors_name_what_is_missing() {
        let btf = Btf::parse(fixture(), "fixture").unwrap();
        let e = btf.member("task_struct", "start_time").unwrap_err();
        assert_eq!(
            e.to_string(),
            "kernel BTF: struct task_struct has no member start_time"
        );
        assert!(matches!(
            btf.member("task_struct", "flags"),
            Err(BtfError::Bitfield { .. })
        ));
        assert!(matches!(
            btf.member("mm_struct", "pgd"),
            Err(BtfError::NoStruct(_))
        ));
        assert!(matches!(
            btf.member("task_struct", "se.nope"),
            Err(BtfError::NoMember { .. })
        ));
    }

    #[test]
    fn rejects_garbage_without_panicking() {
        assert!(matches!(
            Btf::parse(vec![0; 10], "x"),
            Err(BtfError::BadHeader(_))
        ));
        let good = fixture();
        // Every truncation is an error, never a panic.
        for n in 0..good.len() {
            // Past 24 bytes the header survives and its sections run past the end.
            let cut = good[..n].to_vec();
            assert!(Btf::parse(cut, "cut").is_err(), "prefix {n} parsed");
        }
        // An unknown kind.
        let mut bad = good.clone();
        bad[24 + 7] = 0x1f;
        assert!(Btf::parse(bad, "bad").is_err());
    }

    /// The running kernel's BTF, when there is one (not a fixture: a smoke check of scale).
    #[test]
    fn reads_this_kernel_if_present() {
        if !Path::new(VMLINUX).exists() {
            return;
        }
        let btf = Btf::from_sys_fs().unwrap();
        let pid = btf.member("task_struct", "pid").unwrap();
        let tgid = btf.member("task_struct", "tgid").unwrap();
        assert_eq!((pid.size, tgid.size), (4, 4));
        assert_eq!(tgid.offset, pid.offset + 4);
        assert_eq!(btf.member("task_struct", "nvcsw").unwrap().size, 8);
        assert_eq!(
            btf.member("task_struct", "sched_info.run_delay")
                .unwrap()
                .size,
            8
        );
    }

    /// Enum values and tracepoint parameter types on the running kernel (io-lat and net-rx
    /// depend on both), when its BTF is present.
    #[test]
    fn reads_enums_and_tracepoint_parameters_if_present() {
        if !Path::new(VMLINUX).exists() {
            return;
        }
        let btf = Btf::from_sys_fs().unwrap();
        let reasons = btf.enum_named("skb_drop_reason").unwrap();
        assert!(reasons.contains(&("SKB_DROP_REASON_NO_SOCKET".to_string(), 3)));
        let ops = btf.enum_named("req_op").unwrap();
        assert!(ops.contains(&("REQ_OP_READ".to_string(), 0)));
        assert!(ops.contains(&("REQ_OP_WRITE".to_string(), 1)));
        assert_eq!(
            btf.proto_param_type("btf_trace_block_rq_issue", 1)
                .as_deref(),
            Some("struct request *")
        );
        assert_eq!(btf.proto_param_type("btf_trace_block_rq_issue", 9), None);
        assert_eq!(btf.enum_named("no_such_enum_at_all"), None);
    }
}
