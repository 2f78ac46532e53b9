//! The exported histogram buckets: a fixed subset of the kernel's log-linear bucket bounds.
//!
//! The kernel splits every power of two into 8 sub-buckets ([`probes_common::hist`]); exporting
//! all of them would be 320 series per label set. `serve` keeps two bounds per power of two,
//! `2^k` and `1.5·2^k` ns, from 2^10 ns (1.02 µs) to 2^34 ns (17.2 s): 49 bounds plus `+Inf`.
//! Every exported bound is a kernel bucket bound, so each kernel bucket falls whole into one
//! exported bucket and the exported counts are exact (`le` counts values below the bound, the
//! kernel's boundary; a value of exactly `le` ns lands in the next bucket).
//!
//! **Quantile error.** `histogram_quantile` interpolates inside the bucket holding the rank, and
//! the true quantile lies in that same bucket, so the estimate is off by at most the bucket's
//! width over its lower bound: `(1.5·2^k − 2^k) / 2^k` = **50 %** (and 33 % in the upper half of
//! each power of two), for quantiles between 1 µs and 17 s. Below 1.02 µs the estimate only says
//! "under 1 µs"; above 17 s, "over 17 s". `MAX_QUANTILE_ERROR` is that bound; a unit test checks
//! it on synthetic data.

use probes_common::hist::{bucket_low, LatHist};

/// Exponent of the first bound (2^10 ns = 1.024 µs).
const FIRST_EXP: u32 = 10;
/// Exponent of the last bound (2^34 ns = 17.2 s).
const LAST_EXP: u32 = 34;
/// Number of exported bounds (without `+Inf`).
pub const NBOUNDS: usize = 2 * (LAST_EXP - FIRST_EXP) as usize + 1;

/// Worst relative error of `histogram_quantile` on these buckets, for quantiles in range.
pub const MAX_QUANTILE_ERROR: f64 = 0.5;

/// The exported bounds in ns, ascending.
pub const BOUNDS_NS: [u64; NBOUNDS] = {
    let mut b = [0u64; NBOUNDS];
    let mut i = 0;
    while i < NBOUNDS {
        let p = 1u64 << (FIRST_EXP + (i / 2) as u32);
        b[i] = if i % 2 == 0 { p } else { p + p / 2 };
        i += 1;
    }
    b
};

/// Counts per exported bucket (`NBOUNDS` bounded ones, then `+Inf`), with sum and count.
#[derive(Clone, Debug, PartialEq)]
pub struct Buckets {
    pub counts: [u64; NBOUNDS + 1],
    pub count: u64,
    pub sum_ns: u64,
}

impl Default for Buckets {
    fn default() -> Self {
        Buckets {
            counts: [0; NBOUNDS + 1],
            count: 0,
            sum_ns: 0,
        }
    }
}

/// The exported bucket holding kernel bucket `i` (whose values start at `bucket_low(i)`).
fn exported(i: usize) -> usize {
    let low = bucket_low(i);
    BOUNDS_NS.partition_point(|&b| b <= low)
}

impl Buckets {
    /// Adds a kernel histogram.
    pub fn add_hist(&mut self, h: &LatHist) {
        for (i, &c) in h.buckets.iter().enumerate() {
            if c > 0 {
                self.counts[exported(i)] += c;
            }
        }
        self.count += h.count;
        self.sum_ns += h.sum;
    }

    pub fn add(&mut self, o: &Buckets) {
        for (a, b) in self.counts.iter_mut().zip(o.counts.iter()) {
            *a += b;
        }
        self.count += o.count;
        self.sum_ns += o.sum_ns;
    }

    /// `(upper bound in seconds, count in that bucket)` for the encoder (non-cumulative; the
    /// last is `+Inf`).
    pub fn prometheus(&self) -> Vec<(f64, u64)> {
        BOUNDS_NS
            .iter()
            .map(|&b| b as f64 / 1e9)
            .chain(std::iter::once(f64::INFINITY))
            .zip(self.counts.iter().copied())
            .collect()
    }
}

/// What Prometheus's `histogram_quantile` computes from these buckets (its algorithm: the
/// first bucket whose cumulative count reaches `q·count`, linear inside it), in seconds.
pub fn prometheus_quantile(q: f64, b: &Buckets) -> Option<f64> {
    if b.count == 0 {
        return None;
    }
    let buckets = b.prometheus();
    let rank = q * b.count as f64;
    let mut cum = 0u64;
    let mut lower = 0.0;
    for (i, (le, n)) in buckets.iter().enumerate() {
        let before = cum;
        cum += n;
        if cum as f64 >= rank {
            if le.is_infinite() {
                return Some(buckets[i - 1].0);
            }
            let within = if *n == 0 {
                0.0
            } else {
                (rank - before as f64) / *n as f64
            };
            return Some(lower + (le - lower) * within);
        }
        lower = *le;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_kernel_bounds_in_order() {
        assert_eq!(NBOUNDS, 49);
        assert_eq!(BOUNDS_NS[0], 1024);
        assert_eq!(BOUNDS_NS[1], 1536);
        assert_eq!(BOUNDS_NS[NBOUNDS - 1], 1 << 34);
        let lows: Vec<u64> = (0..probes_common::hist::NBUCKETS).map(bucket_low).collect();
        for b in BOUNDS_NS {
            assert!(lows.contains(&b), "{b} is no kernel bucket bound");
        }
        assert!(BOUNDS_NS.windows(2).all(|w| w[0] < w[1]));
    }

    /// A deterministic spread of values: log-uniform from 1.1 µs to 15 s.
    fn values(seed: u64, n: usize) -> Vec<u64> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let u = (x >> 11) as f64 / (1u64 << 53) as f64;
                (1100.0 * (15e9f64 / 1100.0).powf(u)) as u64
            })
            .collect()
    }

    #[test]
    fn quantile_error_is_within_the_documented_bound() {
        let mut worst: f64 = 0.0;
        for seed in 1..40u64 {
            for n in [7usize, 100, 1000, 5000] {
                let mut v = values(seed * 7919 + n as u64, n);
                let mut h = Box::new(LatHist::ZERO);
                for &x in &v {
                    h.record(x);
                }
                let mut b = Buckets::default();
                b.add_hist(&h);
                assert_eq!(b.counts.iter().sum::<u64>(), n as u64);
                v.sort_unstable();
                for q in [0.5, 0.9, 0.99, 0.999] {
                    let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
                    let exact = v[rank - 1] as f64 / 1e9;
                    let est = prometheus_quantile(q, &b).unwrap();
                    let err = (est - exact).abs() / exact;
                    worst = worst.max(err);
                    assert!(
                        err <= MAX_QUANTILE_ERROR,
                        "q{q} n{n}: estimate {est} s, exact {exact} s ({:.0} % off)",
                        err * 100.0
                    );
                }
            }
        }
        // The bound is tight enough to matter: real data gets close to it.
        assert!(worst > 0.2, "worst {worst}");
    }

    #[test]
    fn exact_counts_per_bucket() {
        let mut h = Box::new(LatHist::ZERO);
        for v in [1023, 1024, 1535, 1536, 5_000_000, 1 << 40] {
            h.record(v);
        }
        let mut b = Buckets::default();
        b.add_hist(&h);
        let p = b.prometheus();
        assert_eq!(p[0], (1.024e-6, 1), "1023 ns is below the first bound");
        assert_eq!(p[1].1, 2, "1024 and 1535 ns");
        assert_eq!(p[2].1, 1, "1536 ns");
        assert_eq!(p[NBOUNDS], (f64::INFINITY, 1));
        assert_eq!(b.count, 6);
        assert_eq!(prometheus_quantile(0.5, &Buckets::default()), None);
    }
}
