//! Test fixtures: a BTF blob builder and a miniature `task_struct`.

use super::{
    KIND_ARRAY, KIND_FUNC_PROTO, KIND_INT, KIND_PTR, KIND_STRUCT, KIND_TYPEDEF, KIND_UNION, MAGIC,
};

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
