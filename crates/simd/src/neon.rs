//! The NEON level (aarch64): 4 lanes in `float32x4_t` / `int32x4_t`.
//!

use crate::portable::EXP2_POLY;
use crate::Simd;
use core::arch::aarch64::*;

/// The NEON token (aarch64); a value exists only if the CPU has NEON.
#[derive(Clone, Copy, Debug)]
pub struct Neon(());

/// Four bytes at `p` in the low lanes of a vector (the loads below widen only those).
///
/// # Safety
/// `p` is readable for 4 bytes.
#[inline(always)]
unsafe fn load4_bytes(p: *const u8) -> uint8x8_t {
    // SAFETY: 4 readable bytes at `p` (caller); any alignment.
    unsafe { vreinterpret_u8_u32(vdup_n_u32(p.cast::<u32>().read_unaligned())) }
}

// SAFETY: a value of `Neon` exists only when `Level::Neon.is_available()` (or its caller
// promised so); every primitive uses only NEON.
unsafe impl Simd for Neon {
    simd_methods! {
        Neon: 4 lanes, float32x4_t, int32x4_t;
        fn (x: f32) -> float32x4_t { splat = vdupq_n_f32 }
        unsafe fn (p: *const f32) -> float32x4_t { load = vld1q_f32 }
        unsafe fn (p: *mut f32, v: float32x4_t) { store = vst1q_f32 }
        fn (a: float32x4_t, b: float32x4_t) -> float32x4_t {
            add = vaddq_f32, sub = vsubq_f32, mul = vmulq_f32, max = vmaxq_f32, min = vminq_f32,
        }
        fn (a: float32x4_t) -> f32 { reduce_sum = vaddvq_f32, reduce_max = vmaxvq_f32 }
        fn (x: i32) -> int32x4_t { splat_i32 = vdupq_n_s32 }
        fn (a: int32x4_t, b: int32x4_t) -> int32x4_t {
            add_i32 = vaddq_s32, sub_i32 = vsubq_s32, mul_i32 = vmulq_s32, and_i32 = vandq_s32,
        }
        fn (a: int32x4_t) -> i32 { reduce_sum_i32 = vaddvq_s32 }
        fn (a: int32x4_t) -> float32x4_t {
            i32_to_f32 = vcvtq_f32_s32, bits_to_f32 = vreinterpretq_f32_s32,
        }
        fn (a: float32x4_t) -> int32x4_t {
            f32_to_i32 = vcvtnq_s32_f32, f32_to_bits = vreinterpretq_s32_f32,
        }
    }
    #[inline(always)]
    unsafe fn load_bf16(self, p: *const u16) -> float32x4_t {
        feat!({
            let h = vld1_u16(p);
            vreinterpretq_f32_u32(vshll_n_u16::<16>(h))
        })
    }
    #[inline(always)]
    unsafe fn load_f16(self, p: *const u16) -> float32x4_t {
        feat!({
            let h = vmovl_u16(vld1_u16(p));
            // The magnitude's bits moved into f32 position and scaled by 2^112 (the exponent
            // bias difference) give every finite f16 exactly, subnormals included; infinity and
            // NaN (exponent 31) get the f32 exponent 255 instead.
            let abs = vshlq_n_u32::<13>(vandq_u32(h, vdupq_n_u32(0x7fff)));
            let finite = vmulq_f32(
                vreinterpretq_f32_u32(abs),
                vdupq_n_f32(f32::from_bits((127 + 112) << 23)),
            );
            let special = vceqq_u32(vandq_u32(h, vdupq_n_u32(0x7c00)), vdupq_n_u32(0x7c00));
            let inf_nan = vorrq_u32(abs, vdupq_n_u32(0x7f80_0000));
            let mag = vbslq_u32(special, inf_nan, vreinterpretq_u32_f32(finite));
            let sign = vshlq_n_u32::<16>(vandq_u32(h, vdupq_n_u32(0x8000)));
            vreinterpretq_f32_u32(vorrq_u32(mag, sign))
        })
    }
    #[inline(always)]
    fn fma(self, a: float32x4_t, b: float32x4_t, c: float32x4_t) -> float32x4_t {
        feat!(vfmaq_f32(c, a, b))
    }
    #[inline(always)]
    fn exp2_neg(self, x: float32x4_t) -> float32x4_t {
        feat!({
            // `vmaxnm` gives -127 for a NaN lane, so NaN gives 0 as on the other levels.
            let x = vmaxnmq_f32(x, vdupq_n_f32(-127.0));
            let n = vrndnq_f32(x);
            let f = vsubq_f32(x, n);
            let mut p = vdupq_n_f32(EXP2_POLY[0]);
            for &c in &EXP2_POLY[1..] {
                p = vfmaq_f32(vdupq_n_f32(c), p, f);
            }
            // 2^n from its exponent bits; n = -127 gives the bit pattern 0, i.e. 0.0.
            let e = vshlq_n_s32::<23>(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)));
            vmulq_f32(p, vreinterpretq_f32_s32(e))
        })
    }
    #[inline(always)]
    unsafe fn load_i8(self, p: *const i8) -> int32x4_t {
        feat!({
            let b = vreinterpret_s8_u8(load4_bytes(p.cast()));
            vmovl_s16(vget_low_s16(vmovl_s8(b)))
        })
    }
    #[inline(always)]
    unsafe fn load_u8(self, p: *const u8) -> int32x4_t {
        feat!({
            let b = load4_bytes(p);
            vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(vmovl_u8(b))))
        })
    }
    #[inline(always)]
    fn shl_i32<const N: i32>(self, a: int32x4_t) -> int32x4_t {
        feat!(vshlq_n_s32::<N>(a))
    }
    #[inline(always)]
    fn shr_i32<const N: i32>(self, a: int32x4_t) -> int32x4_t {
        feat!(vreinterpretq_s32_u32(vshrq_n_u32::<N>(
            vreinterpretq_u32_s32(a)
        )))
    }
    #[inline(always)]
    fn reduce_sums_i32(self, a: &[int32x4_t]) -> int32x4_t {
        match a.first_chunk::<4>() {
            Some(a) => feat!(vpaddq_s32(vpaddq_s32(a[0], a[1]), vpaddq_s32(a[2], a[3]))),
            None => crate::reduce_sums_lanes(self, a),
        }
    }
    #[inline(always)]
    unsafe fn load_i16(self, p: *const i16) -> int32x4_t {
        feat!(vmovl_s16(vld1_s16(p)))
    }
    #[inline(always)]
    unsafe fn store_i16(self, p: *mut i16, v: int32x4_t) {
        feat!(vst1_s16(p, vqmovn_s32(v)))
    }
    #[inline(always)]
    unsafe fn madd_i16_i8(self, acc: int32x4_t, q: *const i16, k: *const i8) -> int32x4_t {
        feat!({
            let (qv, kv) = (vld1q_s16(q), vmovl_s8(vld1_s8(k)));
            let lo = vmull_s16(vget_low_s16(qv), vget_low_s16(kv));
            let hi = vmull_high_s16(qv, kv);
            // Adjacent products summed pairwise, as `vpmaddwd` does.
            vaddq_s32(acc, vpaddq_s32(lo, hi))
        })
    }
    #[inline(always)]
    unsafe fn madd_rows_i8(
        self,
        acc: [int32x4_t; 2],
        w: int32x4_t,
        a: *const i8,
        b: *const i8,
    ) -> [int32x4_t; 2] {
        feat!({
            let (x, y) = (vmovl_s8(vld1_s8(a)), vmovl_s8(vld1_s8(b)));
            // i16 lanes 0 and 1 of `w` are the pair (w0, w1).
            let w = vreinterpretq_s16_s32(w);
            let lo = vmlal_laneq_s16::<0>(acc[0], vget_low_s16(x), w);
            let hi = vmlal_laneq_s16::<0>(acc[1], vget_high_s16(x), w);
            [
                vmlal_laneq_s16::<1>(lo, vget_low_s16(y), w),
                vmlal_laneq_s16::<1>(hi, vget_high_s16(y), w),
            ]
        })
    }
    #[inline(always)]
    fn madd_rows_order(self, acc: [int32x4_t; 2]) -> [int32x4_t; 2] {
        // Widened halves keep column order.
        acc
    }
    #[inline(always)]
    unsafe fn dot_nibbles16_i8(self, q: *const u8, x: *const i8) -> [int32x4_t; 4] {
        // Byte products of 8 positions add at most 8 * 2 * 15 * 128 = 30720 to a 16-bit lane;
        // then the lanes are widened into the rows' i32 sums.
        feat!({
            let mask = vdupq_n_u8(15);
            let mut rows = [vdupq_n_s32(0); 4];
            for half in 0..2 {
                let (mut a, mut b) = (vdupq_n_s16(0), vdupq_n_s16(0)); // rows 0..8, 8..16
                for j in 8 * half..8 * half + 8 {
                    let v = vld1q_u8(q.add(16 * j));
                    let lo = vreinterpretq_s8_u8(vandq_u8(v, mask));
                    let hi = vreinterpretq_s8_u8(vshrq_n_u8::<4>(v));
                    let (xl, xh) = (vdup_n_s8(*x.add(j)), vdup_n_s8(*x.add(j + 16)));
                    a = vmlal_s8(a, vget_low_s8(lo), xl);
                    b = vmlal_s8(b, vget_high_s8(lo), xl);
                    a = vmlal_s8(a, vget_low_s8(hi), xh);
                    b = vmlal_s8(b, vget_high_s8(hi), xh);
                }
                rows[0] = vaddw_s16(rows[0], vget_low_s16(a));
                rows[1] = vaddw_high_s16(rows[1], a);
                rows[2] = vaddw_s16(rows[2], vget_low_s16(b));
                rows[3] = vaddw_high_s16(rows[3], b);
            }
            rows
        })
    }
}
