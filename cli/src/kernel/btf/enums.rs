//! Enums: enumerator values by name or prefix, and every value of a named enum, so values that
//! change between kernels are read from BTF rather than compiled in.

use super::{Btf, KIND_ENUM, KIND_ENUM64};

impl Btf {
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

    /// Ids of every enum, 32- and 64-bit, in id order (the first of two same-named ones wins).
    fn enum_ids(&self) -> Vec<u32> {
        let mut ids = [self.of_kind(KIND_ENUM), self.of_kind(KIND_ENUM64)].concat();
        ids.sort_unstable();
        ids
    }

    fn enum_values_where(&self, want: impl Fn(&[u8]) -> bool) -> Vec<(String, i64)> {
        let mut out = Vec::new();
        for id in self.enum_ids() {
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
        let id = self.enum_ids().into_iter().find(|&id| {
            matches!(self.ty(id), Some((n, _, _, vlen, _, _)) if vlen > 0 && self.str_at(n) == name.as_bytes())
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
mod tests {
    use std::path::Path;

    use super::super::VMLINUX;
    use super::*;

    /// Enum values on the running kernel (io-lat and net-rx depend on them), when its BTF is
    /// present.
    #[test]
    fn reads_enums_if_present() {
        if !Path::new(VMLINUX).exists() {
            return;
        }
        let btf = Btf::from_sys_fs().unwrap();
        let reasons = btf.enum_named("skb_drop_reason").unwrap();
        assert!(reasons.contains(&("SKB_DROP_REASON_NO_SOCKET".to_string(), 3)));
        let ops = btf.enum_named("req_op").unwrap();
        assert!(ops.contains(&("REQ_OP_READ".to_string(), 0)));
        assert!(ops.contains(&("REQ_OP_WRITE".to_string(), 1)));
        assert_eq!(btf.enum_named("no_such_enum_at_all"), None);
    }
}
