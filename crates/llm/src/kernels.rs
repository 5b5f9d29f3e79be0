//! The kernels of a Llama forward pass. Each takes a [`Scratch`] (its view of the temp
//! allocator) and takes every temporary buffer it needs from it; the runtime
//! ([`crate::runtime::Runtime`]) resets the allocator after every kernel call.
//!
//! Matrices are HF `Linear` weights, `[out, in]` row-major, in f32, bf16 or f16; bf16/f16 are
//! widened to f32 on the fly (decode: in registers; prefill: a block of rows at a time into
//! scratch). Work is split over output rows with rayon. The inner loops are the generic
//! bodies of `kernels/simd.rs` over `kernel_simd`, instantiated for the portable, AVX2,
//! AVX-512 and NEON levels; each task runs on the level [`isa`] picks (detected at run time,
//! capped by `KERNEL_SIMD_MAX` and [`set_max_level`]).

use core::sync::atomic::{AtomicU8, Ordering};

use rayon::prelude::*;

use crate::error::{LlmError, Result};
use crate::runtime::Scratch;
use crate::safetensors::TensorData;
use caching_allocator::TempAllocator;
pub use kernel_simd::{available_levels, Level};
pub use row_jobs::LinearJob;
use simd::{deinterleave, pair_block, Rows};

pub(crate) mod row_jobs;
mod simd;
#[cfg(test)]
pub(crate) mod test_data;

/// Rows of the weight matrix widened at a time per task by the prefill matmul.
const NB: usize = 16;

/// A `*mut f32` shared by tasks that write disjoint elements.
#[derive(Clone, Copy)]
struct SharedOut(*mut f32);
// SAFETY: only used by `prefill` and `row_jobs::run`, whose tasks write disjoint elements
// (distinct output columns or row chunks) of buffers that outlive the parallel section.
unsafe impl Send for SharedOut {}
// SAFETY: as above.
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// The pointer (a method, so closures capture the `Send` wrapper, not the raw field).
    fn ptr(self) -> *mut f32 {
        self.0
    }
}

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

/// `w` as the row kernels read it.
fn rows(w: TensorData<'_>) -> Rows<'_> {
    match w {
        TensorData::F32(d) => Rows::F32(d),
        TensorData::BF16(d) => Rows::Bf16(d),
        TensorData::F16(d) => Rows::F16(d),
    }
}

/// `out[i, r] (+)= sum_j x[i, j] * w[r, j] + bias[r]` for `i < m`, `r < n`, `j < k`: a
/// `Linear` layer over `m` rows. `out` holds `m * n` floats (row stride `n`); with
/// `accumulate` the result is added to `out` (a fused residual add).
///
/// Decode (`m == 1`) reads every weight once, widened in registers. Prefill widens `NB` rows
/// at a time into a scratch block per task and multiplies every input row against them.
#[allow(clippy::too_many_arguments)]
pub fn linear<A: TempAllocator + ?Sized>(
    s: &Scratch<'_, A>,
    x: &[f32],
    m: usize,
    w: TensorData<'_>,
    n: usize,
    k: usize,
    bias: Option<&[f32]>,
    out: &mut [f32],
    accumulate: bool,
) -> Result<()> {
    let wlen = match w {
        TensorData::F32(d) => d.len(),
        TensorData::BF16(d) | TensorData::F16(d) => d.len(),
    };
    if wlen != n * k {
        return Err(LlmError::InvalidArgument {
            message: format!("linear: weights of {wlen} elements, want {n}x{k}"),
        });
    }
    check_buffers("linear", [m, n, k], x, out, bias)?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    if m == 1 {
        // Decode: chunks of output rows in parallel, one row at a time per task.
        let x = &x[..k];
        let bf16 = matches!(w, TensorData::BF16(_));
        let isa = decode_level(bf16);
        let xd = deinterleave_into(s, isa, bf16, x)?;
        let job = LinearJob {
            w,
            n,
            bias,
            out,
            accumulate,
        };
        row_jobs::run([job], decode_chunk, |w, r0, o, add| {
            simd::matvec::run(isa, rows(*w), r0, x, xd, o, add)
        });
        return Ok(());
    }
    prefill(s, x, m, &w, n, k, bias, out, accumulate)
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

/// Weight rows as the prefill matmul reads them: f32, a block of rows at a time.
pub(crate) trait PrefillRows: Sync {
    /// Whether [`PrefillRows::rows`] widens into its buffer (so [`prefill`] takes a scratch
    /// block per task) rather than borrowing f32 weights.
    fn widens(&self) -> bool;
    /// Rows `r .. r + nb` (`k` floats each) as f32: borrowed from the weights, or widened
    /// into `buf` (`nb * k` floats when [`PrefillRows::widens`]).
    fn rows<'b>(
        &'b self,
        isa: Level,
        r: usize,
        nb: usize,
        k: usize,
        buf: &'b mut [f32],
    ) -> &'b [f32];
}

impl PrefillRows for TensorData<'_> {
    fn widens(&self) -> bool {
        !matches!(self, TensorData::F32(_))
    }

    fn rows<'b>(
        &'b self,
        isa: Level,
        r: usize,
        nb: usize,
        k: usize,
        buf: &'b mut [f32],
    ) -> &'b [f32] {
        let span = r * k..(r + nb) * k;
        match *self {
            TensorData::F32(d) => &d[span],
            TensorData::BF16(d) | TensorData::F16(d) => {
                let bf16 = matches!(self, TensorData::BF16(_));
                simd::widen::run(isa, &d[span], bf16, &mut buf[..nb * k]);
                &buf[..nb * k]
            }
        }
    }
}

/// The prefill matmul `out[i, r] (+)= x[i] . w[r] + bias[r]` (`m` rows of `x`, `n` of `w`,
/// shapes checked by the caller): `tasks` contiguous ranges of output rows (columns of
/// `out`), each widening [`NB`] weight rows at a time into its own scratch block and
/// multiplying every input row against them.
#[allow(clippy::too_many_arguments)]
pub(crate) fn prefill<A: TempAllocator + ?Sized, R: PrefillRows>(
    s: &Scratch<'_, A>,
    x: &[f32],
    m: usize,
    w: &R,
    n: usize,
    k: usize,
    bias: Option<&[f32]>,
    out: &mut [f32],
    accumulate: bool,
) -> Result<()> {
    let isa = isa();
    let threads = rayon::current_num_threads().max(1);
    let blocks = n.div_ceil(NB);
    let tasks = (threads * 4).min(blocks).max(1);
    // Whole blocks of NB rows per task, as evenly as they divide (counts differ by at most
    // one): every widening but the matrix's last is a full block, which for quantized
    // weights is a whole group of their layout (`quant_groups::GROUP` = NB).
    let task_rows = |t: usize| (t * blocks / tasks * NB).min(n);
    // Borrowed f32 weights need no block: a 1-float placeholder per task.
    let block = if w.widens() { NB * k } else { 1 };
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
                let rows = w.rows(isa, rb, nb, k, wbuf);
                // SAFETY: this task writes only columns rb..rb + nb of rows 0..m of `out`
                // (which holds m * n floats, the caller's check); the column ranges of tasks
                // are disjoint, and `out` outlives the parallel loop.
                unsafe { gemm_block(isa, x, m, k, rows, nb, outp, n, rb, bias, accumulate) };
                rb += nb;
            }
        });
    Ok(())
}

/// Rows of one parallel task of the decode matvec over `n` rows.
fn decode_chunk(n: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    (n / (threads * 8)).clamp(4, 256).next_multiple_of(4)
}

/// The level of a decode matvec: [`isa`], but at most AVX2 when weights are bf16. Those
/// rows are memory-bound, and the AVX-512 instantiation decoded slower than the AVX2 one on
/// this project's AVX-512 machines (measured interleaved in one run: 0.5-0.9x on 2 threads,
/// 0.88-0.99x on 1), so AVX-512 buys nothing there.
fn decode_level(bf16: bool) -> Level {
    match isa() {
        Level::Avx512 if bf16 => Level::Avx2,
        level => level,
    }
}

/// `x` de-interleaved into pair blocks ([`simd::deinterleave`]) in scratch, for the bf16
/// row kernels; empty (and no scratch taken) when no weights are bf16.
fn deinterleave_into<'t, A: TempAllocator + ?Sized>(
    s: &Scratch<'t, A>,
    isa: Level,
    bf16: bool,
    x: &[f32],
) -> Result<&'t [f32]> {
    if !bf16 {
        return Ok(&[]);
    }
    let b = pair_block(isa);
    let xd = s.f32s(x.len() / b * b)?;
    deinterleave(isa, x, xd);
    Ok(xd)
}

/// Several decode matvecs over the same `x` (`k` floats) in **one** parallel section (q, k
/// and v of a layer): fewer fork/join points per token, and `x` prepared once.
pub fn linear_many<A: TempAllocator + ?Sized, const J: usize>(
    s: &Scratch<'_, A>,
    x: &[f32],
    k: usize,
    jobs: [LinearJob<'_, TensorData<'_>>; J],
) -> Result<()> {
    let x = x.get(..k).ok_or_else(|| LlmError::InvalidArgument {
        message: format!("linear_many: x has {} floats, want {k}", x.len()),
    })?;
    let mut bf16 = false;
    for j in &jobs {
        let wlen = match j.w {
            TensorData::F32(d) => d.len(),
            TensorData::BF16(d) | TensorData::F16(d) => d.len(),
        };
        bf16 |= matches!(j.w, TensorData::BF16(_));
        if wlen != j.n * k || j.out.len() < j.n || j.bias.is_some_and(|b| b.len() != j.n) {
            return Err(LlmError::InvalidArgument {
                message: format!(
                    "linear_many: weights {wlen} (want {}x{k}), out {}",
                    j.n,
                    j.out.len()
                ),
            });
        }
    }
    let isa = decode_level(bf16);
    let xd = deinterleave_into(s, isa, bf16, x)?;
    row_jobs::run(jobs, decode_chunk, |w, r0, o, add| {
        simd::matvec::run(isa, rows(*w), r0, x, xd, o, add)
    });
    Ok(())
}

/// The decode MLP's first half in one parallel section: `out[r] = silu(gate[r] . x) *
/// (up[r] . x)` for `r < n` (`gate`, `up`: `[n, k]`).
pub fn linear_swiglu<A: TempAllocator + ?Sized>(
    s: &Scratch<'_, A>,
    x: &[f32],
    k: usize,
    gate: TensorData<'_>,
    up: TensorData<'_>,
    n: usize,
    out: &mut [f32],
) -> Result<()> {
    let len = |w: TensorData<'_>| match w {
        TensorData::F32(d) => d.len(),
        TensorData::BF16(d) | TensorData::F16(d) => d.len(),
    };
    if len(gate) != n * k || len(up) != n * k || x.len() < k || out.len() < n {
        return Err(LlmError::InvalidArgument {
            message: "linear_swiglu: length mismatch".into(),
        });
    }
    let x = &x[..k];
    let bf16 = matches!(gate, TensorData::BF16(_)) || matches!(up, TensorData::BF16(_));
    let isa = decode_level(bf16);
    let xd = deinterleave_into(s, isa, bf16, x)?;
    let chunk = decode_chunk(n);
    out[..n]
        .par_chunks_mut(chunk)
        .enumerate()
        .for_each(|(ci, o)| {
            simd::swiglu_rows::run(isa, rows(gate), rows(up), ci * chunk, x, xd, o);
        });
    Ok(())
}

/// Columns `c0 .. c0 + nb` of `out` (`[m, ldo]`) from `x` (`[m, k]`) and `rows` (`[nb, k]`).
///
/// # Safety
/// `out` points to `m * ldo` floats with `c0 + nb <= ldo`; no other thread accesses those
/// columns during the call.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_block(
    isa: Level,
    x: &[f32],
    m: usize,
    k: usize,
    rows: &[f32],
    nb: usize,
    out: SharedOut,
    ldo: usize,
    c0: usize,
    bias: Option<&[f32]>,
    accumulate: bool,
) {
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
                    x[i * k..].as_ptr(),
                    mr,
                    rows[j * k..].as_ptr(),
                    nr,
                    k,
                    &mut res,
                )
            };
            for (a, ra) in res.iter().enumerate().take(mr) {
                for (b, &v) in ra.iter().enumerate().take(nr) {
                    let c = c0 + j + b;
                    let v = v + bias.map_or(0.0, |bs| bs[c]);
                    // SAFETY: (i + a) < m and c < c0 + nb <= ldo: inside `out`, in this
                    // task's columns (the caller's contract).
                    unsafe {
                        let p = out.0.add((i + a) * ldo + c);
                        *p = if accumulate { *p + v } else { v };
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

/// Rotary embedding, HF rotate-half convention, in place on `m` positions
/// `start_pos..start_pos + m` of `q` (`[m, heads, head_dim]`) and `k` (`[m, kv_heads,
/// head_dim]`): for `i < head_dim / 2`, with `a = pos * inv_freq[i]`,
/// `x'[i] = x[i] cos a - x[i + half] sin a`, `x'[i + half] = x[i + half] cos a + x[i] sin a`.
/// The cos/sin table (`m * head_dim / 2` of each) goes to scratch, computed in f64.
#[allow(clippy::too_many_arguments)]
pub fn rope<A: TempAllocator + ?Sized>(
    s: &Scratch<'_, A>,
    q: &mut [f32],
    heads: usize,
    k: &mut [f32],
    kv_heads: usize,
    head_dim: usize,
    m: usize,
    start_pos: usize,
    inv_freq: &[f64],
) -> Result<()> {
    let half = head_dim / 2;
    if inv_freq.len() != half || q.len() < m * heads * head_dim || k.len() < m * kv_heads * head_dim
    {
        return Err(LlmError::InvalidArgument {
            message: "rope: length mismatch".into(),
        });
    }
    let cos = s.f32s(m * half)?;
    let sin = s.f32s(m * half)?;
    for p in 0..m {
        let pos = (start_pos + p) as f64;
        for i in 0..half {
            let a = pos * inv_freq[i];
            cos[p * half + i] = a.cos() as f32;
            sin[p * half + i] = a.sin() as f32;
        }
    }
    let rot = |v: &mut [f32], nh: usize| {
        for (p, row) in v[..m * nh * head_dim]
            .chunks_exact_mut(nh * head_dim)
            .enumerate()
        {
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
    };
    rot(q, heads);
    rot(k, kv_heads);
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

/// Embedding lookup: row `tokens[i]` of `table` (`[vocab, dim]`) widened into `out[i]`.
pub fn embed(table: TensorData<'_>, dim: usize, tokens: &[u32], out: &mut [f32]) -> Result<()> {
    let rows = match table {
        TensorData::F32(d) => d.len(),
        TensorData::BF16(d) | TensorData::F16(d) => d.len(),
    } / dim.max(1);
    if out.len() < tokens.len() * dim {
        return Err(LlmError::InvalidArgument {
            message: "embed: output too short".into(),
        });
    }
    if let Some(&t) = tokens.iter().find(|&&t| t as usize >= rows) {
        return Err(LlmError::BadToken {
            token: t,
            vocab: rows,
        });
    }
    for (i, &t) in tokens.iter().enumerate() {
        let t = t as usize;
        let o = &mut out[i * dim..][..dim];
        match table {
            TensorData::F32(d) => o.copy_from_slice(&d[t * dim..][..dim]),
            TensorData::BF16(d) => simd::widen::run(isa(), &d[t * dim..][..dim], true, o),
            TensorData::F16(d) => simd::widen::run(isa(), &d[t * dim..][..dim], false, o),
        }
    }
    Ok(())
}
