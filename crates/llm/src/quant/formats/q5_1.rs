//! **Q5_1** (24 bytes, 32 weights): f16 `d`, f16 minimum `m`, a little-endian `u32` `qh`
//! of fifth bits, 16 bytes of nibbles. Weight `j < 16` is `((qs[j] & 15) | bit j of qh <<
//! 4) * d + m`, weight `j + 16` is `((qs[j] >> 4) | bit j + 16 of qh << 4) * d + m`.

use super::f16_at;
use crate::safetensors::f32_to_f16;

/// Bytes of a block.
pub(crate) const BLOCK_BYTES: usize = 24;

/// The block's 32 quants (`0..32`) in weight order.
#[inline(always)]
pub(crate) fn quants(b: &[u8]) -> [u8; 32] {
    // The layout after the minimum is Q5_0's after its scale.
    super::q5_0::quants(&b[2..])
}

/// One block (`BLOCK_BYTES` bytes) into 32 floats, exactly as the format defines.
#[inline(always)]
pub(crate) fn dequantize(b: &[u8], out: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    for (o, q) in out.iter_mut().zip(quants(b)) {
        *o = q as f32 * d + m;
    }
}

/// ggml's `quantize_row_q5_1_ref` of one block of 32.
pub(crate) fn quantize(blk: &[f32], out: &mut Vec<u8>) {
    let min = blk.iter().copied().fold(f32::INFINITY, f32::min);
    let max = blk.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let d = (max - min) / 31.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out.extend_from_slice(&f32_to_f16(d).to_le_bytes());
    out.extend_from_slice(&f32_to_f16(min).to_le_bytes());
    let mut qh = 0u32;
    let mut qs = [0u8; 16];
    for j in 0..16 {
        let q0 = (((blk[j] - min) * id + 0.5) as i32).min(31) as u32;
        let q1 = (((blk[j + 16] - min) * id + 0.5) as i32).min(31) as u32;
        qs[j] = (q0 & 15) as u8 | (((q1 & 15) as u8) << 4);
        qh |= ((q0 & 0x10) >> 4) << j;
        qh |= ((q1 & 0x10) >> 4) << (j + 16);
    }
    out.extend_from_slice(&qh.to_le_bytes());
    out.extend_from_slice(&qs);
}
