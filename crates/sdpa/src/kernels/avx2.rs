//! The AVX2 kernels that are not a generic body, used by both x86 sets: the 8x8 register
//! transposes of `pack_k` and of the int8 cache's scale table, the bf16 scores on the split
//! query order, and the L2 prefetches. Everything else is a generic body of [`super::tile`],
//! [`super::row`], [`super::convert`] or [`super::int8`].

use core::arch::x86_64::*;

use kernel_simd::{Avx2, Simd};

use crate::elem::Bf16;
use crate::kernels::int8::{pv_table_check, pv_table_from, PV_MAX_TILE};
use crate::kernels::layout::{GroupedHeads, Strided};
use crate::kernels::row::{check, heads_by_group, KvRow};
use crate::kernels::scalar::KTile;
use crate::plan::NR;

/// The sum of the 8 lanes (`kernel_simd`'s AVX2 reduction, in this file's `target_feature`
/// context).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum(v: __m256) -> f32 {
    // SAFETY: the caller runs with AVX2, FMA and F16C (this function's target features).
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
pub(super) unsafe fn pack_k(k: &[f32], t: KTile, kp: &mut [f32]) {
    t.check(k, kp);
    let KTile { stride, nk, d, .. } = t;
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
    super::scalar::pack_k_rows(k, t, j..t.nkp, kp);
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
    hg: GroupedHeads,
    k: KvRow<'_, Bf16>,
    Strided(s, lds): Strided<&mut [f32]>,
) {
    assert!(k.scales.is_empty(), "bf16 rows are dense");
    let GroupedHeads { d, group } = hg;
    let heads = check(q.len(), hg, &[k], (s.len(), lds), 1);
    let d16 = d / 16 * 16;
    let zero = _mm256_setzero_si256();
    for (h, g) in heads_by_group(heads, group) {
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

/// AVX2 version of [`crate::kernels::int8::pv_table`] (the same entries): blocks of 8 positions x 8
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
