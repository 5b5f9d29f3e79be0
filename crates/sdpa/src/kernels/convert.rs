//! Conversion kernels: bf16 / f16 / int8 (dequantized) tiles to f32 in scratch. A portable
//! version and one generic SIMD body per conversion with the same results: each conversion is
//! exact (bf16, f16) or one rounding of `(q - zero_point) * scale` (int8).

use kernel_simd::Simd;

use crate::elem::{Bf16, F16};
use crate::kernels::row::Lane;

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

/// The body of the SIMD [`widen_bf16`]s.
#[inline(always)]
fn widen_bf16_body<S: Simd>(s: S, src: &[Bf16], dst: &mut [f32]) {
    widen_body(s, src, dst)
}

/// The body of the SIMD [`widen_f16`]s.
#[inline(always)]
fn widen_f16_body<S: Simd>(s: S, src: &[F16], dst: &mut [f32]) {
    widen_body(s, src, dst)
}

/// `dst[i] = src[i]` as f32, `S::LANES` at a time; panics if `dst` is shorter.
#[inline(always)]
fn widen_body<S: Simd, E: Lane>(s: S, src: &[E], dst: &mut [f32]) {
    let n = src.len();
    assert!(dst.len() >= n, "dst shorter than src");
    let l = S::LANES;
    let mut i = 0;
    while i + l <= n {
        // SAFETY: `i + LANES <= n <= dst.len()`: LANES elements read, LANES floats written.
        unsafe { s.store(dst.as_mut_ptr().add(i), E::load(s, src.as_ptr().add(i))) };
        i += l;
    }
    for j in i..n {
        dst[j] = src[j].widen(0);
    }
}

/// The body of the SIMD [`dequant`]s.
#[inline(always)]
fn dequant_body<S: Simd>(s: S, src: &[i8], scale: f32, zero_point: i8, dst: &mut [f32]) {
    let n = src.len();
    assert!(dst.len() >= n, "dst shorter than src");
    let l = S::LANES;
    let zp = s.splat_i32(i32::from(zero_point));
    let sc = s.splat(scale);
    let mut i = 0;
    while i + l <= n {
        // SAFETY: `i + LANES <= n <= dst.len()`: LANES bytes read, LANES floats written.
        unsafe {
            let x = s.sub_i32(s.load_i8(src.as_ptr().add(i)), zp);
            s.store(dst.as_mut_ptr().add(i), s.mul(s.i32_to_f32(x), sc));
        }
        i += l;
    }
    let zp = i32::from(zero_point);
    for j in i..n {
        dst[j] = (i32::from(src[j]) - zp) as f32 * scale;
    }
}

kernel_simd::instantiate! {
    /// [`widen_bf16`] per ISA.
    pub(crate) fn widen_bf16_simd(src: &[Bf16], dst: &mut [f32]) = widen_bf16_body;
    /// [`widen_f16`] per ISA.
    pub(crate) fn widen_f16_simd(src: &[F16], dst: &mut [f32]) = widen_f16_body;
    /// [`dequant`] per ISA.
    pub(crate) fn dequant_simd(src: &[i8], scale: f32, zero_point: i8, dst: &mut [f32])
        = dequant_body;
}
