//! **Q5_K** (176 bytes, a super-block of 256 weights in 8 sub-blocks of 32): f16 `d`, f16
//! `dmin`, 12 bytes of packed 6-bit scales and minimums (as Q4_K's), 32 bytes `qh` of fifth
//! bits, 128 bytes of nibbles. Sub-blocks `2i` and `2i + 1` share `qs[32 i ..]` (low and
//! high nibbles); weight `l`'s fifth bit is bit `2i` (sub-block `2i`) or `2i + 1` of
//! `qh[l]`. A weight is `(d * sc) * q - dmin * m`, rounded as Q4_K's.

use super::{f16_at, k_scale_min};

/// Bytes of a super-block.
pub(crate) const BLOCK_BYTES: usize = 176;

/// One super-block (`BLOCK_BYTES` bytes) into 256 floats, exactly as the format defines.
#[inline(always)]
pub(crate) fn dequantize(b: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for i in 0..4 {
        let q = &qs[32 * i..][..32];
        let (sc0, m0) = k_scale_min(2 * i, scales);
        let (sc1, m1) = k_scale_min(2 * i + 1, scales);
        let (d0, min0) = (d * sc0 as f32, dmin * m0 as f32);
        let (d1, min1) = (d * sc1 as f32, dmin * m1 as f32);
        let o = &mut out[64 * i..][..64];
        for l in 0..32 {
            let h0 = ((qh[l] >> (2 * i)) & 1) << 4;
            let h1 = ((qh[l] >> (2 * i + 1)) & 1) << 4;
            o[l] = d0 * ((q[l] & 15) | h0) as f32 - min0;
            o[32 + l] = d1 * ((q[l] >> 4) | h1) as f32 - min1;
        }
    }
}

/// `row . x` for a row of whole super-blocks (`row.len()` a multiple of [`BLOCK_BYTES`],
/// `x` at least 256 floats for each), with f32 `x`: as Q4_K's, each weight's fifth bit
/// picked out of `qh` with its sub-block's mask and weighted 16 (exact: small integers).
/// NaN if `x` is short.
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
            // Sub-block `2i`'s fifth bits are bit `2i` of `qh[l]`, `2i + 1`'s the next.
            let (bit0, bit1) = (s.splat_i32(1 << (2 * i)), s.splat_i32(2 << (2 * i)));
            let w0 = s.splat(16.0 / (1 << (2 * i)) as f32);
            let w1 = s.splat(16.0 / (2 << (2 * i)) as f32);
            let (mut qx0, mut qx1) = (s.zero(), s.zero());
            let (mut xs0, mut xs1) = (s.zero(), s.zero());
            for c in (0..32).step_by(l) {
                // SAFETY: `b` has 176 bytes: `qh` reads `16 + c + LANES <= 48`, `qs` reads
                // `48 + 32 i + c + LANES <= 176`; `xb` has 256 floats and `64 i + 32 + c +
                // LANES <= 256` (`LANES` divides 32).
                unsafe {
                    let (lo, hi) = s.load_nibbles_f32(b.as_ptr().add(48 + 32 * i + c));
                    let qh = s.load_u8(b.as_ptr().add(16 + c));
                    let lo = s.fma(s.i32_to_f32(s.and_i32(qh, bit0)), w0, lo);
                    let hi = s.fma(s.i32_to_f32(s.and_i32(qh, bit1)), w1, hi);
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
