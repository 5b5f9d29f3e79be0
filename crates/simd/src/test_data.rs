//! Deterministic pseudo-random inputs for the tests and benchmarks of kernels (not for
//! anything that needs statistical quality or unpredictability).
//!
//! The same seed gives the same values on every platform and level, so a test that compares
//! a kernel against a reference, or a benchmark that compares two runs, sees the same data.

/// `n` floats spread evenly over `[-amp, amp)`, from a 32-bit xorshift generator seeded by
/// `seed` (any seed, 0 included, gives a full-period sequence).
///
/// Each value is `u * 2 * amp - amp` for a `u` in `[0, 1)` that is a multiple of `2^-24`
/// (exact for `amp` a power of two).
///
/// ```
/// let x = kernel_simd::test_data::uniform(1000, 7, 0.5);
/// assert_eq!(x, kernel_simd::test_data::uniform(1000, 7, 0.5));
/// assert!(x.iter().all(|v| (-0.5..0.5).contains(v)));
/// ```
pub fn uniform(n: usize, seed: u32, amp: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 8) as f32 / (1u32 << 24) as f32 * (2.0 * amp) - amp
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::uniform;

    /// The sequence is pinned: tests and benchmarks that were tuned on these inputs (the
    /// kernels' tolerances, the benchmarks' data) keep them.
    #[test]
    fn pinned_values_and_range() {
        let want = [-3_068_601.0, 4_205_669.0, 6_150_893.0, 1_007_976.0].map(|x| x / 8_388_608.0);
        assert_eq!(uniform(4, 1, 1.0), want);
        assert_eq!(uniform(4, 1, 0.5), want.map(|x| x * 0.5));
        let x = uniform(10_000, 0, 3.0);
        assert!(x.iter().all(|v| (-3.0..3.0).contains(v)));
        let mean = x.iter().sum::<f32>() / x.len() as f32;
        assert!(mean.abs() < 0.1, "mean {mean}");
        assert_ne!(uniform(8, 2, 1.0), uniform(8, 3, 1.0));
    }
}
