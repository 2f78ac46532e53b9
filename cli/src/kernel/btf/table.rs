//! The raw type table: reading and validating the blob, indexing where each type record starts,
//! decoding one record, following typedefs and sizing types.

use std::path::Path;

use super::{
    data::Data, Btf, BtfError, KIND_ARRAY, KIND_CONST, KIND_DATASEC, KIND_DECL_TAG, KIND_ENUM,
    KIND_ENUM64, KIND_FLOAT, KIND_FUNC, KIND_FUNC_PROTO, KIND_FWD, KIND_INT, KIND_PTR,
    KIND_RESTRICT, KIND_STRUCT, KIND_TYPEDEF, KIND_TYPE_TAG, KIND_UNION, KIND_VAR, KIND_VOLATILE,
    MAGIC, MAX_BTF_BYTES, VMLINUX,
};

/// Whether `file` is on sysfs, whose files no one can truncate (so a mapping of one never
/// faults past its end).
fn on_sysfs(file: &std::fs::File) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: a zeroed statfs is a valid out-parameter; plain syscall on a descriptor we hold.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let rc = unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) };
    rc == 0 && st.f_type == libc::SYSFS_MAGIC
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
        let host = |e| match e {
            crate::host::HostError::TooLarge { .. } => too_large(),
            crate::host::HostError::Read { source, .. } => io(source),
            other => BtfError::Host(other),
        };
        // Opened non-blocking and only if a regular file: `TRACEKIT_BTF` may name a FIFO or a
        // device.
        let file = crate::host::open_regular(path, MAX_BTF_BYTES).map_err(host)?;
        // mmap where the file cannot be truncated under us: reading the 5–6 MB sysfs file costs
        // ~1,300 read() calls of one page each (3–9 ms here, most of tracekit's start-up); the
        // mapping costs ~50 µs. Any other file (`TRACEKIT_BTF`) is read into memory: a mapping
        // of a file rewritten during the run dies by SIGBUS on the first page past its new end.
        let data = match on_sysfs(&file).then(|| Data::map(&file)).flatten() {
            Some(d) => d,
            None => {
                Data::Heap(crate::host::read_limited(&file, path, MAX_BTF_BYTES).map_err(host)?)
            }
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
            by_kind: Vec::new(),
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

    pub(super) fn u32_at(&self, at: usize) -> Result<u32, BtfError> {
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
        let mut by_kind: Vec<Vec<u32>> = vec![Vec::new(); 32];
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
            by_kind[kind as usize].push(types.len() as u32);
            at += 12 + extra;
        }
        if at != end {
            return Err(self.corrupt(at));
        }
        self.types = types;
        self.by_kind = by_kind;
        Ok(())
    }

    /// Ids of the first type of `kind` named after each of `names` (0 where none), in one pass
    /// that compares names only for records of that kind. `nonempty` skips members-less
    /// records (forward-declared structs).
    pub(super) fn find_kind(&self, kind: u32, names: &[&str], nonempty: bool) -> Vec<u32> {
        let mut found = vec![0u32; names.len()];
        let mut left = names.len();
        let data: &[u8] = &self.data;
        for &id in self.of_kind(kind) {
            let at = self.types[id as usize - 1] as usize;
            let w = &data[at..at + 8];
            let info = u32::from_ne_bytes([w[4], w[5], w[6], w[7]]);
            if nonempty && info & 0xffff == 0 {
                continue;
            }
            let name = self.str_at(u32::from_ne_bytes([w[0], w[1], w[2], w[3]]));
            for (j, n) in names.iter().enumerate() {
                if found[j] == 0 && name == n.as_bytes() {
                    found[j] = id;
                    left -= 1;
                }
            }
            if left == 0 {
                break;
            }
        }
        found
    }

    /// Ids of every type of `kind` (`BTF_KIND_*`), in id order.
    pub(super) fn of_kind(&self, kind: u32) -> &[u32] {
        self.by_kind.get(kind as usize).map_or(&[], Vec::as_slice)
    }

    /// Type id of the typedef named `name` (e.g. `btf_trace_sched_switch`).
    pub fn find_typedef(&self, name: &str) -> Option<u32> {
        Some(self.find_kind(KIND_TYPEDEF, &[name], false)[0]).filter(|&id| id != 0)
    }

    /// Type id of the function named `name` (`BTF_KIND_FUNC`: what fentry attaches to).
    pub fn find_func(&self, name: &str) -> Option<u32> {
        Some(self.find_kind(KIND_FUNC, &[name], false)[0]).filter(|&id| id != 0)
    }

    pub(super) fn str_at(&self, off: u32) -> &[u8] {
        let start = self.str_start + off as usize;
        if start >= self.str_end {
            return b"";
        }
        let s = &self.data[start..self.str_end];
        let end = s.iter().position(|&b| b == 0).unwrap_or(s.len());
        &s[..end]
    }

    /// (name_off, kind, kind_flag, vlen, size_or_type, record offset) of type `id`.
    pub(super) fn ty(&self, id: u32) -> Option<(u32, u32, bool, usize, u32, usize)> {
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

    /// Follows typedefs and qualifiers to the underlying type.
    pub(super) fn resolve(&self, mut id: u32) -> u32 {
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
    pub(super) fn size_of(&self, id: u32) -> u32 {
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
}

#[cfg(test)]
mod tests {
    use super::super::fixture::fixture;
    use super::*;

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
}
