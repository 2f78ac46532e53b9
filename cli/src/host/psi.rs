//! Pressure stall information (`/proc/pressure/{cpu,memory,io}`, and a v2 cgroup's
//! `{cpu,memory,io}.pressure`): the share of wall time some (or all) tasks were stalled on a
//! resource. The cumulative `total` (µs) gives the exact share over any window.

use std::{collections::BTreeMap, path::Path};

use super::{proc_path, read_text_capped, SMALL_FILE};

/// One resource's stall totals, in microseconds since boot (or cgroup creation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Psi {
    pub some_us: u64,
    /// `None` for system-wide CPU on kernels before 5.13 (no `full` line).
    pub full_us: Option<u64>,
}

impl Psi {
    /// Shares of a window of `secs` stalled, in parts per million: (some, full).
    pub fn share_ppm(&self, before: &Psi, secs: f64) -> (u64, Option<u64>) {
        let ppm = |a: u64, b: u64| (a.saturating_sub(b) as f64 / (secs * 1e6) * 1e6) as u64;
        (
            ppm(self.some_us, before.some_us),
            match (self.full_us, before.full_us) {
                (Some(a), Some(b)) => Some(ppm(a, b)),
                _ => None,
            },
        )
    }
}

/// Parses `some avg10=… total=N` / `full …` lines.
pub fn parse(text: &str) -> Option<Psi> {
    let mut p = Psi::default();
    let mut seen = false;
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let kind = it.next()?;
        let total = it.find_map(|w| w.strip_prefix("total="))?.parse().ok()?;
        match kind {
            "some" => {
                p.some_us = total;
                seen = true;
            }
            "full" => p.full_us = Some(total),
            _ => {}
        }
    }
    seen.then_some(p)
}

/// System-wide PSI per resource (`cpu`, `memory`, `io`); empty when the kernel has no PSI
/// (CONFIG_PSI off, or `psi=0` on the command line).
pub fn system() -> BTreeMap<&'static str, Psi> {
    ["cpu", "memory", "io"]
        .into_iter()
        .filter_map(|r| {
            let t = read_text_capped(&proc_path(&format!("pressure/{r}")), SMALL_FILE).ok()?;
            Some((r, parse(&t)?))
        })
        .collect()
}

/// A v2 cgroup directory's PSI per resource.
pub fn cgroup(dir: &Path) -> BTreeMap<&'static str, Psi> {
    ["cpu", "memory", "io"]
        .into_iter()
        .filter_map(|r| {
            let t = read_text_capped(&dir.join(format!("{r}.pressure")), SMALL_FILE).ok()?;
            Some((r, parse(&t)?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_computes_shares() {
        let a = parse("some avg10=0.00 avg60=0.00 avg300=0.00 total=1000000\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=500000\n").unwrap();
        let b = parse("some avg10=1.00 avg60=0.00 avg300=0.00 total=1500000\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=600000\n").unwrap();
        assert_eq!(b.share_ppm(&a, 10.0), (50_000, Some(10_000)));
        let cpu_old = parse("some avg10=0.00 avg60=0.00 avg300=0.00 total=5\n").unwrap();
        assert_eq!(cpu_old.full_us, None);
        assert!(parse("garbage").is_none());
        assert!(!system().is_empty(), "this kernel has PSI");
    }
}
