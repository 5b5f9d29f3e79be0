//! **Q4_K** (144 bytes, a super-block of 256 weights in 8 sub-blocks of 32): f16 `d`, f16
//! `dmin`, 12 bytes of packed 6-bit scales `sc` and minimums `m` (one pair a sub-block,
//! [`super::k_scale_min`]), 128 bytes of nibbles. Sub-blocks `2i` and `2i + 1` share the
//! 32 bytes `qs[32 i ..]`: weight `l` of sub-block `2i` is `(d * sc) * (qs & 15) - dmin *
//! m`, of sub-block `2i + 1` the same with `qs >> 4` and its own `sc`, `m` (each product
//! rounded to f32, then the difference).

use super::{f16_at, k_scale_min};

/// Bytes of a super-block.
pub(crate) const BLOCK_BYTES: usize = 144;

/// One super-block (`BLOCK_BYTES` bytes) into 256 floats, exactly as the format defines.
#[inline(always)]
pub(crate) fn dequantize(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..16];
    let qs = &b[16..144];
    for i in 0..4 {
        let q = &qs[32 * i..][..32];
        let (sc0, m0) = k_scale_min(2 * i, scales);
        let (sc1, m1) = k_scale_min(2 * i + 1, scales);
        let (d0, min0) = (d * sc0 as f32, dmin * m0 as f32);
        let (d1, min1) = (d * sc1 as f32, dmin * m1 as f32);
        let o = &mut out[64 * i..][..64];
        for l in 0..32 {
            o[l] = d0 * (q[l] & 15) as f32 - min0;
            o[32 + l] = d1 * (q[l] >> 4) as f32 - min1;
        }
    }
}

/// `row . x` for a row of whole super-blocks (`row.len()` a multiple of [`BLOCK_BYTES`],
/// `x` at least 256 floats for each), with f32 `x`: per sub-block, `d * sc` times the
/// FMA'd `q . x` of its nibbles, less `dmin * m` times its sum of `x` (the definition's
/// value, summed in another order). NaN if `x` is short.
#[inline(always)]
pub(crate) fn dot<S: kernel_simd::Simd>(s: S, row: &[u8], x: &[f32]) -> f32 {
    let l = S::LANES;
    let blocks = row.len() / BLOCK_BYTES;
    if x.len() < blocks * 256 || l > 32 {
        return f32::NAN;
    }
    let (mut total, mut off) = (s.zero(), s.zero());
    for (b, xb) in row.chunks_exact(BLOCK_BYTES).zip(x.chunks_exact(256)) {
        let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
        let scales = &b[4..16];
        for i in 0..4 {
            let (sc0, m0) = k_scale_min(2 * i, scales);
            let (sc1, m1) = k_scale_min(2 * i + 1, scales);
            let (mut qx0, mut qx1) = (s.zero(), s.zero());
            let (mut xs0, mut xs1) = (s.zero(), s.zero());
            for c in (0..32).step_by(l) {
                // SAFETY: `b` has 144 bytes and `16 + 32 i + c + LANES <= 144`; `xb` has 256
                // floats and `64 i + 32 + c + LANES <= 256` (`LANES` divides 32).
                unsafe {
                    let (lo, hi) = s.load_nibbles_f32(b.as_ptr().add(16 + 32 * i + c));
                    let x0 = s.load(xb.as_ptr().add(64 * i + c));
                    let x1 = s.load(xb.as_ptr().add(64 * i + 32 + c));
                    qx0 = s.fma(lo, x0, qx0);
                    qx1 = s.fma(hi, x1, qx1);
                    xs0 = s.add(xs0, x0);
                    xs1 = s.add(xs1, x1);
                }
            }
            total = s.fma(s.splat(d * sc0 as f32), qx0, total);
            total = s.fma(s.splat(d * sc1 as f32), qx1, total);
            off = s.fma(s.splat(dmin * m0 as f32), xs0, off);
            off = s.fma(s.splat(dmin * m1 as f32), xs1, off);
        }
    }
    s.reduce_sum(s.sub(total, off))
}
