//! The SIMD inner loops of the quantized kernels ([`crate::quant_kernels`]), in one module so
//! they can move onto a shared SIMD layer: a quantized row's dot product with f32 `x`
//! (dequantized in registers) and the f32 dot products of the prefill's dequantized block.
//! AVX-512 F and AVX2 + FMA + F16C on x86-64, detected at run time; portable otherwise.

use crate::quant::{QType, QK};
use crate::quant_kernels::{dot_row_portable, QIsa, NB};

/// The best path this CPU supports.
pub fn detect() -> QIsa {
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 = std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c");
        if avx2 && std::is_x86_feature_detected!("avx512f") {
            return QIsa::Avx512;
        }
        if avx2 {
            return QIsa::Avx2;
        }
    }
    QIsa::Portable
}

/// Dot product of one quantized row (`row.len()` = blocks of `t`) with `x` (32 floats per
/// block); `xsum` holds the per-block sums of `x`.
#[inline]
pub fn dot_row(isa: QIsa, t: QType, row: &[u8], x: &[f32], xsum: &[f32]) -> f32 {
    let blocks = row.len() / t.block_bytes();
    if x.len() < blocks * QK || xsum.len() < blocks {
        return f32::NAN; // unreachable from the kernels, which check the shapes
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Avx512` is only returned by `detect` when the CPU has AVX-512 F, AVX2, FMA
        // and F16C; `x` holds 32 floats and `xsum` one float per block of `row` (checked).
        QIsa::Avx512 => unsafe { x86::dot_row_avx512(t, row, x, xsum) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Avx2` is only returned when the CPU has AVX2, FMA and F16C; lengths as above.
        QIsa::Avx2 => unsafe { x86::dot_row_avx2(t, row, x, xsum) },
        _ => dot_row_portable(t, row, x, xsum),
    }
}

/// Dot products of `R` quantized rows of equal length with `x` (shared loads of `x` and
/// independent accumulation chains per row).
#[inline]
pub fn dot_rows<const R: usize>(
    isa: QIsa,
    t: QType,
    rows: [&[u8]; R],
    x: &[f32],
    xsum: &[f32],
) -> [f32; R] {
    let len = rows[0].len();
    let blocks = len / t.block_bytes();
    #[cfg(target_arch = "x86_64")]
    if isa == QIsa::Avx512
        && rows.iter().all(|r| r.len() == len)
        && x.len() >= blocks * QK
        && xsum.len() >= blocks
    {
        // SAFETY: `Avx512` means the CPU has AVX-512 F, AVX2, FMA and F16C; every row has
        // `blocks` blocks, `x` 32 floats and `xsum` one float per block (checked).
        return unsafe { x86::dot_rows_avx512(t, rows, x, xsum) };
    }
    rows.map(|r| dot_row(isa, t, r, x, xsum))
}

/// `out[r] = x . w[r * k .. (r + 1) * k]` for every row `r` of `w` (at most [`NB`] rows;
/// `k` a multiple of 32).
pub fn dots(isa: QIsa, x: &[f32], w: &[f32], k: usize, out: &mut [f32; NB]) {
    let rows = (w.len() / k.max(1)).min(NB);
    if x.len() < k || !k.is_multiple_of(QK) {
        out.fill(f32::NAN); // unreachable from the kernels, which check the shapes
        return;
    }
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Avx512`/`Avx2` are returned only when the CPU has the features; `x` holds
        // `k` floats, `w` `rows * k`, and `k` is a multiple of 16 (checked above).
        QIsa::Avx512 => unsafe { x86::dots_avx512(x, w, k, rows, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above (k a multiple of 8).
        QIsa::Avx2 => unsafe { x86::dots_avx2(x, w, k, rows, out) },
        _ => {
            for (r, o) in out.iter_mut().enumerate().take(rows) {
                let wr = &w[r * k..(r + 1) * k];
                let mut lanes = [0f32; 8];
                for (j, (a, b)) in x[..k].iter().zip(wr).enumerate() {
                    lanes[j % 8] += a * b;
                }
                *o = lanes.iter().sum();
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use core::arch::x86_64::*;

    use crate::quant::{QType, QK};
    use crate::quant_kernels::NB;

    /// The f16 at `p` (two bytes, any alignment), widened.
    ///
    /// # Safety
    /// `p` is valid for reading 2 bytes; the CPU has F16C.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn f16(p: *const u8) -> f32 {
        // SAFETY: `p` is valid for reading 2 bytes (caller); any alignment is read.
        let h = unsafe { p.cast::<u16>().read_unaligned() };
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
    }

    /// # Safety
    /// The CPU has AVX-512 F, AVX2, FMA, F16C; `x` holds 32 floats and `xsum` one per block.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(super) unsafe fn dot_row_avx512(t: QType, row: &[u8], x: &[f32], xsum: &[f32]) -> f32 {
        let bb = t.block_bytes();
        let blocks = row.len() / bb;
        let mut acc = _mm512_setzero_ps();
        let mut extra = 0f32;
        let mask = _mm512_set1_epi32(15);
        for (b, &xs) in xsum.iter().enumerate().take(blocks) {
            // SAFETY: block b lies in `row` (b < blocks), its 32 floats in `x` (caller).
            unsafe {
                let blk = row.as_ptr().add(b * bb);
                let xp = x.as_ptr().add(b * QK);
                let d = f16(blk);
                let s = match t {
                    QType::Q4_0 | QType::Q4_1 => {
                        // Widen the 16 bytes once; low and high nibbles in 32-bit lanes.
                        let z = _mm512_cvtepu8_epi32(_mm_loadu_si128(blk.add(bb - 16).cast()));
                        let lo = _mm512_and_si512(z, mask);
                        let hi = _mm512_srli_epi32(z, 4);
                        let s = _mm512_mul_ps(_mm512_cvtepi32_ps(lo), _mm512_loadu_ps(xp));
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(hi), _mm512_loadu_ps(xp.add(16)), s)
                    }
                    QType::Q8_0 => {
                        let q0 = _mm_loadu_si128(blk.add(2).cast());
                        let q1 = _mm_loadu_si128(blk.add(18).cast());
                        let s = _mm512_mul_ps(
                            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)),
                            _mm512_loadu_ps(xp),
                        );
                        _mm512_fmadd_ps(
                            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)),
                            _mm512_loadu_ps(xp.add(16)),
                            s,
                        )
                    }
                };
                acc = _mm512_fmadd_ps(_mm512_set1_ps(d), s, acc);
                extra += match t {
                    QType::Q4_0 => -8.0 * d * xs,
                    QType::Q4_1 => f16(blk.add(2)) * xs,
                    QType::Q8_0 => 0.0,
                };
            }
        }
        _mm512_reduce_add_ps(acc) + extra
    }

    /// # Safety
    /// The CPU has AVX-512 F, AVX2, FMA, F16C; every row has the same number of blocks, `x`
    /// holds 32 floats and `xsum` one per block.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(super) unsafe fn dot_rows_avx512<const R: usize>(
        t: QType,
        rows: [&[u8]; R],
        x: &[f32],
        xsum: &[f32],
    ) -> [f32; R] {
        let bb = t.block_bytes();
        let blocks = rows[0].len() / bb;
        let mut acc = [_mm512_setzero_ps(); R];
        let mut extra = [0f32; R];
        let mask = _mm512_set1_epi32(15);
        for (b, &xs) in xsum.iter().enumerate().take(blocks) {
            // SAFETY: block b lies in every row (b < blocks), its 32 floats in `x` (caller).
            unsafe {
                let xp = x.as_ptr().add(b * QK);
                let x0 = _mm512_loadu_ps(xp);
                let x1 = _mm512_loadu_ps(xp.add(16));
                for i in 0..R {
                    let blk = rows[i].as_ptr().add(b * bb);
                    let d = f16(blk);
                    let s = match t {
                        QType::Q4_0 | QType::Q4_1 => {
                            let z = _mm512_cvtepu8_epi32(_mm_loadu_si128(blk.add(bb - 16).cast()));
                            let lo = _mm512_cvtepi32_ps(_mm512_and_si512(z, mask));
                            let hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(z, 4));
                            _mm512_fmadd_ps(hi, x1, _mm512_mul_ps(lo, x0))
                        }
                        QType::Q8_0 => {
                            let q0 = _mm512_cvtepi8_epi32(_mm_loadu_si128(blk.add(2).cast()));
                            let q1 = _mm512_cvtepi8_epi32(_mm_loadu_si128(blk.add(18).cast()));
                            let s = _mm512_mul_ps(_mm512_cvtepi32_ps(q0), x0);
                            _mm512_fmadd_ps(_mm512_cvtepi32_ps(q1), x1, s)
                        }
                    };
                    acc[i] = _mm512_fmadd_ps(_mm512_set1_ps(d), s, acc[i]);
                    extra[i] += match t {
                        QType::Q4_0 => -8.0 * d * xs,
                        QType::Q4_1 => f16(blk.add(2)) * xs,
                        QType::Q8_0 => 0.0,
                    };
                }
            }
        }
        core::array::from_fn(|i| _mm512_reduce_add_ps(acc[i]) + extra[i])
    }

    /// Horizontal sum of 8 lanes.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn hsum256(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    /// # Safety
    /// The CPU has AVX2, FMA, F16C; `x` holds 32 floats and `xsum` one per block.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_row_avx2(t: QType, row: &[u8], x: &[f32], xsum: &[f32]) -> f32 {
        let bb = t.block_bytes();
        let blocks = row.len() / bb;
        let mut acc = _mm256_setzero_ps();
        let mut extra = 0f32;
        let mask = _mm256_set1_epi32(15);
        let cvts = |v: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
        for (b, &xs) in xsum.iter().enumerate().take(blocks) {
            // SAFETY: block b lies in `row` (b < blocks), its 32 floats in `x` (caller).
            unsafe {
                let blk = row.as_ptr().add(b * bb);
                let xp = x.as_ptr().add(b * QK);
                let d = f16(blk);
                let (w0, w1, w2, w3) = match t {
                    QType::Q4_0 | QType::Q4_1 => {
                        // Widen each 8 bytes once; nibbles split in 32-bit lanes.
                        let qs = _mm_loadu_si128(blk.add(bb - 16).cast());
                        let z0 = _mm256_cvtepu8_epi32(qs);
                        let z1 = _mm256_cvtepu8_epi32(_mm_srli_si128(qs, 8));
                        let f = _mm256_cvtepi32_ps;
                        (
                            f(_mm256_and_si256(z0, mask)),
                            f(_mm256_and_si256(z1, mask)),
                            f(_mm256_srli_epi32(z0, 4)),
                            f(_mm256_srli_epi32(z1, 4)),
                        )
                    }
                    QType::Q8_0 => {
                        let q0 = _mm_loadu_si128(blk.add(2).cast());
                        let q1 = _mm_loadu_si128(blk.add(18).cast());
                        (
                            cvts(q0),
                            cvts(_mm_srli_si128(q0, 8)),
                            cvts(q1),
                            cvts(_mm_srli_si128(q1, 8)),
                        )
                    }
                };
                let s0 = _mm256_mul_ps(w0, _mm256_loadu_ps(xp));
                let s1 = _mm256_mul_ps(w1, _mm256_loadu_ps(xp.add(8)));
                let s0 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xp.add(16)), s0);
                let s1 = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xp.add(24)), s1);
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_add_ps(s0, s1), acc);
                extra += match t {
                    QType::Q4_0 => -8.0 * d * xs,
                    QType::Q4_1 => f16(blk.add(2)) * xs,
                    QType::Q8_0 => 0.0,
                };
            }
        }
        hsum256(acc) + extra
    }

    /// # Safety
    /// The CPU has AVX-512 F; `x` holds `k` floats, `w` `rows * k`, `k` a multiple of 16,
    /// `rows <= NB`.
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub(super) unsafe fn dots_avx512(
        x: &[f32],
        w: &[f32],
        k: usize,
        rows: usize,
        out: &mut [f32; NB],
    ) {
        let xp = x.as_ptr();
        let mut r = 0;
        while r + 4 <= rows {
            // SAFETY: rows r .. r + 4 and columns j .. j + 16 < k lie in `w` and `x` (caller).
            unsafe {
                let wp = w.as_ptr().add(r * k);
                let (mut a0, mut a1, mut a2, mut a3) = (
                    _mm512_setzero_ps(),
                    _mm512_setzero_ps(),
                    _mm512_setzero_ps(),
                    _mm512_setzero_ps(),
                );
                let mut j = 0;
                while j < k {
                    let xv = _mm512_loadu_ps(xp.add(j));
                    a0 = _mm512_fmadd_ps(_mm512_loadu_ps(wp.add(j)), xv, a0);
                    a1 = _mm512_fmadd_ps(_mm512_loadu_ps(wp.add(k + j)), xv, a1);
                    a2 = _mm512_fmadd_ps(_mm512_loadu_ps(wp.add(2 * k + j)), xv, a2);
                    a3 = _mm512_fmadd_ps(_mm512_loadu_ps(wp.add(3 * k + j)), xv, a3);
                    j += 16;
                }
                out[r] = _mm512_reduce_add_ps(a0);
                out[r + 1] = _mm512_reduce_add_ps(a1);
                out[r + 2] = _mm512_reduce_add_ps(a2);
                out[r + 3] = _mm512_reduce_add_ps(a3);
            }
            r += 4;
        }
        while r < rows {
            // SAFETY: as above, one row.
            unsafe {
                let wp = w.as_ptr().add(r * k);
                let mut a = _mm512_setzero_ps();
                let mut j = 0;
                while j < k {
                    a = _mm512_fmadd_ps(_mm512_loadu_ps(wp.add(j)), _mm512_loadu_ps(xp.add(j)), a);
                    j += 16;
                }
                out[r] = _mm512_reduce_add_ps(a);
            }
            r += 1;
        }
    }

    /// # Safety
    /// The CPU has AVX2 and FMA; `x` holds `k` floats, `w` `rows * k`, `k` a multiple of 8,
    /// `rows <= NB`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dots_avx2(
        x: &[f32],
        w: &[f32],
        k: usize,
        rows: usize,
        out: &mut [f32; NB],
    ) {
        let xp = x.as_ptr();
        for (r, o) in out.iter_mut().enumerate().take(rows) {
            // SAFETY: row r and columns j .. j + 16 <= k lie in `w` and `x` (caller; k is a
            // multiple of 32).
            unsafe {
                let wp = w.as_ptr().add(r * k);
                let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
                let mut j = 0;
                while j < k {
                    a0 =
                        _mm256_fmadd_ps(_mm256_loadu_ps(wp.add(j)), _mm256_loadu_ps(xp.add(j)), a0);
                    a1 = _mm256_fmadd_ps(
                        _mm256_loadu_ps(wp.add(j + 8)),
                        _mm256_loadu_ps(xp.add(j + 8)),
                        a1,
                    );
                    j += 16;
                }
                *o = hsum256(_mm256_add_ps(a0, a1));
            }
        }
    }
}
