//! The decode matvec of the formats kept row by row ([`super::tensor::Layout::Rows`]:
//! Q5_K), with f32 activations: each row's dot product with `x` by its
//! format's own kernel (`dot` in its file in `quant/formats/`), which widens the packed
//! quants in registers and FMAs them against `x` per (sub-)block, then applies the block's
//! scale, and its minimum or offset against the block's sum of `x`: the dot product of `x`
//! with the values [`super::format::dequantize_row`] gives, summed in another order. One
//! body over `kernel_simd::Simd`, instantiated for the portable, AVX2, AVX-512 and NEON
//! levels.

use kernel_simd::Simd;

use super::format::QType;
use super::formats::q5_k;
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

/// `o[i] (+)= row i . x` for the rows of `w` (NaN if the lengths do not fit; the kernels
/// check the shapes, so this does not happen): each format's own dot product over its
/// packed bits, called by name here so that it is compiled inside this function's level (a
/// kernel passed in as a closure or a function value is compiled without the level's target
/// features: its intrinsics become calls, measured 50x slower for Q6_K). The formats packed
/// in groups never come here; should one, its rows are NaN, not a guess.
#[inline(always)]
fn matvec_body<S: Simd>(s: S, w: Rows<'_>, x: &[f32], o: &mut [f32], output: Output) {
    let rb = w.qtype.row_bytes(w.cols);
    if !w.cols.is_multiple_of(w.qtype.block_len())
        || x.len() < w.cols
        || w.bytes.len() < o.len() * rb
    {
        o.fill(f32::NAN);
        return;
    }
    let x = &x[..w.cols];
    for (oi, row) in o.iter_mut().zip(w.bytes.chunks_exact(rb.max(1))) {
        let dot = match w.qtype {
            QType::Q5_K => q5_k::dot(s, row, x),
            QType::Q4_0
            | QType::Q4_1
            | QType::Q5_0
            | QType::Q5_1
            | QType::Q8_0
            | QType::Q4_K
            | QType::Q6_K => f32::NAN,
        };
        *oi = output.apply(*oi, dot);
    }
}

kernel_simd::instantiate! {
    /// The decode matvec over a run of rows held row by row.
    pub fn matvec(w: Rows<'_>, x: &[f32], o: &mut [f32], output: Output) = matvec_body;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_data::{close, data, file_rows};
    use kernel_simd::available_levels;

    /// `rows` rows of `blocks` blocks of `t` from seeded data.
    fn rows_of(t: QType, rows: usize, blocks: usize, seed: u32) -> QTensor {
        let k = blocks * t.block_len();
        QTensor::from_bytes(t, rows, k, &file_rows(t, rows, k, seed)).unwrap()
    }

    /// Every level's row matvec, in every format held row by row, against f64 dot products
    /// of the exactly dequantized rows, written over and added to the output.
    #[test]
    fn row_matvec_matches_f64_on_every_level() {
        for t in QType::ALL.into_iter().filter(|t| !t.grouped()) {
            for (rows, blocks) in [(1, 1), (5, 2), (17, 3)] {
                let w = rows_of(t, rows, blocks, (rows * 13 + blocks) as u32);
                let exact = w.to_f32();
                let x = data(w.cols(), 77 + blocks as u32);
                let want: Vec<f64> = exact
                    .chunks_exact(w.cols())
                    .map(|r| {
                        r.iter()
                            .zip(&x)
                            .map(|(&a, &b)| f64::from(a) * f64::from(b))
                            .sum()
                    })
                    .collect();
                assert!(want.iter().any(|&v| v != 0.0), "{t:?}: all zero");
                for level in available_levels() {
                    let rw = Rows::of(&w, 0, rows).unwrap();
                    let mut o = vec![1.0f32; rows];
                    matvec::run(level, rw, &x, &mut o, Output::AddTo);
                    for (r, (&got, &d)) in o.iter().zip(&want).enumerate() {
                        close(got, 1.0 + d, &format!("{level} {t:?} add row {r}"));
                    }
                    let rw = Rows::of(&w, 1.min(rows - 1), rows - 1.min(rows - 1)).unwrap();
                    let mut o = vec![f32::NAN; rw.bytes.len() / w.row_bytes()];
                    matvec::run(level, rw, &x, &mut o, Output::Overwrite);
                    for (r, (&got, &d)) in o.iter().zip(&want[1.min(rows - 1)..]).enumerate() {
                        close(got, d, &format!("{level} {t:?} overwrite row {r}"));
                    }
                }
            }
        }
    }

    /// Lengths that do not fit give NaN, not a read out of bounds.
    #[test]
    fn row_matvec_refuses_short_inputs() {
        let w = rows_of(QType::Q5_K, 2, 2, 3);
        let x = data(256, 2); // one super-block of the two
        for level in available_levels() {
            let mut o = [0f32; 2];
            matvec::run(
                level,
                Rows::of(&w, 0, 2).unwrap(),
                &x,
                &mut o,
                Output::Overwrite,
            );
            assert!(o.iter().all(|v| v.is_nan()), "{level}");
        }
    }
}
