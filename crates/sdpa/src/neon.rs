//! aarch64 NEON versions of the inner loops (same contracts as `kernels::scalar`). Built and
//! tested under qemu-user in CI (`.ci/run`).

use crate::plan::{MR, NR};
use core::arch::aarch64::*;

/// `2^x` for `x <= 0`, 4 lanes; `x <= -127` gives 0 (the AVX2 polynomial).
#[target_feature(enable = "neon")]
fn exp2_ps(x: float32x4_t) -> float32x4_t {
    let x = vmaxq_f32(x, vdupq_n_f32(-127.0));
    let n = vrndnq_f32(x);
    let f = vsubq_f32(x, n);
    let mut p = vdupq_n_f32(1.540_353e-4);
    for c in [
        1.333_355_8e-3,
        9.618_129e-3,
        5.550_411e-2,
        0.240_226_5,
        core::f32::consts::LN_2,
        1.0,
    ] {
        p = vfmaq_f32(vdupq_n_f32(c), p, f);
    }
    let e = vshlq_n_s32::<23>(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)));
    vmulq_f32(p, vreinterpretq_f32_s32(e))
}

/// NEON version of `scalar::qk_tile`.
///
/// # Safety
/// The contract of `scalar::qk_tile` holds (NEON is always present on aarch64).
#[target_feature(enable = "neon")]
pub(crate) unsafe fn qk_tile(a: *const f32, d: usize, b: *const f32, s: *mut f32, lds: usize) {
    let mut c = [[vdupq_n_f32(0.0); 4]; MR];
    for x in 0..d {
        // SAFETY: `x < d`: panel row `b[x * NR..][..16]` is readable (caller).
        let bv: [float32x4_t; 4] =
            core::array::from_fn(|j| unsafe { vld1q_f32(b.add(x * NR + 4 * j)) });
        for (r, cr) in c.iter_mut().enumerate() {
            // SAFETY: `x < d`, `r < MR`: `a[x * MR + r]` is readable (caller).
            let ar = unsafe { *a.add(x * MR + r) };
            for j in 0..4 {
                cr[j] = vfmaq_n_f32(cr[j], bv[j], ar);
            }
        }
    }
    for (r, cr) in c.iter().enumerate() {
        for (j, v) in cr.iter().enumerate() {
            // SAFETY: row `r < MR` of `s` is writable for 16 floats (caller).
            unsafe { vst1q_f32(s.add(r * lds + 4 * j), *v) };
        }
    }
}

/// NEON version of `scalar::pv_tile`.
///
/// # Safety
/// The contract of `scalar::pv_tile` holds.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn pv_tile(
    p: *const f32,
    ldp: usize,
    v: *const f32,
    ldv: usize,
    nk: usize,
    o: *mut f32,
    ldo: usize,
) {
    let mut c: [[float32x4_t; 4]; MR] = core::array::from_fn(|r| {
        core::array::from_fn(|j| {
            // SAFETY: row `r < MR` of `o` is readable for 16 floats (caller), `j < 4`.
            unsafe { vld1q_f32(o.add(r * ldo + 4 * j)) }
        })
    });
    for t in 0..nk {
        // SAFETY: `t < nk`: row `t` of `v` is readable for 16 floats (caller).
        let bv: [float32x4_t; 4] =
            core::array::from_fn(|j| unsafe { vld1q_f32(v.add(t * ldv + 4 * j)) });
        for (r, cr) in c.iter_mut().enumerate() {
            // SAFETY: `r < MR`, `t < nk`: readable (caller).
            let pr = unsafe { *p.add(r * ldp + t) };
            for j in 0..4 {
                cr[j] = vfmaq_n_f32(cr[j], bv[j], pr);
            }
        }
    }
    for (r, cr) in c.iter().enumerate() {
        for (j, x) in cr.iter().enumerate() {
            // SAFETY: row `r < MR` of `o` is writable for 16 floats (caller).
            unsafe { vst1q_f32(o.add(r * ldo + 4 * j), *x) };
        }
    }
}

/// NEON version of `scalar::softmax_row`.
///
/// # Safety
/// None beyond NEON being present.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn softmax_row(s: &mut [f32], valid: usize, c: f32, m_old: f32) -> (f32, f32) {
    let (vis, rest) = s.split_at_mut(valid);
    let mut mx = m_old;
    for x in vis.iter_mut() {
        *x *= c;
        mx = mx.max(*x);
    }
    let mv = vdupq_n_f32(mx);
    let mut sv = vdupq_n_f32(0.0);
    let mut chunks = vis.chunks_exact_mut(4);
    for ch in &mut chunks {
        // SAFETY: `ch` is 4 floats.
        unsafe {
            let e = exp2_ps(vsubq_f32(vld1q_f32(ch.as_ptr()), mv));
            vst1q_f32(ch.as_mut_ptr(), e);
            sv = vaddq_f32(sv, e);
        }
    }
    let mut sum = vaddvq_f32(sv);
    for x in chunks.into_remainder() {
        *x = (*x - mx).exp2();
        sum += *x;
    }
    rest.fill(0.0);
    (mx, sum)
}

/// NEON version of `scalar::scale`.
///
/// # Safety
/// None beyond NEON being present.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn scale(x: &mut [f32], a: f32) {
    let mut chunks = x.chunks_exact_mut(4);
    for ch in &mut chunks {
        // SAFETY: `ch` is 4 floats.
        unsafe { vst1q_f32(ch.as_mut_ptr(), vmulq_n_f32(vld1q_f32(ch.as_ptr()), a)) };
    }
    for e in chunks.into_remainder() {
        *e *= a;
    }
}
