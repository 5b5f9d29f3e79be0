//! The SIMD inner loops of the quantized decode kernels ([`crate::matrix::Linear`]): 16 rows
//! at a time in the group layout ([`crate::quant::groups`]), dequantized in registers and
//! multiplied (FMA) against f32 `x`. One body over `kernel_simd::Simd`, instantiated for the
//! portable, AVX2, AVX-512 and NEON levels by `kernel_simd::instantiate!`.
//!
//! A vector lane is a row: for each byte position `j` of a block, the 16 rows' quants are
//! widened to f32 and multiplied by the broadcast `x[j]` (and `x[j + 16]` for the high
//! nibbles), so a block's `q . x` of 16 rows ends in registers with no horizontal sum. Per
//! block, `d * (q . x) + m * sum(x)` (Q4_1, Q4_1F32, Q5_1), `d * (q . x - 8 sum(x))`
//! (Q4_0; 16 for Q5_0, whose fifth bits come from its `qh` words lane by lane),
//! `d * (q . x)` (Q8_0) or `d0 * (q . x)_lo + d1 * (q . x)_hi` over its halves (Q8_0F32x2)
//! is added to the rows' accumulators; the sums of `x` per block come from scratch.

use kernel_simd::{load_nibbles, Simd};

use crate::output::Output;
use crate::quant::format::QK;
use crate::quant::groups::{group_block_bytes, scale_bytes, GroupFormat, GROUP};
use crate::quant::QTensor;

/// The largest number of vectors a group spans (portable and NEON: 4 lanes).
const MAX_VECS: usize = 4;

/// Bytes ahead of the group-block being read that [`prefetch_ahead`] asks for: about three
/// Q4_1 group-blocks. Measured on the real model (SmolLM2-135M Q4_1, 2 rayon threads, one
/// run, distances interleaved, 6 rounds, medians): decode 51.6 tok/s without the hint, 60.2
/// at 640 bytes, 63.1 at 1024, 56.3 at 2048, 44.1 at 4096.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // read by the x86-64 prefetch only
const PREFETCH_DISTANCE: usize = 1024;

/// A hint to bring the `len` bytes [`PREFETCH_DISTANCE`] past `p` into cache, so the next
/// group-blocks' loads do not wait on memory (the hardware prefetcher alone left decode at
/// about half the weight-streaming bound). x86-64 only; nothing elsewhere. The address may
/// lie past the matrix: a prefetch never faults.
#[inline(always)]
fn prefetch_ahead(p: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    for line in (0..len).step_by(64) {
        let a = p.wrapping_add(PREFETCH_DISTANCE + line).cast::<i8>();
        // SAFETY: a prefetch is a hint that reads nothing architecturally and never faults,
        // at any address.
        unsafe { core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(a) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, len);
}

/// The dot products of one group's 16 rows (`blocks` group-blocks at `g`) with `x`.
///
/// # Safety
/// `g` is readable for `blocks` group-blocks of `f`, `x` for `32 * blocks` floats and `xsum`
/// for `blocks`.
#[inline(always)]
unsafe fn group_dots<S: Simd>(
    s: S,
    f: GroupFormat,
    g: *const u8,
    blocks: usize,
    x: *const f32,
    xsum: *const f32,
) -> [f32; GROUP] {
    let l = S::LANES;
    let vecs = GROUP / l;
    let (gbb, sb) = (group_block_bytes(f), scale_bytes(f));
    let mut acc = [s.zero(); MAX_VECS];
    for b in 0..blocks {
        // SAFETY: block `b < blocks` of `g`, its 32 floats of `x` and its sum (caller).
        unsafe {
            let gb = g.add(b * gbb);
            prefetch_ahead(gb, gbb);
            let xb = x.add(b * QK);
            let q = gb.add(sb);
            // Four chains per vector (low / high nibbles or byte parity, even / odd `j`), so
            // the FMAs of one block do not wait on each other.
            let mut c = [[s.zero(); 4]; MAX_VECS];
            match f {
                GroupFormat::Q4_0 | GroupFormat::Q4_1 | GroupFormat::Q4_1F32 => {
                    // Two byte positions a step, so every chain index is a constant and the
                    // chains stay in registers.
                    for j in (0..QK / 2).step_by(2) {
                        for (v, cv) in c.iter_mut().enumerate().take(vecs) {
                            for (u, [lo_c, hi_c]) in [(0, [0, 1]), (1, [2, 3])] {
                                let p = q.add((j + u) * GROUP + v * l);
                                let (lo, hi) = s.load_nibbles_f32(p);
                                let (xl, xh) = (*xb.add(j + u), *xb.add(j + u + 16));
                                cv[lo_c] = s.fma(lo, s.splat(xl), cv[lo_c]);
                                cv[hi_c] = s.fma(hi, s.splat(xh), cv[hi_c]);
                            }
                        }
                    }
                }
                GroupFormat::Q5_0 | GroupFormat::Q5_1 | GroupFormat::Q5_1F32 => {
                    // Each lane's fifth bits of weights 0..16 and 16..32, from the vector's
                    // rows' `qh` (the last two header words, or the last one of 32 bits),
                    // shifted so that after `j` shifts right weight `j`'s bit is the 16 of
                    // its quant (one shift a byte position: cheaper than a conversion and
                    // an FMA).
                    let hw = f.header_words();
                    let sixteen = s.splat_i32(16);
                    let mut qh = [[s.splat_i32(0); 2]; MAX_VECS];
                    for (v, qv) in qh.iter_mut().enumerate().take(vecs) {
                        *qv = if f.word_bytes() == 4 {
                            let at = gb.add((hw - 1) * GROUP * 4).cast::<i32>();
                            let word = s.load_i32(at.add(v * l));
                            [s.shl_i32::<4>(word), s.shr_i32::<12>(word)]
                        } else {
                            let at = gb.add((hw - 2) * GROUP * 2).cast::<i16>();
                            [
                                s.shl_i32::<4>(s.load_i16(at.add(v * l))),
                                s.shl_i32::<4>(s.load_i16(at.add(GROUP + v * l))),
                            ]
                        };
                    }
                    for j in (0..QK / 2).step_by(2) {
                        for (v, cv) in c.iter_mut().enumerate().take(vecs) {
                            // Two chains, not four: AVX2's 16 registers hold the two
                            // vectors' chains and fifth bits without spilling.
                            for u in 0..2 {
                                let p = q.add((j + u) * GROUP + v * l);
                                let (lo, hi) = load_nibbles(s, p);
                                let [qh_lo, qh_hi] = &mut qh[v];
                                let lo = s.add_i32(lo, s.and_i32(*qh_lo, sixteen));
                                let hi = s.add_i32(hi, s.and_i32(*qh_hi, sixteen));
                                *qh_lo = s.shr_i32::<1>(*qh_lo);
                                *qh_hi = s.shr_i32::<1>(*qh_hi);
                                let (lo, hi) = (s.i32_to_f32(lo), s.i32_to_f32(hi));
                                let (xl, xh) = (*xb.add(j + u), *xb.add(j + u + 16));
                                cv[0] = s.fma(lo, s.splat(xl), cv[0]);
                                cv[1] = s.fma(hi, s.splat(xh), cv[1]);
                            }
                        }
                    }
                }
                GroupFormat::Q8_0F32x2 => {
                    // Chains 0 and 1 take the first half's byte positions, 2 and 3 the
                    // second's: each half has its own scale.
                    for j in (0..QK / 2).step_by(2) {
                        for (v, cv) in c.iter_mut().enumerate().take(vecs) {
                            for (u, cu) in [(0, 0), (1, 1), (16, 2), (17, 3)] {
                                let p = q.add((j + u) * GROUP + v * l).cast::<i8>();
                                let w = s.i32_to_f32(s.load_i8(p));
                                cv[cu] = s.fma(w, s.splat(*xb.add(j + u)), cv[cu]);
                            }
                        }
                    }
                }
                GroupFormat::Q8_0 => {
                    for j in (0..QK).step_by(4) {
                        for (v, cv) in c.iter_mut().enumerate().take(vecs) {
                            for (u, cu) in cv.iter_mut().enumerate() {
                                let p = q.add((j + u) * GROUP + v * l).cast::<i8>();
                                let w = s.i32_to_f32(s.load_i8(p));
                                *cu = s.fma(w, s.splat(*xb.add(j + u)), *cu);
                            }
                        }
                    }
                }
            }
            let xs = *xsum.add(b);
            for (v, (cv, av)) in c.iter().zip(acc.iter_mut()).enumerate().take(vecs) {
                let (lo, hi) = (s.add(cv[0], cv[1]), s.add(cv[2], cv[3]));
                *av = match f {
                    GroupFormat::Q8_0F32x2 => {
                        let (d0, d1) = (header_word(s, f, gb, 0, v), header_word(s, f, gb, 1, v));
                        s.fma(d1, hi, s.fma(d0, lo, *av))
                    }
                    _ => add_block(s, f, gb, v, s.add(lo, hi), xs, *av),
                };
            }
        }
    }
    group_rows(s, &acc)
}

/// Vector `v`'s rows of header word `w` of group-block `gb` (of `f`), as f32: their
/// scales (`w = 0`), minimums or second scales.
///
/// # Safety
/// `gb` is readable for a group-block of `f`, `w < f.header_words()` and `(v + 1) * LANES
/// <= GROUP`.
#[inline(always)]
unsafe fn header_word<S: Simd>(s: S, f: GroupFormat, gb: *const u8, w: usize, v: usize) -> S::F32 {
    let l = S::LANES;
    // SAFETY: word `w` of the group-block's rows `v * LANES .. (v + 1) * LANES` (caller).
    unsafe {
        let at = gb.add(w * GROUP * f.word_bytes());
        if f.word_bytes() == 4 {
            s.load(at.cast::<f32>().add(v * l))
        } else {
            s.load_f16(at.cast::<u16>().add(v * l))
        }
    }
}

/// `acc` plus vector `v`'s rows of group-block `gb` (of `f`, a format of one scale per
/// block): `d * qx` and the format's minimum (Q4_1, Q4_1F32, Q5_1: `m * xs`) or offset
/// (Q4_0: `-8 d * xs`, Q5_0: `-16 d * xs`), where `qx` holds the rows' `q . x` and `xs` is the block's sum of `x`.
/// (Q8_0F32x2, of two scales, is summed by its caller; here it would take `d0 * qx`.)
///
/// # Safety
/// `gb` is readable for a group-block of `f` and `(v + 1) * LANES <= GROUP`.
#[inline(always)]
unsafe fn add_block<S: Simd>(
    s: S,
    f: GroupFormat,
    gb: *const u8,
    v: usize,
    qx: S::F32,
    xs: f32,
    acc: S::F32,
) -> S::F32 {
    // SAFETY: the header words of the group-block's rows `v * LANES .. (v + 1) * LANES`
    // (caller); the minimum is word 1 of the formats that have one.
    unsafe {
        let d = header_word(s, f, gb, 0, v);
        match f {
            GroupFormat::Q4_0 => s.fma(d, s.sub(qx, s.splat(8.0 * xs)), acc),
            GroupFormat::Q5_0 => s.fma(d, s.sub(qx, s.splat(16.0 * xs)), acc),
            GroupFormat::Q4_1 | GroupFormat::Q4_1F32 | GroupFormat::Q5_1 | GroupFormat::Q5_1F32 => {
                let m = header_word(s, f, gb, 1, v);
                s.fma(m, s.splat(xs), s.fma(d, qx, acc))
            }
            GroupFormat::Q8_0 | GroupFormat::Q8_0F32x2 => s.fma(d, qx, acc),
        }
    }
}

/// The group's 16 rows from the accumulators' lanes.
#[inline(always)]
fn group_rows<S: Simd>(s: S, acc: &[S::F32; MAX_VECS]) -> [f32; GROUP] {
    let l = S::LANES;
    let mut out = [0f32; GROUP];
    for (v, av) in acc.iter().enumerate().take(GROUP / l) {
        // SAFETY: `(v + 1) * LANES <= GROUP`: inside `out`.
        unsafe { s.store(out.as_mut_ptr().add(v * l), *av) };
    }
    out
}

/// [`group_dots`] of a 4-bit format against `x` quantized to int8 ([`Int8X`]): per block,
/// the integer dots of the 16 rows ([`Simd::dot_nibbles16_i8`]) times the block's scale of
/// `x`, then the format's scale and minimum (or offset) against the quantized block's sum,
/// so each row meets one and the same quantized `x`. The 5- and 8-bit formats never come
/// here.
///
/// The walk over the blocks is written out here as in [`group_dots`], not shared through a
/// closure: a closure is compiled without the target features of the function it is
/// written in, so its intrinsics become calls (a version that shared it decoded at 2.4 tok/s
/// instead of 118).
///
/// # Safety
/// As [`group_dots`]; `x8` is readable for `32 * blocks` bytes, `xscale` and `xsum` for
/// `blocks` floats.
#[inline(always)]
unsafe fn group_dots_i8<S: Simd>(
    s: S,
    f: GroupFormat,
    g: *const u8,
    blocks: usize,
    x8: *const i8,
    xscale: *const f32,
    xsum: *const f32,
) -> [f32; GROUP] {
    debug_assert!(f.nibbles(), "5- and 8-bit rows take the f32 kernel");
    let l = S::LANES;
    let vecs = GROUP / l;
    let (gbb, sb) = (group_block_bytes(f), scale_bytes(f));
    let mut acc = [s.zero(); MAX_VECS];
    for b in 0..blocks {
        // SAFETY: block `b < blocks` of `g`: 256 bytes of quants after its scales; its 32
        // bytes of `x8`, its scale and its sum (caller).
        unsafe {
            let gb = g.add(b * gbb);
            prefetch_ahead(gb, gbb);
            let dots = s.dot_nibbles16_i8(gb.add(sb), x8.add(b * QK));
            let (dx, xs) = (s.splat(*xscale.add(b)), *xsum.add(b));
            for (v, (dv, av)) in dots.iter().zip(acc.iter_mut()).enumerate().take(vecs) {
                let qx = s.mul(s.i32_to_f32(*dv), dx);
                *av = add_block(s, f, gb, v, qx, xs, *av);
            }
        }
    }
    group_rows(s, &acc)
}

/// A run of groups of one quantized matrix, as the group kernels read it.
#[derive(Clone, Copy)]
pub struct Groups<'a> {
    /// The format of the blocks.
    pub format: GroupFormat,
    /// Whole groups ([`crate::quant::groups::RowGroups::groups`]).
    pub bytes: &'a [u8],
    /// Blocks per row.
    pub blocks: usize,
}

impl<'a> Groups<'a> {
    /// The groups of rows `r0 .. r0 + rows` of `w` (`r0` a multiple of [`GROUP`]).
    pub fn of(w: &'a QTensor, r0: usize, rows: usize) -> Self {
        let g = w.groups();
        Groups {
            format: w.format(),
            bytes: g.groups(r0 / GROUP, rows.div_ceil(GROUP)),
            blocks: g.blocks(),
        }
    }

    /// Whether the groups cover `rows` rows and `x` (the form these rows read) their
    /// blocks.
    fn fit(&self, rows: usize, x: &Activation<'_>) -> bool {
        let n = self.blocks;
        self.bytes.len() >= rows.div_ceil(GROUP) * n * group_block_bytes(self.format)
            && x.x.len() >= n * QK
            && match x.int8 {
                Some(i) if self.format.nibbles() => {
                    i.q.len() >= n * QK && i.scales.len() >= n && i.sums.len() >= n
                }
                _ => x.sums.len() >= n,
            }
    }

    /// The dot products of group `g`'s 16 rows with `x` (which [`Groups::fit`] checked).
    #[inline(always)]
    fn dots<S: Simd>(&self, s: S, g: usize, x: &Activation<'_>) -> [f32; GROUP] {
        let group_bytes = self.blocks * group_block_bytes(self.format);
        // SAFETY: the caller checked `fit` for rows past group `g`: the group, `x` and its
        // sums cover `blocks` blocks.
        unsafe {
            let (g, n) = (self.bytes.as_ptr().add(g * group_bytes), self.blocks);
            // One call per format with the format written out: the kernels are inlined here,
            // so each copy has its format as a constant and its branches on it folded (a
            // format passed at run time cost SmolLM2's Q4_1 decode about 3% on AVX2).
            macro_rules! f32_dots {
                ($f:expr) => {
                    group_dots(s, $f, g, n, x.x.as_ptr(), x.sums.as_ptr())
                };
            }
            macro_rules! i8_dots {
                ($f:expr, $i:expr) => {
                    group_dots_i8(
                        s,
                        $f,
                        g,
                        n,
                        $i.q.as_ptr(),
                        $i.scales.as_ptr(),
                        $i.sums.as_ptr(),
                    )
                };
            }
            match (x.int8, self.format) {
                (Some(i), GroupFormat::Q4_0) => i8_dots!(GroupFormat::Q4_0, i),
                (Some(i), GroupFormat::Q4_1) => i8_dots!(GroupFormat::Q4_1, i),
                (Some(i), GroupFormat::Q4_1F32) => i8_dots!(GroupFormat::Q4_1F32, i),
                (_, GroupFormat::Q4_0) => f32_dots!(GroupFormat::Q4_0),
                (_, GroupFormat::Q4_1) => f32_dots!(GroupFormat::Q4_1),
                (_, GroupFormat::Q4_1F32) => f32_dots!(GroupFormat::Q4_1F32),
                (_, GroupFormat::Q5_0) => f32_dots!(GroupFormat::Q5_0),
                (_, GroupFormat::Q5_1) => f32_dots!(GroupFormat::Q5_1),
                (_, GroupFormat::Q5_1F32) => f32_dots!(GroupFormat::Q5_1F32),
                (_, GroupFormat::Q8_0) => f32_dots!(GroupFormat::Q8_0),
                (_, GroupFormat::Q8_0F32x2) => f32_dots!(GroupFormat::Q8_0F32x2),
            }
        }
    }
}

/// The f32 activation of a decode matvec and its sums per block of 32 (from scratch).
#[derive(Clone, Copy)]
pub struct Activation<'a> {
    /// `x`, 32 floats per block.
    pub x: &'a [f32],
    /// The sum of each block of 32 of `x` ([`block_sums`]), for the rows that read the f32
    /// `x` (may be empty when every row reads `int8`).
    pub sums: &'a [f32],
    /// `x` quantized to int8, when the 4-bit rows are to use it (an inexact, opt-in mode:
    /// [`crate::Activations::Int8`]); 5- and 8-bit rows read the f32 `x` either way.
    pub int8: Option<Int8X<'a>>,
}

/// `x` quantized to int8 per block of 32: `x[i] ~ q[i] * scales[i / 32]` ([`quantize`]).
#[derive(Clone, Copy)]
pub struct Int8X<'a> {
    /// The quantized values, 32 per block.
    pub q: &'a [i8],
    /// Each block's scale: its largest magnitude over 127 (0 for a block of zeros; NaN if
    /// the block holds a NaN or an infinity).
    pub scales: &'a [f32],
    /// Each block's sum of the quantized `x`, `scale * sum(q)` ([`quantize`]).
    pub sums: &'a [f32],
}

/// `sums[b] = sum(x[32 b .. 32 b + 32])` for the whole blocks of `x` that `sums` holds.
#[inline(always)]
fn block_sums_body<S: Simd>(s: S, x: &[f32], sums: &mut [f32]) {
    for (xb, o) in x.chunks_exact(QK).zip(sums.iter_mut()) {
        let mut acc = s.zero();
        for v in xb.chunks_exact(S::LANES) {
            // SAFETY: `v` holds LANES floats (LANES divides 32 on every level).
            acc = s.add(acc, unsafe { s.load(v.as_ptr()) });
        }
        *o = s.reduce_sum(acc);
    }
}

/// Quantizes the whole blocks of `x` (as many as `q`, `scales` and `sums` hold) for the int8
/// kernels: each block's values divided by its scale (its largest magnitude over 127) and
/// rounded to the nearest integer (ties to even), so `|q| <= 127` and each value moves by at
/// most half its block's scale; `sums[b]` is the quantized block's sum, `scale * sum(q)`. A
/// block holding a NaN or an infinity gets the scale NaN, so every dot product over it is
/// NaN, as in the f32 kernel, not a silently finite result.
#[inline(always)]
fn quantize_body<S: Simd>(s: S, x: &[f32], q: &mut [i8], scales: &mut [f32], sums: &mut [f32]) {
    let l = S::LANES;
    let blocks = x.chunks_exact(QK).zip(q.chunks_exact_mut(QK));
    for (((xb, qb), d), sum) in blocks.zip(scales.iter_mut()).zip(sums.iter_mut()) {
        // A block in registers: 32 / LANES vectors, at most 8 (4 lanes).
        let mut v = [s.zero(); 8];
        for (i, vi) in v.iter_mut().enumerate().take(QK / l) {
            // SAFETY: `(i + 1) * LANES <= 32`: inside the block.
            *vi = unsafe { s.load(xb.as_ptr().add(i * l)) };
        }
        let (mut m, mut bad) = (s.zero(), s.zero());
        for &vi in v.iter().take(QK / l) {
            m = s.max(m, kernel_simd::abs(s, vi));
            bad = s.add(bad, kernel_simd::non_finite(s, vi));
        }
        let amax = s.reduce_max(m);
        let inv = s.splat(if amax > 0.0 { 127.0 / amax } else { 0.0 });
        *d = if s.reduce_sum(bad).is_nan() {
            f32::NAN
        } else {
            amax / 127.0
        };
        let mut ints = [0i32; QK];
        let mut isum = s.splat_i32(0);
        for (i, &vi) in v.iter().enumerate().take(QK / l) {
            let r = kernel_simd::round_small(s, s.mul(vi, inv));
            isum = s.add_i32(isum, r);
            // SAFETY: `(i + 1) * LANES <= 32`: inside `ints`.
            unsafe { s.store_i32(ints.as_mut_ptr().add(i * l), r) };
        }
        for (o, &r) in qb.iter_mut().zip(&ints) {
            // `|r| <= 127` for finite blocks; the clamp keeps a non-finite block's values
            // (unspecified, its scale is NaN) inside i8.
            *o = r.clamp(-127, 127) as i8;
        }
        *sum = *d * s.reduce_sum_i32(isum) as f32;
    }
}

/// `o[i] (+)= row i . x` for the rows of `w` (the last group may be partly used). Writes
/// NaN if the lengths do not fit (the kernels check the shapes, so this does not happen).
#[inline(always)]
fn matvec_body<S: Simd>(s: S, w: Groups<'_>, x: Activation<'_>, o: &mut [f32], output: Output) {
    if !w.fit(o.len(), &x) {
        o.fill(f32::NAN);
        return;
    }
    for (g, og) in o.chunks_mut(GROUP).enumerate() {
        for (oi, v) in og.iter_mut().zip(w.dots(s, g, &x)) {
            *oi = output.apply(*oi, v);
        }
    }
}

/// `o[i] = silu(gate_i . x) * (up_i . x)` for the rows of the MLP's `gate` and `up` (NaN
/// if the lengths do not fit, as for [`matvec_body`]).
#[inline(always)]
fn swiglu_body<S: Simd>(s: S, gate: Groups<'_>, up: Groups<'_>, x: Activation<'_>, o: &mut [f32]) {
    if !gate.fit(o.len(), &x) || !up.fit(o.len(), &x) {
        o.fill(f32::NAN);
        return;
    }
    for (g, og) in o.chunks_mut(GROUP).enumerate() {
        let (gv, uv) = (gate.dots(s, g, &x), up.dots(s, g, &x));
        for ((oi, gi), ui) in og.iter_mut().zip(gv).zip(uv) {
            *oi = gi / (1.0 + (-gi).exp()) * ui;
        }
    }
}

kernel_simd::instantiate! {
    /// Sums of `x` per block of 32, for the f32 kernels.
    pub fn block_sums(x: &[f32], sums: &mut [f32]) = block_sums_body;
    /// `x` quantized to int8 per block of 32, with its scales and quantized sums.
    pub fn quantize(x: &[f32], q: &mut [i8], scales: &mut [f32], sums: &mut [f32]) = quantize_body;
    /// The decode matvec over a run of groups.
    pub fn matvec(w: Groups<'_>, x: Activation<'_>, o: &mut [f32], output: Output) = matvec_body;
    /// The decode MLP's gate/up matvecs and SwiGLU over a run of groups.
    pub fn swiglu(gate: Groups<'_>, up: Groups<'_>, x: Activation<'_>, o: &mut [f32]) = swiglu_body;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_data::{data, file_rows};
    use crate::kernels::{self, check_row_kernels};
    use crate::quant::format::{dequantize_row, quantize_row, QType};
    use kernel_simd::available_levels;

    /// A matrix of `rows` rows of `blocks` blocks of `t` (of 32, or super-blocks of 256 for
    /// the K-quants) from seeded data, and its rows exactly dequantized (from the file's
    /// bytes, by the format's definition).
    fn quantized(t: QType, rows: usize, blocks: usize, seed: u32) -> (QTensor, Vec<f32>) {
        let k = blocks * t.block_len();
        let bytes = file_rows(t, rows, k, seed);
        let w = QTensor::from_bytes(t, rows, k, &bytes).unwrap();
        let mut exact = vec![0f32; rows * k];
        for (o, r) in exact
            .chunks_exact_mut(k)
            .zip(bytes.chunks_exact(t.row_bytes(k)))
        {
            dequantize_row(t, r, o);
        }
        assert_eq!(
            w.to_f32().iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            exact.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            "{t:?}: the group layout holds the file's values"
        );
        (w, exact)
    }

    /// Every level's matvec and SwiGLU over `w` and `xa` against f64 dot products of the
    /// `exact` rows with `x`.
    fn check_every_level(w: &QTensor, exact: &[f32], x: &[f64], xa: Activation<'_>, what: &str) {
        let want: Vec<f64> = exact
            .chunks_exact(x.len())
            .map(|r| r.iter().zip(x).map(|(&a, b)| f64::from(a) * b).sum())
            .collect();
        let wg = Groups::of(w, 0, w.rows());
        for level in available_levels() {
            check_row_kernels(
                &want,
                &format!("{what} {level} {:?} rows {}", w.qtype(), w.rows()),
                |o| matvec::run(level, wg, xa, o, Output::AddTo),
                |o| swiglu::run(level, wg, wg, xa, o),
            );
        }
    }

    /// Every level's group matvec and SwiGLU, in every format packed in groups (the
    /// transcoded and repacked ones included), against f64 dot products of the exactly
    /// dequantized rows, for row counts around a group (padding rows) and several block
    /// counts.
    #[test]
    fn group_kernels_match_f64_on_every_level() {
        for t in QType::ALL {
            for (rows, blocks) in [(1, 1), (5, 2), (16, 1), (21, 3), (33, 4)] {
                let (w, exact) = quantized(t, rows, blocks, (rows * 31 + blocks) as u32);
                let x = data(w.cols(), 99 + blocks as u32);
                let xsum: Vec<f32> = x.chunks_exact(QK).map(|b| b.iter().sum()).collect();
                let xa = Activation {
                    x: &x,
                    sums: &xsum,
                    int8: None,
                };
                let x64: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
                check_every_level(&w, &exact, &x64, xa, &format!("blocks {blocks}"));
            }
        }
    }

    /// The int8-activation kernels (4-bit rows) on every level, against f64 dot products of
    /// the exactly dequantized rows with the *quantized* `x` (`q * scale`): the integer sums
    /// are exact, so only f32 rounding separates them. 5- and 8-bit rows ignore the int8
    /// `x`. And
    /// the quantized `x` is within half a step of `x`.
    #[test]
    fn int8_group_kernels_match_f64_of_the_quantized_x() {
        for t in QType::ALL {
            for (rows, blocks) in [(1, 1), (16, 1), (21, 3), (33, 4)] {
                let (w, exact) = quantized(t, rows, blocks, (rows * 17 + blocks) as u32);
                let k = w.cols();
                let x = data(k, 7 + blocks as u32);
                let (mut q, mut scales) = (vec![0i8; k], vec![0f32; k / QK]);
                let mut sums = vec![0f32; k / QK];
                quantize::run(kernels::isa(), &x, &mut q, &mut scales, &mut sums);
                let xq: Vec<f64> = (0..k)
                    .map(|i| f64::from(q[i]) * f64::from(scales[i / QK]))
                    .collect();
                for (i, (a, b)) in x.iter().zip(&xq).enumerate() {
                    let half_step = 0.5 * f64::from(scales[i / QK]);
                    assert!(
                        (f64::from(*a) - b).abs() <= half_step * (1.0 + 1e-6),
                        "x[{i}]"
                    );
                }
                // 5- and 8-bit rows read the f32 `x`; 4-bit rows the quantized one.
                let x_used: Vec<f64> = match GroupFormat::of(t).nibbles() {
                    false => x.iter().map(|&v| f64::from(v)).collect(),
                    true => xq,
                };
                let int8 = Some(Int8X {
                    q: &q,
                    scales: &scales,
                    sums: &sums,
                });
                let mut xsums = vec![0f32; k / QK];
                block_sums::run(kernels::isa(), &x, &mut xsums);
                let xa = Activation {
                    x: &x,
                    sums: &xsums,
                    int8,
                };
                check_every_level(&w, &exact, &x_used, xa, &format!("int8 blocks {blocks}"));
            }
        }
    }

    /// Every level's block sums and int8 quantization against a scalar definition: sums
    /// within f32 rounding, the quantized values exact (round to nearest, ties to even), the
    /// scales exact, and a block of zeros quantized to zeros with scale 0.
    #[test]
    fn block_sums_and_quantize_match_scalar_on_every_level() {
        let mut x = data(4 * QK, 5);
        x[QK..2 * QK].fill(0.0);
        x[2 * QK + 3] = -3.0 * x.iter().fold(0f32, |m, v| m.max(v.abs())); // an extreme
        x[3 * QK + 7] = 0.0;
        for level in available_levels() {
            let mut sums = [f32::NAN; 4];
            block_sums::run(level, &x, &mut sums);
            let (mut q, mut scales, mut qsums) = ([0i8; 4 * QK], [0f32; 4], [0f32; 4]);
            quantize::run(level, &x, &mut q, &mut scales, &mut qsums);
            for b in 0..4 {
                let xb = &x[b * QK..][..QK];
                let want: f64 = xb.iter().map(|&v| f64::from(v)).sum();
                let size: f64 = xb.iter().map(|&v| f64::from(v.abs())).sum();
                assert!(
                    (f64::from(sums[b]) - want).abs() <= 1e-6 * size,
                    "{level} sum {b}"
                );
                let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                assert_eq!(scales[b], amax / 127.0, "{level} scale {b}");
                let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
                let want_q: Vec<i8> = xb
                    .iter()
                    .map(|&v| (v * inv).round_ties_even() as i8)
                    .collect();
                assert_eq!(q[b * QK..][..QK], want_q[..], "{level} q {b}");
                let isum: i32 = want_q.iter().map(|&v| i32::from(v)).sum();
                assert_eq!(
                    qsums[b],
                    scales[b] * isum as f32,
                    "{level} quantized sum {b}"
                );
            }
            assert!(
                q[QK..2 * QK].iter().all(|&v| v == 0) && scales[1] == 0.0,
                "{level}"
            );
            assert!(q.contains(&-127), "{level}: the extreme maps to -127");
        }
    }

    /// A NaN or infinity in `x` makes the int8 kernel's rows NaN, not a finite guess.
    #[test]
    fn int8_activations_keep_non_finite_inputs_visible() {
        let bytes = quantize_row(QType::Q4_1, &data(64, 3)).unwrap();
        let w = QTensor::from_bytes(QType::Q4_1, 1, 64, &bytes).unwrap();
        for bad in [f32::NAN, f32::INFINITY] {
            let mut x = data(64, 4);
            x[40] = bad;
            let (mut q, mut scales, mut sums) = (vec![0i8; 64], vec![0f32; 2], vec![0f32; 2]);
            quantize::run(kernels::isa(), &x, &mut q, &mut scales, &mut sums);
            let xa = Activation {
                x: &x,
                sums: &[],
                int8: Some(Int8X {
                    q: &q,
                    scales: &scales,
                    sums: &sums,
                }),
            };
            for level in available_levels() {
                let mut o = [0f32; 1];
                matvec::run(level, Groups::of(&w, 0, 1), xa, &mut o, Output::Overwrite);
                assert!(o[0].is_nan(), "{level} {bad}");
            }
        }
    }

    /// Lengths that do not fit give NaN, not a read out of bounds.
    #[test]
    fn group_matvec_refuses_short_inputs() {
        let bytes = quantize_row(QType::Q4_1, &data(64, 1)).unwrap();
        let w = QTensor::from_bytes(QType::Q4_1, 1, 64, &bytes).unwrap();
        let x = data(32, 2); // one block of the two
        let mut o = [0f32; 1];
        for level in available_levels() {
            let xa = Activation {
                x: &x,
                sums: &[0.0; 2],
                int8: None,
            };
            matvec::run(level, Groups::of(&w, 0, 1), xa, &mut o, Output::Overwrite);
            assert!(o[0].is_nan(), "{level}");
        }
    }
}
