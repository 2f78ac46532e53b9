//! Latency histogram layout shared by the kernel (which bumps buckets) and userspace (which turns
//! them into `hdrhistogram`s).
//!
//! Log-linear buckets, like HdrHistogram's: values below [`SUB_COUNT`] get one bucket each, and
//! every power of two above is split into [`SUB_COUNT`] equal sub-buckets. A bucket is at most
//! 1/[`SUB_COUNT`] of its lower bound wide, so reporting its midpoint is off by at most
//! 1/(2·[`SUB_COUNT`]) = 6.25 % of the true value ([`MAX_REL_ERROR_PPM`]). bcc's log2 histograms
//! are up to 100 % off for the same reason, which is why a p99 from them cannot be trusted.
//!
//! With nanosecond values the buckets reach 2^40 ns (about 18 minutes); larger values land in the
//! last bucket, and the exact maximum is kept beside the buckets anyway.

/// log2 of the number of sub-buckets per power of two.
pub const SUB_BITS: u32 = 3;
/// Sub-buckets per power of two.
pub const SUB_COUNT: u64 = 1 << SUB_BITS;
/// Largest power of two with its own buckets; values at or above `2^(MAX_EXP + 1)` are clamped.
pub const MAX_EXP: u32 = 39;
/// Number of buckets.
pub const NBUCKETS: usize = (SUB_COUNT + (MAX_EXP - SUB_BITS + 1) as u64 * SUB_COUNT) as usize;
/// Worst relative error of a bucket's midpoint against any value in it, in parts per million.
pub const MAX_REL_ERROR_PPM: u64 = 1_000_000 / (2 * SUB_COUNT);

/// One latency histogram as the kernel keeps it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LatHist {
    /// Number of values recorded.
    pub count: u64,
    /// Exact sum of the values.
    pub sum: u64,
    /// Exact largest value.
    pub max: u64,
    /// Exact smallest value plus one (0 = nothing recorded yet), so a zeroed value is empty.
    pub min_plus1: u64,
    /// Bucket counts, indexed by [`bucket_index`].
    pub buckets: [u64; NBUCKETS],
}

impl LatHist {
    pub const ZERO: LatHist = LatHist {
        count: 0,
        sum: 0,
        max: 0,
        min_plus1: 0,
        buckets: [0; NBUCKETS],
    };

    /// Exact smallest value, if any was recorded.
    pub fn min(&self) -> Option<u64> {
        self.min_plus1.checked_sub(1)
    }

    /// Records one value (non-atomically: for host-side use and tests; the kernel side bumps the
    /// fields with atomic adds).
    pub fn record(&mut self, v: u64) {
        self.count += 1;
        self.sum += v;
        if v > self.max {
            self.max = v;
        }
        if self.min_plus1 == 0 || v.saturating_add(1) < self.min_plus1 {
            self.min_plus1 = v.saturating_add(1);
        }
        self.buckets[bucket_index(v)] += 1;
    }

    /// Adds another histogram into this one.
    pub fn merge(&mut self, other: &LatHist) {
        self.count += other.count;
        self.sum += other.sum;
        if other.max > self.max {
            self.max = other.max;
        }
        if other.min_plus1 != 0 && (self.min_plus1 == 0 || other.min_plus1 < self.min_plus1) {
            self.min_plus1 = other.min_plus1;
        }
        for (a, b) in self.buckets.iter_mut().zip(other.buckets.iter()) {
            *a += *b;
        }
    }
}

crate::impl_pod!(LatHist);

/// `floor(log2(v))` for `v > 0`, without loops or a count-leading-zeros instruction (the BPF ISA
/// has none, and the verifier dislikes loops).
#[inline(always)]
pub const fn log2_floor(mut v: u64) -> u32 {
    let mut r = 0;
    if v >= 1 << 32 {
        v >>= 32;
        r += 32;
    }
    if v >= 1 << 16 {
        v >>= 16;
        r += 16;
    }
    if v >= 1 << 8 {
        v >>= 8;
        r += 8;
    }
    if v >= 1 << 4 {
        v >>= 4;
        r += 4;
    }
    if v >= 1 << 2 {
        v >>= 2;
        r += 2;
    }
    if v >= 1 << 1 {
        r += 1;
    }
    r
}

/// Bucket of value `v`; always `< NBUCKETS`.
#[inline(always)]
pub const fn bucket_index(v: u64) -> usize {
    if v < SUB_COUNT {
        return v as usize;
    }
    let e = log2_floor(v);
    if e > MAX_EXP {
        return NBUCKETS - 1;
    }
    let sub = (v >> (e - SUB_BITS)) & (SUB_COUNT - 1);
    (SUB_COUNT + (e - SUB_BITS) as u64 * SUB_COUNT + sub) as usize
}

/// An optimisation barrier: returns `x` unchanged, but the compiler can no longer see what it
/// is. Used by [`bucket_index_flat`] so LLVM cannot turn its arithmetic back into comparisons
/// (on BPF, every `select` becomes a conditional jump, and every jump doubles the paths the
/// verifier walks).
#[inline(always)]
pub fn opaque(x: u64) -> u64 {
    #[cfg(target_arch = "bpf")]
    {
        let mut y = x;
        // SAFETY: one register move (`rN = rN`); an empty template would leave two BTF
        // line-info records on one instruction, which the kernel rejects.
        unsafe {
            core::arch::asm!("{0} = {0}", inout(reg) y, options(pure, nomem, nostack, preserves_flags))
        };
        y
    }
    #[cfg(not(target_arch = "bpf"))]
    {
        core::hint::black_box(x)
    }
}

/// [`bucket_index`] without a single branch, for the kernel side.
///
/// The BPF ISA has no count-leading-zeros and no conditional move, so `bucket_index` compiles
/// to about ten conditional jumps whose outcomes feed the bucket pointer; the verifier cannot
/// merge those paths (the index is a precise scalar) and walks every combination — 64 or more
/// per call site, most of `sched_switch`'s 17,000 verified instructions. Here each step of the
/// binary search turns "is `t` non-zero" into arithmetic, `(t + (2^k - 1)) >> k` for `t < 2^k`,
/// so there is one path. Same result as `bucket_index` for every `v` (unit-tested).
#[inline(always)]
pub fn bucket_index_flat(v: u64) -> u64 {
    // e = floor(log2(v | 8)), so e >= 3 and the general formula covers v < 16 too.
    let mut x = v | SUB_COUNT;
    let mut e = 0u64;
    let s = ((opaque(x >> 32) + 0xffff_ffff) >> 32) << 5;
    x >>= s;
    e += s;
    let s = ((opaque(x >> 16) + 0xffff) >> 16) << 4;
    x >>= s;
    e += s;
    let s = ((opaque(x >> 8) + 0xff) >> 8) << 3;
    x >>= s;
    e += s;
    let s = ((opaque(x >> 4) + 0xf) >> 4) << 2;
    x >>= s;
    e += s;
    let s = ((opaque(x >> 2) + 3) >> 2) << 1;
    x >>= s;
    e += s;
    e += (opaque(x >> 1) + 1) >> 1;
    // SUB_COUNT + (e - SUB_BITS) * SUB_COUNT + sub, for e >= 3.
    let sub = (v >> (e - SUB_BITS as u64)) & (SUB_COUNT - 1);
    let mut idx = ((e - SUB_BITS as u64 + 1) << SUB_BITS) + sub;
    // v < 8 went through `v | 8`: one power of two too high.
    let small = 1 - ((opaque(v >> SUB_BITS) + ((1 << (64 - SUB_BITS)) - 1)) >> (64 - SUB_BITS));
    idx -= small << SUB_BITS;
    // e > MAX_EXP: the last bucket. e <= 63, so (e + 24) >> 6 is 1 exactly when e >= 40.
    let big = opaque(e + (64 - (MAX_EXP as u64 + 1))) >> 6;
    let mask = 0u64.wrapping_sub(big);
    (idx & !mask) | ((NBUCKETS as u64 - 1) & mask)
}

/// Lowest value that lands in bucket `i`.
pub const fn bucket_low(i: usize) -> u64 {
    let i = i as u64;
    if i < SUB_COUNT {
        return i;
    }
    let j = i - SUB_COUNT;
    let shift = j / SUB_COUNT;
    (SUB_COUNT + j % SUB_COUNT) << shift
}

/// Number of distinct values bucket `i` covers (the last bucket also takes everything above).
pub const fn bucket_width(i: usize) -> u64 {
    let i = i as u64;
    if i < SUB_COUNT {
        1
    } else {
        1 << ((i - SUB_COUNT) / SUB_COUNT)
    }
}

/// The value reported for everything in bucket `i`: its midpoint.
pub const fn bucket_mid(i: usize) -> u64 {
    bucket_low(i) + bucket_width(i) / 2
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use proptest::prelude::*;
    use std::vec::Vec;

    #[test]
    fn layout_is_contiguous_and_ordered() {
        assert_eq!(NBUCKETS, 304);
        for i in 0..NBUCKETS - 1 {
            assert_eq!(
                bucket_low(i) + bucket_width(i),
                bucket_low(i + 1),
                "gap after bucket {i}"
            );
            assert_eq!(bucket_index(bucket_low(i)), i);
            assert_eq!(bucket_index(bucket_low(i + 1) - 1), i);
        }
        assert_eq!(bucket_index(u64::MAX), NBUCKETS - 1);
        assert_eq!(bucket_index(1 << 40), NBUCKETS - 1);
    }

    #[test]
    fn flat_index_matches_branchy_index() {
        let mut vs: Vec<u64> = (0..4096).collect();
        for s in 0..64 {
            let p = 1u64 << s;
            vs.extend([
                p - 1,
                p,
                p + 1,
                p | (p >> 1),
                p | (p >> 3),
                p.wrapping_mul(3) / 2,
            ]);
        }
        vs.extend([u64::MAX, u64::MAX - 1, (1 << 40) - 1, 1 << 40]);
        for v in vs {
            assert_eq!(bucket_index_flat(v), bucket_index(v) as u64, "v={v}");
        }
    }

    proptest! {
        #[test]
        fn flat_index_matches_everywhere(v in any::<u64>(), s in 0u32..64) {
            let v = v >> s;
            prop_assert_eq!(bucket_index_flat(v), bucket_index(v) as u64);
        }
    }

    #[test]
    fn log2_matches_leading_zeros() {
        for s in 0..64 {
            let v = 1u64 << s;
            assert_eq!(log2_floor(v), s);
            assert_eq!(log2_floor(v | (v >> 1)), s);
            if s > 0 {
                assert_eq!(log2_floor(v - 1), s - 1);
            }
        }
    }

    fn exact_quantile(sorted: &[u64], q: f64) -> u64 {
        // Nearest-rank, the definition hdrhistogram uses too.
        let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        sorted[rank - 1]
    }

    fn bucket_quantile(h: &LatHist, q: f64) -> u64 {
        let rank = ((q * h.count as f64).ceil() as u64).clamp(1, h.count);
        let mut seen = 0;
        for (i, c) in h.buckets.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return bucket_mid(i);
            }
        }
        unreachable!()
    }

    proptest! {
        #[test]
        fn every_value_is_within_the_bound_of_its_midpoint(v in 1u64..(1 << 40)) {
            let mid = bucket_mid(bucket_index(v));
            let err = mid.abs_diff(v) as u128 * 1_000_000;
            prop_assert!(err <= MAX_REL_ERROR_PPM as u128 * v as u128, "v={v} mid={mid}");
        }

        #[test]
        fn percentiles_from_buckets_are_within_the_bound(
            // Latency-like data: log-uniform from 1 µs to 10 s.
            exps in proptest::collection::vec(0.0f64..7.0, 1..2000),
            q in prop::sample::select(std::vec![0.5, 0.9, 0.99, 0.999, 1.0]),
        ) {
            let mut values: Vec<u64> = exps.iter().map(|e| (1000.0 * 10f64.powf(*e)) as u64).collect();
            let mut h = LatHist::ZERO;
            for v in &values { h.record(*v); }
            values.sort_unstable();
            let exact = exact_quantile(&values, q);
            let got = bucket_quantile(&h, q);
            let err = got.abs_diff(exact) as f64 / exact as f64;
            prop_assert!(err <= MAX_REL_ERROR_PPM as f64 / 1e6, "q={q} exact={exact} got={got}");
            prop_assert_eq!(h.count as usize, values.len());
            prop_assert_eq!(h.max, *values.last().unwrap());
        }
    }
}
