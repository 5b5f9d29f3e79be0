//! The AVX2 level: 8 lanes in `__m256` / `__m256i`, with FMA and F16C.

use crate::portable::EXP2_POLY;
use crate::Simd;
use core::arch::x86_64::*;

/// The AVX2 + FMA + F16C token (x86-64); a value exists only if the CPU has them.
#[derive(Clone, Copy, Debug)]
pub struct Avx2(());

/// `op` over the 8 lanes: the two halves, then the pairs of 64-bit halves, then the last two
/// lanes (`op` works lane-wise on `__m128`).
///
/// # Safety
/// The CPU has AVX (the caller's token).
#[inline(always)]
unsafe fn reduce(v: __m256, op: impl Fn(__m128, __m128) -> __m128) -> f32 {
    // SAFETY: the caller's token proves AVX (and SSE, its predecessor).
    unsafe {
        let x = op(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let x = op(x, _mm_movehl_ps(x, x));
        _mm_cvtss_f32(op(x, _mm_shuffle_ps::<1>(x, x)))
    }
}

/// The lane sums of eight vectors as the lanes of one: `vphaddd` pairs them up within each
/// 128-bit half, then the two halves are added.
///
/// # Safety
/// The CPU has AVX2 (the caller's token).
#[inline(always)]
pub(crate) unsafe fn hsum8(a: &[__m256i; 8]) -> __m256i {
    // SAFETY: the caller's token proves AVX2.
    unsafe {
        let (x01, x23) = (_mm256_hadd_epi32(a[0], a[1]), _mm256_hadd_epi32(a[2], a[3]));
        let (x45, x67) = (_mm256_hadd_epi32(a[4], a[5]), _mm256_hadd_epi32(a[6], a[7]));
        // Lane i < 4 of `lo` sums half of a[i], lane 4 + i the other half; `hi` for a[4 + i].
        let (lo, hi) = (_mm256_hadd_epi32(x01, x23), _mm256_hadd_epi32(x45, x67));
        _mm256_add_epi32(
            _mm256_permute2x128_si256::<0x20>(lo, hi),
            _mm256_permute2x128_si256::<0x31>(lo, hi),
        )
    }
}

/// [`Simd::dot_nibbles16_i8`] in two vectors, rows 0..8 and 8..16.
///
/// Each step reads two byte positions of the 16 rows (32 bytes), moves the 8-byte quarters
/// so that each 128-bit half holds 8 rows, and interleaves them so each row's two bytes sit
/// side by side: `vpmaddubsw` then multiplies a row's nibble pair by the pair of `x` values
/// and adds them in one 16-bit lane (row `i` of the half). Four steps add at most
/// `4 * 2 * 2 * 15 * 128 = 30720` to a lane, within i16; the lanes are then widened to i32.
///
/// # Safety
/// The CPU has AVX2; `q` is readable for 256 bytes, `x` for 32.
#[inline(always)]
pub(crate) unsafe fn dot_nibbles16(q: *const u8, x: *const i8) -> [__m256i; 2] {
    // SAFETY: AVX2 (caller); every load is inside the 256 bytes at `q` (`32 * 7 + 32`) or the
    // 32 at `x` (`16 + 2 * 7 + 2`), unaligned loads.
    unsafe {
        let pairs = _mm256_setr_epi8(
            0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15, //
            0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15,
        );
        let mask = _mm256_set1_epi8(15);
        let mut rows = [_mm256_setzero_si256(); 2];
        for half in 0..2 {
            let mut acc = _mm256_setzero_si256();
            for step in 0..4 {
                let jp = 2 * (4 * half + step);
                // Quarters: rows 0..8 and 8..16 at `jp`, the same at `jp + 1`; reordered to
                // (0..8 at jp, 0..8 at jp + 1 | 8..16 at jp, 8..16 at jp + 1).
                let v = _mm256_loadu_si256(q.add(16 * jp).cast());
                let v = _mm256_shuffle_epi8(_mm256_permute4x64_epi64::<0b11_01_10_00>(v), pairs);
                let lo = _mm256_and_si256(v, mask);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), mask);
                let xl = _mm256_set1_epi16(x.add(jp).cast::<i16>().read_unaligned());
                let xh = _mm256_set1_epi16(x.add(jp + 16).cast::<i16>().read_unaligned());
                let both =
                    _mm256_add_epi16(_mm256_maddubs_epi16(lo, xl), _mm256_maddubs_epi16(hi, xh));
                acc = _mm256_add_epi16(acc, both);
            }
            rows[0] = _mm256_add_epi32(rows[0], _mm256_cvtepi16_epi32(_mm256_castsi256_si128(acc)));
            rows[1] = _mm256_add_epi32(
                rows[1],
                _mm256_cvtepi16_epi32(_mm256_extracti128_si256::<1>(acc)),
            );
        }
        rows
    }
}

// SAFETY: a value of `Avx2` exists only when `Level::Avx2.is_available()` (or its caller
// promised so); every primitive uses only AVX2, FMA, F16C and their predecessors.
unsafe impl Simd for Avx2 {
    simd_methods! {
        Avx2: 8 lanes, __m256, __m256i;
        fn (x: f32) -> __m256 { splat = _mm256_set1_ps }
        fn (x: i32) -> __m256i { splat_i32 = _mm256_set1_epi32 }
        fn () -> __m256 { zero = _mm256_setzero_ps }
        unsafe fn (p: *const f32) -> __m256 { load = _mm256_loadu_ps }
        unsafe fn (p: *mut f32, v: __m256) { store = _mm256_storeu_ps }
        fn (a: __m256, b: __m256) -> __m256 {
            add = _mm256_add_ps, sub = _mm256_sub_ps, mul = _mm256_mul_ps,
            max = _mm256_max_ps, min = _mm256_min_ps,
        }
        fn (a: __m256i) -> __m256 {
            i32_to_f32 = _mm256_cvtepi32_ps, bits_to_f32 = _mm256_castsi256_ps,
        }
        fn (a: __m256, b: __m256, c: __m256) -> __m256 { fma = _mm256_fmadd_ps }
        fn (a: __m256) -> __m256i {
            f32_to_i32 = _mm256_cvtps_epi32, f32_to_bits = _mm256_castps_si256,
        }
        fn (a: __m256i, b: __m256i) -> __m256i {
            add_i32 = _mm256_add_epi32, sub_i32 = _mm256_sub_epi32,
            mul_i32 = _mm256_mullo_epi32, and_i32 = _mm256_and_si256,
        }
    }
    x86_widening_loads! {
        __m256, __m256i; load_words = _mm_loadu_si128, load_bytes = _mm_loadl_epi64,
        zext16 = _mm256_cvtepu16_epi32, sext16 = _mm256_cvtepi16_epi32,
        zext8 = _mm256_cvtepu8_epi32, sext8 = _mm256_cvtepi8_epi32, shl = _mm256_slli_epi32,
        cast = _mm256_castsi256_ps, from_f16 = _mm256_cvtph_ps,
    }
    #[inline(always)]
    fn reduce_sum(self, v: __m256) -> f32 {
        feat!(reduce(v, |a, b| _mm_add_ps(a, b)))
    }
    #[inline(always)]
    fn reduce_max(self, v: __m256) -> f32 {
        feat!(reduce(v, |a, b| _mm_max_ps(a, b)))
    }
    #[inline(always)]
    fn exp2_neg(self, x: __m256) -> __m256 {
        feat!({
            let x = _mm256_max_ps(x, _mm256_set1_ps(-127.0));
            let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
            let f = _mm256_sub_ps(x, n);
            let mut p = _mm256_set1_ps(EXP2_POLY[0]);
            for &c in &EXP2_POLY[1..] {
                p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(c));
            }
            // 2^n from its exponent bits; n = -127 gives the bit pattern 0, i.e. 0.0.
            let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(
                _mm256_cvtps_epi32(n),
                _mm256_set1_epi32(127),
            ));
            _mm256_mul_ps(p, _mm256_castsi256_ps(e))
        })
    }
    #[inline(always)]
    fn shl_i32<const N: i32>(self, a: __m256i) -> __m256i {
        feat!(_mm256_slli_epi32::<N>(a))
    }
    #[inline(always)]
    fn shr_i32<const N: i32>(self, a: __m256i) -> __m256i {
        feat!(_mm256_srli_epi32::<N>(a))
    }
    #[inline(always)]
    fn reduce_sum_i32(self, v: __m256i) -> i32 {
        feat!({
            let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
            let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
            _mm_cvtsi128_si32(s)
        })
    }
    #[inline(always)]
    fn reduce_sums_i32(self, a: &[__m256i]) -> __m256i {
        match a.first_chunk::<8>() {
            Some(a) => feat!(hsum8(a)),
            None => crate::reduce_sums_lanes(self, a),
        }
    }
    #[inline(always)]
    unsafe fn store_i16(self, p: *mut i16, v: __m256i) {
        // SAFETY: the features (token) and 8 writable i16 (16 bytes) at `p` (caller).
        unsafe {
            let lo = _mm256_castsi256_si128(v);
            let hi = _mm256_extracti128_si256::<1>(v);
            _mm_storeu_si128(p.cast(), _mm_packs_epi32(lo, hi));
        }
    }
    x86_madd! {
        __m256i; load_half = _mm_loadu_si128, load = _mm256_loadu_si256,
        widen8 = _mm256_cvtepi8_epi16, madd = _mm256_madd_epi16, add = _mm256_add_epi32,
        unpacklo = _mm_unpacklo_epi8, unpackhi = _mm_unpackhi_epi8,
    }
    #[inline(always)]
    fn madd_rows_order(self, acc: [__m256i; 2]) -> [__m256i; 2] {
        // The 128-bit unpacks keep column order: columns 0..8, then 8..16.
        acc
    }
    #[inline(always)]
    unsafe fn dot_nibbles16_i8(self, q: *const u8, x: *const i8) -> [__m256i; 4] {
        // SAFETY: the features (token); 256 readable bytes at `q`, 32 at `x` (caller).
        let [a, b] = unsafe { dot_nibbles16(q, x) };
        let z = self.splat_i32(0);
        [a, b, z, z]
    }
}
