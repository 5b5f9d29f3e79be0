//! The AVX-512 level: 16 lanes in `__m512` / `__m512i` (AVX-512F and BW, with AVX2, FMA and
//! F16C).
//!
//! Miri runs this level's kernels when the target features are enabled at build time: the
//! primitives avoid the few 512-bit instructions it does not implement (`vmaxps`, `vminps`
//! and `vrndscaleps` are written another way under Miri or everywhere).

use crate::portable::EXP2_POLY;
use crate::Simd;
use core::arch::x86_64::*;

/// The AVX-512F + AVX-512BW token (with AVX2, FMA, F16C; x86-64); a value exists only if
/// the CPU has them.
#[derive(Clone, Copy, Debug)]
pub struct Avx512(());

/// Per lane `if a > b { a } else { b }` (`MAX`) or `if a < b { a } else { b }`: `b` when
/// either is NaN, as `vmaxps` / `vminps` define it.
#[inline(always)]
fn pick_ps<const MAX: bool>(a: __m512, b: __m512) -> __m512 {
    #[cfg(not(miri))]
    {
        if MAX {
            feat!(_mm512_max_ps(a, b))
        } else {
            feat!(_mm512_min_ps(a, b))
        }
    }
    #[cfg(miri)]
    {
        // SAFETY: `__m512` and `[f32; 16]` have the same size and every bit pattern is valid
        // in both.
        let (a, b): ([f32; 16], [f32; 16]) =
            unsafe { (core::mem::transmute(a), core::mem::transmute(b)) };
        let m: [f32; 16] = core::array::from_fn(|i| {
            let keep_a = if MAX { a[i] > b[i] } else { a[i] < b[i] };
            if keep_a {
                a[i]
            } else {
                b[i]
            }
        });
        // SAFETY: as above.
        unsafe { core::mem::transmute(m) }
    }
}

// SAFETY: a value of `Avx512` exists only when `Level::Avx512.is_available()` (or its caller
// promised so); every primitive uses only AVX-512F/BW, AVX2, FMA, F16C and their
// predecessors.
unsafe impl Simd for Avx512 {
    simd_methods! {
        Avx512: 16 lanes, __m512, __m512i;
        unsafe fn (p: *const f32) -> __m512 { load = _mm512_loadu_ps }
        unsafe fn (p: *mut f32, v: __m512) { store = _mm512_storeu_ps }
        fn (x: f32) -> __m512 { splat = _mm512_set1_ps }
        fn () -> __m512 { zero = _mm512_setzero_ps }
        fn (a: __m512, b: __m512, c: __m512) -> __m512 { fma = _mm512_fmadd_ps }
        fn (a: __m512, b: __m512) -> __m512 {
            add = _mm512_add_ps, sub = _mm512_sub_ps, mul = _mm512_mul_ps,
        }
        fn (a: __m512) -> f32 {
            reduce_sum = _mm512_reduce_add_ps, reduce_max = _mm512_reduce_max_ps,
        }
        fn (a: __m512i) -> i32 { reduce_sum_i32 = _mm512_reduce_add_epi32 }
        fn (x: i32) -> __m512i { splat_i32 = _mm512_set1_epi32 }
        fn (a: __m512i, b: __m512i) -> __m512i {
            add_i32 = _mm512_add_epi32, sub_i32 = _mm512_sub_epi32,
            mul_i32 = _mm512_mullo_epi32, and_i32 = _mm512_and_si512,
        }
        fn (a: __m512) -> __m512i {
            f32_to_i32 = _mm512_cvtps_epi32, f32_to_bits = _mm512_castps_si512,
        }
        fn (a: __m512i) -> __m512 {
            i32_to_f32 = _mm512_cvtepi32_ps, bits_to_f32 = _mm512_castsi512_ps,
        }
    }
    x86_widening_loads! {
        __m512, __m512i; load_words = _mm256_loadu_si256, load_bytes = _mm_loadu_si128,
        zext16 = _mm512_cvtepu16_epi32, sext16 = _mm512_cvtepi16_epi32,
        zext8 = _mm512_cvtepu8_epi32, sext8 = _mm512_cvtepi8_epi32, shl = _mm512_slli_epi32,
        cast = _mm512_castsi512_ps, from_f16 = _mm512_cvtph_ps,
    }
    #[inline(always)]
    fn max(self, a: __m512, b: __m512) -> __m512 {
        pick_ps::<true>(a, b)
    }
    #[inline(always)]
    fn min(self, a: __m512, b: __m512) -> __m512 {
        pick_ps::<false>(a, b)
    }
    #[inline(always)]
    fn exp2_neg(self, x: __m512) -> __m512 {
        // Round to nearest by adding 1.5 * 2^23: for |x| <= 127 the sum's bits are the
        // constant's plus `n` (its unit in the last place is 1), and subtracting the constant
        // back gives `n` as a float (no `vrndscaleps`, which Miri lacks).
        const MAGIC: f32 = 12_582_912.0;
        let x = pick_ps::<true>(x, self.splat(-127.0));
        feat!({
            let big = _mm512_add_ps(x, _mm512_set1_ps(MAGIC));
            let n = _mm512_sub_ps(big, _mm512_set1_ps(MAGIC));
            let f = _mm512_sub_ps(x, n);
            let mut p = _mm512_set1_ps(EXP2_POLY[0]);
            for &c in &EXP2_POLY[1..] {
                p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
            }
            // `big`'s bits less the constant's minus 127 are the biased exponent `n + 127`;
            // n = -127 gives the bit pattern 0, i.e. 0.0.
            let ni = _mm512_sub_epi32(
                _mm512_castps_si512(big),
                _mm512_set1_epi32(MAGIC.to_bits() as i32 - 127),
            );
            _mm512_mul_ps(p, _mm512_castsi512_ps(_mm512_slli_epi32::<23>(ni)))
        })
    }
    #[inline(always)]
    unsafe fn load_nibbles_f32(self, p: *const u8) -> (__m512, __m512) {
        if cfg!(miri) {
            // Miri lacks `vpermps`: the mask-and-convert form, which gives the same floats.
            // SAFETY: 16 readable bytes at `p` (caller).
            let (lo, hi) = unsafe { crate::load_nibbles(self, p) };
            return (self.i32_to_f32(lo), self.i32_to_f32(hi));
        }
        // SAFETY: the features (token) and 16 readable bytes at `p` (caller).
        unsafe {
            let b = _mm512_cvtepu8_epi32(_mm_loadu_si128(p.cast()));
            let table = _mm512_setr_ps(
                0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0,
                15.0,
            );
            // `vpermps` indexes by bits 0..4 of each lane: the low nibble as it is, the high
            // one after the shift (a byte's bits 4..8).
            (
                _mm512_permutexvar_ps(b, table),
                _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(b), table),
            )
        }
    }
    #[inline(always)]
    fn shl_i32<const N: i32>(self, a: __m512i) -> __m512i {
        // The immediate form takes a `u32` count; a constant count in a register folds to it.
        feat!(_mm512_sll_epi32(a, _mm_cvtsi32_si128(N)))
    }
    #[inline(always)]
    fn shr_i32<const N: i32>(self, a: __m512i) -> __m512i {
        feat!(_mm512_srl_epi32(a, _mm_cvtsi32_si128(N)))
    }
    #[inline(always)]
    fn reduce_sums_i32(self, a: &[__m512i]) -> __m512i {
        let Some(a) = a.first_chunk::<16>() else {
            return crate::reduce_sums_lanes(self, a);
        };
        // SAFETY (hsum8): the AVX-512 level includes AVX2.
        feat!({
            // Each vector's halves added, then the AVX2 transpose-and-add of each eight.
            let mut h = [[_mm256_setzero_si256(); 8]; 2];
            for (i, v) in a.iter().enumerate() {
                let (lo, hi) = (
                    _mm512_castsi512_si256(*v),
                    _mm512_extracti64x4_epi64::<1>(*v),
                );
                h[i / 8][i % 8] = _mm256_add_epi32(lo, hi);
            }
            let lo = _mm512_castsi256_si512(crate::avx2::hsum8(&h[0]));
            _mm512_inserti64x4::<1>(lo, crate::avx2::hsum8(&h[1]))
        })
    }
    #[inline(always)]
    unsafe fn store_i16(self, p: *mut i16, v: __m512i) {
        // The 256-bit saturating pack (not `vpmovsdw`, which Miri lacks): it interleaves
        // the halves' 128-bit blocks, which the permute puts back in order.
        // SAFETY: the features (token) and 16 writable i16 (32 bytes) at `p` (caller).
        unsafe {
            let lo = _mm512_castsi512_si256(v);
            let hi = _mm512_extracti64x4_epi64::<1>(v);
            let packed = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(lo, hi));
            _mm256_storeu_si256(p.cast(), packed);
        }
    }
    x86_madd! {
        __m512i; load_half = _mm256_loadu_si256, load = _mm512_loadu_si512,
        widen8 = _mm512_cvtepi8_epi16, madd = _mm512_madd_epi16, add = _mm512_add_epi32,
        unpacklo = _mm256_unpacklo_epi8, unpackhi = _mm256_unpackhi_epi8,
    }
    #[inline(always)]
    fn madd_rows_order(self, acc: [__m512i; 2]) -> [__m512i; 2] {
        // 128-bit blocks of acc[0]: columns 0..4, 4..8, 16..20, 20..24; of acc[1]: 8..12,
        // 12..16, 24..28, 28..32.
        feat!([
            _mm512_shuffle_i64x2::<0x44>(acc[0], acc[1]),
            _mm512_shuffle_i64x2::<0xEE>(acc[0], acc[1]),
        ])
    }
    #[inline(always)]
    unsafe fn dot_nibbles16_i8(self, q: *const u8, x: *const i8) -> [__m512i; 4] {
        // SAFETY: the features (token; AVX-512 comes with AVX2); 256 readable bytes at `q`,
        // 32 at `x` (caller). 16 rows fill one vector: the 256-bit halves are joined.
        unsafe {
            let [a, b] = crate::avx2::dot_nibbles16(q, x);
            let z = _mm512_setzero_si512();
            [
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b),
                z,
                z,
                z,
            ]
        }
    }
}
