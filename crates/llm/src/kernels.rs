//! The kernels of a Llama forward pass. Each takes a [`Scratch`] (its view of the temp
//! allocator) and takes every temporary buffer it needs from it; the runtime
//! ([`crate::runtime::Runtime`]) resets the allocator after every kernel call.
//!
//! Matrices are HF `Linear` weights, `[out, in]` row-major, in f32, bf16 or f16; bf16/f16 are
//! widened to f32 on the fly (decode: in registers; prefill: a block of rows at a time into
//! scratch). Work is split over output rows with rayon. On x86-64 with AVX2+FMA(+F16C),
//! detected at run time, the inner loops use intrinsics; elsewhere a portable version.

use rayon::prelude::*;

use crate::error::{LlmError, Result};
use crate::runtime::Scratch;
use crate::safetensors::{bf16_to_f32, f16_to_f32, TensorData};
use caching_allocator::TempAllocator;

/// Rows of the weight matrix widened at a time per task by the prefill matmul.
const NB: usize = 16;

/// A `*mut f32` shared by tasks that write disjoint elements.
#[derive(Clone, Copy)]
struct SharedOut(*mut f32);
// SAFETY: only used by `linear`, whose tasks write disjoint elements (distinct output
// columns) of one buffer that outlives the parallel section.
unsafe impl Send for SharedOut {}
// SAFETY: as above.
unsafe impl Sync for SharedOut {}

/// Which SIMD path the kernels take on this CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// AVX2 + FMA + F16C intrinsics.
    Avx2,
    /// Portable Rust (auto-vectorised where the compiler can).
    Portable,
}

static FORCE_PORTABLE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Makes every kernel take the portable path (`true`) or the detected one (`false`), process
/// wide: for tests of the fallback on machines that have AVX2.
pub fn force_portable(on: bool) {
    FORCE_PORTABLE.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// The SIMD path the kernels use here (detected once per call; `std` caches the CPUID).
pub fn isa() -> Isa {
    if FORCE_PORTABLE.load(std::sync::atomic::Ordering::Relaxed) {
        return Isa::Portable;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c")
        {
            return Isa::Avx2;
        }
    }
    Isa::Portable
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
    if wlen != n * k || x.len() < m * k || out.len() < m * n || bias.is_some_and(|b| b.len() != n) {
        return Err(LlmError::InvalidArgument {
            message: format!(
                "linear: weights {wlen} (want {n}x{k}), x {} (want {m}x{k}), out {} (want {m}x{n})",
                x.len(),
                out.len()
            ),
        });
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    let isa = isa();
    if m == 1 {
        // Decode: chunks of output rows in parallel; 4 rows share each load of x.
        let threads = rayon::current_num_threads().max(1);
        let chunk = (n / (threads * 8)).clamp(4, 256).next_multiple_of(4);
        let x = &x[..k];
        // bf16 on AVX2: x de-interleaved per 16-element block (8 even, then 8 odd elements)
        // in scratch, so a row's 16 bf16 widen with one shift and one mask, no shuffles.
        let xd: &[f32] = if isa == Isa::Avx2 && matches!(w, TensorData::BF16(_)) {
            let kb = k / 16 * 16;
            let xd = s.f32s(kb)?;
            for (d, src) in xd.chunks_exact_mut(16).zip(x.chunks_exact(16)) {
                for j in 0..8 {
                    d[j] = src[2 * j];
                    d[8 + j] = src[2 * j + 1];
                }
            }
            xd
        } else {
            &[]
        };
        out[..n]
            .par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(ci, o)| {
                let r0 = ci * chunk;
                matvec_rows(isa, w, k, r0, x, xd, o, accumulate);
                if let Some(b) = bias {
                    for (oi, bi) in o.iter_mut().zip(&b[r0..]) {
                        *oi += bi;
                    }
                }
            });
        return Ok(());
    }
    // Prefill: `tasks` contiguous ranges of output rows (columns of `out`), each with its own
    // scratch block of NB widened weight rows.
    let threads = rayon::current_num_threads().max(1);
    let tasks = (threads * 4).min(n.div_ceil(NB)).max(1);
    let per_task = n.div_ceil(tasks).next_multiple_of(4);
    let tasks = n.div_ceil(per_task);
    let widen = !matches!(w, TensorData::F32(_));
    // f32 weights are used in place: a 1-float placeholder block per task.
    let block = if widen { NB * k } else { 1 };
    let scratch = s.f32s(tasks * block)?;
    let outp = SharedOut(out.as_mut_ptr());
    scratch
        .par_chunks_mut(block)
        .take(tasks)
        .enumerate()
        .for_each(|(t, wbuf)| {
            let r_begin = t * per_task;
            let r_end = (r_begin + per_task).min(n);
            let mut rb = r_begin;
            while rb < r_end {
                let nb = NB.min(r_end - rb);
                let rows: &[f32] = match w {
                    TensorData::F32(d) => &d[rb * k..(rb + nb) * k],
                    TensorData::BF16(d) => {
                        widen_bf16(&d[rb * k..(rb + nb) * k], &mut wbuf[..nb * k]);
                        &wbuf[..nb * k]
                    }
                    TensorData::F16(d) => {
                        widen_f16(isa, &d[rb * k..(rb + nb) * k], &mut wbuf[..nb * k]);
                        &wbuf[..nb * k]
                    }
                };
                // SAFETY: this task writes only columns rb..rb + nb of rows 0..m of `out`
                // (which holds m * n floats, checked above); the column ranges of tasks are
                // disjoint, and `out` outlives the parallel loop.
                unsafe { gemm_block(isa, x, m, k, rows, nb, outp, n, rb, bias, accumulate) };
                rb += nb;
            }
        });
    Ok(())
}

/// One matrix of [`linear_many`]: `out (+)= w x + bias`, `w` of `n` rows.
pub struct LinearJob<'a> {
    /// The weights, `[n, k]`.
    pub w: TensorData<'a>,
    /// Output rows.
    pub n: usize,
    /// Optional bias of `n`.
    pub bias: Option<&'a [f32]>,
    /// `n` outputs.
    pub out: &'a mut [f32],
    /// Add to `out` instead of overwriting it.
    pub accumulate: bool,
}

/// Rows of one parallel task of the decode matvec over `n` rows.
fn decode_chunk(n: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    (n / (threads * 8)).clamp(4, 256).next_multiple_of(4)
}

/// `x` de-interleaved per 16-element block into scratch (8 even elements, then 8 odd), for the
/// AVX2 bf16 decode path; empty when that path is not taken.
fn deinterleave<'t, A: TempAllocator + ?Sized>(
    s: &Scratch<'t, A>,
    isa: Isa,
    bf16: bool,
    x: &[f32],
) -> Result<&'t [f32]> {
    if isa != Isa::Avx2 || !bf16 {
        return Ok(&[]);
    }
    let kb = x.len() / 16 * 16;
    let xd = s.f32s(kb)?;
    for (d, src) in xd.chunks_exact_mut(16).zip(x.chunks_exact(16)) {
        for j in 0..8 {
            d[j] = src[2 * j];
            d[8 + j] = src[2 * j + 1];
        }
    }
    Ok(xd)
}

/// Several decode matvecs over the same `x` (`k` floats) in **one** parallel section (q, k
/// and v of a layer): fewer fork/join points per token, and `x` prepared once.
pub fn linear_many<A: TempAllocator + ?Sized, const J: usize>(
    s: &Scratch<'_, A>,
    x: &[f32],
    k: usize,
    jobs: [LinearJob<'_>; J],
) -> Result<()> {
    let x = x.get(..k).ok_or_else(|| LlmError::InvalidArgument {
        message: format!("linear_many: x has {} floats, want {k}", x.len()),
    })?;
    let mut bf16 = true;
    for j in &jobs {
        let wlen = match j.w {
            TensorData::F32(d) => d.len(),
            TensorData::BF16(d) | TensorData::F16(d) => d.len(),
        };
        bf16 &= matches!(j.w, TensorData::BF16(_));
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
    let isa = isa();
    let xd = deinterleave(s, isa, bf16, x)?;
    let chunk: [usize; J] = core::array::from_fn(|i| decode_chunk(jobs[i].n));
    let counts: [usize; J] = core::array::from_fn(|i| jobs[i].n.div_ceil(chunk[i]));
    let total: usize = counts.iter().sum();
    let outs: [SharedOut; J] = core::array::from_fn(|i| SharedOut(jobs[i].out.as_ptr().cast_mut()));
    let jobs = &jobs;
    (0..total).into_par_iter().for_each(|mut ci| {
        let mut j = 0;
        while ci >= counts[j] {
            ci -= counts[j];
            j += 1;
        }
        let job = &jobs[j];
        let r0 = ci * chunk[j];
        let len = chunk[j].min(job.n - r0);
        // SAFETY: `outs[j]` points to job j's output of at least `n` floats (checked above),
        // borrowed mutably by `jobs` for the whole call and not otherwise accessed during the
        // parallel section; task (j, ci) writes only rows r0 .. r0 + len < n, and the row
        // ranges of the tasks of one job are disjoint.
        let o = unsafe { core::slice::from_raw_parts_mut(outs[j].0.add(r0), len) };
        matvec_rows(isa, job.w, k, r0, x, xd, o, job.accumulate);
        if let Some(b) = job.bias {
            for (oi, bi) in o.iter_mut().zip(&b[r0..]) {
                *oi += bi;
            }
        }
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
    let isa = isa();
    let x = &x[..k];
    let bf16 = matches!(gate, TensorData::BF16(_)) && matches!(up, TensorData::BF16(_));
    let xd = deinterleave(s, isa, bf16, x)?;
    let chunk = decode_chunk(n);
    out[..n]
        .par_chunks_mut(chunk)
        .enumerate()
        .for_each(|(ci, o)| {
            let r0 = ci * chunk;
            for (i, oi) in o.iter_mut().enumerate() {
                let (mut g, mut u) = ([0f32], [0f32]);
                matvec_rows(isa, gate, k, r0 + i, x, xd, &mut g, false);
                matvec_rows(isa, up, k, r0 + i, x, xd, &mut u, false);
                let g = g[0];
                *oi = g / (1.0 + (-g).exp()) * u[0];
            }
        });
    Ok(())
}

/// Rows `r0 .. r0 + o.len()` of `w` (`[n, k]`) times `x`, into `o`. `xd` is `x`
/// de-interleaved (see `linear`) when the AVX2 bf16 path is taken, else empty.
#[allow(clippy::too_many_arguments)]
fn matvec_rows(
    isa: Isa,
    w: TensorData<'_>,
    k: usize,
    r0: usize,
    x: &[f32],
    xd: &[f32],
    o: &mut [f32],
    accumulate: bool,
) {
    let mut r = 0;
    while r < o.len() {
        // One row at a time: a single sequential stream per thread reads faster than 4 rows
        // interleaved (measured: ~30% more decode tokens/s on this project's machines).
        let nr = 1;
        let base = (r0 + r) * k;
        let mut res = [0f32; 4];
        match (isa, w) {
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2, TensorData::BF16(d)) if xd.len() == k / 16 * 16 => {
                // SAFETY: the CPU has AVX2 and FMA (`isa`); rows base .. base + nr * k are
                // inside `d` (r0 + r + nr <= n); `x` holds k floats and `xd` k / 16 * 16.
                unsafe { avx2::dot_rows_bf16d(d, base, k, nr, x, xd, &mut res) };
            }
            #[cfg(target_arch = "x86_64")]
            (Isa::Avx2, w) => {
                // SAFETY: `isa()` returned Avx2, so the CPU has AVX2, FMA and F16C; the rows
                // base .. base + nr * k are inside `w` (r0 + r + nr <= n) and `x` holds k floats.
                unsafe { avx2::dot_rows(w, base, k, nr, x.as_ptr(), &mut res) };
            }
            (_, TensorData::F32(d)) => {
                for (i, ri) in res.iter_mut().enumerate().take(nr) {
                    *ri = dot_portable(&d[base + i * k..][..k], x, |v| v);
                }
            }
            (_, TensorData::BF16(d)) => {
                for (i, ri) in res.iter_mut().enumerate().take(nr) {
                    *ri = dot_portable(&d[base + i * k..][..k], x, bf16_to_f32);
                }
            }
            (_, TensorData::F16(d)) => {
                for (i, ri) in res.iter_mut().enumerate().take(nr) {
                    *ri = dot_portable(&d[base + i * k..][..k], x, f16_to_f32);
                }
            }
        }
        for i in 0..nr {
            if accumulate {
                o[r + i] += res[i];
            } else {
                o[r + i] = res[i];
            }
        }
        r += nr;
    }
}

/// A dot product with 8 partial sums (vectorisable without FMA).
#[inline]
fn dot_portable<T: Copy>(w: &[T], x: &[f32], conv: impl Fn(T) -> f32) -> f32 {
    let mut acc = [0f32; 8];
    let wc = w.chunks_exact(8);
    let xc = x.chunks_exact(8);
    let (wr, xr) = (wc.remainder(), xc.remainder());
    for (wv, xv) in wc.zip(xc) {
        for l in 0..8 {
            acc[l] += conv(wv[l]) * xv[l];
        }
    }
    let mut s = acc.iter().sum::<f32>();
    for (a, b) in wr.iter().zip(xr) {
        s += conv(*a) * b;
    }
    s
}

/// bf16 bits to f32, element-wise (the compiler vectorises the shift).
fn widen_bf16(src: &[u16], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = bf16_to_f32(*s);
    }
}

/// f16 bits to f32, element-wise (F16C when available).
fn widen_f16(isa: Isa, src: &[u16], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 {
        // SAFETY: `isa` says the CPU has F16C/AVX2; both slices are valid for their lengths.
        unsafe { avx2::widen_f16(src, dst) };
        return;
    }
    let _ = isa;
    for (d, s) in dst.iter_mut().zip(src) {
        *d = f16_to_f32(*s);
    }
}

/// Columns `c0 .. c0 + nb` of `out` (`[m, ldo]`) from `x` (`[m, k]`) and `rows` (`[nb, k]`).
///
/// # Safety
/// `out` points to `m * ldo` floats with `c0 + nb <= ldo`; no other thread accesses those
/// columns during the call.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_block(
    isa: Isa,
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
            #[cfg(target_arch = "x86_64")]
            let done = if isa == Isa::Avx2 {
                // SAFETY: the CPU has AVX2+FMA (`isa`); rows i..i + mr of x and j..j + nr of
                // `rows` hold k floats each.
                unsafe {
                    avx2::micro(
                        x[i * k..].as_ptr(),
                        mr,
                        rows[j * k..].as_ptr(),
                        nr,
                        k,
                        &mut res,
                    )
                };
                true
            } else {
                false
            };
            #[cfg(not(target_arch = "x86_64"))]
            let done = {
                let _ = isa;
                false
            };
            if !done {
                for (a, ra) in res.iter_mut().enumerate().take(mr) {
                    for (b, rab) in ra.iter_mut().enumerate().take(nr) {
                        *rab =
                            dot_portable(&rows[(j + b) * k..][..k], &x[(i + a) * k..][..k], |v| v);
                    }
                }
            }
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

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::TensorData;
    use crate::safetensors::{bf16_to_f32, f16_to_f32};
    use core::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma")]
    fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
        _mm_cvtss_f32(s)
    }

    /// 8 weights at `p` as f32.
    ///
    /// # Safety
    /// 8 elements readable at `p`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn ld_f32(p: *const f32) -> __m256 {
        // SAFETY: the caller's contract.
        unsafe { _mm256_loadu_ps(p) }
    }

    /// 8 bf16 at `p` widened.
    ///
    /// # Safety
    /// 8 elements readable at `p`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn ld_bf16(p: *const u16) -> __m256 {
        // SAFETY: the caller's contract: 16 bytes readable.
        let h = unsafe { _mm_loadu_si128(p.cast()) };
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
    }

    /// 8 f16 at `p` widened.
    ///
    /// # Safety
    /// 8 elements readable at `p`.
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn ld_f16(p: *const u16) -> __m256 {
        // SAFETY: the caller's contract: 16 bytes readable.
        let h = unsafe { _mm_loadu_si128(p.cast()) };
        _mm256_cvtph_ps(h)
    }

    macro_rules! dot_impl {
        ($name:ident, $t:ty, $ld:ident, $conv:expr, $feat:literal) => {
            /// `nr` (1..=4) consecutive rows of `k` elements from `w` dotted with `x`.
            ///
            /// # Safety
            /// CPU features enabled below; `nr * k` elements at `w`, `k` floats at `x`.
            #[target_feature(enable = $feat)]
            unsafe fn $name<const NR: usize>(
                w: *const $t,
                k: usize,
                x: *const f32,
                res: &mut [f32; 4],
            ) {
                let mut a0 = [_mm256_setzero_ps(); NR];
                let mut a1 = [_mm256_setzero_ps(); NR];
                let mut i = 0;
                while i + 16 <= k {
                    // SAFETY: i + 16 <= k: inside `x` and inside every row (caller).
                    unsafe {
                        let x0 = _mm256_loadu_ps(x.add(i));
                        let x1 = _mm256_loadu_ps(x.add(i + 8));
                        for r in 0..NR {
                            let wr = w.add(r * k + i);
                            a0[r] = _mm256_fmadd_ps($ld(wr), x0, a0[r]);
                            a1[r] = _mm256_fmadd_ps($ld(wr.add(8)), x1, a1[r]);
                        }
                    }
                    i += 16;
                }
                if i + 8 <= k {
                    // SAFETY: i + 8 <= k, as above.
                    unsafe {
                        let x0 = _mm256_loadu_ps(x.add(i));
                        for r in 0..NR {
                            a0[r] = _mm256_fmadd_ps($ld(w.add(r * k + i)), x0, a0[r]);
                        }
                    }
                    i += 8;
                }
                for r in 0..NR {
                    let mut s = hsum(_mm256_add_ps(a0[r], a1[r]));
                    for j in i..k {
                        // SAFETY: j < k, inside row r and `x`.
                        s += unsafe { $conv(*w.add(r * k + j)) * *x.add(j) };
                    }
                    res[r] = s;
                }
            }
        };
    }
    dot_impl!(dot_f32, f32, ld_f32, |v: f32| v, "avx2,fma");
    dot_impl!(dot_bf16, u16, ld_bf16, bf16_to_f32, "avx2,fma");
    dot_impl!(dot_f16, u16, ld_f16, f16_to_f32, "avx2,fma,f16c");

    /// `nr` (1 or 4) rows of `w` starting at element `base`, each of `k`, dotted with `x`.
    ///
    /// # Safety
    /// AVX2, FMA and F16C available; `base + nr * k <= w.len()`; `k` floats at `x`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_rows(
        w: TensorData<'_>,
        base: usize,
        k: usize,
        nr: usize,
        x: *const f32,
        res: &mut [f32; 4],
    ) {
        macro_rules! go {
            ($f:ident, $d:expr) => {{
                let p = $d[base..].as_ptr();
                // SAFETY: the caller's contract (rows inside `w`, k floats at `x`).
                unsafe {
                    if nr == 4 {
                        $f::<4>(p, k, x, res)
                    } else {
                        $f::<1>(p, k, x, res)
                    }
                }
            }};
        }
        match w {
            TensorData::F32(d) => go!(dot_f32, d),
            TensorData::BF16(d) => go!(dot_bf16, d),
            TensorData::F16(d) => go!(dot_f16, d),
        }
    }

    /// `nr` (1 or 4) bf16 rows at `w[base..]` dotted with `x`, whose 16-element blocks are
    /// also given de-interleaved in `xd` (8 even elements, then 8 odd).
    ///
    /// # Safety
    /// AVX2 and FMA available; `base + nr * k <= w.len()`; `x.len() >= k`;
    /// `xd.len() >= k / 16 * 16`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot_rows_bf16d(
        w: &[u16],
        base: usize,
        k: usize,
        nr: usize,
        x: &[f32],
        xd: &[f32],
        res: &mut [f32; 4],
    ) {
        let p = w[base..].as_ptr();
        // SAFETY: the caller's contract.
        unsafe {
            if nr == 4 {
                dot_bf16d::<4>(p, k, x.as_ptr(), xd.as_ptr(), res)
            } else {
                dot_bf16d::<1>(p, k, x.as_ptr(), xd.as_ptr(), res)
            }
        }
    }

    /// [`dot_rows_bf16d`] for `NR` rows: a 32-bit lane `j` of 16 loaded bf16 holds elements
    /// `2j` (low half) and `2j + 1` (high half); `lane << 16` is element `2j` as f32 and
    /// `lane & 0xFFFF0000` is element `2j + 1`, matched with the even and odd halves of `xd`.
    ///
    /// # Safety
    /// As [`dot_rows_bf16d`], with `NR * k` elements at `w`.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn dot_bf16d<const NR: usize>(
        w: *const u16,
        k: usize,
        x: *const f32,
        xd: *const f32,
        res: &mut [f32; 4],
    ) {
        let mask = _mm256_set1_epi32(0xFFFF_0000u32 as i32);
        let mut ae = [_mm256_setzero_ps(); NR];
        let mut ao = [_mm256_setzero_ps(); NR];
        let mut be = [_mm256_setzero_ps(); NR];
        let mut bo = [_mm256_setzero_ps(); NR];
        let kb = k / 16 * 16;
        let mut i = 0;
        // 32 elements a step, into two accumulator pairs (four independent FMA chains).
        while i + 32 <= kb {
            // SAFETY: i + 32 <= kb <= k: inside `xd` and inside every row (caller).
            unsafe {
                let xe = _mm256_loadu_ps(xd.add(i));
                let xo = _mm256_loadu_ps(xd.add(i + 8));
                let ye = _mm256_loadu_ps(xd.add(i + 16));
                let yo = _mm256_loadu_ps(xd.add(i + 24));
                for r in 0..NR {
                    let v = _mm256_loadu_si256(w.add(r * k + i).cast());
                    let u = _mm256_loadu_si256(w.add(r * k + i + 16).cast());
                    let we = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v));
                    let wo = _mm256_castsi256_ps(_mm256_and_si256(v, mask));
                    let ue = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(u));
                    let uo = _mm256_castsi256_ps(_mm256_and_si256(u, mask));
                    ae[r] = _mm256_fmadd_ps(we, xe, ae[r]);
                    ao[r] = _mm256_fmadd_ps(wo, xo, ao[r]);
                    be[r] = _mm256_fmadd_ps(ue, ye, be[r]);
                    bo[r] = _mm256_fmadd_ps(uo, yo, bo[r]);
                }
            }
            i += 32;
        }
        while i < kb {
            // SAFETY: i + 16 <= kb <= k: inside `xd` and inside every row (caller).
            unsafe {
                let xe = _mm256_loadu_ps(xd.add(i));
                let xo = _mm256_loadu_ps(xd.add(i + 8));
                for r in 0..NR {
                    let v = _mm256_loadu_si256(w.add(r * k + i).cast());
                    let we = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v));
                    let wo = _mm256_castsi256_ps(_mm256_and_si256(v, mask));
                    ae[r] = _mm256_fmadd_ps(we, xe, ae[r]);
                    ao[r] = _mm256_fmadd_ps(wo, xo, ao[r]);
                }
            }
            i += 16;
        }
        for r in 0..NR {
            let mut s = hsum(_mm256_add_ps(
                _mm256_add_ps(ae[r], ao[r]),
                _mm256_add_ps(be[r], bo[r]),
            ));
            for j in kb..k {
                // SAFETY: j < k: inside row r and `x`.
                s += unsafe { bf16_to_f32(*w.add(r * k + j)) * *x.add(j) };
            }
            res[r] = s;
        }
    }

    /// `src` f16 bits to f32 into `dst` (the shorter length).
    ///
    /// # Safety
    /// F16C and AVX2 available.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn widen_f16(src: &[u16], dst: &mut [f32]) {
        let n = src.len().min(dst.len());
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: i + 8 <= n: 8 elements readable in `src`, writable in `dst`.
            unsafe { _mm256_storeu_ps(dst.as_mut_ptr().add(i), ld_f16(src.as_ptr().add(i))) };
            i += 8;
        }
        for j in i..n {
            dst[j] = f16_to_f32(src[j]);
        }
    }

    /// Register-blocked dot products: rows `0..mr` (<= 3) of `x` against rows `0..nr` (<= 4)
    /// of `w`, each of `k` floats; `res[a][b] = x[a] . w[b]`.
    ///
    /// # Safety
    /// AVX2 and FMA available; `mr * k` floats at `x`, `nr * k` at `w` (rows `k` apart).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn micro(
        x: *const f32,
        mr: usize,
        w: *const f32,
        nr: usize,
        k: usize,
        res: &mut [[f32; 4]; 3],
    ) {
        macro_rules! arm {
            ($mr:literal, $nr:literal) => {
                // SAFETY: the caller's contract with mr = $mr, nr = $nr.
                unsafe { micro_n::<$mr, $nr>(x, w, k, res) }
            };
        }
        match (mr, nr) {
            (3, 4) => arm!(3, 4),
            (3, 3) => arm!(3, 3),
            (3, 2) => arm!(3, 2),
            (3, _) => arm!(3, 1),
            (2, 4) => arm!(2, 4),
            (2, 3) => arm!(2, 3),
            (2, 2) => arm!(2, 2),
            (2, _) => arm!(2, 1),
            (_, 4) => arm!(1, 4),
            (_, 3) => arm!(1, 3),
            (_, 2) => arm!(1, 2),
            (_, _) => arm!(1, 1),
        }
    }

    /// [`micro`] for fixed sizes (kept in registers: at most 12 accumulators).
    ///
    /// # Safety
    /// As [`micro`] with `mr = MR`, `nr = NR`.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn micro_n<const MR: usize, const NR: usize>(
        x: *const f32,
        w: *const f32,
        k: usize,
        res: &mut [[f32; 4]; 3],
    ) {
        let mut acc = [[_mm256_setzero_ps(); NR]; MR];
        let mut i = 0;
        while i + 8 <= k {
            // SAFETY: i + 8 <= k: inside every row of x and w (caller).
            unsafe {
                let mut wv = [_mm256_setzero_ps(); NR];
                for (b, v) in wv.iter_mut().enumerate() {
                    *v = _mm256_loadu_ps(w.add(b * k + i));
                }
                for (a, acc_a) in acc.iter_mut().enumerate() {
                    let xv = _mm256_loadu_ps(x.add(a * k + i));
                    for b in 0..NR {
                        acc_a[b] = _mm256_fmadd_ps(xv, wv[b], acc_a[b]);
                    }
                }
            }
            i += 8;
        }
        for a in 0..MR {
            for b in 0..NR {
                let mut s = hsum(acc[a][b]);
                for j in i..k {
                    // SAFETY: j < k: inside row a of x and row b of w.
                    s += unsafe { *x.add(a * k + j) * *w.add(b * k + j) };
                }
                res[a][b] = s;
            }
        }
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
    let inv = s.f32s(m)?;
    let body = |(i, inv): (usize, &mut f32)| {
        let row = &x[i * dim..][..dim];
        let ss = dot_portable(row, row, |v| v);
        *inv = 1.0 / (ss / dim as f32 + eps).sqrt();
    };
    if m >= 4 {
        inv.par_iter_mut().enumerate().for_each(body);
    } else {
        inv.iter_mut().enumerate().for_each(body);
    }
    for (i, o) in out[..m * dim].chunks_exact_mut(dim).enumerate() {
        let r = inv[i];
        for ((o, &xv), &w) in o.iter_mut().zip(&x[i * dim..][..dim]).zip(weight) {
            *o = xv * r * w;
        }
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
            TensorData::BF16(d) => widen_bf16(&d[t * dim..][..dim], o),
            TensorData::F16(d) => widen_f16(isa(), &d[t * dim..][..dim], o),
        }
    }
    Ok(())
}
