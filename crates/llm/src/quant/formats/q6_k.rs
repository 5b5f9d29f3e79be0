//! **Q6_K** (210 bytes, a super-block of 256 weights in 16 sub-blocks of 16): 128 bytes
//! `ql` of low nibbles, 64 bytes `qh` of 2-bit high parts, 16 signed bytes `sc` of scales,
//! then f16 `d`. Each half of 128 weights reads 64 bytes of `ql`, 32 of `qh` and 8 scales:
//! for `l < 32`, weights `l`, `l + 32`, `l + 64`, `l + 96` take the low nibble of `ql[l]`,
//! of `ql[l + 32]`, the high nibble of `ql[l]`, of `ql[l + 32]`, and bits 0-1, 2-3, 4-5,
//! 6-7 of `qh[l]` above it; each is `(d * sc[s]) * (q - 32)` with `s` its sub-block of 16.

use super::f16_at;

/// Bytes of a super-block.
pub(crate) const BLOCK_BYTES: usize = 210;

/// One super-block (`BLOCK_BYTES` bytes) into 256 floats, exactly as the format defines.
#[inline(always)]
pub(crate) fn dequantize(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 208);
    for half in 0..2 {
        let ql = &b[64 * half..][..64];
        let qh = &b[128 + 32 * half..][..32];
        let sc = &b[192 + 8 * half..][..8];
        let o = &mut out[128 * half..][..128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 15) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            o[l] = d * sc[is] as i8 as f32 * q1 as f32;
            o[l + 32] = d * sc[is + 2] as i8 as f32 * q2 as f32;
            o[l + 64] = d * sc[is + 4] as i8 as f32 * q3 as f32;
            o[l + 96] = d * sc[is + 6] as i8 as f32 * q4 as f32;
        }
    }
}

/// Weights `32 j .. 32 j + 32` (`j < 8`) of a super-block (`BLOCK_BYTES` bytes of `b`) as a
/// [`GroupFormat::Q8_0F32x2`](crate::quant::group_format::GroupFormat::Q8_0F32x2) block (40
/// bytes into `out`): the scales `d * sc` of its two sub-blocks of 16 (exact in f32: an f16
/// times an 8-bit integer, 19 significant bits) and each weight's `q - 32` as a signed byte,
/// so `(q - 32) * (d * sc)` is this format's value bit for bit. The decode kernels read Q6_K
/// this way (`QTensor` repacks it when it packs the groups): 52% more bytes, but an 8-bit
/// group kernel.
#[inline(always)]
pub(crate) fn to_q8_0_f32x2(b: &[u8], j: usize, out: &mut [u8]) {
    let d = f16_at(b, 208);
    let (half, k) = (j / 4, j % 4);
    let ql = &b[64 * half + 32 * (k % 2)..][..32];
    let qh = &b[128 + 32 * half..][..32];
    let sc = &b[192 + 8 * half..][..8];
    for (h, o) in out[..8].chunks_exact_mut(4).enumerate() {
        o.copy_from_slice(&(d * sc[2 * k + h] as i8 as f32).to_le_bytes());
    }
    for l in 0..32 {
        let lo = (ql[l] >> (4 * (k / 2))) & 15;
        let hi = (qh[l] >> (2 * k)) & 3;
        out[8 + l] = ((lo | (hi << 4)) as i8 - 32) as u8;
    }
}
