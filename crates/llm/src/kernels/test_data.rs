//! Inputs and the tolerance check shared by the kernels' unit tests.

/// Deterministic values in `[-1, 1)` (xorshift from `seed`).
pub(crate) fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
        })
        .collect()
}

/// Panics (naming `what`) unless `got` is within `1e-4 * (1 + |want|)` of the f64 `want`.
pub(crate) fn close(got: f32, want: f64, what: &str) {
    assert!(
        (f64::from(got) - want).abs() <= 1e-4 * (1.0 + want.abs()),
        "{what}: {got} vs {want}"
    );
}
