//! Conversion kernels: bf16 / f16 / int8 (dequantized) tiles to f32 in scratch. A portable
//! version and x86-64 (AVX2, F16C) and aarch64 (NEON) versions with the same results: each
//! conversion is exact (bf16, f16) or one rounding of `(q - zero_point) * scale` (int8).

use crate::elem::{Bf16, F16};

/// `dst[i] = src[i]` as f32 for `i < src.len()`; panics if `dst` is shorter.
///
/// # Safety
/// None (safe to call; `unsafe` only to share the kernel-pointer type).
pub(crate) unsafe fn widen_bf16(src: &[Bf16], dst: &mut [f32]) {
    for (d, s) in dst[..src.len()].iter_mut().zip(src) {
        *d = s.to_f32();
    }
}

/// `dst[i] = src[i]` as f32 for `i < src.len()`; panics if `dst` is shorter.
///
/// # Safety
/// None (safe to call).
pub(crate) unsafe fn widen_f16(src: &[F16], dst: &mut [f32]) {
    for (d, s) in dst[..src.len()].iter_mut().zip(src) {
        *d = s.to_f32();
    }
}

/// `dst[i] = (src[i] - zero_point) * scale` for `i < src.len()`; panics if `dst` is shorter.
///
/// # Safety
/// None (safe to call).
pub(crate) unsafe fn dequant(src: &[i8], scale: f32, zero_point: i8, dst: &mut [f32]) {
    let zp = i32::from(zero_point);
    for (d, &q) in dst[..src.len()].iter_mut().zip(src) {
        *d = (i32::from(q) - zp) as f32 * scale;
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use crate::elem::{Bf16, F16};
    use core::arch::x86_64::*;

    /// AVX2 version of [`super::widen_bf16`].
    ///
    /// # Safety
    /// The CPU supports AVX2.
    #[target_feature(enable = "avx2")]
    pub(crate) unsafe fn widen_bf16(src: &[Bf16], dst: &mut [f32]) {
        let n = src.len();
        assert!(dst.len() >= n);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: `i + 8 <= n <= dst.len()`: 16 bytes read from `src`, 32 written to `dst`.
            unsafe {
                let h = _mm_loadu_si128(src.as_ptr().add(i).cast());
                let w = _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h));
                _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_castsi256_ps(w));
            }
            i += 8;
        }
        for j in i..n {
            dst[j] = src[j].to_f32();
        }
    }

    /// F16C version of [`super::widen_f16`].
    ///
    /// # Safety
    /// The CPU supports AVX2 and F16C.
    #[target_feature(enable = "avx2,f16c")]
    pub(crate) unsafe fn widen_f16(src: &[F16], dst: &mut [f32]) {
        let n = src.len();
        assert!(dst.len() >= n);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: `i + 8 <= n <= dst.len()`: 16 bytes read, 32 written, in bounds.
            unsafe {
                let h = _mm_loadu_si128(src.as_ptr().add(i).cast());
                _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
            }
            i += 8;
        }
        for j in i..n {
            dst[j] = src[j].to_f32();
        }
    }

    /// AVX2 version of [`super::dequant`].
    ///
    /// # Safety
    /// The CPU supports AVX2.
    #[target_feature(enable = "avx2")]
    pub(crate) unsafe fn dequant(src: &[i8], scale: f32, zero_point: i8, dst: &mut [f32]) {
        let n = src.len();
        assert!(dst.len() >= n);
        let zp = _mm256_set1_epi32(i32::from(zero_point));
        let sc = _mm256_set1_ps(scale);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: `i + 8 <= n <= dst.len()`: 8 bytes read, 32 written, in bounds.
            unsafe {
                let q = _mm_loadl_epi64(src.as_ptr().add(i).cast());
                let x = _mm256_sub_epi32(_mm256_cvtepi8_epi32(q), zp);
                _mm256_storeu_ps(
                    dst.as_mut_ptr().add(i),
                    _mm256_mul_ps(_mm256_cvtepi32_ps(x), sc),
                );
            }
            i += 8;
        }
        let zp = i32::from(zero_point);
        for j in i..n {
            dst[j] = (i32::from(src[j]) - zp) as f32 * scale;
        }
    }
}

#[cfg(target_arch = "aarch64")]
pub(crate) mod neon {
    use crate::elem::Bf16;
    use core::arch::aarch64::*;

    /// NEON version of [`super::widen_bf16`].
    ///
    /// # Safety
    /// The CPU supports NEON (always true on aarch64 Linux).
    #[target_feature(enable = "neon")]
    pub(crate) unsafe fn widen_bf16(src: &[Bf16], dst: &mut [f32]) {
        let n = src.len();
        assert!(dst.len() >= n);
        let mut i = 0;
        while i + 4 <= n {
            // SAFETY: `i + 4 <= n <= dst.len()`: 8 bytes read, 16 written, in bounds.
            unsafe {
                let h = vld1_u16(src.as_ptr().add(i).cast());
                let w = vshll_n_u16::<16>(h);
                vst1q_f32(dst.as_mut_ptr().add(i), vreinterpretq_f32_u32(w));
            }
            i += 4;
        }
        for j in i..n {
            dst[j] = src[j].to_f32();
        }
    }

    /// NEON version of [`super::dequant`].
    ///
    /// # Safety
    /// The CPU supports NEON.
    #[target_feature(enable = "neon")]
    pub(crate) unsafe fn dequant(src: &[i8], scale: f32, zero_point: i8, dst: &mut [f32]) {
        let n = src.len();
        assert!(dst.len() >= n);
        let zp = vdupq_n_s32(i32::from(zero_point));
        let sc = vdupq_n_f32(scale);
        let mut i = 0;
        while i + 8 <= n {
            // SAFETY: `i + 8 <= n <= dst.len()`: 8 bytes read, 32 written, in bounds.
            unsafe {
                let q = vmovl_s8(vld1_s8(src.as_ptr().add(i)));
                let lo = vsubq_s32(vmovl_s16(vget_low_s16(q)), zp);
                let hi = vsubq_s32(vmovl_s16(vget_high_s16(q)), zp);
                let p = dst.as_mut_ptr().add(i);
                vst1q_f32(p, vmulq_f32(vcvtq_f32_s32(lo), sc));
                vst1q_f32(p.add(4), vmulq_f32(vcvtq_f32_s32(hi), sc));
            }
            i += 8;
        }
        let zp = i32::from(zero_point);
        for j in i..n {
            dst[j] = (i32::from(src[j]) - zp) as f32 * scale;
        }
    }
}
