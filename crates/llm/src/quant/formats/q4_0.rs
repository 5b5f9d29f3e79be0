//! **Q4_0** (18 bytes, 32 weights): f16 scale `d`, 16 bytes of nibbles; weight `j < 16` is
//! `((qs[j] & 15) - 8) * d`, weight `j + 16` is `((qs[j] >> 4) - 8) * d`.

use super::f16_at;
use crate::safetensors::f32_to_f16;

/// Bytes of a block.
pub(crate) const BLOCK_BYTES: usize = 18;

/// One block (`BLOCK_BYTES` bytes) into 32 floats, exactly as the format defines.
#[inline(always)]
pub(crate) fn dequantize(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for j in 0..16 {
        let q = b[2 + j];
        out[j] = ((q & 15) as i32 - 8) as f32 * d;
        out[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
    }
}

/// ggml's `quantize_row_q4_0_ref` of one block of 32: the value of largest magnitude maps
/// to -8.
pub(crate) fn quantize(blk: &[f32], out: &mut Vec<u8>) {
    let mut amax = 0f32;
    let mut max = 0f32;
    for &v in blk {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out.extend_from_slice(&f32_to_f16(d).to_le_bytes());
    for j in 0..16 {
        let q0 = ((blk[j] * id + 8.5) as i32).min(15) as u8;
        let q1 = ((blk[j + 16] * id + 8.5) as i32).min(15) as u8;
        out.push(q0 | (q1 << 4));
    }
}
