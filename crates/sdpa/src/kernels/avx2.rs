//! The AVX2 set's kernels that are not a generic body: the 8x8 register transposes of
//! `pack_k` and the int8 cache's integer scores and `P . V` (`vpmaddwd` and its horizontal
//! sums), the bf16 scores on the split query order, and the L2 prefetches. The prefill
//! micro-kernels, softmax and the f32 / bf16 row kernels are the generic ones of [`super::tile`]
//! and [`super::row`], instantiated for AVX2.

use core::arch::x86_64::*;

use kernel_simd::{Avx2, Simd};

use crate::elem::Bf16;
use crate::kernels::row::{
    check, flush_check, pv_check, pv_madd_lanes, pv_table_check, pv_table_from, pv_weights_check,
    q16_check, q16_scale, round_i16, KvRow, PvTable, PV_MAX_TILE, PV_ROWS, Q16,
};
use crate::plan::NR;

/// The largest of the 8 lanes (`kernel_simd`'s AVX2 reduction, in this file's
/// `target_feature` context).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hmax(v: __m256) -> f32 {
    // SAFETY: the caller runs with AVX2, FMA and F16C (this function's target features).
    let s = unsafe { Avx2::new_unchecked() };
    s.reduce_max(v)
}

/// The sum of the 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum(v: __m256) -> f32 {
    // SAFETY: as in `hmax`.
    let s = unsafe { Avx2::new_unchecked() };
    s.reduce_sum(v)
}

/// Transposes the 8x8 block whose rows are `r`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(u0, u4),
        _mm256_permute2f128_ps::<0x20>(u1, u5),
        _mm256_permute2f128_ps::<0x20>(u2, u6),
        _mm256_permute2f128_ps::<0x20>(u3, u7),
        _mm256_permute2f128_ps::<0x31>(u0, u4),
        _mm256_permute2f128_ps::<0x31>(u1, u5),
        _mm256_permute2f128_ps::<0x31>(u2, u6),
        _mm256_permute2f128_ps::<0x31>(u3, u7),
    ]
}

/// AVX2 version of [`super::scalar::pack_k`]: 8x8 blocks transposed in registers.
///
/// # Safety
/// The CPU supports AVX2 and FMA.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn pack_k(
    k: &[f32],
    stride: usize,
    nk: usize,
    nkp: usize,
    d: usize,
    kp: &mut [f32],
) {
    assert!(nk <= nkp && nkp.is_multiple_of(NR) && kp.len() >= nkp * d);
    assert!(nk == 0 || k.len() >= (nk - 1) * stride + d);
    let d8 = d / 8 * 8;
    let mut j = 0;
    while j + 8 <= nk {
        let base = (j / NR) * d * NR + j % NR;
        let mut x = 0;
        while x < d8 {
            // SAFETY: rows j..j+8 < nk and columns x..x+8 <= d are inside `k` (asserted
            // length covers row nk-1 up to column d).
            let rows: [__m256; 8] = core::array::from_fn(|u| unsafe {
                _mm256_loadu_ps(k.as_ptr().add((j + u) * stride + x))
            });
            let cols = transpose8(rows);
            for (c, col) in cols.iter().enumerate() {
                // SAFETY: `base + (x + c) * NR + 8 <= nkp * d`: j % NR is 0 or 8 and
                // x + c < d, so the 8 floats are inside panel j / NR, inside `kp`.
                unsafe { _mm256_storeu_ps(kp.as_mut_ptr().add(base + (x + c) * NR), *col) };
            }
            x += 8;
        }
        for u in 0..8 {
            for x in d8..d {
                kp[base + x * NR + u] = k[(j + u) * stride + x];
            }
        }
        j += 8;
    }
    super::scalar::pack_k_rows(k, stride, nk, j..nkp, d, kp);
}

/// AVX2-build version of [`super::scalar::prefetch_rows`] (all counts in bytes):
/// prefetches each 64-byte line of the rows into L2.
///
/// # Safety
/// The CPU supports AVX2 and FMA. `base..base + len` must be one allocation (so the
/// offsets computed inside stay in it).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn prefetch_rows(
    base: *const u8,
    len: usize,
    start: usize,
    stride: usize,
    n: usize,
    d: usize,
) {
    for j in 0..n {
        let row = start + j * stride;
        if row + d > len {
            break;
        }
        let mut x = 0;
        while x < d {
            // SAFETY: `row + x < len`: the address is inside the allocation (caller), so
            // `add` is in bounds; a prefetch never faults nor accesses memory
            // architecturally, so it races with nothing.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(base.add(row + x).cast::<i8>()) };
            x += 64;
        }
    }
}

/// [`scores_row`] for bf16 K with `q` in the order of [`crate::kernels::row::split16`]: each 32-byte load
/// of 16 bf16 is widened by `vpunpcklwd` / `vpunpckhwd` against zero, giving lanes
/// `0..4, 8..12` and `4..8, 12..16`, which the split query matches.
///
/// # Safety
/// The CPU supports AVX2 and FMA.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn scores_row_bf16_split(
    q: &[f32],
    d: usize,
    group: usize,
    k: KvRow<'_, Bf16>,
    s: &mut [f32],
    lds: usize,
) {
    assert!(k.scales.is_empty(), "bf16 rows are dense");
    let heads = check(q.len(), d, group, &[k], s.len(), lds, 1);
    let d16 = d / 16 * 16;
    let zero = _mm256_setzero_si256();
    for h in 0..heads {
        let g = h / group;
        // SAFETY: `h < heads`, `g < heads / group`: query row h and head vector g are
        // `d` elements inside `q` and `k.x` (checked above).
        let (qp, kp) = unsafe { (q.as_ptr().add(h * d), k.x.as_ptr().add(g * d)) };
        let mut acc = [_mm256_setzero_ps(); 2];
        let mut j = 0;
        while j < d16 {
            // SAFETY: `j + 16 <= d16 <= d`: 16 bf16 and 16 floats inside both vectors.
            unsafe {
                let x = _mm256_loadu_si256(kp.add(j).cast());
                let lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, x));
                let hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, x));
                acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(j)), lo, acc[0]);
                acc[1] = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(j + 8)), hi, acc[1]);
            }
            j += 16;
        }
        let mut dot = hsum(_mm256_add_ps(acc[0], acc[1]));
        for j in d16..d {
            dot += q[h * d + j] * k.x[g * d + j].to_f32();
        }
        s[h * lds] = dot;
    }
}

/// AVX2 version of [`crate::kernels::row::pv_table`] (the same entries): blocks of 8 positions x 8
/// heads transposed in registers (the scales as floats, the zero points as bytes, then
/// widened to i16); the remaining positions and heads in scalar code.
///
/// # Safety
/// The CPU supports AVX2 and FMA.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn pv_table(
    rows: &[KvRow<'_, i8>],
    kv_heads: usize,
    vs: &mut [f32],
    zp: &mut [i16],
) {
    const T: usize = PV_MAX_TILE;
    pv_table_check(rows, kv_heads, vs, zp);
    let (t8, g8) = (rows.len() / 8 * 8, kv_heads / 8 * 8);
    for t in (0..t8).step_by(8) {
        let r = &rows[t..t + 8];
        for g in (0..g8).step_by(8) {
            // SAFETY: `g + 8 <= g8 <= kv_heads <= scales.len(), zps.len()` of every row
            // (checked above): 8 floats and 8 bytes readable at `g`.
            let (sc, z): ([__m256; 8], [__m128i; 8]) = unsafe {
                (
                    core::array::from_fn(|k| _mm256_loadu_ps(r[k].scales.as_ptr().add(g))),
                    core::array::from_fn(|k| _mm_loadl_epi64(r[k].zps.as_ptr().add(g).cast())),
                )
            };
            let cols = transpose8(sc);
            // Bytes: after these, 64-bit half `j % 2` of `w[j / 2]` is head g + j's rows.
            let a = [
                _mm_unpacklo_epi8(z[0], z[1]),
                _mm_unpacklo_epi8(z[2], z[3]),
                _mm_unpacklo_epi8(z[4], z[5]),
                _mm_unpacklo_epi8(z[6], z[7]),
            ];
            let b = [
                _mm_unpacklo_epi16(a[0], a[1]),
                _mm_unpackhi_epi16(a[0], a[1]),
                _mm_unpacklo_epi16(a[2], a[3]),
                _mm_unpackhi_epi16(a[2], a[3]),
            ];
            let w = [
                _mm_unpacklo_epi32(b[0], b[2]),
                _mm_unpackhi_epi32(b[0], b[2]),
                _mm_unpacklo_epi32(b[1], b[3]),
                _mm_unpackhi_epi32(b[1], b[3]),
            ];
            for (j, c) in cols.into_iter().enumerate() {
                let o = (g + j) * T + t;
                // SAFETY: `o + 8 <= (g + j + 1) * T <= kv_heads * T <= vs.len()` (as
                // `t + 8 <= t8 <= T`; checked above).
                unsafe { _mm256_storeu_ps(vs.as_mut_ptr().add(o), c) };
            }
            for (k, x) in w.into_iter().enumerate() {
                let x = _mm256_cvtepi8_epi16(x);
                let o = (g + 2 * k) * T + t;
                // SAFETY: as above, for heads g + 2k and g + 2k + 1 (`o + T + 8 <=
                // kv_heads * T <= zp.len()`).
                unsafe {
                    _mm_storeu_si128(zp.as_mut_ptr().add(o).cast(), _mm256_castsi256_si128(x));
                    _mm_storeu_si128(
                        zp.as_mut_ptr().add(o + T).cast(),
                        _mm256_extracti128_si256::<1>(x),
                    );
                }
            }
        }
    }
    // Heads g8.. of positions ..t8, positions t8.. of every head, and the padding.
    pv_table_from(rows, kv_heads, vs, zp, t8, g8);
}

/// AVX2 version of [`crate::kernels::row::pv_weights`], bit for bit: the same products, maximum and
/// scale; the clamp and `vcvtps2dq` (half to even) round as `round_i16` does. Each head's
/// weights are 32 lanes (the table is zero past the tile).
///
/// # Safety
/// The CPU supports AVX2 and FMA.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn pv_weights(
    p: &[f32],
    ldp: usize,
    group: usize,
    tab: PvTable<'_>,
    ldw: usize,
    w16: &mut [i16],
    step: &mut [f32],
    zterm: &mut [i32],
) {
    const T: usize = PV_MAX_TILE;
    let (n, heads) = pv_weights_check(p, ldp, group, tab, ldw, w16, step, zterm);
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let (hi, lo) = (_mm256_set1_ps(32767.0), _mm256_set1_ps(-32767.0));
    // Lanes t >= n stay 0: weight p * 0 with p = 0.
    let mut pb = [0f32; T];
    for h in 0..heads {
        let g = h / group;
        let (vs, zp) = (&tab.vs[g * T..(g + 1) * T], &tab.zp[g * T..(g + 1) * T]);
        // A full tile's weights are read in place, a shorter one's through `pb`.
        let ph: &[f32] = if n == T {
            &p[h * ldp..h * ldp + T]
        } else {
            for (x, y) in pb.iter_mut().zip(&p[h * ldp..h * ldp + n]) {
                *x = *y;
            }
            &pb
        };
        let (mut mv, mut nanv) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let w: [__m256; 4] = core::array::from_fn(|k| {
            // SAFETY: `8k + 8 <= 32 = T`: inside `ph` and `vs` (T floats each).
            let x = unsafe {
                _mm256_mul_ps(
                    _mm256_loadu_ps(ph.as_ptr().add(8 * k)),
                    _mm256_loadu_ps(vs.as_ptr().add(8 * k)),
                )
            };
            mv = _mm256_max_ps(mv, _mm256_and_ps(x, abs));
            nanv = _mm256_or_ps(nanv, _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x));
            x
        });
        let nan = _mm256_movemask_ps(nanv) != 0;
        let (sc, inv) = q16_scale(hmax(mv), nan);
        let out = &mut w16[h * ldw..(h + 1) * ldw];
        if sc.is_nan() {
            // As the scalar version (NaN * 0 rounds to 0), not vcvtps2dq's 0x80000000.
            out.fill(0);
            (step[h], zterm[h]) = (sc, 0);
            continue;
        }
        let iv = _mm256_set1_ps(inv);
        let r = w.map(|x| {
            _mm256_cvtps_epi32(_mm256_max_ps(_mm256_min_ps(_mm256_mul_ps(x, iv), hi), lo))
        });
        // packs interleaves the 128-bit halves: a0-3 b0-3 a4-7 b4-7.
        let q = [
            _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(r[0], r[1])),
            _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(r[2], r[3])),
        ];
        let mut buf = [0i16; T];
        let dst: &mut [i16] = if ldw == T { out } else { &mut buf };
        // SAFETY: `dst` and `zp` are 32 i16 (64 bytes): two 32-byte halves each.
        let z = unsafe {
            _mm256_storeu_si256(dst.as_mut_ptr().cast(), q[0]);
            _mm256_storeu_si256(dst.as_mut_ptr().add(16).cast(), q[1]);
            _mm256_add_epi32(
                _mm256_madd_epi16(q[0], _mm256_loadu_si256(zp.as_ptr().cast())),
                _mm256_madd_epi16(q[1], _mm256_loadu_si256(zp.as_ptr().add(16).cast())),
            )
        };
        let zero = _mm256_setzero_si256();
        if ldw < T {
            for (x, y) in w16[h * ldw..(h + 1) * ldw].iter_mut().zip(&buf) {
                *x = *y;
            }
        }
        step[h] = sc;
        zterm[h] = _mm_cvtsi128_si32(hsum4_epi32([z, zero, zero, zero]));
    }
}

/// AVX2 version of [`crate::kernels::row::pv_madd`] (the same i32 sums, so the same bits). Two
/// positions at a time: their int8 values interleaved bytewise (`vpunpcklbw` /
/// `vpunpckhbw`), sign-extended to 16 i16 lanes `(v_u[j], v_u+1[j])` (`vpmovsxbw`) and
/// multiplied by the i32 broadcast of the weight pair `(w_u, w_u+1)` with `vpmaddwd`,
/// which adds each lane pair: 8 lanes of `w_u v_u + w_u+1 v_u+1` per instruction; the
/// accumulators are loaded and stored once per [`PV_ROWS`] rows.
///
/// # Safety
/// The CPU supports AVX2 and FMA.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn pv_madd(
    acc32: &mut [i32],
    d: usize,
    group: usize,
    w16: &[i16],
    ldw: usize,
    v: [KvRow<'_, i8>; PV_ROWS],
) {
    const P: usize = PV_ROWS / 2;
    let heads = pv_check(acc32.len(), d, group, w16.len(), ldw, &v);
    let (d8, d16) = (d / 8 * 8, d / 16 * 16);
    for h in 0..heads {
        let g = h / group;
        let w = &w16[h * ldw..h * ldw + PV_ROWS];
        if w == [0; PV_ROWS] {
            continue;
        }
        // (w_2k, w_2k+1) as i32 lanes: the low i16 pairs with row 2k.
        let wp: [__m256i; P] = core::array::from_fn(|k| {
            _mm256_set1_epi32(i32::from(w[2 * k] as u16) | i32::from(w[2 * k + 1]) << 16)
        });
        // SAFETY: `h < heads`, `g < heads / group`: accumulator h and head vector g of
        // every row are `d` elements inside `acc32` and the rows (checked above).
        let (ap, vp) = unsafe {
            (
                acc32.as_mut_ptr().add(h * d),
                v.map(|r| r.x.as_ptr().add(g * d)),
            )
        };
        let mut j = 0;
        while j < d16 {
            let (mut lo, mut hi) = (_mm256_setzero_si256(), _mm256_setzero_si256());
            for k in 0..P {
                // SAFETY: `j + 16 <= d16 <= d`: 16 lanes inside rows 2k and 2k + 1.
                let (a, b) = unsafe {
                    (
                        _mm_loadu_si128(vp[2 * k].add(j).cast()),
                        _mm_loadu_si128(vp[2 * k + 1].add(j).cast()),
                    )
                };
                let l = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(a, b));
                let u = _mm256_cvtepi8_epi16(_mm_unpackhi_epi8(a, b));
                lo = _mm256_add_epi32(lo, _mm256_madd_epi16(l, wp[k]));
                hi = _mm256_add_epi32(hi, _mm256_madd_epi16(u, wp[k]));
            }
            // SAFETY: `j + 16 <= d`: 16 lanes inside accumulator h.
            unsafe {
                let a0 = _mm256_loadu_si256(ap.add(j).cast());
                let a1 = _mm256_loadu_si256(ap.add(j + 8).cast());
                _mm256_storeu_si256(ap.add(j).cast(), _mm256_add_epi32(a0, lo));
                _mm256_storeu_si256(ap.add(j + 8).cast(), _mm256_add_epi32(a1, hi));
            }
            j += 16;
        }
        if j < d8 {
            let mut lo = _mm256_setzero_si256();
            for k in 0..P {
                // SAFETY: `j + 8 <= d8 <= d`: 8 lanes inside rows 2k and 2k + 1.
                let (a, b) = unsafe {
                    (
                        _mm_loadl_epi64(vp[2 * k].add(j).cast()),
                        _mm_loadl_epi64(vp[2 * k + 1].add(j).cast()),
                    )
                };
                let l = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(a, b));
                lo = _mm256_add_epi32(lo, _mm256_madd_epi16(l, wp[k]));
            }
            // SAFETY: `j + 8 <= d`: 8 lanes inside accumulator h.
            unsafe {
                let a0 = _mm256_loadu_si256(ap.add(j).cast());
                _mm256_storeu_si256(ap.add(j).cast(), _mm256_add_epi32(a0, lo));
            }
            j += 8;
        }
        pv_madd_lanes(&mut acc32[h * d..(h + 1) * d], w, &v, g * d, j..d);
    }
}

/// AVX2 version of [`crate::kernels::row::pv_flush`], bit for bit (`vcvtdq2ps` rounds as `as f32`;
/// a multiply then an add, not an FMA, as the scalar code).
///
/// # Safety
/// The CPU supports AVX2 and FMA.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn pv_flush(
    acc: &mut [f32],
    acc32: &mut [i32],
    d: usize,
    step: &[f32],
    zterm: &[i32],
) {
    let heads = flush_check(acc, acc32, d, step, zterm);
    let d8 = d / 8 * 8;
    let zero = _mm256_setzero_si256();
    for h in 0..heads {
        if step[h] == 0.0 {
            continue;
        }
        let (sv, zv) = (_mm256_set1_ps(step[h]), _mm256_set1_epi32(zterm[h]));
        let (a, a32) = (&mut acc[h * d..(h + 1) * d], &mut acc32[h * d..(h + 1) * d]);
        for j in (0..d8).step_by(8) {
            // SAFETY: `j + 8 <= d8 <= d`: 8 lanes inside both heads' slices.
            unsafe {
                let x = _mm256_loadu_si256(a32.as_ptr().add(j).cast());
                let f = _mm256_cvtepi32_ps(_mm256_sub_epi32(x, zv));
                let y = _mm256_add_ps(_mm256_loadu_ps(a.as_ptr().add(j)), _mm256_mul_ps(sv, f));
                _mm256_storeu_ps(a.as_mut_ptr().add(j), y);
                _mm256_storeu_si256(a32.as_mut_ptr().add(j).cast(), zero);
            }
        }
        for (x, y) in a[d8..].iter_mut().zip(&mut a32[d8..]) {
            *x += step[h] * (y.wrapping_sub(zterm[h]) as f32);
            *y = 0;
        }
    }
}

/// AVX2 version of [`crate::kernels::row::quantize_q16`], with the same results (`vcvtps2dq` rounds half
/// to even, as `round_i16` does).
///
/// # Safety
/// The CPU supports AVX2 and FMA.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize_q16(
    q: &[f32],
    d: usize,
    q16: &mut [i16],
    scale: &mut [f32],
    sum: &mut [i32],
) {
    let heads = q16_check(q, d, q16, scale, sum);
    let (d8, d16) = (d / 8 * 8, d / 16 * 16);
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let ones = _mm256_set1_epi16(1);
    for h in 0..heads {
        let qh = &q[h * d..(h + 1) * d];
        let (mut mv, mut nanv) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        for j in (0..d8).step_by(8) {
            // SAFETY: `j + 8 <= d8 <= d`: inside the head.
            let x = unsafe { _mm256_loadu_ps(qh.as_ptr().add(j)) };
            mv = _mm256_max_ps(mv, _mm256_and_ps(x, abs));
            nanv = _mm256_or_ps(nanv, _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x));
        }
        let mut mx = hmax(mv);
        let mut nan = _mm256_movemask_ps(nanv) != 0;
        for &x in &qh[d8..] {
            mx = mx.max(x.abs());
            nan |= x.is_nan();
        }
        let (sc, inv) = q16_scale(mx, nan);
        let out = &mut q16[h * d..(h + 1) * d];
        if sc.is_nan() {
            // As the scalar version (NaN * 0 rounds to 0), not vcvtps2dq's 0x80000000.
            out.fill(0);
            (scale[h], sum[h]) = (sc, 0);
            continue;
        }
        let iv = _mm256_set1_ps(inv);
        let mut sv = _mm256_setzero_si256();
        for j in (0..d16).step_by(16) {
            // SAFETY: `j + 16 <= d16 <= d`: inside the head and its i16 row.
            unsafe {
                let a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(qh.as_ptr().add(j)), iv));
                let b =
                    _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(qh.as_ptr().add(j + 8)), iv));
                // packs interleaves the 128-bit halves: a0-3 b0-3 a4-7 b4-7.
                let p = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(a, b));
                _mm256_storeu_si256(out.as_mut_ptr().add(j).cast(), p);
                sv = _mm256_add_epi32(sv, _mm256_madd_epi16(p, ones));
            }
        }
        let z = _mm256_setzero_si256();
        let mut sums = [0i32; 4];
        // SAFETY: `sums` is 16 writable bytes.
        unsafe { _mm_storeu_si128(sums.as_mut_ptr().cast(), hsum4_epi32([sv, z, z, z])) };
        let mut total = sums[0];
        for j in d16..d {
            out[j] = round_i16(qh[j] * inv);
            total += i32::from(out[j]);
        }
        scale[h] = sc;
        sum[h] = total;
    }
}

/// `sum_j q[j] k[j]` over the first `n` lanes (`n` a multiple of 16) as 8 i32 partial
/// sums: `vpmaddwd` on the i16 query and the int8 values widened to i16, 16 lanes per
/// instruction. Exact if `n <= 256` (at most `256 * 32767 * 128 < 2^31` in all).
///
/// # Safety
/// AVX2; `q` readable for `n` i16, `k` for `n` bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn madd_block(q: *const i16, k: *const i8, n: usize) -> __m256i {
    let mut acc = [_mm256_setzero_si256(); 2];
    let mut j = 0;
    while j + 32 <= n {
        for (u, au) in acc.iter_mut().enumerate() {
            // SAFETY: `j + 16u + 16 <= n`: inside both vectors (caller).
            unsafe {
                let kv = _mm256_cvtepi8_epi16(_mm_loadu_si128(k.add(j + 16 * u).cast()));
                let qv = _mm256_loadu_si256(q.add(j + 16 * u).cast());
                *au = _mm256_add_epi32(*au, _mm256_madd_epi16(qv, kv));
            }
        }
        j += 32;
    }
    if j < n {
        // SAFETY: `j + 16 <= n` (both multiples of 16).
        unsafe {
            let kv = _mm256_cvtepi8_epi16(_mm_loadu_si128(k.add(j).cast()));
            let qv = _mm256_loadu_si256(q.add(j).cast());
            acc[0] = _mm256_add_epi32(acc[0], _mm256_madd_epi16(qv, kv));
        }
    }
    _mm256_add_epi32(acc[0], acc[1])
}

/// The sums of the 8 lanes of each of `a`, as 4 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum4_epi32(a: [__m256i; 4]) -> __m128i {
    let x = _mm256_hadd_epi32(a[0], a[1]);
    let y = _mm256_hadd_epi32(a[2], a[3]);
    let z = _mm256_hadd_epi32(x, y);
    _mm_add_epi32(_mm256_castsi256_si128(z), _mm256_extracti128_si256::<1>(z))
}

/// AVX2 version of [`crate::kernels::row::scores_row_q16`]. Heads go four at a time (one horizontal
/// reduction for the four) when `d <= 256`; the sums are exact integers (i32 within
/// blocks of 256 lanes, i64 across blocks and for the zero point's share).
///
/// # Safety
/// The CPU supports AVX2 and FMA.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn scores_row_q16(
    q: Q16<'_>,
    d: usize,
    group: usize,
    k: KvRow<'_, i8>,
    s: &mut [f32],
    lds: usize,
) {
    let heads = check(q.q.len(), d, group, &[k], s.len(), lds, 1);
    let d16 = d / 16 * 16;
    // The KV head of query head `h` (the four-head loop steps it without dividing).
    let kv_head = |h: usize| h / group;
    let finish = |s: &mut [f32], h: usize, g: usize, mut dot: i64| {
        for j in d16..d {
            dot += i64::from(q.q[h * d + j]) * i64::from(k.x[g * d + j]);
        }
        let (sc, zp) = k.head(g);
        let dot = dot - i64::from(zp) * i64::from(q.sum[h]);
        s[h * lds] = sc * q.scale[h] * dot as f32;
    };
    let mut h = 0;
    if d16 <= 256 {
        // kv_head(h) and h's index in its group, stepped along with h (no division).
        let (mut g, mut in_group) = (0, 0);
        while h + 4 <= heads {
            let gs: [usize; 4] = core::array::from_fn(|_| {
                let gu = g;
                in_group += 1;
                if in_group == group {
                    (g, in_group) = (g + 1, 0);
                }
                gu
            });
            debug_assert!((0..4).all(|u| gs[u] == kv_head(h + u)));
            let acc: [__m256i; 4] = core::array::from_fn(|u| {
                // SAFETY: `h + u < heads`, `gs[u] < heads / group`: query row h + u and
                // head vector gs[u] are `d >= d16` elements inside `q.q` and `k.x`
                // (checked above); AVX2 is enabled here.
                unsafe {
                    madd_block(
                        q.q.as_ptr().add((h + u) * d),
                        k.x.as_ptr().add(gs[u] * d),
                        d16,
                    )
                }
            });
            let sums = hsum4_epi32(acc);
            if d16 == d && !k.scales.is_empty() {
                // No tail: the four scores at once, `(sum - zp * qsum) * kscale * qscale`
                // in f64 (exact up to the last product, as the i64 path).
                let (ks, zs): ([f32; 4], [i32; 4]) = if group == 1 {
                    let zp = &k.zps[h..h + 4];
                    (
                        k.scales[h..h + 4].try_into().unwrap_or_default(),
                        core::array::from_fn(|u| i32::from(zp[u])),
                    )
                } else {
                    (gs.map(|g| k.scales[g]), gs.map(|g| i32::from(k.zps[g])))
                };
                let (qs, qsum) = (&q.scale[h..h + 4], &q.sum[h..h + 4]);
                // SAFETY: `ks`, `zs`, `qs` and `qsum` are 4 elements (16 bytes) each.
                let (ks, zs, qs, qsum) = unsafe {
                    (
                        _mm256_cvtps_pd(_mm_loadu_ps(ks.as_ptr())),
                        _mm256_cvtepi32_pd(_mm_loadu_si128(zs.as_ptr().cast())),
                        _mm256_cvtps_pd(_mm_loadu_ps(qs.as_ptr())),
                        _mm256_cvtepi32_pd(_mm_loadu_si128(qsum.as_ptr().cast())),
                    )
                };
                let dot = _mm256_sub_pd(_mm256_cvtepi32_pd(sums), _mm256_mul_pd(zs, qsum));
                let r = _mm256_cvtpd_ps(_mm256_mul_pd(dot, _mm256_mul_pd(ks, qs)));
                let mut out = [0f32; 4];
                // SAFETY: `out` is 16 writable bytes.
                unsafe { _mm_storeu_ps(out.as_mut_ptr(), r) };
                for (u, x) in out.into_iter().enumerate() {
                    s[(h + u) * lds] = x;
                }
            } else {
                let mut sums4 = [0i32; 4];
                // SAFETY: `sums4` is 16 writable bytes.
                unsafe { _mm_storeu_si128(sums4.as_mut_ptr().cast(), sums) };
                for u in 0..4 {
                    finish(s, h + u, gs[u], i64::from(sums4[u]));
                }
            }
            h += 4;
        }
    }
    for h in h..heads {
        let g = kv_head(h);
        // SAFETY: `h < heads`, `g < heads / group`: query row h and head vector g are `d`
        // elements inside `q.q` and `k.x` (checked above).
        let (qp, kp) = unsafe { (q.q.as_ptr().add(h * d), k.x.as_ptr().add(g * d)) };
        let mut dot = 0i64;
        let mut j = 0;
        while j < d16 {
            let n = (d16 - j).min(256);
            // SAFETY: lanes `j..j + n` are inside both head vectors; `n <= 256`.
            let a = unsafe { madd_block(qp.add(j), kp.add(j), n) };
            let a = hsum4_epi32([
                a,
                _mm256_setzero_si256(),
                _mm256_setzero_si256(),
                _mm256_setzero_si256(),
            ]);
            dot += i64::from(_mm_cvtsi128_si32(a));
            j += n;
        }
        finish(s, h, g, dot);
    }
}
