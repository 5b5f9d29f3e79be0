//! The AVX-512 set's kernels that are not a generic body: the int8 cache's integer scores and
//! `P . V` at 32 lanes per `vpmaddwd`. The prefill micro-kernels, softmax and the f32 / bf16
//! row kernels are the generic ones of [`super::tile`] and [`super::row`] at 16 lanes, and the
//! other kernels of the set are the AVX2 ones (an AVX-512 CPU runs AVX2 and FMA too): see
//! `Kernels::for_level`.
//!
//! Only instructions of AVX-512F and AVX-512BW are used, and no rounding-mode or mask
//! intrinsics, which keeps every kernel of the set runnable under Miri (`RUSTFLAGS="-C
//! target-feature=+avx2,+fma,+f16c,+avx512f,+avx512bw"`), which is how CI tests them on
//! machines without AVX-512.

use core::arch::x86_64::*;

use crate::kernels::row::{KvRow, PV_ROWS, Q16};

/// `sum_j q[j] k[j]` over the first `n` lanes (`n` a multiple of 32) as 16 i32 partial sums:
/// `vpmaddwd` on the i16 query and the int8 values widened to i16, 32 lanes per instruction.
/// Exact if `n <= 256` (as the AVX2 `madd_block`).
///
/// # Safety
/// AVX-512BW; `q` readable for `n` i16, `k` for `n` bytes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn madd_block(q: *const i16, k: *const i8, n: usize) -> __m512i {
    let mut acc = [_mm512_setzero_si512(); 2];
    let mut j = 0;
    while j + 64 <= n {
        for (u, au) in acc.iter_mut().enumerate() {
            // SAFETY: `j + 32u + 32 <= n`: inside both vectors (caller).
            unsafe {
                let kv = _mm512_cvtepi8_epi16(_mm256_loadu_si256(k.add(j + 32 * u).cast()));
                let qv = _mm512_loadu_si512(q.add(j + 32 * u).cast());
                *au = _mm512_add_epi32(*au, _mm512_madd_epi16(qv, kv));
            }
        }
        j += 64;
    }
    if j < n {
        // SAFETY: `j + 32 <= n` (both multiples of 32).
        unsafe {
            let kv = _mm512_cvtepi8_epi16(_mm256_loadu_si256(k.add(j).cast()));
            let qv = _mm512_loadu_si512(q.add(j).cast());
            acc[0] = _mm512_add_epi32(acc[0], _mm512_madd_epi16(qv, kv));
        }
    }
    _mm512_add_epi32(acc[0], acc[1])
}

/// AVX-512 version of [`crate::kernels::row::scores_row_q16`]: 32 lanes per `vpmaddwd`, in blocks of
/// at most 256 lanes (each exact in i32, summed in i64), the lanes past the last multiple of 32
/// in scalar code. The sums are the same integers and the last step is the portable one, so
/// the scores are the same bits as the portable kernel's.
///
/// # Safety
/// The CPU supports AVX-512F and AVX-512BW.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn scores_row_q16(
    q: Q16<'_>,
    d: usize,
    group: usize,
    k: KvRow<'_, i8>,
    s: &mut [f32],
    lds: usize,
) {
    let heads = crate::kernels::row::check(q.q.len(), d, group, &[k], s.len(), lds, 1);
    let d32 = d / 32 * 32;
    for h in 0..heads {
        let g = h / group;
        // SAFETY: `h < heads`, `g < heads / group`: query row h and head vector g are `d`
        // elements inside `q.q` and `k.x` (checked above).
        let (qp, kp) = unsafe { (q.q.as_ptr().add(h * d), k.x.as_ptr().add(g * d)) };
        let mut dot = 0i64;
        let mut j = 0;
        while j < d32 {
            let n = (d32 - j).min(256);
            // SAFETY: lanes `j..j + n` are inside both head vectors (`j + n <= d32 <= d`);
            // `n` is a multiple of 32 and at most 256.
            let sums = unsafe { madd_block(qp.add(j), kp.add(j), n) };
            dot += i64::from(_mm512_reduce_add_epi32(sums));
            j += n;
        }
        for j in d32..d {
            dot += i64::from(q.q[h * d + j]) * i64::from(k.x[g * d + j]);
        }
        let (sc, zp) = k.head(g);
        let dot = dot - i64::from(zp) * i64::from(q.sum[h]);
        s[h * lds] = sc * q.scale[h] * dot as f32;
    }
}

/// AVX-512 version of [`crate::kernels::row::pv_madd`] (the same i32 sums, so the same bits), 32
/// lanes a step: two positions' 32 int8 values interleaved bytewise (`vpunpcklbw` /
/// `vpunpckhbw` on 256 bits), each half sign-extended to 32 i16 lanes `(v_u[j], v_u+1[j])` and
/// multiplied by the weight pair with `vpmaddwd`. The halves hold lanes `0..8, 16..24` and
/// `8..16, 24..32` of the step, so their sums are put back in order (`vshufi64x2`) once per
/// step, before the accumulators are loaded and stored. Lanes past the last multiple of 32 in
/// scalar code.
///
/// # Safety
/// The CPU supports AVX-512F and AVX-512BW.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn pv_madd(
    acc32: &mut [i32],
    d: usize,
    group: usize,
    w16: &[i16],
    ldw: usize,
    v: [KvRow<'_, i8>; PV_ROWS],
) {
    const P: usize = PV_ROWS / 2;
    let heads = crate::kernels::row::pv_check(acc32.len(), d, group, w16.len(), ldw, &v);
    let d32 = d / 32 * 32;
    for h in 0..heads {
        let g = h / group;
        let w = &w16[h * ldw..h * ldw + PV_ROWS];
        if w == [0; PV_ROWS] {
            continue;
        }
        // (w_2k, w_2k+1) as i32 lanes: the low i16 pairs with row 2k.
        let wp: [__m512i; P] = core::array::from_fn(|k| {
            _mm512_set1_epi32(i32::from(w[2 * k] as u16) | i32::from(w[2 * k + 1]) << 16)
        });
        // SAFETY: `h < heads`, `g < heads / group`: accumulator h and head vector g of every
        // row are `d` elements inside `acc32` and the rows (checked above).
        let (ap, vp) = unsafe {
            (
                acc32.as_mut_ptr().add(h * d),
                v.map(|r| r.x.as_ptr().add(g * d)),
            )
        };
        let mut j = 0;
        while j < d32 {
            let (mut lo, mut hi) = (_mm512_setzero_si512(), _mm512_setzero_si512());
            for k in 0..P {
                // SAFETY: `j + 32 <= d32 <= d`: 32 lanes inside rows 2k and 2k + 1.
                let (a, b) = unsafe {
                    (
                        _mm256_loadu_si256(vp[2 * k].add(j).cast()),
                        _mm256_loadu_si256(vp[2 * k + 1].add(j).cast()),
                    )
                };
                let l = _mm512_cvtepi8_epi16(_mm256_unpacklo_epi8(a, b));
                let u = _mm512_cvtepi8_epi16(_mm256_unpackhi_epi8(a, b));
                lo = _mm512_add_epi32(lo, _mm512_madd_epi16(l, wp[k]));
                hi = _mm512_add_epi32(hi, _mm512_madd_epi16(u, wp[k]));
            }
            // 128-bit blocks of `lo`: lanes 0..4, 4..8, 16..20, 20..24; of `hi`: 8..12,
            // 12..16, 24..28, 28..32.
            let first = _mm512_shuffle_i64x2::<0x44>(lo, hi);
            let second = _mm512_shuffle_i64x2::<0xEE>(lo, hi);
            // SAFETY: `j + 32 <= d`: 32 lanes inside accumulator h.
            unsafe {
                let a0 = _mm512_loadu_si512(ap.add(j).cast());
                let a1 = _mm512_loadu_si512(ap.add(j + 16).cast());
                _mm512_storeu_si512(ap.add(j).cast(), _mm512_add_epi32(a0, first));
                _mm512_storeu_si512(ap.add(j + 16).cast(), _mm512_add_epi32(a1, second));
            }
            j += 32;
        }
        crate::kernels::row::pv_madd_lanes(&mut acc32[h * d..(h + 1) * d], w, &v, g * d, d32..d);
    }
}

#[cfg(test)]
mod tests {
    use crate::kernels::tests::data;
    use crate::{
        attention_quantized, attention_typed, quantize_kv, simd_level, with_max_simd, Bf16, Params,
        QuantizedKv, QuantizedKvMut, Shape, SimdLevel,
    };
    use caching_allocator::CachingAllocator;

    /// One call at the current level: f32, bf16 or (`int8`) f32 Q over an int8 cache holding
    /// `k` and `v`; the output as f32.
    fn call(kind: usize, q: &[f32], k: &[f32], v: &[f32], sh: &Shape, p: &Params) -> Vec<f32> {
        let temp = CachingAllocator::new(8 << 20);
        let mut out = vec![0f32; q.len()];
        match kind {
            0 => attention_typed(q, k, v, &mut out, sh, p, &temp).unwrap(),
            1 => {
                let b = |x: &[f32]| x.iter().map(|&y| Bf16::from_f32(y)).collect::<Vec<_>>();
                let mut ob = b(&out);
                attention_typed(&b(q), &b(k), &b(v), &mut ob, sh, p, &temp).unwrap();
                out = ob.iter().map(|x| x.to_f32()).collect();
            }
            _ => {
                let rows = sh.kv_capacity * sh.kv_heads;
                let all = Shape {
                    q_len: sh.kv_capacity,
                    start_pos: 0,
                    ..*sh
                };
                let quant = |x: &[f32]| {
                    let mut c = (vec![0i8; x.len()], vec![0f32; rows], vec![0i8; rows]);
                    let m = QuantizedKvMut {
                        values: &mut c.0,
                        scales: &mut c.1,
                        zero_points: &mut c.2,
                    };
                    quantize_kv(x, m, &all).unwrap();
                    c
                };
                let (kc, vc) = (quant(k), quant(v));
                let [kv, vv] = [&kc, &vc].map(|c| QuantizedKv {
                    values: &c.0,
                    scales: &c.1,
                    zero_points: &c.2,
                });
                attention_quantized(q, kv, vv, &mut out, sh, p, &temp).unwrap();
            }
        }
        // SAFETY: nothing handed out by `temp` is used any more.
        unsafe { temp.reset_unchecked() };
        out
    }

    /// Whole calls at the AVX-512 level agree with the portable level: decode (the row path)
    /// and prefill (the tiled path), causal or not, GQA, head dim 40 (16-lane tails), f32,
    /// bf16 and the int8 cache. This reaches what the kernel unit checks do not: the
    /// dispatch, the unsplit bf16 query order the set takes, and the path code around the
    /// kernels. CI runs it under Miri with the target features on, under Tree Borrows (see
    /// `.ci/run`: rayon's crossbeam-epoch is known not to pass Stacked Borrows).
    #[test]
    fn avx512_attention_matches_portable() {
        if !kernel_simd::Level::Avx512.is_available() {
            eprintln!("no AVX-512 here: the AVX-512 set is tested under Miri (.ci/run)");
            return;
        }
        // Under Miri (~45 s a shape there) decode and a causal prefill.
        let shapes: &[(usize, usize, bool)] = if cfg!(miri) {
            &[(1, 36, true), (9, 0, true)]
        } else {
            &[(1, 36, true), (3, 20, false), (9, 0, true)]
        };
        for &(q_len, start_pos, causal) in shapes {
            let sh = Shape {
                batch: 1,
                q_len,
                heads: 4,
                kv_heads: 2,
                head_dim: 40,
                kv_capacity: 40,
                start_pos,
            };
            let p = Params {
                causal,
                ..Params::default()
            };
            let q = data(q_len * 4 * 40, 1);
            let (k, v) = (data(40 * 2 * 40, 2), data(40 * 2 * 40, 3));
            for kind in 0..3 {
                let got = call(kind, &q, &k, &v, &sh, &p);
                assert_eq!(simd_level(), SimdLevel::Avx512);
                let want = with_max_simd(SimdLevel::Portable, || call(kind, &q, &k, &v, &sh, &p));
                // bf16 outputs may round to neighbouring values (2^-8 apart).
                let tol = if kind == 1 { 1.0 / 128.0 } else { 1e-5 };
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (a - b).abs() <= tol * (1.0 + b.abs()),
                        "kind {kind} q_len {q_len} at {i}: {a} vs {b}"
                    );
                }
            }
        }
    }
}
