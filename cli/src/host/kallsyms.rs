//! `/proc/kallsyms`: which kernel functions exist (kprobe attach checks in the attach policy
//! and `doctor`). Read once per run, with a cap well above distribution kernels' ~15 MiB.

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
}
