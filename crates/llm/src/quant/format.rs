//! ggml's block-quantized weight formats (`ggml-quants.c`): Q4_0, Q4_1 and Q8_0, as the file
//! stores them, with their exact dequantization and ggml's reference quantizers.
//!
//! Every format packs 32 consecutive weights of a row into one block:
//! - **Q4_0** (18 bytes): f16 scale `d`, 16 bytes of nibbles; weight `j < 16` is
//!   `((qs[j] & 15) - 8) * d`, weight `j + 16` is `((qs[j] >> 4) - 8) * d`.
//! - **Q4_1** (20 bytes): f16 `d`, f16 minimum `m`, 16 bytes of nibbles; weight `j` is
//!   `(qs[j] & 15) * d + m`, weight `j + 16` is `(qs[j] >> 4) * d + m`.
//! - **Q8_0** (34 bytes): f16 `d`, 32 signed bytes; weight `j` is `qs[j] * d`.

use crate::safetensors::{f16_to_f32, f32_to_f16};

/// Weights per block, in every supported format.
pub const QK: usize = 32;

/// A block-quantized format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QType {
    /// 4-bit, symmetric (offset 8), one f16 scale per block.
    Q4_0,
    /// 4-bit with an f16 scale and an f16 minimum per block.
    Q4_1,
    /// 8-bit signed, one f16 scale per block.
    Q8_0,
}

impl QType {
    /// Bytes of one block of [`QK`] weights.
    pub fn block_bytes(self) -> usize {
        match self {
            QType::Q4_0 => 18,
            QType::Q4_1 => 20,
            QType::Q8_0 => 34,
        }
    }

    /// The name ggml gives the format.
    pub fn name(self) -> &'static str {
        match self {
            QType::Q4_0 => "Q4_0",
            QType::Q4_1 => "Q4_1",
            QType::Q8_0 => "Q8_0",
        }
    }

    /// Bytes of a row of `cols` weights (`cols` a multiple of [`QK`]).
    pub fn row_bytes(self, cols: usize) -> usize {
        // Saturating: a size no row has fails every length check instead of wrapping.
        (cols / QK).saturating_mul(self.block_bytes())
    }
}

/// `f16` little-endian at `b[i..i + 2]`, widened.
#[inline(always)]
pub(crate) fn f16_at(b: &[u8], i: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[i], b[i + 1]]))
}

/// Dequantizes one block (`block_bytes` bytes) into 32 floats, exactly as the format defines.
#[inline]
pub fn dequantize_block(t: QType, b: &[u8], out: &mut [f32; QK]) {
    match t {
        QType::Q4_0 => {
            let d = f16_at(b, 0);
            for j in 0..16 {
                let q = b[2 + j];
                out[j] = ((q & 15) as i32 - 8) as f32 * d;
                out[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
            }
        }
        QType::Q4_1 => {
            let (d, m) = (f16_at(b, 0), f16_at(b, 2));
            for j in 0..16 {
                let q = b[4 + j];
                out[j] = (q & 15) as f32 * d + m;
                out[j + 16] = (q >> 4) as f32 * d + m;
            }
        }
        QType::Q8_0 => {
            let d = f16_at(b, 0);
            for j in 0..QK {
                out[j] = b[2 + j] as i8 as f32 * d;
            }
        }
    }
}

/// Dequantizes a whole row (`row.len()` a multiple of the block size) into `out`.
pub fn dequantize_row(t: QType, row: &[u8], out: &mut [f32]) {
    let mut tmp = [0f32; QK];
    for (blk, o) in row
        .chunks_exact(t.block_bytes())
        .zip(out.chunks_exact_mut(QK))
    {
        dequantize_block(t, blk, &mut tmp);
        o.copy_from_slice(&tmp);
    }
}

/// Quantizes `x` (`len` a multiple of 32) to `t` the way ggml's reference quantizers do
/// (`quantize_row_*_ref`): for building test files and random quantized weights.
pub fn quantize_row(t: QType, x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(t.row_bytes(x.len()));
    for blk in x.chunks_exact(QK) {
        match t {
            QType::Q4_0 => {
                // The value of largest magnitude maps to -8.
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
            QType::Q4_1 => {
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
            QType::Q8_0 => {
                let amax = blk.iter().fold(0f32, |a, v| a.max(v.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend_from_slice(&f32_to_f16(d).to_le_bytes());
                for &v in blk {
                    out.push(((v * id).round() as i32).clamp(-128, 127) as i8 as u8);
                }
            }
        }
    }
    out
}
