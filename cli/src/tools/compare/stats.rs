//! The statistics of a comparison: a summary of per-interval samples (median, p99, mean,
//! coefficient of variation) and the Mann–Whitney U test.
//!
//! Why Mann–Whitney U: latency and rate samples are skewed and heavy-tailed (one stalled
//! interval is ten times the others), so a t-test's normal assumption fails and a mean moves
//! with one outlier. U compares ranks: it asks whether a sample from one run tends to be larger
//! than one from the other, whatever the shape, and needs no more than the per-interval samples
//! a recording holds. A bootstrap interval on the median would need many resamples of a few
//! dozen intervals and gives a different answer each run; U is exact (for small samples without
//! ties) or a well-known normal approximation, and deterministic.

/// A summary of samples.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Summary {
    pub n: usize,
    pub median: f64,
    pub p99: f64,
    pub mean: f64,
    /// Standard deviation over mean (0 when the mean is 0).
    pub cv: f64,
}

/// Nearest-rank quantile of sorted values (`q` in 0..=1).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// The median as statisticians define it (the mean of the two middle values for an even count).
pub fn median(sorted: &[f64]) -> f64 {
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

pub fn summarize(samples: &[f64]) -> Summary {
    let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return Summary::default();
    }
    let mean = v.iter().sum::<f64>() / n as f64;
    let var = if n > 1 {
        v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64
    } else {
        0.0
    };
    Summary {
        n,
        median: median(&v),
        p99: quantile(&v, 0.99),
        mean,
        cv: if mean.abs() > 0.0 {
            var.sqrt() / mean.abs()
        } else {
            0.0
        },
    }
}

/// The result of a two-sided Mann–Whitney U test.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MannWhitney {
    /// U of the first sample: the number of (a, b) pairs with a > b, ties counting ½.
    pub u: f64,
    /// Two-sided p-value.
    pub p: f64,
    /// Exact distribution (no ties, small samples) rather than the normal approximation.
    pub exact: bool,
}

/// Largest n1 + n2 for the exact distribution (C(40, 20) ≈ 1.4e11 fits an f64 exactly).
const EXACT_MAX: usize = 40;

/// Two-sided Mann–Whitney U test of `a` against `b`. `None` when either sample is empty.
///
/// Without ties and with n1 + n2 ≤ 40 the p-value comes from the exact distribution of U
/// (counted by the recurrence f(m, n, u) = f(m−1, n, u−n) + f(m, n−1, u)). Otherwise from the
/// normal approximation with the tie-corrected variance
/// σ² = n1·n2/12 · ((n+1) − Σ(t³−t)/(n(n−1))) and a continuity correction of ½.
pub fn mann_whitney(a: &[f64], b: &[f64]) -> Option<MannWhitney> {
    let (n1, n2) = (a.len(), b.len());
    if n1 == 0 || n2 == 0 {
        return None;
    }
    let mut all: Vec<(f64, bool)> = a
        .iter()
        .map(|x| (*x, true))
        .chain(b.iter().map(|x| (*x, false)))
        .collect();
    all.sort_by(|x, y| x.0.total_cmp(&y.0));
    let n = all.len();
    // Average ranks over runs of ties; Σ(t³ − t) for the variance.
    let (mut r1, mut ties, mut i) = (0.0, 0.0, 0);
    while i < n {
        let mut j = i;
        while j + 1 < n && all[j + 1].0 == all[i].0 {
            j += 1;
        }
        let rank = (i + j) as f64 / 2.0 + 1.0;
        let t = (j - i + 1) as f64;
        ties += t * t * t - t;
        r1 += all[i..=j].iter().filter(|x| x.1).count() as f64 * rank;
        i = j + 1;
    }
    let (f1, f2) = (n1 as f64, n2 as f64);
    let u = r1 - f1 * (f1 + 1.0) / 2.0;
    if ties == 0.0 && n <= EXACT_MAX {
        return Some(MannWhitney {
            u,
            p: exact_p(n1, n2, u.round() as usize),
            exact: true,
        });
    }
    let mu = f1 * f2 / 2.0;
    let nf = n as f64;
    let var = f1 * f2 / 12.0 * ((nf + 1.0) - ties / (nf * (nf - 1.0)));
    if var <= 0.0 {
        // Every value equal: no evidence of a difference.
        return Some(MannWhitney {
            u,
            p: 1.0,
            exact: false,
        });
    }
    let z = ((u - mu).abs() - 0.5).max(0.0) / var.sqrt();
    Some(MannWhitney {
        u,
        p: (erfc(z / std::f64::consts::SQRT_2)).min(1.0),
        exact: false,
    })
}

/// Two-sided exact p-value of U = `u` for samples of `m` and `n` (no ties).
fn exact_p(m: usize, n: usize, u: usize) -> f64 {
    let max = m * n;
    // counts[j][v]: arrangements of j values of the first sample among the current n with U=v,
    // built up one size of the second sample at a time.
    let mut f = vec![vec![0f64; max + 1]; m + 1];
    // f(j, 0, 0) = 1.
    for row in f.iter_mut() {
        row[0] = 1.0;
    }
    for k in 1..=n {
        let mut g = vec![vec![0f64; max + 1]; m + 1];
        g[0][0] = 1.0;
        for j in 1..=m {
            for v in 0..=j * k {
                // The largest value is from the first sample (it beats all k of the second) or
                // from the second.
                let from_a = if v >= k { g[j - 1][v - k] } else { 0.0 };
                g[j][v] = from_a + f[j][v];
            }
        }
        f = g;
    }
    let dist = &f[m];
    let total: f64 = dist.iter().sum();
    let le: f64 = dist[..=u.min(max)].iter().sum();
    let ge: f64 = dist[u.min(max)..].iter().sum();
    (2.0 * le.min(ge) / total).min(1.0)
}

/// The complementary error function (W. J. Cody's rational Chebyshev form as in Numerical
/// Recipes' `erfcc`: fractional error below 1.2e-7 everywhere), for the normal tail.
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87
                                        + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Exact two-sided p by enumerating every way to split the pooled values (small samples).
    fn brute_p(a: &[f64], b: &[f64]) -> f64 {
        let pooled: Vec<f64> = a.iter().chain(b).copied().collect();
        let n = pooled.len();
        let u_of = |mask: u32| {
            let (x, y): (Vec<f64>, Vec<f64>) = {
                let mut x = Vec::new();
                let mut y = Vec::new();
                for (i, v) in pooled.iter().enumerate() {
                    if mask & (1 << i) != 0 {
                        x.push(*v)
                    } else {
                        y.push(*v)
                    }
                }
                (x, y)
            };
            let mut u = 0.0;
            for p in &x {
                for q in &y {
                    u += if p > q {
                        1.0
                    } else if p == q {
                        0.5
                    } else {
                        0.0
                    };
                }
            }
            u
        };
        let mu = a.len() as f64 * b.len() as f64 / 2.0;
        let observed = (u_of((1 << a.len()) - 1) - mu).abs();
        let (mut hit, mut all) = (0u64, 0u64);
        for mask in 0u32..(1 << n) {
            if mask.count_ones() as usize == a.len() {
                all += 1;
                if (u_of(mask) - mu).abs() >= observed - 1e-9 {
                    hit += 1;
                }
            }
        }
        hit as f64 / all as f64
    }

    #[test]
    fn textbook_values() {
        // Complete separation of two samples of 5: U = 0, p = 2 / C(10, 5) = 2/252.
        let r = mann_whitney(&[1.0, 2.0, 3.0, 4.0, 5.0], &[6.0, 7.0, 8.0, 9.0, 10.0]).unwrap();
        assert_eq!(r.u, 0.0);
        assert!(r.exact);
        assert!((r.p - 2.0 / 252.0).abs() < 1e-12, "{r:?}");
        // Hollander & Wolfe's example (R's `wilcox.test` help page): W = 35, one-sided exact
        // p = 0.1272, so two-sided 0.2544.
        let x = [0.80, 0.83, 1.89, 1.04, 1.45, 1.38, 1.91, 1.64, 0.73, 1.46];
        let y = [1.15, 0.88, 0.90, 0.74, 1.21];
        let r = mann_whitney(&x, &y).unwrap();
        assert_eq!(r.u, 35.0);
        assert!((r.p - 0.2544).abs() < 5e-4, "{r:?}");
        assert!((r.p - brute_p(&x, &y)).abs() < 1e-12);
        // Symmetric: swapping the samples gives U' = n1·n2 − U and the same p.
        let s = mann_whitney(&y, &x).unwrap();
        assert_eq!(s.u, 15.0);
        assert!((s.p - r.p).abs() < 1e-12);
    }

    #[test]
    fn normal_approximation_with_ties_is_close_to_the_permutation_p() {
        // Ties force the approximation; the permutation distribution is the truth.
        let a = [1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 5.0, 5.0];
        let b = [3.0, 4.0, 4.0, 5.0, 6.0, 6.0, 7.0, 7.0];
        let r = mann_whitney(&a, &b).unwrap();
        assert!(!r.exact);
        let exact = brute_p(&a, &b);
        assert!((r.p - exact).abs() < 0.01, "approx {} exact {exact}", r.p);
        // Identical samples: no difference at all.
        let r = mann_whitney(&[2.0; 6], &[2.0; 6]).unwrap();
        assert_eq!(r.p, 1.0);
        assert!(mann_whitney(&[], &[1.0]).is_none());
    }

    #[test]
    fn large_samples_use_the_normal_tail() {
        // 30 vs 30, shifted by half the spread: significant; unshifted: not.
        let a: Vec<f64> = (0..30).map(|i| i as f64).collect();
        let b: Vec<f64> = (0..30).map(|i| i as f64 + 15.5).collect();
        let r = mann_whitney(&a, &b).unwrap();
        assert!(!r.exact && r.p < 0.001, "{r:?}");
        let c: Vec<f64> = (0..30).map(|i| i as f64 + 0.5).collect();
        assert!(mann_whitney(&a, &c).unwrap().p > 0.5);
        // erfc at known points.
        assert!((erfc(0.0) - 1.0).abs() < 1e-7);
        assert!((erfc(1.0) - 0.157_299_207).abs() < 1e-7);
        assert!((erfc(-1.0) - 1.842_700_793).abs() < 1e-7);
    }

    #[test]
    fn summaries() {
        let s = summarize(&[4.0, 1.0, 3.0, 2.0]);
        assert_eq!((s.n, s.median, s.p99, s.mean), (4, 2.5, 4.0, 2.5));
        assert!((s.cv - (5.0f64 / 3.0).sqrt() / 2.5).abs() < 1e-12);
        assert_eq!(summarize(&[]), Summary::default());
        assert_eq!(summarize(&[0.0, 0.0]).cv, 0.0);
    }
}
