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

/// The block as a Q8_0 block (34 bytes into `out`): the same scale and each weight's
/// `q - 16` as a signed byte, so Q8_0's `qs[j] * d` is this format's value bit for bit. The
/// decode kernels read Q5_0 this way (`QTensor` transcodes it when it packs the groups): 55%
/// more bytes, but Q8_0's group kernel, which ran 2-3x faster than Q5_0's own.
#[inline(always)]
pub(crate) fn to_q8_0(b: &[u8], out: &mut [u8]) {
    out[..2].copy_from_slice(&b[..2]);
    for (o, q) in out[2..34].iter_mut().zip(quants(b)) {
        *o = (q as i8 - 16) as u8;
    }
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

/// `1 << i` in lane `i` (a lane's fifth bit, once `qh` is shifted to the vector's first
/// weight), and `16 / (1 << i)`: the bit's value as a weight, exactly.
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

/// `(q . x, sum(x))` of one Q5_0 / Q5_1 block, lane by lane (unsigned quants `0..32`):
/// the low nibbles of `qs` widened as Q4's, each lane's fifth bit picked out of `qh` with
/// its lane's mask and weighted 16 (exact: small integers). `LANES <= 16`.
///
/// # Safety
/// `qs` is readable for 16 bytes and `x` for 32 floats.
#[inline(always)]
pub(crate) unsafe fn qx_block<S: kernel_simd::Simd>(
    s: S,
    qs: *const u8,
    qh: u32,
    x: *const f32,
) -> (S::F32, S::F32) {
    let l = S::LANES;
    // SAFETY: the tables hold 16 >= LANES elements.
    let (bit, weight) = unsafe {
        (
            s.load_i32(LANE_BIT.as_ptr()),
            s.load(SIXTEEN_OVER_BIT.as_ptr()),
        )
    };
    let (mut qx, mut xs) = ([s.zero(); 2], s.zero());
    for c in (0..16).step_by(l) {
        // SAFETY: `c + LANES <= 16`: inside `qs`; `16 + c + LANES <= 32`: inside `x`
        // (caller).
        unsafe {
            let (lo, hi) = s.load_nibbles_f32(qs.add(c));
            let b_lo = s.and_i32(s.splat_i32((qh >> c) as i32), bit);
            let b_hi = s.and_i32(s.splat_i32((qh >> (16 + c)) as i32), bit);
            let w_lo = s.fma(s.i32_to_f32(b_lo), weight, lo);
            let w_hi = s.fma(s.i32_to_f32(b_hi), weight, hi);
            let (x0, x1) = (s.load(x.add(c)), s.load(x.add(16 + c)));
            qx[0] = s.fma(w_lo, x0, qx[0]);
            qx[1] = s.fma(w_hi, x1, qx[1]);
            xs = s.add(xs, s.add(x0, x1));
        }
    }
    (s.add(qx[0], qx[1]), xs)
}
