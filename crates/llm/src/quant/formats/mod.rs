//! One file per ggml block format (`ggml-common.h` lays the blocks out, `ggml-quants.c`'s
//! `dequantize_row_*` defines their values): each gives its block's bytes and its exact
//! dequantization, and the formats a test or a random model writes, a reference quantizer.
//! Adding a format is adding a file here and its arm in [`super::format::QType`].

pub(crate) mod q4_0;
pub(crate) mod q4_1;
pub(crate) mod q4_k;
pub(crate) mod q5_0;
pub(crate) mod q5_1;
pub(crate) mod q5_k;
pub(crate) mod q6_k;
pub(crate) mod q8_0;

use crate::safetensors::f16_to_f32;

/// `f16` little-endian at `b[i..i + 2]`, widened.
#[inline(always)]
pub(crate) fn f16_at(b: &[u8], i: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[i], b[i + 1]]))
}

/// The 6-bit scale and minimum of sub-block `j < 8` of a Q4_K / Q5_K super-block, from its
/// 12 packed bytes `q` (ggml's `get_scale_min_k4`): sub-blocks 0..4 keep theirs in the low
/// 6 bits of `q[j]` and `q[j + 4]`; sub-blocks 4..8 in the nibbles of `q[j + 4]` with their
/// top 2 bits in the top bits of `q[j - 4]` and `q[j]`.
#[inline(always)]
pub(crate) fn k_scale_min(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}
