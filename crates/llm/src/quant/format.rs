//! ggml's block-quantized weight formats, as the file stores them: which there are
//! ([`QType`]), their sizes, their exact dequantization and, where a test or a random model
//! needs one, ggml's reference quantizer. Each format's definition is its file in
//! `quant/formats/`.
//!
//! Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 pack 32 consecutive weights of a row into a block; the
//! K-quants Q4_K, Q5_K and Q6_K pack 256 into a super-block of sub-blocks with their own
//! scales.

use super::formats::{q4_0, q4_1, q4_k, q5_0, q5_1, q5_k, q6_k, q8_0};

pub(crate) use super::formats::f16_at;

/// Weights per block of the 32-weight formats (and per block of `x`'s sums).
pub const QK: usize = 32;

/// Weights per super-block of the K-quants.
pub const QK_K: usize = 256;

/// A block-quantized format (named as ggml names it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)] // ggml's names: Q4_K, not Q4K
pub enum QType {
    /// 4-bit, symmetric (offset 8), one f16 scale per block of 32.
    Q4_0,
    /// 4-bit with an f16 scale and an f16 minimum per block of 32.
    Q4_1,
    /// 5-bit, symmetric (offset 16), one f16 scale per block of 32.
    Q5_0,
    /// 5-bit with an f16 scale and an f16 minimum per block of 32.
    Q5_1,
    /// 8-bit signed, one f16 scale per block of 32.
    Q8_0,
    /// 4-bit super-blocks of 256: 6-bit scales and minimums per 32 under f16 ones.
    Q4_K,
    /// 5-bit super-blocks of 256: 6-bit scales and minimums per 32 under f16 ones.
    Q5_K,
    /// 6-bit super-blocks of 256: 8-bit scales per 16 under an f16 one.
    Q6_K,
}

impl QType {
    /// Every format, in ggml's id order.
    pub const ALL: [QType; 8] = [
        QType::Q4_0,
        QType::Q4_1,
        QType::Q5_0,
        QType::Q5_1,
        QType::Q8_0,
        QType::Q4_K,
        QType::Q5_K,
        QType::Q6_K,
    ];

    /// Weights per block: [`QK`], or [`QK_K`] for the K-quants.
    pub fn block_len(self) -> usize {
        match self {
            QType::Q4_K | QType::Q5_K | QType::Q6_K => QK_K,
            _ => QK,
        }
    }

    /// Bytes of one block of [`QType::block_len`] weights.
    pub fn block_bytes(self) -> usize {
        match self {
            QType::Q4_0 => q4_0::BLOCK_BYTES,
            QType::Q4_1 => q4_1::BLOCK_BYTES,
            QType::Q5_0 => q5_0::BLOCK_BYTES,
            QType::Q5_1 => q5_1::BLOCK_BYTES,
            QType::Q8_0 => q8_0::BLOCK_BYTES,
            QType::Q4_K => q4_k::BLOCK_BYTES,
            QType::Q5_K => q5_k::BLOCK_BYTES,
            QType::Q6_K => q6_k::BLOCK_BYTES,
        }
    }

    /// The name ggml gives the format.
    pub fn name(self) -> &'static str {
        match self {
            QType::Q4_0 => "Q4_0",
            QType::Q4_1 => "Q4_1",
            QType::Q5_0 => "Q5_0",
            QType::Q5_1 => "Q5_1",
            QType::Q8_0 => "Q8_0",
            QType::Q4_K => "Q4_K",
            QType::Q5_K => "Q5_K",
            QType::Q6_K => "Q6_K",
        }
    }

    /// Bytes of a row of `cols` weights (`cols` a multiple of [`QType::block_len`];
    /// saturating: a size no row has fails every length check instead of wrapping).
    pub fn row_bytes(self, cols: usize) -> usize {
        (cols / self.block_len()).saturating_mul(self.block_bytes())
    }
}

/// Dequantizes one block (`t.block_bytes()` bytes) into `out` (`t.block_len()` floats),
/// exactly as the format defines.
#[inline(always)]
pub fn dequantize_block(t: QType, b: &[u8], out: &mut [f32]) {
    match t {
        QType::Q4_0 => q4_0::dequantize(b, out),
        QType::Q4_1 => q4_1::dequantize(b, out),
        QType::Q5_0 => q5_0::dequantize(b, out),
        QType::Q5_1 => q5_1::dequantize(b, out),
        QType::Q8_0 => q8_0::dequantize(b, out),
        QType::Q4_K => q4_k::dequantize(b, out),
        QType::Q5_K => q5_k::dequantize(b, out),
        QType::Q6_K => q6_k::dequantize(b, out),
    }
}

/// Dequantizes a whole row (`row.len()` a multiple of the block size) into `out`.
pub fn dequantize_row(t: QType, row: &[u8], out: &mut [f32]) {
    for (blk, o) in row
        .chunks_exact(t.block_bytes())
        .zip(out.chunks_exact_mut(t.block_len()))
    {
        dequantize_block(t, blk, o);
    }
}

/// Quantizes `x` (`len` a multiple of 32) to `t` the way ggml's reference quantizers do
/// (`quantize_row_*_ref`): for building test files and random quantized weights. `None`
/// for the K-quants, which have no quantizer here (tests write their bytes directly).
pub fn quantize_row(t: QType, x: &[f32]) -> Option<Vec<u8>> {
    let quantize: fn(&[f32], &mut Vec<u8>) = match t {
        QType::Q4_0 => q4_0::quantize,
        QType::Q4_1 => q4_1::quantize,
        QType::Q5_0 => q5_0::quantize,
        QType::Q5_1 => q5_1::quantize,
        QType::Q8_0 => q8_0::quantize,
        QType::Q4_K | QType::Q5_K | QType::Q6_K => return None,
    };
    let mut out = Vec::with_capacity(t.row_bytes(x.len()));
    for blk in x.chunks_exact(QK) {
        quantize(blk, &mut out);
    }
    Some(out)
}
