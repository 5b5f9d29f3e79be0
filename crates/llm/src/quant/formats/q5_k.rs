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

/// Sub-block `j < 8` of a super-block (`BLOCK_BYTES` bytes of `b`) as a
/// [`GroupFormat::Q5_1F32`](crate::quant::group_format::GroupFormat::Q5_1F32) block (28
/// bytes into `out`): `d = d * sc`, `m = -(dmin * m)` (exact in f32, and rounded as this
/// format rounds, as Q4_K's `to_q4_1_f32` says), its 32 fifth bits as a `u32` (weight `l`'s
/// at bit `l`), and its 32 nibbles in Q4_1's order. The decode kernels read Q5_K this way
/// (`QTensor` repacks it when it packs the groups): 27% more bytes, but a group kernel.
#[inline(always)]
pub(crate) fn to_q5_1_f32(b: &[u8], j: usize, out: &mut [u8]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (sc, m) = k_scale_min(j, &b[4..16]);
    out[..4].copy_from_slice(&(d * sc as f32).to_le_bytes());
    out[4..8].copy_from_slice(&(-(dmin * m as f32)).to_le_bytes());
    let qh = &b[16..48];
    let bits = (0..32).fold(0u32, |acc, l| acc | ((u32::from(qh[l]) >> j) & 1) << l);
    out[8..12].copy_from_slice(&bits.to_le_bytes());
    let q = &b[48 + 32 * (j / 2)..][..32];
    let shift = 4 * (j % 2);
    for l in 0..16 {
        let (lo, hi) = ((q[l] >> shift) & 15, (q[l + 16] >> shift) & 15);
        out[12 + l] = lo | (hi << 4);
    }
}
