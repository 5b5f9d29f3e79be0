//! The blocks of 32 weights the group layout ([`super::groups`]) holds: five of ggml's
//! formats as the file has them (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), and three with f32 scales
//! that the K-quants are repacked into at load (Q4_K's sub-blocks as
//! [`GroupFormat::Q4_1F32`], Q5_K's as [`GroupFormat::Q5_1F32`], Q6_K's as
//! [`GroupFormat::Q8_0F32x2`]), so they run the 4-, 5- and 8-bit group kernels.
//!
//! A K-quant's scale of a sub-block is a product of its f16 super-block scale and a small
//! integer: up to 11 + 8 significant bits, exact in f32 but not in f16. Held in f32, the
//! repacked block dequantizes to the file's values bit for bit (each format's `to_*`
//! function in `quant/formats/` says why).
//!
//! Every block is a header of words of the same width (its scales, and for the 5-bit
//! formats `qh`, their fifth bits: two 16-bit halves, or one 32-bit word) and then its quants; the group layout keeps
//! each header word of 16 rows together and the quants byte position by byte position.

use crate::quant::format::{f16_at, QType, QK};
use crate::quant::formats::{q4_0, q4_1, q5_0, q5_1, q8_0};

/// The format of a block of 32 weights in the group layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)] // ggml's names: Q4_1, not Q41
pub enum GroupFormat {
    /// ggml's Q4_0 (18 bytes): f16 `d`, 16 bytes of nibbles; `(q - 8) * d`.
    Q4_0,
    /// ggml's Q4_1 (20 bytes): f16 `d`, f16 `m`, 16 bytes of nibbles; `q * d + m`.
    Q4_1,
    /// ggml's Q5_0 (22 bytes): f16 `d`, then `qh` (fifth bits, little-endian `u32`) as two
    /// 16-bit words (weights 0..16, 16..32), 16 bytes of nibbles; `(q - 16) * d`.
    Q5_0,
    /// ggml's Q5_1 (24 bytes): f16 `d`, f16 `m`, `qh` as Q5_0's, 16 bytes of nibbles; `q * d
    /// + m`.
    Q5_1,
    /// ggml's Q8_0 (34 bytes): f16 `d`, 32 signed bytes; `q * d`.
    Q8_0,
    /// Q4_1 with f32 `d` and `m` (24 bytes): weight `j` is `(qs[j] & 15) * d + m`, weight
    /// `j + 16` is `(qs[j] >> 4) * d + m`. Q4_K's sub-blocks.
    Q4_1F32,
    /// Q5_1 with f32 `d` and `m` (28 bytes): f32 `d`, f32 `m`, `qh` as one little-endian
    /// `u32` word, 16 bytes of nibbles; weight `j` is `q * d + m` with `q` its nibble (as
    /// Q4_1F32's) plus 16 times bit `j` of `qh`. Q5_K's sub-blocks.
    Q5_1F32,
    /// Q8_0 with an f32 scale per half (40 bytes): f32 `d0`, f32 `d1`, 32 signed bytes;
    /// weight `j` is `qs[j] * d0` for `j < 16`, `qs[j] * d1` after. Q6_K's sub-blocks of 16,
    /// two to a block.
    Q8_0F32x2,
}

impl GroupFormat {
    /// The format a file's blocks of `t` are held in.
    pub fn of(t: QType) -> GroupFormat {
        match t {
            QType::Q4_0 => GroupFormat::Q4_0,
            QType::Q4_1 => GroupFormat::Q4_1,
            QType::Q5_0 => GroupFormat::Q5_0,
            QType::Q5_1 => GroupFormat::Q5_1,
            QType::Q8_0 => GroupFormat::Q8_0,
            QType::Q4_K => GroupFormat::Q4_1F32,
            QType::Q5_K => GroupFormat::Q5_1F32,
            QType::Q6_K => GroupFormat::Q8_0F32x2,
        }
    }

    /// Bytes of a block of 32 weights.
    pub const fn block_bytes(self) -> usize {
        self.header_bytes() + self.quant_bytes()
    }

    /// Words before the quants: the scale; the minimum or the second scale; Q5's two
    /// halves of `qh` last.
    pub const fn header_words(self) -> usize {
        match self {
            GroupFormat::Q4_0 | GroupFormat::Q8_0 => 1,
            GroupFormat::Q4_1 | GroupFormat::Q4_1F32 | GroupFormat::Q8_0F32x2 => 2,
            GroupFormat::Q5_0 | GroupFormat::Q5_1F32 => 3,
            GroupFormat::Q5_1 => 4,
        }
    }

    /// Bytes of one header word: 2 (f16, or 16 fifth bits) or 4 (f32).
    pub const fn word_bytes(self) -> usize {
        match self {
            GroupFormat::Q4_0
            | GroupFormat::Q4_1
            | GroupFormat::Q5_0
            | GroupFormat::Q5_1
            | GroupFormat::Q8_0 => 2,
            GroupFormat::Q4_1F32 | GroupFormat::Q5_1F32 | GroupFormat::Q8_0F32x2 => 4,
        }
    }

    /// Bytes of the header (the scale words).
    pub const fn header_bytes(self) -> usize {
        self.header_words() * self.word_bytes()
    }

    /// Bytes of the quants: 16 (nibbles) or 32 (signed bytes).
    pub const fn quant_bytes(self) -> usize {
        if self.bits() == 8 {
            QK
        } else {
            QK / 2
        }
    }

    /// Bits of a quant: 4, 5 (a nibble and a bit of `qh`) or 8.
    pub const fn bits(self) -> u32 {
        match self {
            GroupFormat::Q4_0 | GroupFormat::Q4_1 | GroupFormat::Q4_1F32 => 4,
            GroupFormat::Q5_0 | GroupFormat::Q5_1 | GroupFormat::Q5_1F32 => 5,
            GroupFormat::Q8_0 | GroupFormat::Q8_0F32x2 => 8,
        }
    }

    /// Whether the quants are nibbles alone (the 4-bit formats, which the int8-activation
    /// kernels also read).
    pub const fn nibbles(self) -> bool {
        self.bits() == 4
    }
}

/// `f32` little-endian at `b[i..i + 4]`.
#[inline(always)]
fn f32_at(b: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// One block of `f` (`f.block_bytes()` bytes) into 32 floats, exactly as the format
/// defines.
#[inline(always)]
pub fn dequantize_block(f: GroupFormat, b: &[u8], out: &mut [f32]) {
    match f {
        GroupFormat::Q4_0 => q4_0::dequantize(b, out),
        GroupFormat::Q4_1 => q4_1::dequantize(b, out),
        GroupFormat::Q5_0 => q5_0::dequantize(b, out),
        GroupFormat::Q5_1 => q5_1::dequantize(b, out),
        GroupFormat::Q8_0 => q8_0::dequantize(b, out),
        GroupFormat::Q4_1F32 => {
            let (d, m) = (f32_at(b, 0), f32_at(b, 4));
            for j in 0..QK / 2 {
                let q = b[8 + j];
                out[j] = (q & 15) as f32 * d + m;
                out[j + 16] = (q >> 4) as f32 * d + m;
            }
        }
        GroupFormat::Q5_1F32 => {
            let (d, m) = (f32_at(b, 0), f32_at(b, 4));
            let qh = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
            for j in 0..QK / 2 {
                let (lo, hi) = (b[12 + j] & 15, b[12 + j] >> 4);
                let lo = lo | (((qh >> j) & 1) << 4) as u8;
                let hi = hi | (((qh >> (j + 16)) & 1) << 4) as u8;
                out[j] = lo as f32 * d + m;
                out[j + 16] = hi as f32 * d + m;
            }
        }
        GroupFormat::Q8_0F32x2 => {
            let d = [f32_at(b, 0), f32_at(b, 4)];
            for j in 0..QK {
                out[j] = b[8 + j] as i8 as f32 * d[j / 16];
            }
        }
    }
}

/// Header word `w` of a block `b` of `f`: its scale (`w = 0`), minimum or second scale, as
/// f32 (widened from f16, or as stored).
#[inline(always)]
pub(crate) fn scale_word(f: GroupFormat, b: &[u8], w: usize) -> f32 {
    if f.word_bytes() == 4 {
        f32_at(b, 4 * w)
    } else {
        f16_at(b, 2 * w)
    }
}
