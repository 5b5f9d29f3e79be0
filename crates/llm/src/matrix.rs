//! A weight matrix of either kind the model runs, dense ([`Tensor`]: f32, bf16, f16) or
//! block-quantized ([`QTensor`]: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K), and the [`Linear`] layer over one: the
//! one place a matrix's kind picks its row kernel.
//!
//! - Decode (one row of `x`): every matrix's rows dotted with `x` in registers, chunks of
//!   output rows in parallel ([`Linear::forward`]); several matrices over the same `x` (a
//!   layer's q, k and v) in one parallel section ([`Linear::forward_many`]), and the MLP's
//!   gate and up projections fused with SwiGLU ([`Linear::forward_swiglu`]). `x` is
//!   prepared once per call for the kernels that read it: de-interleaved pair blocks for bf16
//!   rows, sums per block of 32 for quantized rows (the Q4_1 minimum, Q4_0's offset of 8),
//!   both in scratch. Activations stay f32 unless the runtime opts in to
//!   [`Activations::Int8`] (inexact): then `x` is also quantized to int8 per block, in
//!   scratch, for the 4-bit rows.
//! - Prefill (more rows): the blocked matmul of [`crate::kernels`], each task widening or
//!   dequantizing a block of weight rows into its scratch.

use std::path::Path;

use caching_allocator::TempAllocator;

use crate::error::{LlmError, Result};
use crate::kernels::row_jobs::{self, RowJob, MAX_CHUNK};
use crate::kernels::row_kernel::Kernel;
use crate::kernels::simd::{self as dense, deinterleave, pair_block, Rows};
use crate::kernels::{self, check_buffers, Gemm, Level};
use crate::output::Output;
use crate::quant::format::QK;
use crate::quant::group_matvec::{self, Activation, Groups, Int8X};
use crate::quant::QTensor;
use crate::runtime::{Activations, Scratch};
use crate::safetensors::{Tensor, TensorData};

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
            Matrix::Quant(q) => q.bytes(),
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

impl Matrix {
    /// Rows (outputs).
    pub fn rows(&self) -> usize {
        match self {
            Matrix::Dense(t) => t.shape().first().copied().unwrap_or(0),
            Matrix::Quant(q) => q.rows(),
        }
    }

    /// Columns (inputs).
    pub fn cols(&self) -> usize {
        match self {
            Matrix::Dense(t) => t.shape().iter().skip(1).product(),
            Matrix::Quant(q) => q.cols(),
        }
    }

    /// The row kernel that runs this matrix.
    pub(crate) fn kernel(&self) -> Kernel<'_> {
        match self {
            Matrix::Dense(t) => Kernel::Dense(match t.data() {
                TensorData::F32(d) => Rows::F32(d),
                TensorData::BF16(d) => Rows::Bf16(d),
                TensorData::F16(d) => Rows::F16(d),
            }),
            Matrix::Quant(q) => Kernel::Quant(q),
        }
    }

    /// Embedding lookup: row `tokens[i]` of this `[vocab, dim]` table widened (or
    /// dequantized exactly) into `out[i * dim ..][..dim]`.
    pub fn embed(&self, tokens: &[u32], out: &mut [f32]) -> Result<()> {
        let (vocab, dim) = (self.rows(), self.cols());
        if out.len() < tokens.len() * dim {
            return Err(LlmError::InvalidArgument {
                message: "embed: output too short".into(),
            });
        }
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(LlmError::BadToken { token: t, vocab });
        }
        let level = kernels::isa();
        for (&t, o) in tokens.iter().zip(out.chunks_exact_mut(dim.max(1))) {
            let t = t as usize;
            match self.kernel() {
                Kernel::Dense(Rows::F32(d)) => o.copy_from_slice(&d[t * dim..][..dim]),
                widened => _ = widened.f32_rows(level, t..t + 1, dim, o),
            }
        }
        Ok(())
    }
}

/// The decode input as every row kernel reads it, prepared once per call.
#[derive(Clone, Copy)]
struct DecodeX<'a> {
    /// `x` itself.
    x: &'a [f32],
    /// The level of every kernel but bf16 rows'.
    level: Level,
    /// The level of bf16 rows' kernels, and of `pairs`.
    pair_level: Level,
    /// `x` de-interleaved into pair blocks at `pair_level` (empty without bf16 rows).
    pairs: &'a [f32],
    /// Sums of `x` per block of 32, for the rows that read the f32 `x` (empty without
    /// quantized rows).
    sums: &'a [f32],
    /// `x` quantized to int8, with [`Activations::Int8`] and 4-bit rows.
    int8: Option<Int8X<'a>>,
}

impl<'a> DecodeX<'a> {
    /// `x` prepared for `kernels`, the pair blocks and block sums in scratch.
    fn new<A: TempAllocator + ?Sized>(
        s: &Scratch<'a, A>,
        x: &'a [f32],
        readers: &[Kernel<'_>],
    ) -> Result<Self> {
        let level = kernels::isa();
        // bf16 rows are memory-bound, and the AVX-512 instantiation decoded slower than the
        // AVX2 one on this project's AVX-512 machines (measured interleaved in one run:
        // 0.5-0.9x on 2 threads, 0.88-0.99x on 1): they run at most on AVX2.
        let pair_level = match level {
            Level::Avx512 => Level::Avx2,
            level => level,
        };
        let mut d = DecodeX {
            x,
            level,
            pair_level,
            pairs: &[],
            sums: &[],
            int8: None,
        };
        if readers.iter().any(|k| k.bf16()) {
            let b = pair_block(pair_level);
            let pairs = s.f32s(x.len() / b * b)?;
            deinterleave(pair_level, x, pairs);
            d.pairs = pairs;
        }
        // Rows of 4-bit nibbles, which the int8 kernels read; the other quantized rows read
        // the f32 `x` and its sums.
        let four_bit = |k: &Kernel<'_>| match k {
            Kernel::Quant(q) => q.format().nibbles(),
            Kernel::Dense(_) => false,
        };
        let blocks = x.len() / QK;
        let int8 = s.activations() == Activations::Int8 && readers.iter().any(four_bit);
        if int8 {
            let (q, scales, sums) = (s.i8s(blocks * QK)?, s.f32s(blocks)?, s.f32s(blocks)?);
            group_matvec::quantize::run(level, x, q, scales, sums);
            d.int8 = Some(Int8X { q, scales, sums });
        }
        let f32_rows = |k: &Kernel<'_>| matches!(k, Kernel::Quant(_)) && !(int8 && four_bit(k));
        if readers.iter().any(f32_rows) {
            let sums = s.f32s(blocks)?;
            group_matvec::block_sums::run(level, x, sums);
            d.sums = sums;
        }
        Ok(d)
    }

    /// The quantized kernels' view of `x`.
    fn activation(&self) -> Activation<'a> {
        Activation {
            x: self.x,
            sums: self.sums,
            int8: self.int8,
        }
    }

    /// The level of a kernel over `k`'s rows.
    fn level_of(&self, k: Kernel<'_>) -> Level {
        if k.bf16() {
            self.pair_level
        } else {
            self.level
        }
    }

    /// `o[i] (output)= row r0 + i of w . x`.
    fn matvec(&self, w: Kernel<'_>, r0: usize, o: &mut [f32], output: Output) {
        let level = self.level_of(w);
        match w {
            Kernel::Dense(rows) => {
                dense::matvec::run(level, rows, r0, self.x, self.pairs, o, output);
            }
            Kernel::Quant(q) => {
                let g = Groups::of(q, r0, o.len());
                group_matvec::matvec::run(level, g, self.activation(), o, output);
            }
        }
    }

    /// `o[i] = silu(gate_r . x) * (up_r . x)` for rows `r = r0 + i`: fused when both
    /// matrices are of one kind, two matvecs a chunk otherwise (`o.len() <= MAX_CHUNK`).
    fn swiglu(&self, gate: Kernel<'_>, up: Kernel<'_>, r0: usize, o: &mut [f32]) {
        match (gate, up) {
            (Kernel::Dense(g), Kernel::Dense(u)) => {
                let level = if gate.bf16() || up.bf16() {
                    self.pair_level
                } else {
                    self.level
                };
                dense::swiglu_rows::run(level, g, u, r0, self.x, self.pairs, o);
            }
            (Kernel::Quant(gq), Kernel::Quant(uq)) => {
                let (g, u) = (Groups::of(gq, r0, o.len()), Groups::of(uq, r0, o.len()));
                group_matvec::swiglu::run(self.level, g, u, self.activation(), o);
            }
            _ => {
                let mut up_rows = [0f32; MAX_CHUNK];
                let up_rows = &mut up_rows[..o.len()];
                self.matvec(gate, r0, o, Output::Overwrite);
                self.matvec(up, r0, up_rows, Output::Overwrite);
                kernels::swiglu(o, up_rows);
            }
        }
    }
}

/// A linear layer `out (+)= x W^T + bias` over `[rows, in_features]` activations: a weight
/// matrix (`[out_features, in_features]`, either kind) with its row kernel, and an optional
/// bias.
#[derive(Clone, Copy)]
pub struct Linear<'w> {
    kernel: Kernel<'w>,
    out_features: usize,
    in_features: usize,
    bias: Option<&'w [f32]>,
}

/// One output of [`Linear::forward_many`]: a layer, its output buffer and how the result
/// meets it.
pub struct Job<'a> {
    /// The layer.
    pub layer: Linear<'a>,
    /// `out_features` outputs (more are left alone).
    pub out: &'a mut [f32],
    /// Overwrite `out` or add to it.
    pub output: Output,
}

impl<'w> Linear<'w> {
    /// The layer of weights `w` (`[out_features, in_features]`) and an optional bias of
    /// `out_features` (checked by the forward passes).
    pub fn new(w: &'w Matrix, bias: Option<&'w [f32]>) -> Self {
        Linear {
            kernel: w.kernel(),
            out_features: w.rows(),
            in_features: w.cols(),
            bias,
        }
    }

    /// Outputs per row.
    pub fn out_features(&self) -> usize {
        self.out_features
    }

    /// Inputs per row.
    pub fn in_features(&self) -> usize {
        self.in_features
    }

    /// `[m, n, k]` of this layer over `rows` rows.
    fn shape(&self, rows: usize) -> [usize; 3] {
        [rows, self.out_features, self.in_features]
    }

    /// Checks the weights' length (a dense tensor's shape need not be 2-D) and the buffers.
    fn check(&self, what: &str, rows: usize, x: &[f32], out: &[f32]) -> Result<()> {
        let (n, k) = (self.out_features, self.in_features);
        if self.kernel.len() != n * k {
            return Err(LlmError::InvalidArgument {
                message: format!("{what}: weights of {}, want {n}x{k}", self.kernel.len()),
            });
        }
        check_buffers(what, self.shape(rows), x, out, self.bias)
    }

    /// `out (output)= x W^T + bias` over `rows` rows of `x` (`[rows, in_features]`; `out`
    /// is `[rows, out_features]`). One row is a decode matvec, more the prefill matmul.
    pub fn forward<A: TempAllocator + ?Sized>(
        &self,
        s: &Scratch<'_, A>,
        x: &[f32],
        rows: usize,
        out: &mut [f32],
        output: Output,
    ) -> Result<()> {
        self.check("linear", rows, x, out)?;
        let [m, n, k] = self.shape(rows);
        if m == 0 || n == 0 {
            return Ok(());
        }
        if m > 1 {
            let g = Gemm {
                x,
                m,
                n,
                k,
                bias: self.bias,
                output,
            };
            return kernels::prefill(s, self.kernel, g, &mut out[..m * n]);
        }
        let out = &mut out[..n];
        Self::forward_many(
            s,
            x,
            [Job {
                layer: *self,
                out,
                output,
            }],
        )
    }

    /// Several decode matvecs over the same `x` (one row of `in_features`, the same for
    /// every layer) in **one** parallel section (q, k and v of a layer): fewer fork/join
    /// points per token, and `x` prepared once.
    pub fn forward_many<A: TempAllocator + ?Sized, const J: usize>(
        s: &Scratch<'_, A>,
        x: &[f32],
        jobs: [Job<'_>; J],
    ) -> Result<()> {
        let k = jobs.first().map_or(0, |j| j.layer.in_features);
        for j in &jobs {
            j.layer.check("linear_many", 1, x, j.out)?;
            if j.layer.in_features != k {
                return Err(LlmError::InvalidArgument {
                    message: format!(
                        "linear_many: layers of {} and {k} inputs over one x",
                        j.layer.in_features
                    ),
                });
            }
        }
        let readers = jobs.each_ref().map(|j| j.layer.kernel);
        let d = DecodeX::new(s, &x[..k], &readers)?;
        let jobs = jobs.map(|j| RowJob {
            chunk: j.layer.kernel.chunk(j.layer.out_features),
            out: &mut j.out[..j.layer.out_features],
            task: (j.layer, j.output),
        });
        row_jobs::run(jobs, |(layer, output), r0, o| {
            d.matvec(layer.kernel, r0, o, *output);
            if let Some(b) = layer.bias {
                for (oi, bi) in o.iter_mut().zip(&b[r0..]) {
                    *oi += bi;
                }
            }
        });
        Ok(())
    }

    /// The decode MLP's first half in one parallel section: `out[r] = silu(gate_r . x) *
    /// (up_r . x)` for `r < gate.out_features()` (`x`: one row; the layers' biases are not
    /// read).
    pub fn forward_swiglu<A: TempAllocator + ?Sized>(
        s: &Scratch<'_, A>,
        x: &[f32],
        gate: &Linear<'_>,
        up: &Linear<'_>,
        out: &mut [f32],
    ) -> Result<()> {
        gate.check("linear_swiglu", 1, x, out)?;
        up.check("linear_swiglu", 1, x, out)?;
        if gate.shape(1) != up.shape(1) {
            return Err(LlmError::InvalidArgument {
                message: "linear_swiglu: gate and up of different shapes".into(),
            });
        }
        let (n, k) = (gate.out_features, gate.in_features);
        let (g, u) = (gate.kernel, up.kernel);
        let d = DecodeX::new(s, &x[..k], &[g, u])?;
        // Whole groups when either matrix is quantized.
        let chunk = match u {
            Kernel::Quant(_) => u.chunk(n),
            Kernel::Dense(_) => g.chunk(n),
        };
        let job = RowJob {
            task: (),
            chunk,
            out: &mut out[..n],
        };
        row_jobs::run([job], |_, r0, o| d.swiglu(g, u, r0, o));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_data::{close, data};
    use crate::model::caching_temp;
    use crate::quant::format::{quantize_row, QType};
    use crate::runtime::Runtime;
    use crate::safetensors::DType;
    use crate::weights::random_tensor;

    /// `[n, k]` matrices of every kind the layers run.
    fn matrices(n: usize, k: usize, seed: u64) -> Vec<Matrix> {
        let mut v: Vec<Matrix> = [DType::F32, DType::BF16, DType::F16]
            .into_iter()
            .map(|t| random_tensor(t, &[n, k], 0.5, seed).unwrap().into())
            .collect();
        let wf = data(n * k, seed as u32);
        let bytes: Vec<u8> = wf
            .chunks_exact(k)
            .flat_map(|r| quantize_row(QType::Q4_1, r).unwrap())
            .collect();
        v.push(
            QTensor::from_bytes(QType::Q4_1, n, k, &bytes)
                .unwrap()
                .into(),
        );
        v
    }

    /// `x[i] . w[r]` in f64 over the matrix's exact f32 elements.
    fn dots(w: &Matrix, x: &[f32], m: usize) -> Vec<f64> {
        let (n, k, wf) = (w.rows(), w.cols(), w.to_f32());
        let mut d = vec![0f64; m * n];
        for i in 0..m {
            for r in 0..n {
                d[i * n + r] = (0..k)
                    .map(|j| f64::from(wf[r * k + j]) * f64::from(x[i * k + j]))
                    .sum();
            }
        }
        d
    }

    /// Every kind's layer, decode and prefill, with bias and a fused add, against f64; then
    /// q/k/v-like jobs of mixed kinds in one section and the fused SwiGLU of every pair of
    /// kinds (the mixed pairs take the two-matvec path).
    #[test]
    fn layers_of_every_kind_and_mix_match_f64() {
        let (n, k) = (37, 96);
        let ms = matrices(n, k, 5);
        let bias: Vec<f32> = (0..n).map(|i| i as f32 * 0.01).collect();
        let mut rt = Runtime::new(caching_temp(1 << 20));
        for w in &ms {
            for m in [1, 5] {
                let x = data(m * k, m as u32);
                let mut out = vec![0.5f32; m * n];
                rt.run("linear", |s| {
                    Linear::new(w, Some(&bias)).forward(s, &x, m, &mut out, Output::AddTo)
                })
                .unwrap();
                for (i, (&got, d)) in out.iter().zip(dots(w, &x, m)).enumerate() {
                    let what = format!("{} m={m} out {i}", w.type_name());
                    close(got, 0.5 + d + f64::from(bias[i % n]), &what);
                }
            }
        }
        let x = data(k, 9);
        let want: Vec<Vec<f64>> = ms.iter().map(|w| dots(w, &x, 1)).collect();
        let mut outs = vec![vec![f32::NAN; n]; 3];
        let [o0, o1, o2] = outs.get_disjoint_mut([0, 1, 2]).unwrap();
        let jobs = [(&ms[3], o0), (&ms[1], o1), (&ms[0], o2)].map(|(w, out)| Job {
            layer: Linear::new(w, None),
            out: out.as_mut_slice(),
            output: Output::Overwrite,
        });
        rt.run("linear_qkv", |s| Linear::forward_many(s, &x, jobs))
            .unwrap();
        for (o, wi) in outs.iter().zip([3, 1, 0]) {
            for (r, &got) in o.iter().enumerate() {
                close(got, want[wi][r], &format!("many: matrix {wi} row {r}"));
            }
        }
        for (gi, gate) in ms.iter().enumerate() {
            for (ui, up) in ms.iter().enumerate() {
                let mut o = vec![f32::NAN; n];
                let (gate, up) = (Linear::new(gate, None), Linear::new(up, None));
                rt.run("linear_swiglu", |s| {
                    Linear::forward_swiglu(s, &x, &gate, &up, &mut o)
                })
                .unwrap();
                for (r, &got) in o.iter().enumerate() {
                    let (g, u) = (want[gi][r], want[ui][r]);
                    let what = format!("swiglu gate {gi} up {ui} row {r}");
                    close(got, g / (1.0 + (-g).exp()) * u, &what);
                }
            }
        }
    }

    /// Shapes that do not fit are errors, not panics.
    #[test]
    fn layers_refuse_wrong_buffers() {
        let ms = matrices(20, 64, 3);
        let mut rt = Runtime::new(caching_temp(1 << 20));
        let (x, mut out) = (data(64, 1), vec![0f32; 20]);
        for w in &ms {
            let layer = Linear::new(w, Some(&[0.0; 3]));
            let r = rt.run("linear", |s| {
                layer.forward(s, &x, 1, &mut out, Output::Overwrite)
            });
            assert!(r.is_err(), "{}: a bias of 3 for 20 rows", w.type_name());
            let layer = Linear::new(w, None);
            let r = rt.run("linear", |s| {
                layer.forward(s, &x[..60], 1, &mut out, Output::Overwrite)
            });
            assert!(r.is_err(), "{}: x of 60 for 64 inputs", w.type_name());
        }
        let (a, b) = (Linear::new(&ms[0], None), Linear::new(&ms[1], None));
        let short = matrices(16, 64, 4);
        let c = Linear::new(&short[0], None);
        assert!(rt
            .run("linear_swiglu", |s| Linear::forward_swiglu(
                s, &x, &a, &c, &mut out
            ))
            .is_err());
        assert!(rt
            .run("linear_swiglu", |s| Linear::forward_swiglu(
                s, &x, &a, &b, &mut out
            ))
            .is_ok());
    }
}
