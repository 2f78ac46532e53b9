//! `/proc/kallsyms`: which kernel functions exist (kprobe attach checks in the attach policy
//! and `doctor`), and which function a kernel code address is in (drop locations). Read once
//! per run, with a cap well above distribution kernels' ~15 MiB.

use std::collections::HashSet;

use super::{proc_path, read_capped, HostError};

/// Function names (text symbols, `t`/`T`), without module suffixes.
pub fn parse_functions(text: &str) -> HashSet<String> {
    text.lines()
        .filter_map(|l| {
            // `ffffffff81000000 T _stext` or `ffffffffc0a01000 t foo\t[module]`
            let mut it = l.split_whitespace();
            let (_, kind, name) = (it.next()?, it.next()?, it.next()?);
            matches!(kind, "t" | "T").then(|| name.to_string())
        })
        .collect()
}

pub fn functions() -> Result<HashSet<String>, HostError> {
    let b = read_capped(&proc_path("kallsyms"), super::LARGE_FILE)?;
    Ok(parse_functions(&String::from_utf8_lossy(&b)))
}

/// Text symbols by address, to name kernel code addresses: `__udp4_lib_rcv+0x4bc`.
pub struct Symbolizer(Vec<(u64, String)>);

impl Symbolizer {
    /// Text symbols (`t`/`T`) with a non-zero address (addresses read as 0 without
    /// CAP_SYSLOG, or with `kptr_restrict` 2: then nothing can be named).
    pub fn parse(text: &str) -> Symbolizer {
        let mut v: Vec<(u64, String)> = text
            .lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                let (addr, kind, name) = (it.next()?, it.next()?, it.next()?);
                let a = u64::from_str_radix(addr, 16).ok().filter(|&a| a != 0)?;
                matches!(kind, "t" | "T").then(|| (a, name.to_string()))
            })
            .collect();
        v.sort_unstable();
        Symbolizer(v)
    }

    pub fn load() -> Result<Symbolizer, HostError> {
        let b = read_capped(&proc_path("kallsyms"), super::LARGE_FILE)?;
        Ok(Symbolizer::parse(&String::from_utf8_lossy(&b)))
    }

    /// `function+0xoffset` of the text symbol at or before `addr`; `None` below the first one.
    pub fn name(&self, addr: u64) -> Option<String> {
        let i = self.0.partition_point(|(a, _)| *a <= addr).checked_sub(1)?;
        let (base, name) = &self.0[i];
        Some(match addr - base {
            0 => name.clone(),
            off => format!("{name}+{off:#x}"),
        })
    }

    /// No text symbol could be read (addresses hidden): nothing can be named.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The function name alone (without the offset) of `addr`.
    pub fn function(&self, addr: u64) -> Option<&str> {
        let i = self.0.partition_point(|(a, _)| *a <= addr).checked_sub(1)?;
        Some(&self.0[i].1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_symbols_only() {
        let f = parse_functions(
            "ffffffff81000000 T _stext\nffffffff82000000 D jiffies\nffffffffc0a01000 t virtblk_probe\t[virtio_blk]\nshort\n",
        );
        assert!(f.contains("_stext") && f.contains("virtblk_probe"));
        assert!(!f.contains("jiffies"));
        assert_eq!(f.len(), 2);
    }

    #[test]
    fn addresses_name_their_function() {
        let s = Symbolizer::parse(
            "ffffffff81000000 T _stext\nffffffff81000100 t __udp4_lib_rcv\nffffffff81000080 D data\n0000000000000000 T hidden\nffffffff81000200 T tcp_v4_rcv\n",
        );
        assert_eq!(
            s.name(0xffffffff81000100).as_deref(),
            Some("__udp4_lib_rcv")
        );
        assert_eq!(
            s.name(0xffffffff810001bc).as_deref(),
            Some("__udp4_lib_rcv+0xbc")
        );
        assert_eq!(s.function(0xffffffff81000204), Some("tcp_v4_rcv"));
        assert_eq!(s.name(0xffffffff80000000), None);
        assert_eq!(Symbolizer::parse("0000000000000000 T a\n").name(5), None);
    }
}
