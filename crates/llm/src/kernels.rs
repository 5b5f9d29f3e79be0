//! The kernels of a Llama forward pass. Each takes a [`Scratch`] (its view of the temp
//! allocator) and takes every temporary buffer it needs from it; the runtime
//! ([`crate::runtime::Runtime`]) resets the allocator after every kernel call.
//!
//! The linear layers are [`crate::matrix::Linear`]s, which pick a row kernel per weight
//! matrix (f32, bf16, f16 rows, or quantized groups) and run it through the two shapes of
//! this module: the decode matvec as parallel jobs over chunks of output rows
//! (`row_jobs`), and the prefill matmul (`prefill`), which widens `NB` weight rows at a
//! time into scratch. Work is split with rayon. The inner loops are the generic bodies of
//! `kernels/simd.rs` and [`crate::quant::group_matvec`] over `kernel_simd`, instantiated for the
//! portable, AVX2, AVX-512 and NEON levels; each task runs on the level [`isa`] picks
//! (detected at run time, capped by `KERNEL_SIMD_MAX` and [`set_max_level`]).

use core::ops::Range;
use core::sync::atomic::{AtomicU8, Ordering};

use rayon::prelude::*;

use crate::error::{LlmError, Result};
use crate::output::Output;
use crate::runtime::Scratch;
use caching_allocator::TempAllocator;
pub use kernel_simd::{available_levels, Level};
use row_kernel::Kernel;
use shared_out::SharedOut;

pub mod norm_gate;
pub(crate) mod row_jobs;
pub(crate) mod row_kernel;
mod shared_out;
pub(crate) mod simd;
#[cfg(test)]
pub(crate) mod test_data;

/// Rows of the weight matrix widened at a time per task by the prefill matmul.
const NB: usize = 16;

/// The process-wide cap of [`set_max_level`], as a rank (`u8::MAX`: none).
static MAX_RANK: AtomicU8 = AtomicU8::new(u8::MAX);

/// Caps the SIMD level of every later kernel call in the process (`None` removes the cap;
/// the `KERNEL_SIMD_MAX` environment variable still applies): for tests of the lower levels
/// on a machine that has a higher one.
pub fn set_max_level(cap: Option<Level>) {
    MAX_RANK.store(cap.map_or(u8::MAX, Level::rank), Ordering::Relaxed);
}

/// The SIMD level the kernels use now: the best this CPU runs within the caps (`std` caches
/// the feature detection).
pub fn isa() -> Level {
    kernel_simd::best_within(kernel_simd::env_cap().min(MAX_RANK.load(Ordering::Relaxed)))
}

/// Checks the buffers of a linear layer of `[m, n, k]` (rows of `x`, outputs, inputs): `x`
/// of at least `m * k` floats, `out` of `m * n`, a bias of exactly `n`. The error names
/// `what`.
pub(crate) fn check_buffers(
    what: &str,
    [m, n, k]: [usize; 3],
    x: &[f32],
    out: &[f32],
    bias: Option<&[f32]>,
) -> Result<()> {
    if x.len() < m * k || out.len() < m * n || bias.is_some_and(|b| b.len() != n) {
        return Err(LlmError::InvalidArgument {
            message: format!(
                "{what}: x {} (want {m}x{k}), out {} (want {m}x{n}), bias {:?} (want {n})",
                x.len(),
                out.len(),
                bias.map(<[f32]>::len)
            ),
        });
    }
    Ok(())
}

/// A prefill matmul `out[i, r] (+)= x[i] . w[r] + bias[r]` for `i < m`, `r < n`: `x` is
/// `[m, k]`, `out` `[m, n]` (shapes checked by the caller).
#[derive(Clone, Copy)]
pub(crate) struct Gemm<'a> {
    /// The input rows.
    pub x: &'a [f32],
    /// Rows of `x` (positions).
    pub m: usize,
    /// Rows of the weights (outputs).
    pub n: usize,
    /// Columns of the weights (inputs).
    pub k: usize,
    /// Optional bias of `n`.
    pub bias: Option<&'a [f32]>,
    /// Overwrite `out` or add to it.
    pub output: Output,
}

/// The prefill matmul `g` on weights `w`: `tasks` contiguous ranges of output rows (columns
/// of `out`), each widening [`NB`] weight rows at a time into its own scratch block (or
/// borrowing f32 rows) and multiplying every input row against them.
pub(crate) fn prefill<A: TempAllocator + ?Sized>(
    s: &Scratch<'_, A>,
    w: Kernel<'_>,
    g: Gemm<'_>,
    out: &mut [f32],
) -> Result<()> {
    let isa = isa();
    let threads = rayon::current_num_threads().max(1);
    let blocks = g.n.div_ceil(NB);
    let tasks = (threads * 4).min(blocks).max(1);
    // Whole blocks of NB rows per task, as evenly as they divide (counts differ by at most
    // one): every widening but the matrix's last is a full block, which for quantized
    // weights is a whole group of their layout (`quant::groups::GROUP` = NB).
    let task_rows = |t: usize| (t * blocks / tasks * NB).min(g.n);
    // Borrowed f32 weights need no block: a 1-float placeholder per task.
    let block = if w.widens() { NB * g.k } else { 1 };
    let scratch = s.f32s(tasks * block)?;
    let outp = SharedOut(out.as_mut_ptr());
    scratch
        .par_chunks_mut(block)
        .take(tasks)
        .enumerate()
        .for_each(|(t, wbuf)| {
            let (r_begin, r_end) = (task_rows(t), task_rows(t + 1));
            let mut rb = r_begin;
            while rb < r_end {
                let nb = NB.min(r_end - rb);
                let rows = w.f32_rows(isa, rb..rb + nb, g.k, wbuf);
                // SAFETY: this task writes only columns rb..rb + nb of rows 0..m of `out`
                // (which holds m * n floats, the caller's check); the column ranges of tasks
                // are disjoint, and `out` outlives the parallel loop.
                unsafe { gemm_block(isa, &g, rows, rb..rb + nb, outp) };
                rb += nb;
            }
        });
    Ok(())
}

/// Columns `cols` of `out` (`[g.m, g.n]`) from `g.x` and `rows` (`[cols.len(), g.k]`, the
/// weight rows `cols`).
///
/// # Safety
/// `out` points to `g.m * g.n` floats with `cols.end <= g.n`; no other thread accesses those
/// columns during the call.
unsafe fn gemm_block(isa: Level, g: &Gemm<'_>, rows: &[f32], cols: Range<usize>, out: SharedOut) {
    let (m, k, nb) = (g.m, g.k, cols.len());
    let mut j = 0;
    while j < nb {
        let nr = (nb - j).min(4);
        let mut i = 0;
        while i < m {
            let mr = (m - i).min(3);
            let mut res = [[0f32; 4]; 3];
            // SAFETY: rows i..i + mr of `x` and j..j + nr of `rows` hold k floats each
            // (`x` is `[m, k]`, `rows` `[nb, k]`).
            unsafe {
                simd::micro::run(
                    isa,
                    g.x[i * k..].as_ptr(),
                    mr,
                    rows[j * k..].as_ptr(),
                    nr,
                    k,
                    &mut res,
                )
            };
            for (a, ra) in res.iter().enumerate().take(mr) {
                for (b, &v) in ra.iter().enumerate().take(nr) {
                    let c = cols.start + j + b;
                    let v = v + g.bias.map_or(0.0, |bs| bs[c]);
                    // SAFETY: (i + a) < m and c < cols.end <= n: inside `out`, in this
                    // task's columns (the caller's contract).
                    unsafe {
                        let p = out.0.add((i + a) * g.n + c);
                        *p = g.output.apply(*p, v);
                    }
                }
            }
            i += mr;
        }
        j += nr;
    }
}

/// RMSNorm of `m` rows of `dim`: `out = x / sqrt(mean(x^2) + eps) * weight`. The per-row
/// inverse RMS goes to scratch.
pub fn rmsnorm<A: TempAllocator + ?Sized>(
    s: &Scratch<'_, A>,
    x: &[f32],
    m: usize,
    dim: usize,
    weight: &[f32],
    eps: f32,
    out: &mut [f32],
) -> Result<()> {
    if x.len() < m * dim || out.len() < m * dim || weight.len() != dim {
        return Err(LlmError::InvalidArgument {
            message: "rmsnorm: length mismatch".into(),
        });
    }
    let isa = isa();
    let inv = s.f32s(m)?;
    let body = |(i, inv): (usize, &mut f32)| {
        let ss = simd::sum_squares::run(isa, &x[i * dim..][..dim]);
        *inv = 1.0 / (ss / dim as f32 + eps).sqrt();
    };
    if m >= 4 {
        inv.par_iter_mut().enumerate().for_each(body);
    } else {
        inv.iter_mut().enumerate().for_each(body);
    }
    for (i, o) in out[..m * dim].chunks_exact_mut(dim).enumerate() {
        simd::scale_rows::run(isa, &x[i * dim..][..dim], inv[i], weight, o);
    }
    Ok(())
}

/// `heads` heads of `head_dim` per position, positions one after another: the q or k rows
/// [`rope`] rotates in place.
pub struct Heads<'a> {
    /// `[positions, heads, head_dim]`.
    pub data: &'a mut [f32],
    /// Heads per position.
    pub heads: usize,
}

/// Rotary embedding, HF rotate-half convention, in place on `positions` of `q` and `k`
/// (heads of `head_dim = 2 * inv_freq.len()`): for `i < head_dim / 2`, with
/// `a = pos * inv_freq[i]`, `x'[i] = x[i] cos a - x[i + half] sin a` and
/// `x'[i + half] = x[i + half] cos a + x[i] sin a`. The cos/sin table
/// (`positions.len() * head_dim / 2` of each) goes to scratch, computed in f64.
pub fn rope<A: TempAllocator + ?Sized>(
    s: &Scratch<'_, A>,
    inv_freq: &[f64],
    positions: Range<usize>,
    q: Heads<'_>,
    k: Heads<'_>,
) -> Result<()> {
    let (half, m) = (inv_freq.len(), positions.len());
    let head_dim = 2 * half;
    if q.data.len() < m * q.heads * head_dim || k.data.len() < m * k.heads * head_dim {
        return Err(LlmError::InvalidArgument {
            message: "rope: length mismatch".into(),
        });
    }
    let cos = s.f32s(m * half)?;
    let sin = s.f32s(m * half)?;
    for (p, pos) in positions.enumerate() {
        for i in 0..half {
            let a = pos as f64 * inv_freq[i];
            cos[p * half + i] = a.cos() as f32;
            sin[p * half + i] = a.sin() as f32;
        }
    }
    for v in [q, k] {
        let row_len = v.heads * head_dim;
        for (p, row) in v.data[..m * row_len].chunks_exact_mut(row_len).enumerate() {
            let (c, sn) = (&cos[p * half..][..half], &sin[p * half..][..half]);
            for h in row.chunks_exact_mut(head_dim) {
                let (lo, hi) = h.split_at_mut(half);
                for i in 0..half {
                    let (a, b) = (lo[i], hi[i]);
                    lo[i] = a * c[i] - b * sn[i];
                    hi[i] = b * c[i] + a * sn[i];
                }
            }
        }
    }
    Ok(())
}

/// SwiGLU in place: `gate[i] = silu(gate[i]) * up[i]`, `silu(g) = g / (1 + e^-g)`. Needs no
/// scratch.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    let f = |(g, u): (&mut f32, &f32)| {
        let v = *g;
        *g = v / (1.0 + (-v).exp()) * u;
    };
    if gate.len() >= 1 << 15 {
        gate.par_iter_mut().zip(up.par_iter()).for_each(f);
    } else {
        gate.iter_mut().zip(up).for_each(f);
    }
}

/// Checks a level's row kernels against `want`, the f64 dot products of the rows they cover:
/// `matvec` adds the dots to outputs of 1, `swiglu` (gate and up both those rows) gives
/// `silu(d) * d`. `what` names the case in a failure.
#[cfg(test)]
pub(crate) fn check_row_kernels(
    want: &[f64],
    what: &str,
    matvec: impl FnOnce(&mut [f32]),
    swiglu: impl FnOnce(&mut [f32]),
) {
    let mut o = vec![1.0f32; want.len()];
    matvec(&mut o);
    for (r, (&got, &d)) in o.iter().zip(want).enumerate() {
        test_data::close(got, 1.0 + d, &format!("{what} matvec row {r}"));
    }
    o.fill(f32::NAN);
    swiglu(&mut o);
    for (r, (&got, &d)) in o.iter().zip(want).enumerate() {
        let silu = d / (1.0 + (-d).exp());
        test_data::close(got, silu * d, &format!("{what} swiglu row {r}"));
    }
}
