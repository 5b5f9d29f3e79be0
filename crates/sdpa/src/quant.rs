//! The int8 KV cache: ExecuTorch's quantized-cache layout (int8 values with one f32 scale and
//! one int8 zero point per token and KV head, asymmetric), and the function that quantizes new
//! K or V rows into it.

use crate::elem::Element;
use crate::{SdpaError, Shape, Tensor};

/// One int8-quantized cache (K or V), read-only. Value `x` of position `t`, head `h`, lane `j`
/// stands for `(values[.., t, h, j] - zero_points[.., t, h]) * scales[.., t, h]`.
#[derive(Clone, Copy, Debug)]
pub struct QuantizedKv<'a> {
    /// `[batch, kv_capacity, kv_heads, head_dim]` quantized values.
    pub values: &'a [i8],
    /// `[batch, kv_capacity, kv_heads]` scales.
    pub scales: &'a [f32],
    /// `[batch, kv_capacity, kv_heads]` zero points.
    pub zero_points: &'a [i8],
}

/// One int8-quantized cache (K or V), writable: the target of [`quantize_kv`].
#[derive(Debug)]
pub struct QuantizedKvMut<'a> {
    /// `[batch, kv_capacity, kv_heads, head_dim]` quantized values.
    pub values: &'a mut [i8],
    /// `[batch, kv_capacity, kv_heads]` scales.
    pub scales: &'a mut [f32],
    /// `[batch, kv_capacity, kv_heads]` zero points.
    pub zero_points: &'a mut [i8],
}

/// Element counts of a quantized cache: (values, scales = zero points).
pub(crate) fn cache_elems(shape: &Shape) -> Result<(usize, usize), SdpaError> {
    let values = shape.kv_elems()?;
    // kv_elems succeeded, so this product (a divisor of it, head_dim >= 1) cannot overflow.
    Ok((values, values / shape.head_dim))
}

/// Checks the three slice lengths of a cache against the shape, naming `tensors` (values,
/// scales, zero points) in the error.
pub(crate) fn check_lens(
    shape: &Shape,
    lens: [usize; 3],
    tensors: [Tensor; 3],
) -> Result<(), SdpaError> {
    let (values, scales) = cache_elems(shape)?;
    for ((expected, actual), tensor) in [values, scales, scales].into_iter().zip(lens).zip(tensors)
    {
        if expected != actual {
            return Err(SdpaError::LenMismatch {
                tensor,
                expected,
                actual,
            });
        }
    }
    Ok(())
}

/// Quantizes `rows` — new K (or V) rows `[batch, q_len, kv_heads, head_dim]` for positions
/// `start_pos..start_pos + q_len` — into `cache`, one scale and zero point per (position, KV
/// head): asymmetric int8 over the row's range widened to include 0 (as ExecuTorch's
/// per-token quantization does), so `zero_point` fits in int8 and 0 is exact. The error of a
/// dequantized value is at most half a scale step, `(max - min) / 510`. Only those positions
/// are written. `shape.heads` is not used beyond validation. Non-finite inputs give a
/// non-finite scale (and so non-finite dequantized values), never a panic.
///
/// # Errors
/// The shape's error, or `LenMismatch` naming `Tensor::NewRows` or the cache slice
/// (`CacheValues`, `CacheScales`, `CacheZeroPoints`) whose length is wrong; nothing is written
/// then.
pub fn quantize_kv<T: Element>(
    rows: &[T],
    cache: QuantizedKvMut<'_>,
    shape: &Shape,
) -> Result<(), SdpaError> {
    shape.validate()?;
    check_lens(
        shape,
        [
            cache.values.len(),
            cache.scales.len(),
            cache.zero_points.len(),
        ],
        [
            Tensor::CacheValues,
            Tensor::CacheScales,
            Tensor::CacheZeroPoints,
        ],
    )?;
    let d = shape.head_dim;
    let new_rows = shape.batch * shape.q_len * shape.kv_heads; // <= the cache's row count
    let expected = new_rows * d;
    if rows.len() != expected {
        return Err(SdpaError::LenMismatch {
            tensor: Tensor::NewRows,
            expected,
            actual: rows.len(),
        });
    }
    for (r, src) in rows.chunks_exact(d).enumerate() {
        let (b, rest) = (
            r / (shape.q_len * shape.kv_heads),
            r % (shape.q_len * shape.kv_heads),
        );
        let (i, h) = (rest / shape.kv_heads, rest % shape.kv_heads);
        let row = (b * shape.kv_capacity + shape.start_pos + i) * shape.kv_heads + h;
        let (scale, zp) = quantize_row(src, &mut cache.values[row * d..(row + 1) * d]);
        cache.scales[row] = scale;
        cache.zero_points[row] = zp;
    }
    Ok(())
}

/// Quantizes one row into `dst`, returning its (scale, zero point).
fn quantize_row<T: Element>(src: &[T], dst: &mut [i8]) -> (f32, i8) {
    let (mut lo, mut hi) = (0f32, 0f32);
    for x in src {
        let x = x.to_f32();
        lo = lo.min(x);
        hi = hi.max(x);
    }
    if !(lo.is_finite() && hi.is_finite()) || src.iter().any(|x| x.to_f32().is_nan()) {
        dst.fill(0);
        return (f32::NAN, 0);
    }
    // f32::EPSILON keeps an all-zero row's scale positive (as ExecuTorch does).
    let scale = ((f64::from(hi) - f64::from(lo)) / 255.0).max(f64::from(f32::EPSILON)) as f32;
    let zp = (-128.0 - f64::from(lo) / f64::from(scale))
        .round()
        .clamp(-128.0, 127.0);
    for (q, x) in dst.iter_mut().zip(src) {
        let v = (f64::from(x.to_f32()) / f64::from(scale)).round() + zp;
        *q = v.clamp(-128.0, 127.0) as i8;
    }
    (scale, zp as i8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_error_is_at_most_half_a_step() {
        let rows: [&[f32]; 4] = [
            &[0.5, -1.0, 0.0, 3.0, -2.75],
            &[1.0, 2.0, 3.0, 4.0, 5.0],
            &[-1.0, -2.0, -0.5, -4.0, -5.0],
            &[0.0; 5],
        ];
        for src in rows {
            let mut q = [0i8; 5];
            let (scale, zp) = quantize_row(src, &mut q);
            for (x, q) in src.iter().zip(q) {
                let back = (f32::from(q) - f32::from(zp)) * scale;
                assert!(
                    (back - x).abs() <= scale * 0.5 + 1e-6,
                    "{src:?}: {x} -> {back}"
                );
                if *x == 0.0 {
                    assert_eq!(back, 0.0, "zero is exact: {src:?}");
                }
            }
        }
    }

    #[test]
    fn non_finite_rows_give_nan_scale() {
        let mut q = [1i8; 3];
        assert!(quantize_row(&[1.0, f32::NAN, 2.0], &mut q).0.is_nan());
        assert!(quantize_row(&[1.0, f32::INFINITY, 2.0], &mut q).0.is_nan());
    }
}
