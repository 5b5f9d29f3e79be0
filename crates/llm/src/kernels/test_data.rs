//! Inputs and the tolerance check shared by the kernels' unit tests.

/// Deterministic values in `[-1, 1)`: [`kernel_simd::test_data::uniform`] with amplitude 1.
pub(crate) fn data(n: usize, seed: u32) -> Vec<f32> {
    kernel_simd::test_data::uniform(n, seed, 1.0)
}

/// Panics (naming `what`) unless `got` is within `1e-4 * (1 + |want|)` of the f64 `want`.
pub(crate) fn close(got: f32, want: f64, what: &str) {
    assert!(
        (f64::from(got) - want).abs() <= 1e-4 * (1.0 + want.abs()),
        "{what}: {got} vs {want}"
    );
}
