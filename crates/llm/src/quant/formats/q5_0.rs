//! **Q5_0** (22 bytes, 32 weights): f16 `d`, a little-endian `u32` `qh` of fifth bits, 16
//! bytes of nibbles. Weight `j < 16` is `(((qs[j] & 15) | bit j of qh << 4) - 16) * d`,
//! weight `j + 16` is `(((qs[j] >> 4) | bit j + 16 of qh << 4) - 16) * d`.

use super::f16_at;
use crate::safetensors::f32_to_f16;

/// Bytes of a block.
pub(crate) const BLOCK_BYTES: usize = 22;

/// The block's 32 quants (`0..32`) in weight order.
#[inline(always)]
pub(crate) fn quants(b: &[u8]) -> [u8; 32] {
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    let mut q = [0u8; 32];
    for j in 0..16 {
        let hi0 = ((qh >> j) << 4) as u8 & 0x10;
        let hi1 = (qh >> (j + 12)) as u8 & 0x10;
        q[j] = (b[6 + j] & 15) | hi0;
        q[j + 16] = (b[6 + j] >> 4) | hi1;
    }
    q
}

/// One block (`BLOCK_BYTES` bytes) into 32 floats, exactly as the format defines.
#[inline(always)]
pub(crate) fn dequantize(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for (o, q) in out.iter_mut().zip(quants(b)) {
        *o = (q as i32 - 16) as f32 * d;
    }
}

/// ggml's `quantize_row_q5_0_ref` of one block of 32: the value of largest magnitude maps
/// to -16.
pub(crate) fn quantize(blk: &[f32], out: &mut Vec<u8>) {
    let mut amax = 0f32;
    let mut max = 0f32;
    for &v in blk {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -16.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out.extend_from_slice(&f32_to_f16(d).to_le_bytes());
    let mut qh = 0u32;
    let mut qs = [0u8; 16];
    for j in 0..16 {
        let q0 = ((blk[j] * id + 16.5) as i32).min(31) as u32;
        let q1 = ((blk[j + 16] * id + 16.5) as i32).min(31) as u32;
        qs[j] = (q0 & 15) as u8 | (((q1 & 15) as u8) << 4);
        qh |= ((q0 & 0x10) >> 4) << j;
        qh |= ((q1 & 0x10) >> 4) << (j + 16);
    }
    out.extend_from_slice(&qh.to_le_bytes());
    out.extend_from_slice(&qs);
}
