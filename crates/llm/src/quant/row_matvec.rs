//! The decode matvec of the formats kept row by row ([`super::tensor::Layout::Rows`]: Q5_0,
//! Q5_1, Q4_K, Q5_K, Q6_K), with f32 activations: each block of a row dequantized exactly
//! (its format's definition, `quant/formats/`) into registers-sized scratch on the stack,
//! then multiplied (FMA) against `x`. One body over `kernel_simd::Simd`, instantiated for the
//! portable, AVX2, AVX-512 and NEON levels, so the dequantization is compiled (and
//! vectorized where the compiler can) for each level.
//!
//! This is the exact, general path: its result is the f32 dot product of `x` with the very
//! values [`super::format::dequantize_row`] gives.

use kernel_simd::Simd;

use super::format::{QType, QK, QK_K};
use super::formats::{q4_0, q4_1, q4_k, q5_0, q5_1, q5_k, q6_k, q8_0};
use super::tensor::{Layout, QTensor};
use crate::output::Output;

/// A run of rows of one quantized matrix in the file's layout.
#[derive(Clone, Copy)]
pub struct Rows<'a> {
    /// The format.
    pub qtype: QType,
    /// Whole rows, one after another.
    pub bytes: &'a [u8],
    /// Weights per row.
    pub cols: usize,
}

impl<'a> Rows<'a> {
    /// Rows `r0 .. r0 + rows` of `w` (fewer at the end), when `w` is held row by row.
    pub fn of(w: &'a QTensor, r0: usize, rows: usize) -> Option<Self> {
        let Layout::Rows(b) = w.layout() else {
            return None;
        };
        let rb = w.row_bytes();
        let begin = (r0 * rb).min(b.len());
        let end = ((r0 + rows) * rb).min(b.len());
        Some(Rows {
            qtype: w.qtype(),
            bytes: &b[begin..end],
            cols: w.cols(),
        })
    }
}

/// `o[i] (+)= row i . x` over rows of blocks of `N` weights, each dequantized by `deq`.
#[inline(always)]
fn rows_dot<S: Simd, const N: usize, F: Fn(&[u8], &mut [f32])>(
    s: S,
    w: Rows<'_>,
    x: &[f32],
    o: &mut [f32],
    output: Output,
    deq: F,
) {
    let (l, bb) = (S::LANES, w.qtype.block_bytes());
    let rb = w.qtype.row_bytes(w.cols);
    if !w.cols.is_multiple_of(N)
        || x.len() < w.cols
        || w.bytes.len() < o.len() * rb
        || !N.is_multiple_of(2 * l)
    {
        o.fill(f32::NAN);
        return;
    }
    let mut buf = [0f32; N];
    for (oi, row) in o.iter_mut().zip(w.bytes.chunks_exact(rb.max(1))) {
        let mut acc = [s.zero(); 2];
        for (blk, xb) in row.chunks_exact(bb).zip(x.chunks_exact(N)) {
            deq(blk, &mut buf);
            for c in (0..N).step_by(2 * l) {
                for (u, a) in acc.iter_mut().enumerate() {
                    // SAFETY: `c + 2 * LANES <= N` (`2 * LANES` divides `N`): inside `buf`
                    // and `xb`, both `N` floats.
                    unsafe {
                        let (wv, xv) = (
                            s.load(buf.as_ptr().add(c + u * l)),
                            s.load(xb.as_ptr().add(c + u * l)),
                        );
                        *a = s.fma(wv, xv, *a);
                    }
                }
            }
        }
        *oi = output.apply(*oi, s.reduce_sum(s.add(acc[0], acc[1])));
    }
}

/// `o[i] (+)= row i . x` for the rows of `w` (NaN if the lengths do not fit; the kernels
/// check the shapes, so this does not happen).
#[inline(always)]
fn matvec_body<S: Simd>(s: S, w: Rows<'_>, x: &[f32], o: &mut [f32], output: Output) {
    match w.qtype {
        QType::Q4_0 => rows_dot::<S, QK, _>(s, w, x, o, output, q4_0::dequantize),
        QType::Q4_1 => rows_dot::<S, QK, _>(s, w, x, o, output, q4_1::dequantize),
        QType::Q5_0 => rows_dot::<S, QK, _>(s, w, x, o, output, q5_0::dequantize),
        QType::Q5_1 => rows_dot::<S, QK, _>(s, w, x, o, output, q5_1::dequantize),
        QType::Q8_0 => rows_dot::<S, QK, _>(s, w, x, o, output, q8_0::dequantize),
        QType::Q4_K => rows_dot::<S, QK_K, _>(s, w, x, o, output, q4_k::dequantize),
        QType::Q5_K => rows_dot::<S, QK_K, _>(s, w, x, o, output, q5_k::dequantize),
        QType::Q6_K => rows_dot::<S, QK_K, _>(s, w, x, o, output, q6_k::dequantize),
    }
}

kernel_simd::instantiate! {
    /// The decode matvec over a run of rows held row by row.
    pub fn matvec(w: Rows<'_>, x: &[f32], o: &mut [f32], output: Output) = matvec_body;
}
