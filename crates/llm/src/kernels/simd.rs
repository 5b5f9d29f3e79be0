//! The SIMD bodies of the llm kernels, written once over `kernel_simd::Simd` and instantiated
//! per ISA (portable, AVX2, AVX-512, NEON) by `kernel_simd::instantiate!`; the parent module
//! splits the work over rayon and dispatches each task to one level.

use kernel_simd::{bf16_to_f32, f16_to_f32, Level, Simd};

use crate::output::Output;

/// One weight matrix's rows (`[n, k]` row-major) as a row kernel reads them.
#[derive(Clone, Copy)]
pub(crate) enum Rows<'a> {
    /// f32 weights.
    F32(&'a [f32]),
    /// bf16 weights, dotted with `x` de-interleaved into pairs (see [`deinterleave`]).
    Bf16(&'a [u16]),
    /// f16 weights.
    F16(&'a [u16]),
}

/// Elements of one pair block of [`deinterleave`] at `level`: two vectors of bf16 pairs.
pub(crate) fn pair_block(level: Level) -> usize {
    2 * level.lanes()
}

/// `x` de-interleaved per block of `b = pair_block(level)` elements into `xd` (the `b / 2`
/// even elements, then the `b / 2` odd ones), for the bf16 row kernels: a 32-bit lane of
/// loaded bf16 weights holds an even element (low half) and the next odd one (high half),
/// `lane << 16` and `lane & 0xFFFF0000` widen them with one instruction each, and `xd`
/// matches them without shuffles. Fills `xd[..x.len() / b * b]`.
pub(crate) fn deinterleave(level: Level, x: &[f32], xd: &mut [f32]) {
    let b = pair_block(level);
    for (d, src) in xd.chunks_exact_mut(b).zip(x.chunks_exact(b)) {
        for j in 0..b / 2 {
            d[j] = src[2 * j];
            d[b / 2 + j] = src[2 * j + 1];
        }
    }
}

/// The loop both row dots share, four accumulators of `S::LANES`: `four(i, acc)` for `i` in
/// steps of `4 * S::LANES` while they fit below `end`, then `one(i, acc)` in steps of `tail`
/// while they fit. Returns the sum of the accumulators and the `i` where the steps stopped.
#[inline(always)]
fn four_accumulators<S: Simd>(
    s: S,
    end: usize,
    tail: usize,
    mut four: impl FnMut(usize, &mut [S::F32; 4]),
    mut one: impl FnMut(usize, &mut [S::F32; 4]),
) -> (f32, usize) {
    let mut acc = [s.zero(); 4];
    let mut i = 0;
    while i + 4 * S::LANES <= end {
        four(i, &mut acc);
        i += 4 * S::LANES;
    }
    while i + tail <= end {
        one(i, &mut acc);
        i += tail;
    }
    let sum = s.reduce_sum(s.add(s.add(acc[0], acc[1]), s.add(acc[2], acc[3])));
    (sum, i)
}

/// `sum_j w[j] x[j]` over `k = x.len()` elements of a row widened by `load` (the lanes) and
/// `conv` (the tail): four accumulators of `S::LANES`, then single vectors.
///
/// # Safety
/// `w` is readable for `x.len()` elements; `load(s, p)` reads `S::LANES` elements at `p`.
#[inline(always)]
unsafe fn dot_lanes<S: Simd, E: Copy>(
    s: S,
    w: *const E,
    x: &[f32],
    load: impl Fn(S, *const E) -> S::F32,
    conv: impl Fn(E) -> f32,
) -> f32 {
    let (k, l, xp) = (x.len(), S::LANES, x.as_ptr());
    // SAFETY: every step of the loops ends at `i + LANES <= k`: inside `x` and the row
    // (caller).
    let fma_at = |i: usize, a: S::F32| unsafe { s.fma(load(s, w.add(i)), s.load(xp.add(i)), a) };
    let (mut sum, i) = four_accumulators(
        s,
        k,
        l,
        |i, acc| {
            for (u, au) in acc.iter_mut().enumerate() {
                *au = fma_at(i + u * l, *au);
            }
        },
        |i, acc| acc[0] = fma_at(i, acc[0]),
    );
    for (j, xj) in x.iter().enumerate().skip(i) {
        // SAFETY: `j < k`: inside the row (caller).
        sum += conv(unsafe { *w.add(j) }) * xj;
    }
    sum
}

/// A bf16 row dotted with `x`, whose pair blocks are also given in `xd` ([`deinterleave`]
/// at this level): `2 * S::LANES` weights per vector load, four accumulators over two pair
/// blocks a step.
///
/// # Safety
/// `w` is readable for `x.len()` elements; `xd` holds `x.len() / b * b` floats
/// (`b = 2 * S::LANES`).
#[inline(always)]
unsafe fn dot_bf16_pairs<S: Simd>(s: S, w: *const u16, x: &[f32], xd: &[f32]) -> f32 {
    let (k, l) = (x.len(), S::LANES);
    let b = 2 * l;
    let kb = k / b * b;
    debug_assert!(xd.len() >= kb);
    let mask = s.splat_i32(0xFFFF_0000u32 as i32);
    let xdp = xd.as_ptr();
    // The pair block at `i` (`l` 32-bit lanes of two bf16 each, even and odd halves) dotted
    // into two accumulators.
    let pair = |i: usize, even: &mut S::F32, odd: &mut S::F32| {
        // SAFETY: the steps end at `i + b <= kb <= k`: `b` u16 inside the row (caller), and
        // `b` floats inside `xd` (`kb <= xd.len()`).
        unsafe {
            let bits = s.f32_to_bits(s.load(w.add(i).cast::<f32>()));
            let we = s.bits_to_f32(s.shl_i32::<16>(bits));
            let wo = s.bits_to_f32(s.and_i32(bits, mask));
            *even = s.fma(we, s.load(xdp.add(i)), *even);
            *odd = s.fma(wo, s.load(xdp.add(i + l)), *odd);
        }
    };
    let (mut sum, _) = four_accumulators(
        s,
        kb,
        b,
        |i, [a0, a1, a2, a3]| {
            pair(i, a0, a1);
            pair(i + b, a2, a3);
        },
        |i, [a0, a1, ..]| pair(i, a0, a1),
    );
    for (j, xj) in x.iter().enumerate().skip(kb) {
        // SAFETY: `j < k`: inside the row (caller).
        sum += bf16_to_f32(unsafe { *w.add(j) }) * xj;
    }
    sum
}

/// Row `r` of `w` (rows of `x.len()` elements) dotted with `x`. Panics if the row is not
/// inside `w`, or (bf16) `xd` is shorter than the pair blocks of `x`.
#[inline(always)]
fn dot_row<S: Simd>(s: S, w: Rows<'_>, r: usize, x: &[f32], xd: &[f32]) -> f32 {
    let k = x.len();
    match w {
        Rows::F32(d) => {
            let row = &d[r * k..(r + 1) * k];
            // SAFETY: `row` holds `k` floats; `load` reads LANES at in-bounds offsets.
            unsafe { dot_lanes(s, row.as_ptr(), x, |s, p| s.load(p), |v| v) }
        }
        Rows::Bf16(d) => {
            let row = &d[r * k..(r + 1) * k];
            assert!(
                xd.len() >= k / (2 * S::LANES) * (2 * S::LANES),
                "pair blocks of x"
            );
            // SAFETY: `row` holds `k` elements and `xd` the pair blocks (asserted).
            unsafe { dot_bf16_pairs(s, row.as_ptr(), x, xd) }
        }
        Rows::F16(d) => {
            let row = &d[r * k..(r + 1) * k];
            // SAFETY: `row` holds `k` elements; `load_f16` reads LANES at in-bounds offsets.
            unsafe { dot_lanes(s, row.as_ptr(), x, |s, p| s.load_f16(p), f16_to_f32) }
        }
    }
}

/// `o[i] (+)= row r0 + i of w . x` for `i < o.len()`.
#[inline(always)]
fn matvec_body<S: Simd>(
    s: S,
    w: Rows<'_>,
    r0: usize,
    x: &[f32],
    xd: &[f32],
    o: &mut [f32],
    output: Output,
) {
    for (i, oi) in o.iter_mut().enumerate() {
        *oi = output.apply(*oi, dot_row(s, w, r0 + i, x, xd));
    }
}

/// `o[i] = silu(gate_r . x) * (up_r . x)` for rows `r = r0 + i`, `i < o.len()`.
#[inline(always)]
fn swiglu_rows_body<S: Simd>(
    s: S,
    gate: Rows<'_>,
    up: Rows<'_>,
    r0: usize,
    x: &[f32],
    xd: &[f32],
    o: &mut [f32],
) {
    for (i, oi) in o.iter_mut().enumerate() {
        let g = dot_row(s, gate, r0 + i, x, xd);
        let u = dot_row(s, up, r0 + i, x, xd);
        *oi = g / (1.0 + (-g).exp()) * u;
    }
}

/// `dst[i] = src[i]` widened from bf16 (`bf16`) or f16 bits, over the shorter length.
#[inline(always)]
fn widen_body<S: Simd>(s: S, src: &[u16], bf16: bool, dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    let l = S::LANES;
    let mut i = 0;
    while i + l <= n {
        // SAFETY: `i + LANES <= n`: inside both slices.
        unsafe {
            let p = src.as_ptr().add(i);
            let v = if bf16 { s.load_bf16(p) } else { s.load_f16(p) };
            s.store(dst.as_mut_ptr().add(i), v);
        }
        i += l;
    }
    for j in i..n {
        dst[j] = if bf16 {
            bf16_to_f32(src[j])
        } else {
            f16_to_f32(src[j])
        };
    }
}

/// `sum x[i]^2`.
#[inline(always)]
fn sum_squares_body<S: Simd>(s: S, x: &[f32]) -> f32 {
    kernel_simd::dot(s, x, x)
}

/// `out[i] = x[i] * r * weight[i]` over the shortest length.
#[inline(always)]
fn scale_rows_body<S: Simd>(s: S, x: &[f32], r: f32, weight: &[f32], out: &mut [f32]) {
    let n = x.len().min(weight.len()).min(out.len());
    let (l, rv) = (S::LANES, s.splat(r));
    let mut i = 0;
    while i + l <= n {
        // SAFETY: `i + LANES <= n`: inside all three slices.
        unsafe {
            let v = s.mul(
                s.mul(s.load(x.as_ptr().add(i)), rv),
                s.load(weight.as_ptr().add(i)),
            );
            s.store(out.as_mut_ptr().add(i), v);
        }
        i += l;
    }
    for j in i..n {
        out[j] = x[j] * r * weight[j];
    }
}

/// Register-blocked dot products for the prefill matmul: rows `0..MR` of `x` against rows
/// `0..NR` of `w`, each of `k` floats (rows `k` apart); `res[a][b] = x[a] . w[b]`.
///
/// # Safety
/// `MR * k` floats at `x`, `NR * k` at `w`.
#[inline(always)]
unsafe fn micro_n<S: Simd, const MR: usize, const NR: usize>(
    s: S,
    x: *const f32,
    w: *const f32,
    k: usize,
    res: &mut [[f32; 4]; 3],
) {
    let l = S::LANES;
    let mut acc = [[s.zero(); NR]; MR];
    let mut i = 0;
    while i + l <= k {
        // The `MR` rows of `x` in registers and one row of `w` at a time: 3 x 4 accumulators
        // + 3 + 1 fit AVX2's 16 registers. (Loading the 4 rows of `w` first needed 17: one
        // accumulator went through the stack every step, a store-to-load round trip in its
        // dependency chain that held the 3 x 4 block to 0.5x the speed of this order in an
        // L1-resident test on an AVX2 AMD EPYC.)
        // SAFETY: `i + LANES <= k`: inside every row of `x` and `w` (caller).
        unsafe {
            let xv: [S::F32; MR] = core::array::from_fn(|a| s.load(x.add(a * k + i)));
            for b in 0..NR {
                let wv = s.load(w.add(b * k + i));
                for (acc_a, &xa) in acc.iter_mut().zip(&xv) {
                    acc_a[b] = s.fma(xa, wv, acc_a[b]);
                }
            }
        }
        i += l;
    }
    for a in 0..MR {
        for b in 0..NR {
            let mut sum = s.reduce_sum(acc[a][b]);
            for j in i..k {
                // SAFETY: `j < k`: inside row `a` of `x` and row `b` of `w` (caller).
                sum += unsafe { *x.add(a * k + j) * *w.add(b * k + j) };
            }
            res[a][b] = sum;
        }
    }
}

/// [`micro_n`] for `mr <= 3`, `nr <= 4` chosen at run time (each size kept in registers).
///
/// # Safety
/// `mr * k` floats at `x`, `nr * k` at `w` (rows `k` apart).
#[inline(always)]
unsafe fn micro_body<S: Simd>(
    s: S,
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
            unsafe { micro_n::<S, $mr, $nr>(s, x, w, k, res) }
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

kernel_simd::instantiate! {
    /// Decode matvec over a range of rows.
    pub(crate) fn matvec(
        w: Rows<'_>,
        r0: usize,
        x: &[f32],
        xd: &[f32],
        o: &mut [f32],
        output: Output
    ) = matvec_body;
    /// Decode's fused gate/up matvec and SwiGLU over a range of rows.
    pub(crate) fn swiglu_rows(
        gate: Rows<'_>,
        up: Rows<'_>,
        r0: usize,
        x: &[f32],
        xd: &[f32],
        o: &mut [f32]
    ) = swiglu_rows_body;
    /// bf16 / f16 to f32.
    pub(crate) fn widen(src: &[u16], bf16: bool, dst: &mut [f32]) = widen_body;
    /// `sum x^2`.
    pub(crate) fn sum_squares(x: &[f32]) -> f32 = sum_squares_body;
    /// `out = x * r * weight`.
    pub(crate) fn scale_rows(x: &[f32], r: f32, weight: &[f32], out: &mut [f32]) = scale_rows_body;
    /// The prefill matmul's register block.
    pub(crate) unsafe fn micro(
        x: *const f32,
        mr: usize,
        w: *const f32,
        nr: usize,
        k: usize,
        res: &mut [[f32; 4]; 3]
    ) = micro_body;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::check_row_kernels;
    use crate::kernels::test_data::{close, data};
    use kernel_simd::available_levels;

    fn to_bf16(x: f32) -> u16 {
        (x.to_bits() >> 16) as u16 // truncation: any bf16 value will do
    }

    fn to_f16(x: f32) -> u16 {
        // |x| < 1 here: sign, a normal exponent and the top 10 mantissa bits.
        let b = x.to_bits();
        let e = ((b >> 23) & 0xff) as i32 - 127 + 15;
        if e <= 0 {
            return ((b >> 16) & 0x8000) as u16;
        }
        (((b >> 16) & 0x8000) | ((e as u32) << 10) | ((b >> 13) & 0x3ff)) as u16
    }

    /// Every level's matvec and fused SwiGLU on every weight type, against f64 dot products
    /// of the same widened weights, for lengths around every vector and pair-block width.
    #[test]
    fn row_kernels_match_f64_on_every_level() {
        let n = 5;
        for level in available_levels() {
            for k in [1, 3, 4, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 100, 130] {
                let x = data(k, k as u32);
                let wf = data(n * k, 7 + k as u32);
                let wb: Vec<u16> = wf.iter().map(|&v| to_bf16(v)).collect();
                let wh: Vec<u16> = wf.iter().map(|&v| to_f16(v)).collect();
                let mut xd = vec![0f32; k];
                deinterleave(level, &x, &mut xd);
                let cases: [(Rows<'_>, Vec<f32>); 3] = [
                    (Rows::F32(&wf), wf.clone()),
                    (
                        Rows::Bf16(&wb),
                        wb.iter().map(|&b| bf16_to_f32(b)).collect(),
                    ),
                    (Rows::F16(&wh), wh.iter().map(|&h| f16_to_f32(h)).collect()),
                ];
                for (w, wide) in &cases {
                    let want: Vec<f64> = (0..n)
                        .map(|r| {
                            (0..k)
                                .map(|j| f64::from(wide[r * k + j]) * f64::from(x[j]))
                                .sum()
                        })
                        .collect();
                    // Rows 1.. (a row offset), of every kernel.
                    check_row_kernels(
                        &want[1..],
                        &format!("{level} k={k}"),
                        |o| matvec::run(level, *w, 1, &x, &xd, o, Output::AddTo),
                        |o| swiglu_rows::run(level, *w, *w, 1, &x, &xd, o),
                    );
                }
            }
        }
    }

    #[test]
    fn widen_and_norm_pieces_match_scalar_on_every_level() {
        let x = data(77, 3);
        let w = data(77, 4);
        let bits: Vec<u16> = (0..77u16).map(|i| i.wrapping_mul(853) ^ 0x3c00).collect();
        for level in available_levels() {
            let mut dst = vec![0f32; 77];
            widen::run(level, &bits, true, &mut dst);
            for (d, &b) in dst.iter().zip(&bits) {
                assert_eq!(d.to_bits(), bf16_to_f32(b).to_bits(), "{level} bf16");
            }
            widen::run(level, &bits, false, &mut dst);
            for (d, &b) in dst.iter().zip(&bits) {
                let want = f16_to_f32(b);
                assert!(
                    d.to_bits() == want.to_bits() || d.is_nan() && want.is_nan(),
                    "{level} f16"
                );
            }
            let ss: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
            close(
                sum_squares::run(level, &x),
                ss,
                &format!("{level} sum_squares"),
            );
            let mut out = vec![0f32; 77];
            scale_rows::run(level, &x, 0.75, &w, &mut out);
            for j in 0..77 {
                assert_eq!(out[j], x[j] * 0.75 * w[j], "{level} scale_rows");
            }
        }
    }

    #[test]
    fn micro_matches_f64_on_every_level() {
        let k = 37;
        let x = data(3 * k, 11);
        let w = data(4 * k, 12);
        for level in available_levels() {
            for mr in 1..=3 {
                for nr in 1..=4 {
                    let mut res = [[f32::NAN; 4]; 3];
                    // SAFETY: `x` holds 3 rows and `w` 4 rows of `k` floats.
                    unsafe { micro::run(level, x.as_ptr(), mr, w.as_ptr(), nr, k, &mut res) };
                    for a in 0..mr {
                        for b in 0..nr {
                            let want: f64 = (0..k)
                                .map(|j| f64::from(x[a * k + j]) * f64::from(w[b * k + j]))
                                .sum();
                            close(res[a][b], want, &format!("{level} micro {mr}x{nr}"));
                        }
                    }
                }
            }
        }
    }
}
