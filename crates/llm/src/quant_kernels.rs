//! Linear layers on block-quantized weights ([`QTensor`]: Q4_0, Q4_1, Q8_0) with f32
//! activations: the weights are dequantized in registers and multiplied (FMA) against f32
//! `x`; activations are never quantized.
//!
//! - Decode (`m == 1`): each row's dot product is `sum_b d_b * (q_b . x_b) (+ m_b * sum(x_b))`,
//!   16 rows at a time from the matrix's group layout ([`crate::quant_groups`]; inner loops in
//!   [`crate::quant_simd`]). The per-block sums of `x` that the Q4_1 minimum (and Q4_0's
//!   offset of 8) need are computed once per call into scratch from the temp allocator. Runs
//!   of groups are split over rayon.
//! - Prefill (`m > 1`): the dense kernels' blocked matmul (`kernels::prefill`), each task
//!   dequantizing a block of rows from the same group layout into its scratch.
//!
//! Every kernel runs on the SIMD level [`kernels::isa`] picks (AVX-512, AVX2, NEON or
//! portable, detected at run time, capped by `KERNEL_SIMD_MAX` and
//! [`kernels::set_max_level`]).

use rayon::prelude::*;

use crate::error::{LlmError, Result};
use crate::kernels::{self, row_jobs, Level, LinearJob, PrefillRows};
use crate::matrix::Matrix;
use crate::quant::{QTensor, QK};
use crate::quant_groups::GROUP;
use crate::quant_simd::{self, Activation, Groups};
use crate::runtime::Scratch;
use caching_allocator::TempAllocator;

/// Sums of `x` per block of 32 (`x.len()` a multiple of 32), into scratch.
fn block_sums<'t, A: TempAllocator + ?Sized>(s: &Scratch<'t, A>, x: &[f32]) -> Result<&'t [f32]> {
    let sums = s.f32s(x.len() / QK)?;
    for (o, b) in sums.iter_mut().zip(x.chunks_exact(QK)) {
        *o = b.iter().sum();
    }
    Ok(sums)
}

/// Rows of one parallel task of the decode matvec over `n` rows: whole groups, about four
/// tasks per thread, at most 16 groups.
fn decode_chunk(n: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    n.div_ceil(GROUP).div_ceil(threads * 4).clamp(1, 16) * GROUP
}

/// The groups of rows `r0 .. r0 + rows` of `w` (`r0` a multiple of [`GROUP`]).
fn groups(w: &QTensor, r0: usize, rows: usize) -> Groups<'_> {
    let g = w.groups();
    Groups {
        qtype: w.qtype(),
        bytes: g.groups(r0 / GROUP, rows.div_ceil(GROUP)),
        blocks: g.blocks(),
    }
}

impl PrefillRows for QTensor {
    fn widens(&self) -> bool {
        true
    }

    fn rows<'b>(
        &'b self,
        isa: Level,
        r: usize,
        nb: usize,
        k: usize,
        buf: &'b mut [f32],
    ) -> &'b [f32] {
        self.groups()
            .dequantize_rows(isa, self.qtype(), r, nb, &mut buf[..nb * k]);
        &buf[..nb * k]
    }
}

fn check(w: &QTensor, k: usize, what: &str) -> Result<()> {
    if w.cols() != k {
        return Err(LlmError::InvalidArgument {
            message: format!(
                "{what}: {} matrix of {} columns against x of {k}",
                w.qtype().name(),
                w.cols()
            ),
        });
    }
    Ok(())
}

/// `out[i, r] (+)= sum_j x[i, j] * w[r, j] + bias[r]` for `i < m`, `r < w.rows()`: a `Linear`
/// layer on quantized weights over `m` rows of `x` (`[m, w.cols()]`); `out` is `[m, rows]`.
#[allow(clippy::too_many_arguments)]
pub fn linear<A: TempAllocator + ?Sized>(
    s: &Scratch<'_, A>,
    x: &[f32],
    m: usize,
    w: &QTensor,
    bias: Option<&[f32]>,
    out: &mut [f32],
    accumulate: bool,
) -> Result<()> {
    let (n, k) = (w.rows(), w.cols());
    kernels::check_buffers("quantized linear", [m, n, k], x, out, bias)?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    if m > 1 {
        return kernels::prefill(s, x, m, w, n, k, bias, out, accumulate);
    }
    let isa = kernels::isa();
    let x = &x[..k];
    let xsum = block_sums(s, x)?;
    let job = LinearJob {
        w,
        n,
        bias,
        out,
        accumulate,
    };
    let x = Activation { x, sums: xsum };
    row_jobs::run([job], decode_chunk, |w, r0, o, add| {
        quant_simd::matvec::run(isa, groups(w, r0, o.len()), x, o, add)
    });
    Ok(())
}

/// Several decode matvecs over the same `x` (`k` floats) in one parallel section.
pub fn linear_many<A: TempAllocator + ?Sized, const J: usize>(
    s: &Scratch<'_, A>,
    x: &[f32],
    k: usize,
    jobs: [LinearJob<'_, &Matrix>; J],
) -> Result<()> {
    let x = x.get(..k).ok_or_else(|| LlmError::InvalidArgument {
        message: format!("quantized linear_many: x has {} floats, want {k}", x.len()),
    })?;
    for j in &jobs {
        let Matrix::Quant(w) = j.w else {
            return Err(LlmError::InvalidArgument {
                message: "quantized linear_many: a dense matrix".into(),
            });
        };
        check(w, k, "quantized linear_many")?;
        let n = w.rows();
        if j.n != n || j.out.len() < n || j.bias.is_some_and(|b| b.len() != n) {
            return Err(LlmError::InvalidArgument {
                message: format!(
                    "quantized linear_many: {} rows, out {} for {n} rows",
                    j.n,
                    j.out.len()
                ),
            });
        }
    }
    let isa = kernels::isa();
    let xsum = block_sums(s, x)?;
    let x = Activation { x, sums: xsum };
    row_jobs::run(jobs, decode_chunk, |w, r0, o, add| {
        // Every matrix is quantized (checked above).
        if let Matrix::Quant(w) = w {
            quant_simd::matvec::run(isa, groups(w, r0, o.len()), x, o, add)
        }
    });
    Ok(())
}

/// The decode MLP's first half in one parallel section: `out[r] = silu(gate[r] . x) *
/// (up[r] . x)`.
pub fn linear_swiglu<A: TempAllocator + ?Sized>(
    s: &Scratch<'_, A>,
    x: &[f32],
    k: usize,
    gate: &QTensor,
    up: &QTensor,
    out: &mut [f32],
) -> Result<()> {
    check(gate, k, "quantized linear_swiglu")?;
    check(up, k, "quantized linear_swiglu")?;
    let n = gate.rows();
    if up.rows() != n || x.len() < k || out.len() < n {
        return Err(LlmError::InvalidArgument {
            message: "quantized linear_swiglu: length mismatch".into(),
        });
    }
    let isa = kernels::isa();
    let x = &x[..k];
    let xsum = block_sums(s, x)?;
    let chunk = decode_chunk(n);
    let x = Activation { x, sums: xsum };
    out[..n]
        .par_chunks_mut(chunk)
        .enumerate()
        .for_each(|(ci, o)| {
            let (r0, rows) = (ci * chunk, o.len());
            quant_simd::swiglu::run(isa, groups(gate, r0, rows), groups(up, r0, rows), x, o);
        });
    Ok(())
}

/// Rows `tokens` of a quantized embedding table into `out` (`tokens.len() * cols`).
pub fn embed(table: &QTensor, tokens: &[u32], out: &mut [f32]) -> Result<()> {
    let dim = table.cols();
    if out.len() < tokens.len() * dim {
        return Err(LlmError::InvalidArgument {
            message: "embed: output too small".into(),
        });
    }
    for (&t, o) in tokens.iter().zip(out.chunks_exact_mut(dim)) {
        if t as usize >= table.rows() {
            return Err(LlmError::BadToken {
                token: t,
                vocab: table.rows(),
            });
        }
        table.dequantize_row(t as usize, o);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_data::{close, data};
    use crate::quant::{quantize_row, QType};
    use crate::quant_simd::{matvec, swiglu, Activation};
    use kernel_simd::available_levels;

    /// Every level's group matvec and SwiGLU, in every format, against f64 dot products of
    /// the exactly dequantized rows, for row counts around a group (padding rows) and
    /// several block counts.
    #[test]
    fn group_kernels_match_f64_on_every_level() {
        for t in [QType::Q4_0, QType::Q4_1, QType::Q8_0] {
            for (rows, blocks) in [(1, 1), (5, 2), (16, 1), (21, 3), (33, 4)] {
                let k = blocks * QK;
                let wf = data(rows * k, (rows * 31 + blocks) as u32);
                let bytes: Vec<u8> = wf
                    .chunks_exact(k)
                    .flat_map(|r| quantize_row(t, r))
                    .collect();
                let w = QTensor::from_bytes(t, rows, k, &bytes).unwrap();
                let exact = w.to_f32();
                let x = data(k, 99 + blocks as u32);
                let xsum: Vec<f32> = x.chunks_exact(QK).map(|b| b.iter().sum()).collect();
                let want: Vec<f64> = exact
                    .chunks_exact(k)
                    .map(|r| {
                        r.iter()
                            .zip(&x)
                            .map(|(&a, &b)| f64::from(a) * f64::from(b))
                            .sum()
                    })
                    .collect();
                let (wg, xa) = (groups(&w, 0, rows), Activation { x: &x, sums: &xsum });
                for level in available_levels() {
                    let what = format!("{level} {t:?} rows {rows} blocks {blocks}");
                    let mut o = vec![1.0f32; rows];
                    matvec::run(level, wg, xa, &mut o, true);
                    for (r, &got) in o.iter().enumerate() {
                        close(got, 1.0 + want[r], &format!("{what} matvec row {r}"));
                    }
                    swiglu::run(level, wg, wg, xa, &mut o);
                    for (r, &got) in o.iter().enumerate() {
                        let v = want[r];
                        close(
                            got,
                            v / (1.0 + (-v).exp()) * v,
                            &format!("{what} swiglu row {r}"),
                        );
                    }
                }
            }
        }
    }

    /// Lengths that do not fit give NaN, not a read out of bounds.
    #[test]
    fn group_matvec_refuses_short_inputs() {
        let bytes = quantize_row(QType::Q4_1, &data(64, 1));
        let w = QTensor::from_bytes(QType::Q4_1, 1, 64, &bytes).unwrap();
        let x = data(32, 2); // one block of the two
        let mut o = [0f32; 1];
        for level in available_levels() {
            let xa = Activation {
                x: &x,
                sums: &[0.0; 2],
            };
            matvec::run(level, groups(&w, 0, 1), xa, &mut o, false);
            assert!(o[0].is_nan(), "{level}");
        }
    }
}
