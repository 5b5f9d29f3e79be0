//! Whole quantized blocks of the group formats ([`crate::quant::group_format`]) dequantized
//! with SIMD, exactly as each format defines them: prefill's widening of weight rows (through
//! [`crate::quant::groups::RowGroups::dequantize_rows`]). One body over `kernel_simd::Simd`,
//! instantiated for the portable, AVX2, AVX-512 and NEON levels.

use kernel_simd::{load_nibbles, Simd};

use crate::quant::format::QK;
use crate::quant::group_format::{scale_word, GroupFormat};

/// `1 << i` in lane `i` (a lane's fifth bit, once `qh` is shifted to the vector's first
/// weight), and `16 / (1 << i)`: the bit's value in a quant, exactly.
const LANE_BIT: [i32; 16] = [
    1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768,
];
const SIXTEEN_OVER_BIT: [f32; 16] = [
    16.0,
    8.0,
    4.0,
    2.0,
    1.0,
    0.5,
    0.25,
    0.125,
    0.0625,
    0.03125,
    0.015625,
    0.0078125,
    0.00390625,
    0.001953125,
    0.0009765625,
    0.00048828125,
];

/// `blocks` (whole blocks of `f`, as [`super::group_format`] lays them out) dequantized,
/// block `i` into `out[i * stride ..][..32]`, exactly as
/// [`dequantize_block`](crate::quant::group_format::dequantize_block) defines the format (a
/// product and a sum per weight, rounded as the definition rounds them). Does nothing if
/// `out` cannot hold them (the callers size it).
#[inline(always)]
fn widen_blocks_body<S: Simd>(s: S, f: GroupFormat, blocks: &[u8], out: &mut [f32], stride: usize) {
    let (l, bb, q0) = (S::LANES, f.block_bytes(), f.header_bytes());
    let n = blocks.len() / bb;
    if n == 0 || l > QK / 2 || out.len() < (n - 1) * stride + QK {
        return;
    }
    for (i, blk) in blocks.chunks_exact(bb).enumerate() {
        let o = &mut out[i * stride..][..QK];
        let d = s.splat(scale_word(f, blk, 0));
        let (o, q) = (o.as_mut_ptr(), blk.as_ptr());
        match f {
            GroupFormat::Q4_0 | GroupFormat::Q4_1 | GroupFormat::Q4_1F32 => {
                let with_min = f != GroupFormat::Q4_0;
                let m = if with_min { scale_word(f, blk, 1) } else { 0.0 };
                let (m, off) = (s.splat(m), s.splat_i32(if with_min { 0 } else { 8 }));
                // `q * d + m` as two roundings, as the definition computes it.
                let w = |q| {
                    let w = s.mul(s.i32_to_f32(s.sub_i32(q, off)), d);
                    if with_min {
                        s.add(w, m)
                    } else {
                        w
                    }
                };
                for c in (0..QK / 2).step_by(l) {
                    // SAFETY: `blk` has `q0 + 16` bytes and `c + l <= 16`; `o` has 32
                    // floats and `16 + c + l <= 32`.
                    unsafe {
                        let (lo, hi) = load_nibbles(s, q.add(q0 + c));
                        s.store(o.add(c), w(lo));
                        s.store(o.add(16 + c), w(hi));
                    }
                }
            }
            GroupFormat::Q5_0 | GroupFormat::Q5_1 | GroupFormat::Q5_1F32 => {
                let with_min = f != GroupFormat::Q5_0;
                let m = if with_min { scale_word(f, blk, 1) } else { 0.0 };
                let (m, off) = (s.splat(m), s.splat_i32(if with_min { 0 } else { 16 }));
                // `qh`, the header's last 4 bytes.
                let qh = u32::from_le_bytes([blk[q0 - 4], blk[q0 - 3], blk[q0 - 2], blk[q0 - 1]]);
                // SAFETY: the tables hold 16 >= LANES elements.
                let (bit, sixteen) = unsafe {
                    (
                        s.load_i32(LANE_BIT.as_ptr()),
                        s.load(SIXTEEN_OVER_BIT.as_ptr()),
                    )
                };
                // The quant (nibble, plus 16 if its bit of `qh` from `qh >> from` is set,
                // less the offset: a small integer, exact in f32), then `q * d + m` as two
                // roundings, as the definition computes it.
                let w = |nib, from: usize| {
                    let b = s.and_i32(s.splat_i32((qh >> from) as i32), bit);
                    let q = s.fma(s.i32_to_f32(b), sixteen, s.i32_to_f32(s.sub_i32(nib, off)));
                    let w = s.mul(q, d);
                    if with_min {
                        s.add(w, m)
                    } else {
                        w
                    }
                };
                for c in (0..QK / 2).step_by(l) {
                    // SAFETY: `blk` has `q0 + 16` bytes and `c + l <= 16`; `o` has 32
                    // floats and `16 + c + l <= 32`.
                    unsafe {
                        let (lo, hi) = load_nibbles(s, q.add(q0 + c));
                        s.store(o.add(c), w(lo, c));
                        s.store(o.add(16 + c), w(hi, 16 + c));
                    }
                }
            }
            GroupFormat::Q8_0 | GroupFormat::Q8_0F32x2 => {
                // Q8_0F32x2's second half has its own scale (`l <= 16`: a vector lies in one
                // half).
                let d1 = match f {
                    GroupFormat::Q8_0F32x2 => s.splat(scale_word(f, blk, 1)),
                    _ => d,
                };
                for c in (0..QK).step_by(l) {
                    // SAFETY: `blk` has `q0 + 32` bytes and `c + l <= 32`; `o` has 32 floats.
                    unsafe {
                        let w = s.i32_to_f32(s.load_i8(q.add(q0 + c).cast::<i8>()));
                        s.store(o.add(c), s.mul(w, if c < QK / 2 { d } else { d1 }));
                    }
                }
            }
        }
    }
}

kernel_simd::instantiate! {
    /// Whole file blocks dequantized into rows of a stride (prefill's widening).
    pub fn widen_blocks(f: GroupFormat, blocks: &[u8], out: &mut [f32], stride: usize) = widen_blocks_body;
}
