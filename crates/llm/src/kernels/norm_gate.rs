//! The element-wise kernels the Gemma 3 block adds to the Llama one: RMSNorm over each head
//! (q/k norms), a norm whose result is added to the residual stream (post-norms), the
//! embedding scale, and GELU (tanh) gating. None needs more scratch than one row.

use caching_allocator::TempAllocator;

use super::{isa, simd};
use crate::error::{LlmError, Result};
use crate::runtime::Scratch;

/// `1 / sqrt(mean(x^2) + eps)`, the sum of squares on the SIMD level `isa` picked.
fn inv_rms(level: kernel_simd::Level, x: &[f32], eps: f32) -> f32 {
    let ss = simd::sum_squares::run(level, x);
    1.0 / (ss / x.len() as f32 + eps).sqrt()
}

/// RMSNorm in place over every `weight.len()`-element head of `x` (`[positions, heads,
/// head_dim]`): Gemma 3's q and k norms. One head of scratch.
pub fn rmsnorm_heads<A: TempAllocator + ?Sized>(
    s: &Scratch<'_, A>,
    x: &mut [f32],
    weight: &[f32],
    eps: f32,
) -> Result<()> {
    let dim = weight.len();
    if dim == 0 || !x.len().is_multiple_of(dim) {
        return Err(LlmError::InvalidArgument {
            message: format!(
                "rmsnorm_heads: {} values are not whole heads of {dim}",
                x.len()
            ),
        });
    }
    let level = isa();
    let row = s.f32s(dim)?;
    for head in x.chunks_exact_mut(dim) {
        let r = inv_rms(level, head, eps);
        row.copy_from_slice(head);
        simd::scale_rows::run(level, row, r, weight, head);
    }
    Ok(())
}

/// `stream += rmsnorm(x) * weight` over `rows` rows of `weight.len()`: a block's output
/// normed before the residual add (Gemma 3's `post_attention_norm` and `post_ffw_norm`).
/// One row of scratch.
pub fn rmsnorm_add<A: TempAllocator + ?Sized>(
    s: &Scratch<'_, A>,
    x: &[f32],
    rows: usize,
    weight: &[f32],
    eps: f32,
    stream: &mut [f32],
) -> Result<()> {
    let dim = weight.len();
    let n = rows.checked_mul(dim);
    if n.is_none_or(|n| x.len() < n || stream.len() < n) {
        return Err(LlmError::InvalidArgument {
            message: "rmsnorm_add: length mismatch".into(),
        });
    }
    let level = isa();
    let normed = s.f32s(dim)?;
    for (xr, sr) in x
        .chunks_exact(dim)
        .zip(stream.chunks_exact_mut(dim))
        .take(rows)
    {
        simd::scale_rows::run(level, xr, inv_rms(level, xr, eps), weight, normed);
        sr.iter_mut().zip(normed.iter()).for_each(|(a, b)| *a += b);
    }
    Ok(())
}

/// `x *= factor` (Gemma's embedding scale, `sqrt(hidden)`).
pub fn scale(x: &mut [f32], factor: f32) {
    x.iter_mut().for_each(|v| *v *= factor);
}

/// GELU, tanh approximation (`gelu_pytorch_tanh`): `0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715
/// g^3)))`.
pub fn gelu_tanh(g: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * g * (1.0 + (SQRT_2_OVER_PI * (g + 0.044_715 * g * g * g)).tanh())
}

/// GELU (tanh) gating in place: `gate[i] = gelu_tanh(gate[i]) * up[i]`. Needs no scratch.
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    gate.iter_mut()
        .zip(up)
        .for_each(|(g, u)| *g = gelu_tanh(*g) * u);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gelu_tanh_matches_its_definition_in_f64() {
        for i in -40..=40 {
            let g = i as f64 * 0.25;
            let c = (2.0 / std::f64::consts::PI).sqrt();
            let want = 0.5 * g * (1.0 + (c * (g + 0.044715 * g * g * g)).tanh());
            let got = gelu_tanh(g as f32) as f64;
            assert!(
                (got - want).abs() <= 1e-6 * (1.0 + want.abs()),
                "{g}: {got} {want}"
            );
        }
    }
}
