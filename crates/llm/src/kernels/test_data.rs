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

/// `rows` rows of `cols` weights of `t` in the file's layout, from seeded data: quantized by
/// ggml's reference quantizer where there is one, else (the K-quants) random bytes under
/// small finite f16 super-block scales of either sign.
pub(crate) fn file_rows(t: crate::quant::QType, rows: usize, cols: usize, seed: u32) -> Vec<u8> {
    use crate::quant::format::quantize_row;
    use crate::quant::QType;
    use crate::safetensors::f32_to_f16;
    if quantize_row(t, &data(cols, seed)).is_some() {
        return data(rows * cols, seed)
            .chunks_exact(cols)
            .flat_map(|r| quantize_row(t, r).unwrap())
            .collect();
    }
    let noise = data(rows * t.row_bytes(cols), seed);
    let mut b: Vec<u8> = noise.iter().map(|v| (v.to_bits() >> 11) as u8).collect();
    let blocks = b.len() / t.block_bytes();
    let scales = data(2 * blocks, seed ^ 0x5ca1e);
    for (blk, s) in b
        .chunks_exact_mut(t.block_bytes())
        .zip(scales.chunks_exact(2))
    {
        let (d, dmin) = (f32_to_f16(0.02 * s[0]), f32_to_f16(0.02 * s[1]));
        if t == QType::Q6_K {
            blk[208..210].copy_from_slice(&d.to_le_bytes());
        } else {
            blk[..2].copy_from_slice(&d.to_le_bytes());
            blk[2..4].copy_from_slice(&dmin.to_le_bytes());
        }
    }
    b
}
