//! `/proc/vmstat`: every counter by name, and deltas over a window. Parsed by `procfs`.
//! `allocstall` is synthesised as the sum of the per-zone `allocstall_*` counters (kernels
//! ≥ 4.8 split it; the single counter is what users know).

use std::collections::BTreeMap;

use procfs::FromBufRead;

use super::{proc_path, read_text, HostError};

/// Counters by name; a key is absent when this kernel does not have it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Vmstat(pub BTreeMap<String, i64>);

impl Vmstat {
    pub fn parse(text: &str) -> Result<Vmstat, HostError> {
        let all = procfs::VmStat::from_buf_read(text.as_bytes())
            .map_err(|e| HostError::parse("/proc/vmstat", e.to_string()))?
            .0;
        let mut m: BTreeMap<String, i64> = all.into_iter().collect();
        let parts: Vec<i64> = m
            .iter()
            .filter(|(k, _)| k.starts_with("allocstall_"))
            .map(|(_, v)| *v)
            .collect();
        if !parts.is_empty() {
            m.insert("allocstall".into(), parts.iter().sum());
        }
        Ok(Vmstat(m))
    }

    pub fn read() -> Result<Vmstat, HostError> {
        Vmstat::parse(&read_text(&proc_path("vmstat"))?)
    }

    pub fn get(&self, key: &str) -> Option<i64> {
        self.0.get(key).copied()
    }

    /// `self - before` for keys present in both.
    pub fn since(&self, before: &Vmstat) -> Vmstat {
        Vmstat(
            self.0
                .iter()
                .filter_map(|(k, a)| before.0.get(k).map(|b| (k.clone(), a - b)))
                .collect(),
        )
    }

    /// Only `keys` (those this kernel has), for reports that show a chosen few.
    pub fn select(&self, keys: &[&str]) -> Vmstat {
        Vmstat(
            keys.iter()
                .filter_map(|k| self.get(k).map(|v| (k.to_string(), v)))
                .collect(),
        )
    }

    /// `key +N` (or `key n/a` on a kernel without it), the form findings cite evidence in.
    pub fn cite(&self, key: &str) -> String {
        match self.get(key) {
            Some(v) => format!("{key} +{v}"),
            None => format!("{key} n/a"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::fixture;

    #[test]
    fn fixture_counters_and_deltas() {
        let a = Vmstat::parse(&fixture("memstall/vmstat.before")).unwrap();
        let b = Vmstat::parse(&fixture("memstall/vmstat.after")).unwrap();
        assert!(a.get("compact_stall").is_some());
        let d = b.since(&a);
        let stall = d.get("compact_stall").unwrap();
        assert_eq!(
            stall,
            b.get("compact_stall").unwrap() - a.get("compact_stall").unwrap()
        );
        let alloc: i64 = [
            "allocstall_dma",
            "allocstall_dma32",
            "allocstall_normal",
            "allocstall_movable",
        ]
        .iter()
        .filter_map(|k| b.get(k))
        .sum();
        assert_eq!(b.get("allocstall"), Some(alloc));
        let s = d.select(&["compact_stall", "no_such_counter"]);
        assert_eq!(s.0.len(), 1);
        assert_eq!(s.cite("no_such_counter"), "no_such_counter n/a");
        assert_eq!(s.cite("compact_stall"), format!("compact_stall +{stall}"));
    }

    #[test]
    fn garbage_is_an_error_naming_the_file() {
        let e = Vmstat::parse("compact_stall notanumber\n").unwrap_err();
        assert!(e.to_string().starts_with("/proc/vmstat"), "{e}");
    }

    #[test]
    fn reads_this_machine() {
        assert!(Vmstat::read().unwrap().get("nr_free_pages").is_some());
    }
}
