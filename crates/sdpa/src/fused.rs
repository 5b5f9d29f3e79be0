//! Decode's dot and axpy kernels reading bf16 or int8 K/V directly (widened or dequantized in
//! registers). On the decode path each K/V head vector is used once per query head of its
//! group, so converting it to an f32 buffer first only adds a store and a reload per element;
//! fusing the conversion makes bf16 and int8 decode read-bound like f32 (the prefill path,
//! which reuses each converted tile across many query rows, keeps its scratch tiles).
//!
//! int8 values enter as `(q - zero_point)` converted to f32 (exact), so the only roundings are
//! the ones of the f32 dot/axpy on the dequantized values up to the scale, which the caller
//! applies (`scale * dot`, `p * scale` as the axpy weight).

use crate::elem::Bf16;

/// `sum q[j] * k[j]`; panics if the lengths differ.
///
/// # Safety
/// None (safe to call).
pub(crate) unsafe fn dot_bf16(q: &[f32], k: &[Bf16]) -> f32 {
    assert_eq!(q.len(), k.len());
    q.iter().zip(k).map(|(a, b)| a * b.to_f32()).sum()
}

/// `sum q[j] * (k[j] - zp)`; panics if the lengths differ.
///
/// # Safety
/// None (safe to call).
pub(crate) unsafe fn dot_i8(q: &[f32], k: &[i8], zp: i8) -> f32 {
    assert_eq!(q.len(), k.len());
    let zp = i32::from(zp);
    q.iter()
        .zip(k)
        .map(|(a, &b)| a * (i32::from(b) - zp) as f32)
        .sum()
}

/// `acc[j] += sum_u p[u] * v[u][j]`; panics if a length differs from `acc`'s.
///
/// # Safety
/// None (safe to call).
pub(crate) unsafe fn axpy4_bf16(acc: &mut [f32], p: [f32; 4], v: [&[Bf16]; 4]) {
    let n = acc.len();
    assert!(v.iter().all(|r| r.len() == n));
    for (j, a) in acc.iter_mut().enumerate() {
        *a += p[0] * v[0][j].to_f32()
            + p[1] * v[1][j].to_f32()
            + p[2] * v[2][j].to_f32()
            + p[3] * v[3][j].to_f32();
    }
}

/// `acc[j] += sum_u w[u] * (v[u][j] - zp[u])`; panics if a length differs from `acc`'s.
///
/// # Safety
/// None (safe to call).
pub(crate) unsafe fn axpy4_i8(acc: &mut [f32], w: [f32; 4], v: [&[i8]; 4], zp: [i8; 4]) {
    let n = acc.len();
    assert!(v.iter().all(|r| r.len() == n));
    let x = |u: usize, j: usize| (i32::from(v[u][j]) - i32::from(zp[u])) as f32;
    for (j, a) in acc.iter_mut().enumerate() {
        *a += w[0] * x(0, j) + w[1] * x(1, j) + w[2] * x(2, j) + w[3] * x(3, j);
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use crate::elem::Bf16;
    use core::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma")]
    fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
        _mm_cvtss_f32(s)
    }

    /// 8 bf16 at `p` as f32.
    ///
    /// # Safety
    /// AVX2; `p` readable for 8 elements.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load_bf16(p: *const Bf16) -> __m256 {
        // SAFETY: 16 bytes readable (caller).
        let h = unsafe { _mm_loadu_si128(p.cast()) };
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
    }

    /// 8 int8 at `p`, minus `zp`, as f32 (exact).
    ///
    /// # Safety
    /// AVX2; `p` readable for 8 bytes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load_i8(p: *const i8, zp: __m256i) -> __m256 {
        // SAFETY: 8 bytes readable (caller).
        let q = unsafe { _mm_loadl_epi64(p.cast()) };
        _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_cvtepi8_epi32(q), zp))
    }

    /// AVX2 version of [`super::dot_bf16`].
    ///
    /// # Safety
    /// The CPU supports AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn dot_bf16(q: &[f32], k: &[Bf16]) -> f32 {
        assert_eq!(q.len(), k.len());
        let n = q.len();
        let mut acc = [_mm256_setzero_ps(); 2];
        let mut i = 0;
        while i + 16 <= n {
            for (u, au) in acc.iter_mut().enumerate() {
                // SAFETY: `i + 8u + 8 <= n`: in bounds of both slices.
                unsafe {
                    let kv = load_bf16(k.as_ptr().add(i + 8 * u));
                    *au = _mm256_fmadd_ps(_mm256_loadu_ps(q.as_ptr().add(i + 8 * u)), kv, *au);
                }
            }
            i += 16;
        }
        let mut s = hsum(_mm256_add_ps(acc[0], acc[1]));
        for j in i..n {
            s += q[j] * k[j].to_f32();
        }
        s
    }

    /// AVX2 version of [`super::dot_i8`].
    ///
    /// # Safety
    /// The CPU supports AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn dot_i8(q: &[f32], k: &[i8], zp: i8) -> f32 {
        assert_eq!(q.len(), k.len());
        let n = q.len();
        let zv = _mm256_set1_epi32(i32::from(zp));
        let mut acc = [_mm256_setzero_ps(); 2];
        let mut i = 0;
        while i + 16 <= n {
            for (u, au) in acc.iter_mut().enumerate() {
                // SAFETY: `i + 8u + 8 <= n`: in bounds of both slices.
                unsafe {
                    let kv = load_i8(k.as_ptr().add(i + 8 * u), zv);
                    *au = _mm256_fmadd_ps(_mm256_loadu_ps(q.as_ptr().add(i + 8 * u)), kv, *au);
                }
            }
            i += 16;
        }
        let mut s = hsum(_mm256_add_ps(acc[0], acc[1]));
        let zp = i32::from(zp);
        for j in i..n {
            s += q[j] * (i32::from(k[j]) - zp) as f32;
        }
        s
    }

    /// AVX2 version of [`super::axpy4_bf16`].
    ///
    /// # Safety
    /// The CPU supports AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn axpy4_bf16(acc: &mut [f32], p: [f32; 4], v: [&[Bf16]; 4]) {
        let n = acc.len();
        assert!(v.iter().all(|r| r.len() == n));
        let pv = p.map(|x| _mm256_set1_ps(x));
        let pa = acc.as_mut_ptr();
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: `i + 8 <= n` and every row has length `n`: all accesses in bounds.
            unsafe {
                let mut a = _mm256_loadu_ps(pa.add(i));
                for u in 0..4 {
                    a = _mm256_fmadd_ps(pv[u], load_bf16(v[u].as_ptr().add(i)), a);
                }
                _mm256_storeu_ps(pa.add(i), a);
            }
            i += 8;
        }
        for j in i..n {
            acc[j] += p[0] * v[0][j].to_f32()
                + p[1] * v[1][j].to_f32()
                + p[2] * v[2][j].to_f32()
                + p[3] * v[3][j].to_f32();
        }
    }

    /// AVX2 version of [`super::axpy4_i8`].
    ///
    /// # Safety
    /// The CPU supports AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn axpy4_i8(acc: &mut [f32], w: [f32; 4], v: [&[i8]; 4], zp: [i8; 4]) {
        let n = acc.len();
        assert!(v.iter().all(|r| r.len() == n));
        let wv = w.map(|x| _mm256_set1_ps(x));
        let zv = zp.map(|z| _mm256_set1_epi32(i32::from(z)));
        let pa = acc.as_mut_ptr();
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: `i + 8 <= n` and every row has length `n`: all accesses in bounds.
            unsafe {
                let mut a = _mm256_loadu_ps(pa.add(i));
                for u in 0..4 {
                    a = _mm256_fmadd_ps(wv[u], load_i8(v[u].as_ptr().add(i), zv[u]), a);
                }
                _mm256_storeu_ps(pa.add(i), a);
            }
            i += 8;
        }
        let x = |u: usize, j: usize| (i32::from(v[u][j]) - i32::from(zp[u])) as f32;
        for (j, a) in acc.iter_mut().enumerate().skip(i) {
            *a += w[0] * x(0, j) + w[1] * x(1, j) + w[2] * x(2, j) + w[3] * x(3, j);
        }
    }
}
