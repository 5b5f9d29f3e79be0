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

/// Sub-block `j < 8` of a super-block (`BLOCK_BYTES` bytes of `b`) as a
/// [`GroupFormat::Q4_1F32`](crate::quant::group_format::GroupFormat::Q4_1F32) block (24
/// bytes into `out`): `d = d * sc`, `m = -(dmin * m)`, and its 32 nibbles in Q4_1's order
/// (weight `l` low in byte `l`, weight `l + 16` high). The products are exact in f32 (an f16
/// times a 6-bit integer: 17 significant bits), and `q * d + m` rounds as `(d * sc) * q -
/// dmin * m` does (a difference is the sum with the negation), so the block dequantizes to
/// this format's values bit for bit. The decode kernels read Q4_K this way (`QTensor`
/// repacks it when it packs the groups): 33% more bytes, but Q4_1's group kernel.
#[inline(always)]
pub(crate) fn to_q4_1_f32(b: &[u8], j: usize, out: &mut [u8]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (sc, m) = k_scale_min(j, &b[4..16]);
    out[..4].copy_from_slice(&(d * sc as f32).to_le_bytes());
    out[4..8].copy_from_slice(&(-(dmin * m as f32)).to_le_bytes());
    let q = &b[16 + 32 * (j / 2)..][..32];
    let shift = 4 * (j % 2);
    for l in 0..16 {
        let (lo, hi) = ((q[l] >> shift) & 15, (q[l + 16] >> shift) & 15);
        out[8 + l] = lo | (hi << 4);
    }
}
