//! The AVX-512 (F + BW) kernels: the prefill micro-kernels, the online-softmax step and the
//! decode row kernels at 16 lanes, and the int8 cache's integer scores and `P . V` at 32.
//! Every other kernel of the AVX-512 set is the AVX2 one (an AVX-512 CPU runs AVX2 and FMA
//! too): see `Kernels::for_level`.
//!
//! The packed layouts are the AVX2 ones (`MR = 6` rows, `NR = 16` columns), so one panel row
//! is one `zmm` register and the 6x16 block is six accumulators (twelve `ymm` on AVX2).
//!
//! Only instructions of AVX-512F and AVX-512BW are used, and no rounding-mode or mask
//! intrinsics: rounding to an integer is the `1.5 * 2^23` addition, and vector tails go through
//! a stack buffer. That keeps every kernel here runnable under Miri (`RUSTFLAGS="-C
//! target-feature=+avx512f,+avx512bw"`), which is how CI tests them on machines without
//! AVX-512.

use core::arch::x86_64::*;

use crate::fused::{KvRow, Lane, LaneKind, PV_ROWS, Q16};
use crate::plan::{MR, NR};

// One panel row of NR floats is one 16-lane register.
const _: () = assert!(NR == 16);

/// `vmaxps`: per lane `if a > b { a } else { b }` (so `b` when either is NaN).
#[cfg(not(miri))]
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn max_ps(a: __m512, b: __m512) -> __m512 {
    _mm512_max_ps(a, b)
}

/// Miri does not implement `vmaxps` on 512 bits: the same lanes, as Intel defines them.
#[cfg(miri)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn max_ps(a: __m512, b: __m512) -> __m512 {
    // SAFETY: `__m512` and `[f32; 16]` have the same size, and every bit pattern is valid in
    // both.
    let (a, b): ([f32; 16], [f32; 16]) =
        unsafe { (core::mem::transmute(a), core::mem::transmute(b)) };
    let m: [f32; 16] = core::array::from_fn(|i| if a[i] > b[i] { a[i] } else { b[i] });
    // SAFETY: as above.
    unsafe { core::mem::transmute(m) }
}

/// `2^x` for `x <= 0`, 16 lanes; `x <= -127` (and NaN) give 0. The polynomial of the AVX2
/// `exp2_ps` (relative error ~1.2e-7).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn exp2_ps(x: __m512) -> __m512 {
    // Round to nearest by adding 1.5 * 2^23: for |x| <= 127 the sum's bits are the
    // constant's plus `n` (its unit in the last place is 1), and subtracting the constant back
    // gives `n` as a float.
    const MAGIC: f32 = 12_582_912.0;
    let x = max_ps(x, _mm512_set1_ps(-127.0));
    let big = _mm512_add_ps(x, _mm512_set1_ps(MAGIC));
    let n = _mm512_sub_ps(big, _mm512_set1_ps(MAGIC));
    let f = _mm512_sub_ps(x, n);
    let mut p = _mm512_set1_ps(1.540_353e-4);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.333_355_8e-3));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.618_129e-3));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.550_411e-2));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.240_226_5));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(core::f32::consts::LN_2));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0));
    // 2^n from its exponent bits: `big`'s bits less the constant's give `n`, so less the
    // constant's minus 127 give the biased exponent `n + 127`; n = -127 gives the bit pattern
    // 0, i.e. 0.0.
    let ni = _mm512_sub_epi32(
        _mm512_castps_si512(big),
        _mm512_set1_epi32(MAGIC.to_bits() as i32 - 127),
    );
    _mm512_mul_ps(p, _mm512_castsi512_ps(_mm512_slli_epi32::<23>(ni)))
}

/// The 6x16 register block both micro-kernels accumulate into.
type Block = [__m512; MR];

/// `c[r] += sum_{x < k} a[r * a_rs + x * a_cs] * b[x * ldb..][..NR]` for `r < MR`.
///
/// # Safety
/// AVX-512F; `a` readable at every offset named, `b` for rows `x < k` of NR floats.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn fma_block(
    mut c: Block,
    k: usize,
    a: *const f32,
    a_rs: usize,
    a_cs: usize,
    b: *const f32,
    ldb: usize,
) -> Block {
    for x in 0..k {
        // SAFETY: `x < k`: row `x` of `b` is readable for NR floats (caller).
        let br = unsafe { _mm512_loadu_ps(b.add(x * ldb)) };
        for (r, cr) in c.iter_mut().enumerate() {
            // SAFETY: `r < MR`, `x < k`: readable (caller).
            let ar = _mm512_set1_ps(unsafe { *a.add(r * a_rs + x * a_cs) });
            *cr = _mm512_fmadd_ps(ar, br, *cr);
        }
    }
    c
}

/// Stores the block into rows `r < MR` of NR floats at `o + r * ldo`.
///
/// # Safety
/// AVX-512F; those rows are writable.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn store_block(c: &Block, o: *mut f32, ldo: usize) {
    for (r, cr) in c.iter().enumerate() {
        // SAFETY: row `r < MR` of `o` is writable for NR = 16 floats (caller).
        unsafe { _mm512_storeu_ps(o.add(r * ldo), *cr) };
    }
}

/// AVX-512 version of [`crate::kernels::scalar::qk_tile`].
///
/// # Safety
/// The CPU supports AVX-512F and AVX-512BW, and the contract of the scalar version holds.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn qk_tile(a: *const f32, d: usize, b: *const f32, s: *mut f32, lds: usize) {
    // SAFETY: the packed strip holds `a[x * MR + r]`, the panel rows `b[x * NR..][..NR]` for
    // `x < d`, and `s` has MR writable rows (caller).
    unsafe {
        let c = fma_block([_mm512_setzero_ps(); MR], d, a, 1, MR, b, NR);
        store_block(&c, s, lds);
    }
}

/// AVX-512 version of [`crate::kernels::scalar::pv_tile`].
///
/// # Safety
/// The CPU supports AVX-512F and AVX-512BW, and the contract of the scalar version holds.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn pv_tile(
    p: *const f32,
    ldp: usize,
    v: *const f32,
    ldv: usize,
    nk: usize,
    o: *mut f32,
    ldo: usize,
) {
    // SAFETY: row `r < MR` of `o` is readable for 16 floats (caller).
    let c: Block = core::array::from_fn(|r| unsafe { _mm512_loadu_ps(o.add(r * ldo)) });
    // SAFETY: `p[r * ldp + t]` for `r < MR`, `t < nk`, the V rows `v[t * ldv..][..NR]` and MR
    // rows of `o` are valid (caller).
    unsafe {
        let c = fma_block(c, nk, p, ldp, 1, v, ldv);
        store_block(&c, o, ldo);
    }
}

/// AVX-512 version of [`crate::kernels::scalar::softmax_row`].
///
/// # Safety
/// The CPU supports AVX-512F and AVX-512BW.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn softmax_row(s: &mut [f32], valid: usize, c: f32, m_old: f32) -> (f32, f32) {
    let (vis, rest) = s.split_at_mut(valid);
    let cv = _mm512_set1_ps(c);
    let mut mv = _mm512_set1_ps(m_old);
    let mut chunks = vis.chunks_exact_mut(16);
    for ch in &mut chunks {
        // SAFETY: `ch` is 16 floats.
        unsafe {
            let y = _mm512_mul_ps(_mm512_loadu_ps(ch.as_ptr()), cv);
            _mm512_storeu_ps(ch.as_mut_ptr(), y);
            mv = max_ps(mv, y);
        }
    }
    let mut mx = _mm512_reduce_max_ps(mv);
    for x in chunks.into_remainder() {
        *x *= c;
        mx = mx.max(*x);
    }
    let mv = _mm512_set1_ps(mx);
    let mut sv = _mm512_setzero_ps();
    let mut chunks = vis.chunks_exact_mut(16);
    for ch in &mut chunks {
        // SAFETY: `ch` is 16 floats.
        unsafe {
            let e = exp2_ps(_mm512_sub_ps(_mm512_loadu_ps(ch.as_ptr()), mv));
            _mm512_storeu_ps(ch.as_mut_ptr(), e);
            sv = _mm512_add_ps(sv, e);
        }
    }
    let mut sum = _mm512_reduce_add_ps(sv);
    let tail = chunks.into_remainder();
    if !tail.is_empty() {
        let mut buf = [-1000.0f32; 16];
        buf[..tail.len()].copy_from_slice(tail);
        // SAFETY: `buf` is 16 floats.
        let e = unsafe { exp2_ps(_mm512_sub_ps(_mm512_loadu_ps(buf.as_ptr()), mv)) };
        // SAFETY: `buf` is 16 writable floats.
        unsafe { _mm512_storeu_ps(buf.as_mut_ptr(), e) };
        for (x, e) in tail.iter_mut().zip(buf) {
            *x = e;
            sum += e;
        }
    }
    rest.fill(0.0);
    (mx, sum)
}

/// AVX-512 version of [`crate::kernels::scalar::scale`].
///
/// # Safety
/// The CPU supports AVX-512F and AVX-512BW.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn scale(x: &mut [f32], a: f32) {
    let av = _mm512_set1_ps(a);
    let mut chunks = x.chunks_exact_mut(16);
    for ch in &mut chunks {
        // SAFETY: `ch` is 16 floats.
        unsafe {
            _mm512_storeu_ps(
                ch.as_mut_ptr(),
                _mm512_mul_ps(_mm512_loadu_ps(ch.as_ptr()), av),
            )
        };
    }
    for e in chunks.into_remainder() {
        *e *= a;
    }
}

/// 16 elements at `p` as f32 (int8 values as they are: the caller applies the zero point).
///
/// # Safety
/// AVX-512F; `p` readable for 16 elements; not f16.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn load16<E: Lane>(p: *const E) -> __m512 {
    match E::KIND {
        // SAFETY: 16 f32 (64 bytes) at `p` are readable (caller).
        LaneKind::F32 => unsafe { _mm512_loadu_ps(p.cast()) },
        LaneKind::Bf16 => {
            // SAFETY: 16 bf16 (32 bytes) at `p` are readable (caller).
            let h = unsafe { _mm256_loadu_si256(p.cast()) };
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h)))
        }
        LaneKind::I8 => {
            // SAFETY: 16 int8 (16 bytes) at `p` are readable (caller).
            let q = unsafe { _mm_loadu_si128(p.cast()) };
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q))
        }
        LaneKind::F16 => unreachable!("no AVX-512 f16 row kernel"),
    }
}

/// AVX-512 version of [`crate::fused::scores_row`] for f32 and bf16 (int8 K is scored by
/// [`scores_row_q16`]).
///
/// # Safety
/// The CPU supports AVX-512F and AVX-512BW.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn scores_row<E: Lane>(
    q: &[f32],
    d: usize,
    group: usize,
    k: KvRow<'_, E>,
    s: &mut [f32],
    lds: usize,
) {
    assert!(E::KIND == LaneKind::F32 || E::KIND == LaneKind::Bf16);
    let heads = crate::fused::check(q.len(), d, group, &[k], s.len(), lds, 1);
    let (d64, d16) = (d / 64 * 64, d / 16 * 16);
    for h in 0..heads {
        let g = h / group;
        let (sc, zp) = k.head(g);
        // SAFETY: `h < heads`, `g < heads / group`: query row h and head vector g are `d`
        // elements inside `q` and `k.x` (checked above).
        let (qp, kp) = unsafe { (q.as_ptr().add(h * d), k.x.as_ptr().add(g * d)) };
        let mut acc = [_mm512_setzero_ps(); 4];
        let mut j = 0;
        while j < d64 {
            for (u, au) in acc.iter_mut().enumerate() {
                // SAFETY: `j + 16u + 16 <= d64 <= d`: inside both head vectors.
                unsafe {
                    let kv = load16(kp.add(j + 16 * u));
                    *au = _mm512_fmadd_ps(_mm512_loadu_ps(qp.add(j + 16 * u)), kv, *au);
                }
            }
            j += 64;
        }
        while j < d16 {
            // SAFETY: `j + 16 <= d16 <= d`: inside both head vectors.
            unsafe {
                let kv = load16(kp.add(j));
                acc[0] = _mm512_fmadd_ps(_mm512_loadu_ps(qp.add(j)), kv, acc[0]);
            }
            j += 16;
        }
        let v = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
        let mut dot = _mm512_reduce_add_ps(v);
        for j in d16..d {
            dot += q[h * d + j] * k.x[g * d + j].widen(zp);
        }
        s[h * lds] = sc * dot;
    }
}

/// AVX-512 version of [`crate::fused::axpy_row`] (not for f16).
///
/// # Safety
/// The CPU supports AVX-512F and AVX-512BW.
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn axpy_row<E: Lane>(
    acc: &mut [f32],
    d: usize,
    group: usize,
    p: &[f32],
    ldp: usize,
    w: usize,
    v: [KvRow<'_, E>; 4],
) {
    let (heads, v) = crate::fused::axpy_args(acc, d, group, p, ldp, w, v);
    let d16 = d / 16 * 16;
    for h in 0..heads {
        let g = h / group;
        let Some((wu, zsum)) = crate::fused::head_weights(p, ldp, w, &v, h, g) else {
            continue;
        };
        let wv = wu.map(|x| _mm512_set1_ps(x));
        let zsum = _mm512_set1_ps(zsum);
        // SAFETY: `h < heads`, `g < heads / group`: accumulator h and head vector g of every
        // row are `d` elements inside `acc` and the rows (checked above).
        let (ap, vp) = unsafe {
            (
                acc.as_mut_ptr().add(h * d),
                v.map(|r| r.x.as_ptr().add(g * d)),
            )
        };
        let mut j = 0;
        while j < d16 {
            // SAFETY: `j + 16 <= d16 <= d`: inside the accumulator and every head vector.
            unsafe {
                let mut a = _mm512_loadu_ps(ap.add(j));
                for u in 0..4 {
                    a = _mm512_fmadd_ps(wv[u], load16(vp[u].add(j)), a);
                }
                if E::KIND == LaneKind::I8 {
                    a = _mm512_sub_ps(a, zsum);
                }
                _mm512_storeu_ps(ap.add(j), a);
            }
            j += 16;
        }
        crate::fused::axpy_tail(acc, h, g, d, d16, wu, &v);
    }
}

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

/// AVX-512 version of [`crate::fused::scores_row_q16`]: 32 lanes per `vpmaddwd`, in blocks of
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
    let heads = crate::fused::check(q.q.len(), d, group, &[k], s.len(), lds, 1);
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

/// AVX-512 version of [`crate::fused::pv_madd`] (the same i32 sums, so the same bits), 32
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
    let heads = crate::fused::pv_check(acc32.len(), d, group, w16.len(), ldw, &v);
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
        crate::fused::pv_madd_lanes(&mut acc32[h * d..(h + 1) * d], w, &v, g * d, d32..d);
    }
}

#[cfg(test)]
mod tests {
    use crate::kernels::tests::data;
    use crate::{
        attention_quantized, attention_typed, quantize_kv, simd_level, with_max_simd, Bf16, Params,
        QuantizedKv, QuantizedKvMut, Shape, SimdLevel,
    };
    use caching_allocator::{CachingAllocator, TempAllocator};

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
        unsafe { temp.reset() };
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
        if !crate::simd::avx512_detected() {
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
