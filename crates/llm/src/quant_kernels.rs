//! Linear layers on block-quantized weights ([`QTensor`]: Q4_0, Q4_1, Q8_0) with f32
//! activations: the weights are dequantized in registers and multiplied (FMA) against f32
//! `x`; activations are never quantized.
//!
//! - Decode (`m == 1`): each row's dot product is `sum_b d_b * (q_b . x_b) (+ m_b * sum(x_b))`.
//!   The per-block sums of `x` that the Q4_1 minimum (and Q4_0's offset of 8) need are
//!   computed once per call into scratch from the temp allocator. Rows are split over rayon.
//! - Prefill (`m > 1`): each task dequantizes a block of [`NB`] rows into its scratch and
//!   multiplies every input row against them (register-blocked).
//!
//! The SIMD versions (AVX-512, AVX2) live in [`crate::quant_simd`], chosen at run time.

use rayon::prelude::*;

use crate::error::{LlmError, Result};
use crate::matrix::Matrix;
use crate::quant::{dequantize_row, f16_at, QTensor, QType, QK};
use crate::quant_simd;
use crate::runtime::Scratch;
use caching_allocator::TempAllocator;

/// Rows dequantized at a time per task by the prefill matmul.
pub const NB: usize = 16;

/// Which instruction set the quantized kernels use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QIsa {
    /// AVX-512 F.
    Avx512,
    /// AVX2 + FMA.
    Avx2,
    /// Portable Rust.
    Portable,
}

static FORCE_PORTABLE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Makes the quantized kernels take the portable path (`true`) or the detected one, process
/// wide (for tests of the fallback).
pub fn force_portable(on: bool) {
    FORCE_PORTABLE.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// The path the quantized kernels take on this CPU.
pub fn qisa() -> QIsa {
    if FORCE_PORTABLE.load(std::sync::atomic::Ordering::Relaxed) {
        return QIsa::Portable;
    }
    quant_simd::detect()
}

/// A `*mut f32` shared by tasks that write disjoint elements.
#[derive(Clone, Copy)]
struct Out(*mut f32);
// SAFETY: used only by the kernels below, whose tasks write disjoint elements of a buffer that
// outlives the parallel section.
unsafe impl Send for Out {}
// SAFETY: as above.
unsafe impl Sync for Out {}

impl Out {
    /// The pointer (a method, so closures capture the `Send` wrapper, not the raw field).
    fn ptr(self) -> *mut f32 {
        self.0
    }
}

/// Sums of `x` per block of 32 (`x.len()` a multiple of 32), into scratch.
fn block_sums<'t, A: TempAllocator + ?Sized>(s: &Scratch<'t, A>, x: &[f32]) -> Result<&'t [f32]> {
    let sums = s.f32s(x.len() / QK)?;
    for (o, b) in sums.iter_mut().zip(x.chunks_exact(QK)) {
        *o = b.iter().sum();
    }
    Ok(sums)
}

/// One row's dot product with `x`, portable. `xsum` holds the block sums of `x`.
pub fn dot_row_portable(t: QType, row: &[u8], x: &[f32], xsum: &[f32]) -> f32 {
    let mut acc = 0f32;
    let bb = t.block_bytes();
    for (b, blk) in row.chunks_exact(bb).enumerate() {
        let xb = &x[b * QK..(b + 1) * QK];
        let mut lanes = [0f32; 8];
        match t {
            QType::Q4_0 | QType::Q4_1 => {
                let qs = &blk[bb - 16..];
                for j in 0..16 {
                    let q = qs[j];
                    lanes[j % 8] += (q & 15) as f32 * xb[j] + (q >> 4) as f32 * xb[j + 16];
                }
            }
            QType::Q8_0 => {
                for j in 0..QK {
                    lanes[j % 8] += blk[2 + j] as i8 as f32 * xb[j];
                }
            }
        }
        let s: f32 = lanes.iter().sum();
        let d = f16_at(blk, 0);
        acc += match t {
            QType::Q4_0 => d * (s - 8.0 * xsum[b]),
            QType::Q4_1 => d * s + f16_at(blk, 2) * xsum[b],
            QType::Q8_0 => d * s,
        };
    }
    acc
}

/// Rows `r0 .. r0 + o.len()` of `w` times `x` into `o` (added with `accumulate`).
fn matvec_rows(
    isa: QIsa,
    w: &QTensor,
    r0: usize,
    x: &[f32],
    xsum: &[f32],
    o: &mut [f32],
    accumulate: bool,
) {
    let t = w.qtype();
    let mut i = 0;
    // Four rows at a time share the loads of x.
    while i + 4 <= o.len() {
        let r = r0 + i;
        let v = quant_simd::dot_rows(
            isa,
            t,
            [w.row(r), w.row(r + 1), w.row(r + 2), w.row(r + 3)],
            x,
            xsum,
        );
        for (oi, v) in o[i..i + 4].iter_mut().zip(v) {
            *oi = if accumulate { *oi + v } else { v };
        }
        i += 4;
    }
    for (j, oi) in o.iter_mut().enumerate().skip(i) {
        let v = quant_simd::dot_row(isa, t, w.row(r0 + j), x, xsum);
        *oi = if accumulate { *oi + v } else { v };
    }
}

/// Rows of one parallel task of the decode matvec over `n` rows.
fn decode_chunk(n: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    (n / (threads * 8)).clamp(4, 256).next_multiple_of(4)
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
    if x.len() < m * k || out.len() < m * n || bias.is_some_and(|b| b.len() != n) {
        return Err(LlmError::InvalidArgument {
            message: format!(
                "quantized linear: x {} (want {m}x{k}), out {} (want {m}x{n})",
                x.len(),
                out.len()
            ),
        });
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    let isa = qisa();
    if m == 1 {
        let x = &x[..k];
        let xsum = block_sums(s, x)?;
        let chunk = decode_chunk(n);
        out[..n]
            .par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(ci, o)| {
                let r0 = ci * chunk;
                matvec_rows(isa, w, r0, x, xsum, o, accumulate);
                if let Some(b) = bias {
                    for (oi, bi) in o.iter_mut().zip(&b[r0..]) {
                        *oi += bi;
                    }
                }
            });
        return Ok(());
    }
    // Prefill: `tasks` ranges of output rows, each dequantizing NB rows at a time into its
    // own scratch block.
    let threads = rayon::current_num_threads().max(1);
    let tasks = (threads * 4).min(n.div_ceil(NB)).max(1);
    let per_task = n.div_ceil(tasks).next_multiple_of(4);
    let tasks = n.div_ceil(per_task);
    let scratch = s.f32s(tasks * NB * k)?;
    let outp = Out(out.as_mut_ptr());
    scratch
        .par_chunks_mut(NB * k)
        .take(tasks)
        .enumerate()
        .for_each(|(t, wbuf)| {
            let r_begin = t * per_task;
            let r_end = (r_begin + per_task).min(n);
            let mut rb = r_begin;
            while rb < r_end {
                let nb = NB.min(r_end - rb);
                for r in 0..nb {
                    dequantize_row(w.qtype(), w.row(rb + r), &mut wbuf[r * k..(r + 1) * k]);
                }
                let mut tmp = [0f32; NB];
                for i in 0..m {
                    quant_simd::dots(isa, &x[i * k..(i + 1) * k], &wbuf[..nb * k], k, &mut tmp);
                    // SAFETY: this task alone writes columns rb .. rb + nb of row i of `out`
                    // (m * n floats, checked above): the tasks' row ranges are disjoint, and
                    // `out` outlives the parallel loop.
                    let o =
                        unsafe { std::slice::from_raw_parts_mut(outp.ptr().add(i * n + rb), nb) };
                    for (r, (oi, &v)) in o.iter_mut().zip(&tmp[..nb]).enumerate() {
                        let v = v + bias.map_or(0.0, |b| b[rb + r]);
                        *oi = if accumulate { *oi + v } else { v };
                    }
                }
                rb += nb;
            }
        });
    Ok(())
}

/// One matrix of [`linear_many`]: `out (+)= w x + bias`.
pub struct QJob<'a> {
    /// The weights (a [`Matrix::Quant`]; a dense matrix is refused).
    pub w: &'a Matrix,
    /// Optional bias of `w.rows()`.
    pub bias: Option<&'a [f32]>,
    /// `w.rows()` outputs.
    pub out: &'a mut [f32],
    /// Add to `out` instead of overwriting it.
    pub accumulate: bool,
}

/// Several decode matvecs over the same `x` (`k` floats) in one parallel section.
pub fn linear_many<A: TempAllocator + ?Sized, const J: usize>(
    s: &Scratch<'_, A>,
    x: &[f32],
    k: usize,
    jobs: [QJob<'_>; J],
) -> Result<()> {
    let x = x.get(..k).ok_or_else(|| LlmError::InvalidArgument {
        message: format!("quantized linear_many: x has {} floats, want {k}", x.len()),
    })?;
    let mut mats: [Option<&QTensor>; J] = [None; J];
    for (j, slot) in jobs.iter().zip(&mut mats) {
        let Matrix::Quant(w) = j.w else {
            return Err(LlmError::InvalidArgument {
                message: "quantized linear_many: a dense matrix".into(),
            });
        };
        *slot = Some(w);
        check(w, k, "quantized linear_many")?;
        let n = w.rows();
        if j.out.len() < n || j.bias.is_some_and(|b| b.len() != n) {
            return Err(LlmError::InvalidArgument {
                message: format!("quantized linear_many: out {} for {n} rows", j.out.len()),
            });
        }
    }
    let isa = qisa();
    let xsum = block_sums(s, x)?;
    let rows: [usize; J] = core::array::from_fn(|i| mats[i].map_or(0, |w| w.rows()));
    let chunk: [usize; J] = core::array::from_fn(|i| decode_chunk(rows[i]));
    let counts: [usize; J] = core::array::from_fn(|i| rows[i].div_ceil(chunk[i]));
    let total: usize = counts.iter().sum();
    let outs: [Out; J] = core::array::from_fn(|i| Out(jobs[i].out.as_ptr().cast_mut()));
    let jobs = &jobs;
    (0..total).into_par_iter().for_each(|mut ci| {
        let mut j = 0;
        while ci >= counts[j] {
            ci -= counts[j];
            j += 1;
        }
        let job = &jobs[j];
        let Some(w) = mats[j] else { return };
        let r0 = ci * chunk[j];
        let len = chunk[j].min(rows[j] - r0);
        // SAFETY: `outs[j]` points to job j's output of at least `rows` floats (checked
        // above), mutably borrowed by `jobs` for the whole call and not otherwise accessed in
        // the parallel section; task (j, ci) writes only rows r0 .. r0 + len, disjoint from
        // every other task's.
        let o = unsafe { core::slice::from_raw_parts_mut(outs[j].ptr().add(r0), len) };
        matvec_rows(isa, w, r0, x, xsum, o, job.accumulate);
        if let Some(b) = job.bias {
            for (oi, bi) in o.iter_mut().zip(&b[r0..]) {
                *oi += bi;
            }
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
    let isa = qisa();
    let x = &x[..k];
    let xsum = block_sums(s, x)?;
    let chunk = decode_chunk(n);
    out[..n]
        .par_chunks_mut(chunk)
        .enumerate()
        .for_each(|(ci, o)| {
            let r0 = ci * chunk;
            let silu = |g: f32, u: f32| g / (1.0 + (-g).exp()) * u;
            let same = gate.qtype() == up.qtype();
            let mut i = 0;
            // Two rows of each matrix at a time, sharing the loads of x.
            while same && i + 2 <= o.len() {
                let r = r0 + i;
                let [g0, u0, g1, u1] = quant_simd::dot_rows(
                    isa,
                    gate.qtype(),
                    [gate.row(r), up.row(r), gate.row(r + 1), up.row(r + 1)],
                    x,
                    xsum,
                );
                o[i] = silu(g0, u0);
                o[i + 1] = silu(g1, u1);
                i += 2;
            }
            for (j, oi) in o.iter_mut().enumerate().skip(i) {
                let g = quant_simd::dot_row(isa, gate.qtype(), gate.row(r0 + j), x, xsum);
                let u = quant_simd::dot_row(isa, up.qtype(), up.row(r0 + j), x, xsum);
                *oi = silu(g, u);
            }
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
        dequantize_row(table.qtype(), table.row(t as usize), o);
    }
    Ok(())
}
