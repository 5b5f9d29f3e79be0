//! A weight matrix of either kind the model runs, dense ([`Tensor`]: f32, bf16, f16) or
//! block-quantized ([`QTensor`]: Q4_0, Q4_1, Q8_0), and the linear-layer entry points that
//! dispatch to [`crate::kernels`] or [`crate::quant_kernels`].

use std::path::Path;

use caching_allocator::TempAllocator;

use crate::error::{LlmError, Result};
use crate::kernels;
use crate::quant::QTensor;
use crate::quant_kernels;
use crate::runtime::Scratch;
use crate::safetensors::Tensor;

/// A `[rows, cols]` weight matrix (HF `[out, in]` orientation).
#[derive(Clone, Debug)]
pub enum Matrix {
    /// f32, bf16 or f16 elements.
    Dense(Tensor),
    /// Blocks of 32 quantized weights per row.
    Quant(QTensor),
}

impl From<Tensor> for Matrix {
    fn from(t: Tensor) -> Self {
        Matrix::Dense(t)
    }
}

impl From<QTensor> for Matrix {
    fn from(t: QTensor) -> Self {
        Matrix::Quant(t)
    }
}

impl Matrix {
    /// `[rows, cols]` (a dense tensor's own shape).
    pub fn shape(&self) -> Vec<usize> {
        match self {
            Matrix::Dense(t) => t.shape().to_vec(),
            Matrix::Quant(q) => vec![q.rows(), q.cols()],
        }
    }

    /// The stored bytes (what a matvec streams).
    pub fn bytes(&self) -> &[u8] {
        match self {
            Matrix::Dense(t) => t.bytes(),
            Matrix::Quant(q) => q.groups().bytes(),
        }
    }

    /// The file the matrix comes from.
    pub fn path(&self) -> &Path {
        match self {
            Matrix::Dense(t) => t.path(),
            Matrix::Quant(q) => q.path(),
        }
    }

    /// Every element as f32, row-major (dequantized exactly for quantized matrices).
    pub fn to_f32(&self) -> Vec<f32> {
        match self {
            Matrix::Dense(t) => t.to_f32(),
            Matrix::Quant(q) => q.to_f32(),
        }
    }

    /// The element type's name (`F32`, `BF16`, `Q4_1`, ...).
    pub fn type_name(&self) -> &'static str {
        match self {
            Matrix::Dense(t) => t.dtype().name(),
            Matrix::Quant(q) => q.qtype().name(),
        }
    }
}

/// `out[i, r] (+)= x[i] . w[r] + bias[r]` over `m` rows of `x` (`[m, k]`); `w` has `n` rows.
#[allow(clippy::too_many_arguments)]
pub fn linear<A: TempAllocator + ?Sized>(
    s: &Scratch<'_, A>,
    x: &[f32],
    m: usize,
    w: &Matrix,
    n: usize,
    k: usize,
    bias: Option<&[f32]>,
    out: &mut [f32],
    accumulate: bool,
) -> Result<()> {
    match w {
        Matrix::Dense(t) => kernels::linear(s, x, m, t.data(), n, k, bias, out, accumulate),
        Matrix::Quant(q) => {
            if q.rows() != n || q.cols() != k {
                return Err(LlmError::InvalidArgument {
                    message: format!(
                        "linear: {} matrix [{}, {}], want [{n}, {k}]",
                        q.qtype().name(),
                        q.rows(),
                        q.cols()
                    ),
                });
            }
            quant_kernels::linear(s, x, m, q, bias, out, accumulate)
        }
    }
}

/// One matrix of [`linear_many`], of either kind.
pub type Job<'a> = kernels::LinearJob<'a, &'a Matrix>;

/// Several decode matvecs over the same `x` (`k` floats) in one parallel section when every
/// matrix is of one kind; one after another otherwise.
pub fn linear_many<A: TempAllocator + ?Sized, const J: usize>(
    s: &Scratch<'_, A>,
    x: &[f32],
    k: usize,
    jobs: [Job<'_>; J],
) -> Result<()> {
    if jobs.iter().all(|j| matches!(j.w, Matrix::Dense(_))) {
        let jobs = jobs.map(|j| kernels::LinearJob {
            // Every matrix is dense (checked above); an empty view would be refused.
            w: match j.w {
                Matrix::Dense(t) => t.data(),
                Matrix::Quant(_) => crate::safetensors::TensorData::F32(&[]),
            },
            n: j.n,
            bias: j.bias,
            out: j.out,
            accumulate: j.accumulate,
        });
        return kernels::linear_many(s, x, k, jobs);
    }
    if jobs.iter().all(|j| matches!(j.w, Matrix::Quant(_))) {
        return quant_kernels::linear_many(s, x, k, jobs);
    }
    for j in jobs {
        linear(s, x, 1, j.w, j.n, k, j.bias, j.out, j.accumulate)?;
    }
    Ok(())
}

/// `out[r] = silu(gate[r] . x) * (up[r] . x)` for `r < n` (decode).
pub fn linear_swiglu<A: TempAllocator + ?Sized>(
    s: &Scratch<'_, A>,
    x: &[f32],
    k: usize,
    gate: &Matrix,
    up: &Matrix,
    n: usize,
    out: &mut [f32],
) -> Result<()> {
    match (gate, up) {
        (Matrix::Dense(g), Matrix::Dense(u)) => {
            kernels::linear_swiglu(s, x, k, g.data(), u.data(), n, out)
        }
        (Matrix::Quant(g), Matrix::Quant(u)) if g.rows() == n => {
            quant_kernels::linear_swiglu(s, x, k, g, u, out)
        }
        _ => {
            let out = out.get_mut(..n).ok_or_else(|| LlmError::InvalidArgument {
                message: "linear_swiglu: output too short".into(),
            })?;
            let up_out = s.f32s(n)?;
            linear(s, x, 1, gate, n, k, None, out, false)?;
            linear(s, x, 1, up, n, k, None, up_out, false)?;
            kernels::swiglu(out, up_out);
            Ok(())
        }
    }
}

/// Embedding lookup: row `tokens[i]` of `table` (`[vocab, dim]`) into `out[i]`.
pub fn embed(table: &Matrix, dim: usize, tokens: &[u32], out: &mut [f32]) -> Result<()> {
    match table {
        Matrix::Dense(t) => kernels::embed(t.data(), dim, tokens, out),
        Matrix::Quant(q) => quant_kernels::embed(q, tokens, out),
    }
}
