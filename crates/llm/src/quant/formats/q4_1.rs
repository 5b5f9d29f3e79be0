//! **Q4_1** (20 bytes, 32 weights): f16 `d`, f16 minimum `m`, 16 bytes of nibbles; weight
//! `j` is `(qs[j] & 15) * d + m`, weight `j + 16` is `(qs[j] >> 4) * d + m`.

use super::f16_at;
use crate::safetensors::f32_to_f16;

/// Bytes of a block.
pub(crate) const BLOCK_BYTES: usize = 20;

/// One block (`BLOCK_BYTES` bytes) into 32 floats, exactly as the format defines.
#[inline(always)]
pub(crate) fn dequantize(b: &[u8], out: &mut [f32]) {
    let (d, m) = (f16_at(b, 0), f16_at(b, 2));
    for j in 0..16 {
        let q = b[4 + j];
        out[j] = (q & 15) as f32 * d + m;
        out[j + 16] = (q >> 4) as f32 * d + m;
    }
}

/// ggml's `quantize_row_q4_1_ref` of one block of 32.
pub(crate) fn quantize(blk: &[f32], out: &mut Vec<u8>) {
    let min = blk.iter().copied().fold(f32::INFINITY, f32::min);
    let max = blk.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let d = (max - min) / 15.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out.extend_from_slice(&f32_to_f16(d).to_le_bytes());
    out.extend_from_slice(&f32_to_f16(min).to_le_bytes());
    for j in 0..16 {
        let q0 = (((blk[j] - min) * id + 0.5) as i32).min(15) as u8;
        let q1 = (((blk[j + 16] - min) * id + 0.5) as i32).min(15) as u8;
        out.push(q0 | (q1 << 4));
    }
}
