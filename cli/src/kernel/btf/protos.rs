//! Function and tracepoint prototypes: how many parameters `btf_trace_<tp>` takes, their sizes
//! and type names, and whether a kernel function exists.

use super::{
    Btf, KIND_ENUM, KIND_ENUM64, KIND_FUNC_PROTO, KIND_PTR, KIND_STRUCT, KIND_TYPEDEF, KIND_UNION,
};

impl Btf {
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
        self.find_func(name).is_some()
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::{fixture::fixture, VMLINUX};
    use super::*;

    #[test]
    fn reads_tracepoint_prototypes() {
        let btf = Btf::parse(fixture(), "fixture").unwrap();
        assert_eq!(btf.proto_params("btf_trace_sched_switch"), Some(3));
        assert_eq!(btf.proto_params("nope"), None);
        let ty = |i| btf.proto_param_type("btf_trace_sched_switch", i);
        assert_eq!(ty(0).as_deref(), Some("long long unsigned int"));
        assert_eq!(ty(1).as_deref(), Some("struct task_struct *"));
        assert_eq!(ty(3), None);
    }

    /// Tracepoint parameter types on the running kernel (io-lat depends on them), when its BTF
    /// is present.
    #[test]
    fn reads_tracepoint_parameters_if_present() {
        if !Path::new(VMLINUX).exists() {
            return;
        }
        let btf = Btf::from_sys_fs().unwrap();
        assert_eq!(
            btf.proto_param_type("btf_trace_block_rq_issue", 1)
                .as_deref(),
            Some("struct request *")
        );
        assert_eq!(btf.proto_param_type("btf_trace_block_rq_issue", 9), None);
    }
}
