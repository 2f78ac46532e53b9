//! Kernel histograms ([`LatHist`]) to `hdrhistogram` and summary statistics.
//!
//! Each kernel bucket is recorded at its midpoint, so a percentile is off by at most the bucket
//! layout's bound (6.25 %, see `probes_common::hist`) plus hdrhistogram's own 0.1 % (3
//! significant digits). The count, sum (so the mean) and max come from the kernel exactly.

use hdrhistogram::Histogram;
use probes_common::hist::{bucket_mid, LatHist, NBUCKETS};

/// Summary of one latency distribution, all times in nanoseconds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LatStats {
    pub count: u64,
    pub total_ns: u64,
    pub mean_ns: u64,
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub max_ns: u64,
    /// The shortest recorded (exact, from the kernel's histogram); 0 when nothing was.
    pub min_ns: u64,
    pub stddev_ns: u64,
    /// Coefficient of variation (stddev / mean); above 1 the mean misleads.
    pub cv: f64,
}

/// One statistic of [`LatStats`] as a row key: the key's suffix after the row's prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stat {
    Count,
    TotalNs,
    MeanNs,
    P50Ns,
    P90Ns,
    P99Ns,
    P999Ns,
    MaxNs,
    MinNs,
    StddevNs,
}

impl Stat {
    pub fn key(self) -> &'static str {
        match self {
            Stat::Count => "count",
            Stat::TotalNs => "total_ns",
            Stat::MeanNs => "mean_ns",
            Stat::P50Ns => "p50_ns",
            Stat::P90Ns => "p90_ns",
            Stat::P99Ns => "p99_ns",
            Stat::P999Ns => "p999_ns",
            Stat::MaxNs => "max_ns",
            Stat::MinNs => "min_ns",
            Stat::StddevNs => "stddev_ns",
        }
    }

    pub fn of(self, s: &LatStats) -> u64 {
        match self {
            Stat::Count => s.count,
            Stat::TotalNs => s.total_ns,
            Stat::MeanNs => s.mean_ns,
            Stat::P50Ns => s.p50_ns,
            Stat::P90Ns => s.p90_ns,
            Stat::P99Ns => s.p99_ns,
            Stat::P999Ns => s.p999_ns,
            Stat::MaxNs => s.max_ns,
            Stat::MinNs => s.min_ns,
            Stat::StddevNs => s.stddev_ns,
        }
    }
}

/// A row's latency statistics, flattened into its JSON under a key prefix (`wake_p99_ns`,
/// `queue_total_ns`): the one serialiser of every row's latency figures. `keys` says which
/// statistics the row carries (a tool keeps its key set as it was documented). A row whose
/// kind of event is not timed (memstall's background THP work) carries every key as `null`:
/// "not measured" is not 0 ns.
#[derive(Clone, Debug)]
pub struct Keyed {
    pub prefix: &'static str,
    pub s: LatStats,
    pub keys: &'static [Stat],
    pub measured: bool,
}

impl Keyed {
    pub fn new(prefix: &'static str, s: LatStats, keys: &'static [Stat]) -> Keyed {
        Keyed {
            prefix,
            s,
            keys,
            measured: true,
        }
    }

    pub fn of(prefix: &'static str, h: &LatHist, keys: &'static [Stat]) -> Keyed {
        Keyed::new(prefix, stats(h), keys)
    }

    /// The statistic, or `None` when the row's events were not timed.
    pub fn get(&self, k: Stat) -> Option<u64> {
        // The shortest of nothing is not 0 ns.
        let empty = k == Stat::MinNs && self.s.count == 0;
        (self.measured && !empty).then(|| k.of(&self.s))
    }

    /// Every key `null`: the events were counted but not timed.
    pub fn unmeasured(mut self) -> Keyed {
        self.measured = false;
        self
    }
}

impl serde::Serialize for Keyed {
    fn serialize<S: serde::Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = ser.serialize_map(Some(self.keys.len()))?;
        for k in self.keys {
            m.serialize_entry(&format!("{}{}", self.prefix, k.key()), &self.get(*k))?;
        }
        m.end()
    }
}

/// An hdrhistogram from a kernel histogram.
pub fn to_hdr(h: &LatHist) -> Histogram<u64> {
    let mut hdr = Histogram::<u64>::new(3).expect("3 significant digits is valid");
    for (i, &c) in h.buckets.iter().enumerate().take(NBUCKETS) {
        if c > 0 {
            // Midpoints are clamped to the exact [min, max]: a bucket's midpoint can lie
            // outside what was recorded, and a single-valued row is then exact.
            // A zero-length wait stays 0 (hdrhistogram records 0 exactly).
            let v = bucket_mid(i).min(h.max).max(h.min().unwrap_or(0));
            hdr.record_n(v, c).expect("auto-resizing histogram");
        }
    }
    hdr
}

pub fn stats(h: &LatHist) -> LatStats {
    if h.count == 0 {
        return LatStats::default();
    }
    let hdr = to_hdr(h);
    let lo = h.min().unwrap_or(0);
    let q = |q: f64| hdr.value_at_quantile(q).clamp(lo, h.max.max(lo));
    let mean = h.sum / h.count;
    let stddev = hdr.stdev();
    LatStats {
        count: h.count,
        total_ns: h.sum,
        mean_ns: mean,
        p50_ns: q(0.5),
        p90_ns: q(0.9),
        p99_ns: q(0.99),
        p999_ns: q(0.999),
        max_ns: h.max,
        min_ns: lo,
        stddev_ns: stddev.round() as u64,
        cv: if mean > 0 { stddev / mean as f64 } else { 0.0 },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn nearest_rank(sorted: &[u64], q: f64) -> u64 {
        let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        sorted[rank - 1]
    }

    #[test]
    fn exact_for_small_values_and_fields() {
        let mut h = LatHist::ZERO;
        for v in [1, 2, 3, 4, 5] {
            h.record(v);
        }
        let s = stats(&h);
        assert_eq!((s.count, s.total_ns, s.mean_ns, s.max_ns), (5, 15, 3, 5));
        assert_eq!(s.p50_ns, 3);
        assert_eq!(stats(&LatHist::ZERO), LatStats::default());
    }

    #[test]
    fn unmeasured_rows_carry_null_not_zero() {
        let mut h = LatHist::ZERO;
        h.record(7);
        h.record(9);
        const KEYS: &[Stat] = &[Stat::MinNs, Stat::MaxNs];
        let v = serde_json::to_value(Keyed::of("x_", &h, KEYS)).unwrap();
        assert_eq!(v, serde_json::json!({"x_min_ns": 7, "x_max_ns": 9}));
        let v = serde_json::to_value(Keyed::of("x_", &h, KEYS).unmeasured()).unwrap();
        assert_eq!(v, serde_json::json!({"x_min_ns": null, "x_max_ns": null}));
    }

    #[test]
    fn zero_length_waits_are_zero() {
        let mut h = LatHist::ZERO;
        for v in [0, 0, 0, 0, 0, 0, 7_000] {
            h.record(v);
        }
        let s = stats(&h);
        assert_eq!(s.p50_ns, 0);
        assert!(s.p90_ns > 6_000, "{s:?}");
    }

    proptest! {
        /// Every percentile tracekit prints is within 10 % of the exact nearest-rank value.
        #[test]
        fn percentiles_within_ten_percent(
            exps in proptest::collection::vec(0.0f64..8.0, 1..3000),
            spike in 0usize..20,
        ) {
            let mut values: Vec<u64> = exps.iter().map(|e| (500.0 * 10f64.powf(*e)) as u64 + 1).collect();
            // A few outliers, as real latency has.
            for i in 0..spike { values.push(5_000_000_000 + i as u64 * 7); }
            let mut h = LatHist::ZERO;
            for v in &values { h.record(*v); }
            values.sort_unstable();
            let s = stats(&h);
            for (q, got) in [(0.5, s.p50_ns), (0.9, s.p90_ns), (0.99, s.p99_ns), (0.999, s.p999_ns)] {
                let exact = nearest_rank(&values, q);
                let err = got.abs_diff(exact) as f64 / exact as f64;
                prop_assert!(err <= 0.10, "q={} exact={} got={} err={:.3}", q, exact, got, err);
            }
            prop_assert_eq!(s.max_ns, *values.last().unwrap());
            prop_assert_eq!(s.total_ns, values.iter().sum::<u64>());
        }
    }
}
