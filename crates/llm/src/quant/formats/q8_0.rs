//! **Q8_0** (34 bytes, 32 weights): f16 `d`, 32 signed bytes; weight `j` is `qs[j] * d`.

use super::f16_at;
use crate::safetensors::f32_to_f16;

/// Bytes of a block.
pub(crate) const BLOCK_BYTES: usize = 34;

/// One block (`BLOCK_BYTES` bytes) into 32 floats, exactly as the format defines.
#[inline(always)]
pub(crate) fn dequantize(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 0);
    for j in 0..32 {
        out[j] = b[2 + j] as i8 as f32 * d;
    }
}

/// ggml's `quantize_row_q8_0_ref` of one block of 32.
pub(crate) fn quantize(blk: &[f32], out: &mut Vec<u8>) {
    let amax = blk.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out.extend_from_slice(&f32_to_f16(d).to_le_bytes());
    for &v in blk {
        out.push(((v * id).round() as i32).clamp(-128, 127) as i8 as u8);
    }
}
