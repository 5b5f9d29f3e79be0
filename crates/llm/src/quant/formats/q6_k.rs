//! **Q6_K** (210 bytes, a super-block of 256 weights in 16 sub-blocks of 16): 128 bytes
//! `ql` of low nibbles, 64 bytes `qh` of 2-bit high parts, 16 signed bytes `sc` of scales,
//! then f16 `d`. Each half of 128 weights reads 64 bytes of `ql`, 32 of `qh` and 8 scales:
//! for `l < 32`, weights `l`, `l + 32`, `l + 64`, `l + 96` take the low nibble of `ql[l]`,
//! of `ql[l + 32]`, the high nibble of `ql[l]`, of `ql[l + 32]`, and bits 0-1, 2-3, 4-5,
//! 6-7 of `qh[l]` above it; each is `(d * sc[s]) * (q - 32)` with `s` its sub-block of 16.

use super::f16_at;

/// Bytes of a super-block.
pub(crate) const BLOCK_BYTES: usize = 210;

/// One super-block (`BLOCK_BYTES` bytes) into 256 floats, exactly as the format defines.
#[inline(always)]
pub(crate) fn dequantize(b: &[u8], out: &mut [f32]) {
    let d = f16_at(b, 208);
    for half in 0..2 {
        let ql = &b[64 * half..][..64];
        let qh = &b[128 + 32 * half..][..32];
        let sc = &b[192 + 8 * half..][..8];
        let o = &mut out[128 * half..][..128];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 15) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            o[l] = d * sc[is] as i8 as f32 * q1 as f32;
            o[l + 32] = d * sc[is + 2] as i8 as f32 * q2 as f32;
            o[l + 64] = d * sc[is + 4] as i8 as f32 * q3 as f32;
            o[l + 96] = d * sc[is + 6] as i8 as f32 * q4 as f32;
        }
    }
}

/// `row . x` for a row of whole super-blocks (`row.len()` a multiple of [`BLOCK_BYTES`],
/// `x` at least 256 floats for each), with f32 `x`: per sub-block of 16, `d * sc` times
/// the FMA'd `(q - 32) . x` (the definition's value, summed in another order). NaN if `x`
/// is short.
#[inline(always)]
pub(crate) fn dot<S: kernel_simd::Simd>(s: S, row: &[u8], x: &[f32]) -> f32 {
    let l = S::LANES;
    let blocks = row.len() / BLOCK_BYTES;
    if x.len() < blocks * 256 || l > 16 {
        return f32::NAN;
    }
    let (m15, m3, k32) = (s.splat_i32(15), s.splat_i32(3), s.splat_i32(32));
    let mut total = [s.zero(); 2];
    for (b, xb) in row.chunks_exact(BLOCK_BYTES).zip(x.chunks_exact(256)) {
        let d = f16_at(b, 208);
        for half in 0..2 {
            let sc = &b[192 + 8 * half..][..8];
            for c in (0..32).step_by(l) {
                // A vector of `LANES <= 16` weights lies in one sub-block of 16.
                let is = c / 16;
                // SAFETY: `b` has 210 bytes: `ql` reads `64 half + 32 + c + LANES <= 128`,
                // `qh` reads `128 + 32 half + c + LANES <= 192`; `xb` has 256 floats and
                // `128 half + 96 + c + LANES <= 256` (`LANES` divides 32).
                unsafe {
                    let ql0 = s.load_u8(b.as_ptr().add(64 * half + c));
                    let ql1 = s.load_u8(b.as_ptr().add(64 * half + 32 + c));
                    let qh = s.load_u8(b.as_ptr().add(128 + 32 * half + c));
                    let q = [
                        s.add_i32(s.and_i32(ql0, m15), s.shl_i32::<4>(s.and_i32(qh, m3))),
                        s.add_i32(
                            s.and_i32(ql1, m15),
                            s.shl_i32::<4>(s.and_i32(s.shr_i32::<2>(qh), m3)),
                        ),
                        s.add_i32(
                            s.shr_i32::<4>(ql0),
                            s.shl_i32::<4>(s.and_i32(s.shr_i32::<4>(qh), m3)),
                        ),
                        s.add_i32(s.shr_i32::<4>(ql1), s.shl_i32::<4>(s.shr_i32::<6>(qh))),
                    ];
                    let xh = xb.as_ptr().add(128 * half + c);
                    for (k, &qk) in q.iter().enumerate() {
                        let w = s.i32_to_f32(s.sub_i32(qk, k32));
                        let qx = s.mul(w, s.load(xh.add(32 * k)));
                        let scale = d * sc[is + 2 * k] as i8 as f32;
                        total[k % 2] = s.fma(s.splat(scale), qx, total[k % 2]);
                    }
                }
            }
        }
    }
    s.reduce_sum(s.add(total[0], total[1]))
}
