//! Stub BTF blobs for aya: enough for it to load tp_btf (and fentry) programs without parsing
//! all of vmlinux.

use super::{Btf, KIND_FUNC, KIND_INT, KIND_PTR, KIND_TYPEDEF, MAGIC};

impl Btf {
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
}
