//! The inner loops, in an AVX2+FMA version (x86-64, chosen at run time) and a portable scalar
//! version with the same contracts.
//!
//! Packed layouts used by the tile kernels (`MR = 6` rows, `NR = 16` columns):
//! - packed Q strip: `[d][MR]` (the MR rows of a strip interleaved, so the micro-kernel reads
//!   one stream);
//! - packed K panel: `[d][NR]` (NR consecutive KV positions of one head, transposed);
//! - packed V tile: `[t][d_pad]` row-major, head dim padded to a multiple of NR with zeros.

use crate::convert;
use crate::elem::{Bf16, F16};
use crate::fused::{
    self, AxpyRow, PvFlush, PvMadd, PvTableFn, PvWeights, QuantizeQ16, ScoresQ16, ScoresRow,
};
use crate::plan::{MR, NR};
use crate::simd::{simd_level, SimdLevel};

/// The kernel set of a call. Every function pointer is `unsafe` because the AVX2 versions
/// require the CPU features checked by [`Kernels::detect`], on top of each kernel's own
/// pointer contract (documented on the scalar version, which the AVX2 one matches).
#[derive(Clone, Copy)]
pub(crate) struct Kernels {
    /// `S[MR x NR] = Qstrip . Kpanel`: see [`scalar::qk_tile`].
    pub qk_tile: unsafe fn(*const f32, usize, *const f32, *mut f32, usize),
    /// `O[MR x NR] += P[MR x nk] . V[nk x NR]`: see [`scalar::pv_tile`].
    pub pv_tile: unsafe fn(*const f32, usize, *const f32, usize, usize, *mut f32, usize),
    /// Online-softmax step of one row: see [`scalar::softmax_row`].
    pub softmax_row: unsafe fn(&mut [f32], usize, f32, f32) -> (f32, f32),
    /// `x *= a`.
    pub scale: unsafe fn(&mut [f32], f32),
    /// Packs a K tile into panels: see [`scalar::pack_k`].
    pub pack_k: unsafe fn(&[f32], usize, usize, usize, usize, &mut [f32]),
    /// Prefetches rows of a strided tensor towards L2: see [`scalar::prefetch_rows`].
    pub prefetch_rows: unsafe fn(*const u8, usize, usize, usize, usize, usize),
    /// bf16 to f32: see [`convert::widen_bf16`].
    pub widen_bf16: unsafe fn(&[Bf16], &mut [f32]),
    /// f16 to f32: see [`convert::widen_f16`].
    pub widen_f16: unsafe fn(&[F16], &mut [f32]),
    /// int8 to f32: see [`convert::dequant`].
    pub dequant: unsafe fn(&[i8], f32, i8, &mut [f32]),
    /// Decode's scores against one f32 K position row: see [`fused::scores_row`].
    pub scores_f32: ScoresRow<f32>,
    /// The same on a bf16 K row; with `bf16_split_q`, `q` in the order of `fused::split16`.
    pub scores_bf16: ScoresRow<Bf16>,
    /// Whether `scores_bf16` takes its query rows reordered by `fused::split16`.
    pub bf16_split_q: bool,
    /// The same on an int8 K row, with the query quantized to i16 (an integer dot product):
    /// see [`fused::scores_row_q16`].
    pub scores_q16: ScoresQ16,
    /// Quantizes query rows to i16 for `scores_q16`: see [`fused::quantize_q16`].
    pub quantize_q16: QuantizeQ16,
    /// Decode's `acc += P . V` over f32 V position rows: see [`fused::axpy_row`].
    pub axpy_f32: AxpyRow<f32>,
    /// The same on bf16 V rows.
    pub axpy_bf16: AxpyRow<Bf16>,
    /// The same on int8 V rows (used when `int_pv` is false).
    pub axpy_i8: AxpyRow<i8>,
    /// Whether decode computes an int8 cache's `P . V` in integers (`fused::pv_weights`,
    /// then `pv_madd` per four V rows, `pv_flush` per tile) instead of with `axpy_i8`.
    pub int_pv: bool,
    /// The integer `P . V`'s table of a tile's V scales and zero points: see
    /// [`fused::pv_table`].
    pub pv_table: PvTableFn,
    /// The integer `P . V`'s i16 weights of a tile: see [`fused::pv_weights`].
    pub pv_weights: PvWeights,
    /// Integer `acc32 += W . V` over four int8 V rows: see [`fused::pv_madd`].
    pub pv_madd: PvMadd,
    /// Ends a tile of the integer `P . V`: see [`fused::pv_flush`].
    pub pv_flush: PvFlush,
    /// Which set this is.
    pub level: SimdLevel,
}

impl Kernels {
    /// The kernel set of [`simd_level`]: the best this CPU runs within the caps.
    pub(crate) fn detect() -> Kernels {
        Kernels::for_level(simd_level())
    }

    /// The kernel set of `level`, which must be one of `available_simd_levels()` (any other
    /// gives the portable set).
    pub(crate) fn for_level(level: SimdLevel) -> Kernels {
        #[cfg(target_arch = "x86_64")]
        {
            if level == SimdLevel::Avx2
                && std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("fma")
            {
                let f16c = std::is_x86_feature_detected!("f16c");
                return Kernels {
                    qk_tile: avx2::qk_tile,
                    pv_tile: avx2::pv_tile,
                    softmax_row: avx2::softmax_row,
                    scale: avx2::scale,
                    pack_k: avx2::pack_k,
                    prefetch_rows: avx2::prefetch_rows,
                    widen_bf16: convert::avx2::widen_bf16,
                    widen_f16: if f16c {
                        convert::avx2::widen_f16
                    } else {
                        convert::widen_f16
                    },
                    dequant: convert::avx2::dequant,
                    scores_f32: fused::avx2::scores_row,
                    scores_bf16: fused::avx2::scores_row_bf16_split,
                    bf16_split_q: true,
                    scores_q16: fused::avx2::scores_row_q16,
                    quantize_q16: fused::avx2::quantize_q16,
                    axpy_f32: fused::avx2::axpy_row,
                    axpy_bf16: fused::avx2::axpy_row,
                    axpy_i8: fused::avx2::axpy_row,
                    int_pv: true,
                    pv_table: fused::avx2::pv_table,
                    pv_weights: fused::avx2::pv_weights,
                    pv_madd: fused::avx2::pv_madd,
                    pv_flush: fused::avx2::pv_flush,
                    level,
                };
            }
        }
        #[cfg(target_arch = "x86_64")]
        {
            if level == SimdLevel::Avx512 && crate::simd::avx512_detected() {
                use crate::avx512;
                return Kernels {
                    qk_tile: avx512::qk_tile,
                    pv_tile: avx512::pv_tile,
                    softmax_row: avx512::softmax_row,
                    scale: avx512::scale,
                    scores_f32: avx512::scores_row,
                    scores_bf16: avx512::scores_row,
                    bf16_split_q: false,
                    scores_q16: avx512::scores_row_q16,
                    axpy_f32: avx512::axpy_row,
                    axpy_bf16: avx512::axpy_row,
                    axpy_i8: avx512::axpy_row,
                    pv_madd: avx512::pv_madd,
                    level,
                    ..Kernels::for_level(SimdLevel::Avx2)
                };
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            if level == SimdLevel::Neon && std::arch::is_aarch64_feature_detected!("neon") {
                return Kernels {
                    qk_tile: crate::neon::qk_tile,
                    pv_tile: crate::neon::pv_tile,
                    softmax_row: crate::neon::softmax_row,
                    scale: crate::neon::scale,
                    pack_k: scalar::pack_k,
                    prefetch_rows: scalar::prefetch_rows,
                    widen_bf16: convert::neon::widen_bf16,
                    widen_f16: convert::widen_f16,
                    dequant: convert::neon::dequant,
                    scores_f32: fused::neon::scores_row,
                    scores_bf16: fused::neon::scores_row,
                    bf16_split_q: false,
                    scores_q16: fused::scores_row_q16,
                    quantize_q16: fused::quantize_q16,
                    axpy_f32: fused::neon::axpy_row,
                    axpy_bf16: fused::neon::axpy_row,
                    axpy_i8: fused::neon::axpy_row,
                    // NEON keeps the f32 `P . V` (its axpy converts in registers).
                    int_pv: false,
                    pv_table: fused::pv_table,
                    pv_weights: fused::pv_weights,
                    pv_madd: fused::pv_madd,
                    pv_flush: fused::pv_flush,
                    level,
                };
            }
        }
        let _ = level;
        Kernels::scalar()
    }

    /// One online-softmax step of a query row over a tile: raw scores `srow` (the first `vis`
    /// visible; none visible leaves only zeros) become `P`, and the row's running max `m`,
    /// running sum `l` and unnormalised accumulator `acc` are rescaled to the new max.
    #[inline]
    pub(crate) fn softmax_update(
        &self,
        srow: &mut [f32],
        vis: usize,
        c: f32,
        m: &mut f32,
        l: &mut f32,
        acc: &mut [f32],
    ) {
        if vis == 0 {
            srow.fill(0.0);
            return;
        }
        // SAFETY: slice-based kernel; a set is only built for a level this CPU runs.
        let (mn, sum) = unsafe { (self.softmax_row)(srow, vis, c, *m) };
        let alpha = (*m - mn).exp2();
        *l = *l * alpha + sum;
        if alpha != 1.0 {
            // SAFETY: as above.
            unsafe { (self.scale)(acc, alpha) };
        }
        *m = mn;
    }

    /// The portable kernel set (also used by tests to cover it on any CPU).
    pub(crate) fn scalar() -> Kernels {
        Kernels {
            qk_tile: scalar::qk_tile,
            pv_tile: scalar::pv_tile,
            softmax_row: scalar::softmax_row,
            scale: scalar::scale,
            pack_k: scalar::pack_k,
            prefetch_rows: scalar::prefetch_rows,
            widen_bf16: convert::widen_bf16,
            widen_f16: convert::widen_f16,
            dequant: convert::dequant,
            scores_f32: fused::scores_row,
            scores_bf16: fused::scores_row,
            bf16_split_q: false,
            scores_q16: fused::scores_row_q16,
            quantize_q16: fused::quantize_q16,
            axpy_f32: fused::axpy_row,
            axpy_bf16: fused::axpy_row,
            axpy_i8: fused::axpy_row,
            int_pv: true,
            pv_table: fused::pv_table,
            pv_weights: fused::pv_weights,
            pv_madd: fused::pv_madd,
            pv_flush: fused::pv_flush,
            level: SimdLevel::Portable,
        }
    }
}

/// Whether calls made now on this thread use SIMD kernels (a level above portable), for
/// reports; [`simd_level`] says which.
pub fn simd_enabled() -> bool {
    Kernels::detect().level != SimdLevel::Portable
}

pub(crate) mod scalar {
    use super::{MR, NR};

    /// Writes `s[r * lds + j] = sum_x a[x * MR + r] * b[x * NR + j]` for `r < MR`, `j < NR`.
    ///
    /// # Safety
    /// `a` must be readable for `d * MR` floats, `b` for `d * NR` floats, and `s` writable for
    /// rows `r < MR` of `NR` floats at `s + r * lds`, not overlapping `a` or `b`.
    pub(crate) unsafe fn qk_tile(a: *const f32, d: usize, b: *const f32, s: *mut f32, lds: usize) {
        let mut c = [[0f32; NR]; MR];
        for x in 0..d {
            // SAFETY: `x < d`, so both reads are within the caller-guaranteed extents.
            let (ar, br) = unsafe {
                (
                    &*a.add(x * MR).cast::<[f32; MR]>(),
                    &*b.add(x * NR).cast::<[f32; NR]>(),
                )
            };
            for r in 0..MR {
                for j in 0..NR {
                    c[r][j] += ar[r] * br[j];
                }
            }
        }
        for (r, row) in c.iter().enumerate() {
            // SAFETY: row `r < MR` of `s` is writable for NR floats (caller's guarantee).
            unsafe { s.add(r * lds).cast::<[f32; NR]>().write_unaligned(*row) };
        }
    }

    /// `o[r * ldo + j] += sum_{t < nk} p[r * ldp + t] * v[t * ldv + j]` for `r < MR`, `j < NR`.
    ///
    /// # Safety
    /// `p` readable for rows `r < MR` of `nk` floats at `p + r * ldp`; `v` readable for rows
    /// `t < nk` of `NR` floats at `v + t * ldv`; `o` readable and writable for rows `r < MR` of
    /// `NR` floats at `o + r * ldo`, not overlapping `p` or `v`.
    pub(crate) unsafe fn pv_tile(
        p: *const f32,
        ldp: usize,
        v: *const f32,
        ldv: usize,
        nk: usize,
        o: *mut f32,
        ldo: usize,
    ) {
        for r in 0..MR {
            // SAFETY: row `r` of `o` is valid for NR floats and not aliased (caller).
            let orow = unsafe { &mut *o.add(r * ldo).cast::<[f32; NR]>() };
            for t in 0..nk {
                // SAFETY: `r < MR`, `t < nk`: within the caller-guaranteed extents.
                let (pv, vr) =
                    unsafe { (*p.add(r * ldp + t), &*v.add(t * ldv).cast::<[f32; NR]>()) };
                for j in 0..NR {
                    orow[j] += pv * vr[j];
                }
            }
        }
    }

    /// One online-softmax step on a row of raw scores `s` whose first `valid` entries are
    /// visible (`1 <= valid <= s.len()`): with `y = c * s`, `m_new = max(m_old, max(y))`,
    /// overwrites `s[..valid]` with `exp2(y - m_new)` and `s[valid..]` with 0, and returns
    /// `(m_new, sum of the new s)`.
    ///
    /// # Safety
    /// None beyond the function-pointer contract (this version is safe to call).
    pub(crate) unsafe fn softmax_row(
        s: &mut [f32],
        valid: usize,
        c: f32,
        m_old: f32,
    ) -> (f32, f32) {
        let (vis, rest) = s.split_at_mut(valid);
        let mut mx = m_old;
        for x in vis.iter_mut() {
            *x *= c;
            mx = mx.max(*x);
        }
        let mut sum = 0.0;
        for x in vis.iter_mut() {
            *x = (*x - mx).exp2();
            sum += *x;
        }
        rest.fill(0.0);
        (mx, sum)
    }

    /// `x *= a`.
    ///
    /// # Safety
    /// None (safe to call).
    pub(crate) unsafe fn scale(x: &mut [f32], a: f32) {
        for e in x {
            *e *= a;
        }
    }

    /// Packs rows `j < nk` of a K tile (row `j` is `k[j * stride..][..d]`) into NR-column
    /// panels `kp[(j / NR) * d * NR + x * NR + j % NR]`, with columns `nk <= j < nkp` zero.
    /// Panics if `k` or `kp` is too short, or `nkp` is not a multiple of NR.
    ///
    /// # Safety
    /// None (safe to call).
    pub(crate) unsafe fn pack_k(
        k: &[f32],
        stride: usize,
        nk: usize,
        nkp: usize,
        d: usize,
        kp: &mut [f32],
    ) {
        assert!(nk <= nkp && nkp.is_multiple_of(NR) && kp.len() >= nkp * d);
        assert!(nk == 0 || k.len() >= (nk - 1) * stride + d);
        pack_k_rows(k, stride, nk, 0..nkp, d, kp);
    }

    /// The rows `j` in `rows` of [`pack_k`] (zeros for `j >= nk`), one element at a time; the
    /// AVX2 version packs 8x8 blocks and finishes with this.
    pub(crate) fn pack_k_rows(
        k: &[f32],
        stride: usize,
        nk: usize,
        rows: core::ops::Range<usize>,
        d: usize,
        kp: &mut [f32],
    ) {
        for j in rows {
            let base = (j / NR) * d * NR + j % NR;
            if j < nk {
                for (x, &val) in k[j * stride..j * stride + d].iter().enumerate() {
                    kp[base + x * NR] = val;
                }
            } else {
                for x in 0..d {
                    kp[base + x * NR] = 0.0;
                }
            }
        }
    }

    /// Hints that rows `j < n` (bytes `[start + j * stride..][..d]` of the `len` bytes at
    /// `base`) will be accessed soon. Rows past `len` are ignored. No effect in this version.
    ///
    /// # Safety
    /// None: the memory is never accessed (the AVX2 version issues prefetch hints only, for
    /// addresses it checks are inside `base..base + len`).
    pub(crate) unsafe fn prefetch_rows(
        _base: *const u8,
        _len: usize,
        _start: usize,
        _stride: usize,
        _n: usize,
        _d: usize,
    ) {
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use super::{MR, NR};
    use core::arch::x86_64::*;

    /// `2^x` for `x <= 0`, 8 lanes; `x <= -127` (and NaN) give 0. Relative error ~1.2e-7
    /// (degree-6 polynomial on `[-0.5, 0.5]`).
    #[target_feature(enable = "avx2,fma")]
    fn exp2_ps(x: __m256) -> __m256 {
        let x = _mm256_max_ps(x, _mm256_set1_ps(-127.0));
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
        let f = _mm256_sub_ps(x, n);
        // Taylor coefficients of 2^f = e^(f ln 2).
        let mut p = _mm256_set1_ps(1.540_353e-4);
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.333_355_8e-3));
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.618_129e-3));
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(5.550_411e-2));
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(0.240_226_5));
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(core::f32::consts::LN_2));
        p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0));
        // 2^n from its exponent bits; n = -127 gives the bit pattern 0, i.e. 0.0.
        let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        ));
        _mm256_mul_ps(p, _mm256_castsi256_ps(e))
    }

    /// The largest of the 8 lanes.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn hmax(v: __m256) -> f32 {
        let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let m = _mm_max_ss(m, _mm_shuffle_ps::<1>(m, m));
        _mm_cvtss_f32(m)
    }

    /// The sum of the 8 lanes.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
        _mm_cvtss_f32(s)
    }

    /// The 6x16 register block both micro-kernels accumulate into.
    type Block = [[__m256; 2]; MR];

    /// `c[r] += sum_{x < k} a[r * a_rs + x * a_cs] * b[x * ldb..][..NR]` for `r < MR`: the
    /// FMA loop of both micro-kernels (inlined into each, so the strides fold to constants
    /// where they are).
    ///
    /// # Safety
    /// AVX2 and FMA; `a` readable at every offset named, `b` for rows `x < k` of NR floats.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn fma_block(
        mut c: Block,
        k: usize,
        a: *const f32,
        a_rs: usize,
        a_cs: usize,
        b: *const f32,
        ldb: usize,
    ) -> Block {
        for x in 0..k {
            // SAFETY: `x < k`: row `x` of `b` is readable for NR floats (caller).
            let (b0, b1) = unsafe {
                let br = b.add(x * ldb);
                (_mm256_loadu_ps(br), _mm256_loadu_ps(br.add(8)))
            };
            for (r, cr) in c.iter_mut().enumerate() {
                // SAFETY: `r < MR`, `x < k`: readable (caller).
                let ar = _mm256_set1_ps(unsafe { *a.add(r * a_rs + x * a_cs) });
                cr[0] = _mm256_fmadd_ps(ar, b0, cr[0]);
                cr[1] = _mm256_fmadd_ps(ar, b1, cr[1]);
            }
        }
        c
    }

    /// Stores the block into rows `r < MR` of NR floats at `o + r * ldo`.
    ///
    /// # Safety
    /// AVX2; those rows are writable.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn store_block(c: &Block, o: *mut f32, ldo: usize) {
        for (r, cr) in c.iter().enumerate() {
            // SAFETY: row `r < MR` of `o` is writable for NR = 16 floats (caller).
            unsafe {
                let or = o.add(r * ldo);
                _mm256_storeu_ps(or, cr[0]);
                _mm256_storeu_ps(or.add(8), cr[1]);
            }
        }
    }

    /// AVX2 version of [`super::scalar::qk_tile`].
    ///
    /// # Safety
    /// The CPU supports AVX2 and FMA, and the contract of [`super::scalar::qk_tile`] holds.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn qk_tile(a: *const f32, d: usize, b: *const f32, s: *mut f32, lds: usize) {
        // SAFETY: the packed strip holds `a[x * MR + r]`, the panel rows `b[x * NR..][..NR]`
        // for `x < d`, and `s` has MR writable rows (caller).
        unsafe {
            let c = fma_block([[_mm256_setzero_ps(); 2]; MR], d, a, 1, MR, b, NR);
            store_block(&c, s, lds);
        }
    }

    /// AVX2 version of [`super::scalar::pv_tile`].
    ///
    /// # Safety
    /// The CPU supports AVX2 and FMA, and the contract of [`super::scalar::pv_tile`] holds.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn pv_tile(
        p: *const f32,
        ldp: usize,
        v: *const f32,
        ldv: usize,
        nk: usize,
        o: *mut f32,
        ldo: usize,
    ) {
        let c: Block = core::array::from_fn(|r| {
            // SAFETY: row `r < MR` of `o` is readable for 16 floats (caller).
            unsafe {
                let or = o.add(r * ldo);
                [_mm256_loadu_ps(or), _mm256_loadu_ps(or.add(8))]
            }
        });
        // SAFETY: `p[r * ldp + t]` for `r < MR`, `t < nk`, the V rows `v[t * ldv..][..NR]`
        // and MR rows of `o` are valid (caller).
        unsafe {
            let c = fma_block(c, nk, p, ldp, 1, v, ldv);
            store_block(&c, o, ldo);
        }
    }

    /// AVX2 version of [`super::scalar::softmax_row`].
    ///
    /// # Safety
    /// The CPU supports AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn softmax_row(
        s: &mut [f32],
        valid: usize,
        c: f32,
        m_old: f32,
    ) -> (f32, f32) {
        let (vis, rest) = s.split_at_mut(valid);
        let cv = _mm256_set1_ps(c);
        let mut mv = _mm256_set1_ps(m_old);
        let mut chunks = vis.chunks_exact_mut(8);
        for ch in &mut chunks {
            // SAFETY: `ch` is 8 floats.
            unsafe {
                let y = _mm256_mul_ps(_mm256_loadu_ps(ch.as_ptr()), cv);
                _mm256_storeu_ps(ch.as_mut_ptr(), y);
                mv = _mm256_max_ps(mv, y);
            }
        }
        let mut mx = hmax(mv);
        for x in chunks.into_remainder() {
            *x *= c;
            mx = mx.max(*x);
        }
        let mv = _mm256_set1_ps(mx);
        let mut sv = _mm256_setzero_ps();
        let mut chunks = vis.chunks_exact_mut(8);
        for ch in &mut chunks {
            // SAFETY: `ch` is 8 floats.
            unsafe {
                let e = exp2_ps(_mm256_sub_ps(_mm256_loadu_ps(ch.as_ptr()), mv));
                _mm256_storeu_ps(ch.as_mut_ptr(), e);
                sv = _mm256_add_ps(sv, e);
            }
        }
        let mut sum = hsum(sv);
        let tail = chunks.into_remainder();
        if !tail.is_empty() {
            let mut buf = [-1000.0f32; 8];
            buf[..tail.len()].copy_from_slice(tail);
            // SAFETY: `buf` is 8 floats.
            let e = unsafe { exp2_ps(_mm256_sub_ps(_mm256_loadu_ps(buf.as_ptr()), mv)) };
            let mut out = [0f32; 8];
            // SAFETY: `out` is 8 floats.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr(), e) };
            for (x, e) in tail.iter_mut().zip(out) {
                *x = e;
                sum += e;
            }
        }
        rest.fill(0.0);
        (mx, sum)
    }

    /// AVX2 version of [`super::scalar::scale`].
    ///
    /// # Safety
    /// The CPU supports AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn scale(x: &mut [f32], a: f32) {
        let av = _mm256_set1_ps(a);
        let mut chunks = x.chunks_exact_mut(8);
        for ch in &mut chunks {
            // SAFETY: `ch` is 8 floats.
            unsafe {
                _mm256_storeu_ps(
                    ch.as_mut_ptr(),
                    _mm256_mul_ps(_mm256_loadu_ps(ch.as_ptr()), av),
                )
            };
        }
        for e in chunks.into_remainder() {
            *e *= a;
        }
    }

    /// Transposes the 8x8 block whose rows are `r`.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
        let t0 = _mm256_unpacklo_ps(r[0], r[1]);
        let t1 = _mm256_unpackhi_ps(r[0], r[1]);
        let t2 = _mm256_unpacklo_ps(r[2], r[3]);
        let t3 = _mm256_unpackhi_ps(r[2], r[3]);
        let t4 = _mm256_unpacklo_ps(r[4], r[5]);
        let t5 = _mm256_unpackhi_ps(r[4], r[5]);
        let t6 = _mm256_unpacklo_ps(r[6], r[7]);
        let t7 = _mm256_unpackhi_ps(r[6], r[7]);
        let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        [
            _mm256_permute2f128_ps::<0x20>(u0, u4),
            _mm256_permute2f128_ps::<0x20>(u1, u5),
            _mm256_permute2f128_ps::<0x20>(u2, u6),
            _mm256_permute2f128_ps::<0x20>(u3, u7),
            _mm256_permute2f128_ps::<0x31>(u0, u4),
            _mm256_permute2f128_ps::<0x31>(u1, u5),
            _mm256_permute2f128_ps::<0x31>(u2, u6),
            _mm256_permute2f128_ps::<0x31>(u3, u7),
        ]
    }

    /// AVX2 version of [`super::scalar::pack_k`]: 8x8 blocks transposed in registers.
    ///
    /// # Safety
    /// The CPU supports AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn pack_k(
        k: &[f32],
        stride: usize,
        nk: usize,
        nkp: usize,
        d: usize,
        kp: &mut [f32],
    ) {
        assert!(nk <= nkp && nkp.is_multiple_of(NR) && kp.len() >= nkp * d);
        assert!(nk == 0 || k.len() >= (nk - 1) * stride + d);
        let d8 = d / 8 * 8;
        let mut j = 0;
        while j + 8 <= nk {
            let base = (j / NR) * d * NR + j % NR;
            let mut x = 0;
            while x < d8 {
                // SAFETY: rows j..j+8 < nk and columns x..x+8 <= d are inside `k` (asserted
                // length covers row nk-1 up to column d).
                let rows: [__m256; 8] = core::array::from_fn(|u| unsafe {
                    _mm256_loadu_ps(k.as_ptr().add((j + u) * stride + x))
                });
                let cols = transpose8(rows);
                for (c, col) in cols.iter().enumerate() {
                    // SAFETY: `base + (x + c) * NR + 8 <= nkp * d`: j % NR is 0 or 8 and
                    // x + c < d, so the 8 floats are inside panel j / NR, inside `kp`.
                    unsafe { _mm256_storeu_ps(kp.as_mut_ptr().add(base + (x + c) * NR), *col) };
                }
                x += 8;
            }
            for u in 0..8 {
                for x in d8..d {
                    kp[base + x * NR + u] = k[(j + u) * stride + x];
                }
            }
            j += 8;
        }
        super::scalar::pack_k_rows(k, stride, nk, j..nkp, d, kp);
    }

    /// AVX2-build version of [`super::scalar::prefetch_rows`] (all counts in bytes):
    /// prefetches each 64-byte line of the rows into L2.
    ///
    /// # Safety
    /// The CPU supports AVX2 and FMA. `base..base + len` must be one allocation (so the
    /// offsets computed inside stay in it).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn prefetch_rows(
        base: *const u8,
        len: usize,
        start: usize,
        stride: usize,
        n: usize,
        d: usize,
    ) {
        for j in 0..n {
            let row = start + j * stride;
            if row + d > len {
                break;
            }
            let mut x = 0;
            while x < d {
                // SAFETY: `row + x < len`: the address is inside the allocation (caller), so
                // `add` is in bounds; a prefetch never faults nor accesses memory
                // architecturally, so it races with nothing.
                unsafe { _mm_prefetch::<_MM_HINT_T1>(base.add(row + x).cast::<i8>()) };
                x += 64;
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Deterministic pseudo-random floats in `[-1, 1)` (xorshift), `n` of them.
    pub(crate) fn data(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
            })
            .collect()
    }

    /// The lengths of `r`; under Miri (minutes per level otherwise) only those next to the
    /// vector widths 8, 16 and 32, where the kernels' loops and tails change.
    fn lengths(r: impl Iterator<Item = usize>) -> impl Iterator<Item = usize> {
        r.filter(|n| !cfg!(miri) || [0, 1, 7, 8, 9, 15, 16, 17, 31, 32, 33].contains(n))
    }

    fn close(a: &[f32], b: &[f32], tol: f32) {
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= tol * (1.0 + y.abs()), "at {i}: {x} vs {y}");
        }
    }

    /// Every kernel set this CPU runs agrees with the scalar one.
    #[test]
    fn every_level_matches_scalar() {
        for level in crate::simd::available_simd_levels() {
            level_matches_scalar(level);
        }
    }

    /// The AVX-512 set alone: on a machine without AVX-512, CI runs this test under Miri
    /// with the target features enabled (see `.ci/run`), which is what tests these kernels
    /// there; `every_level_matches_scalar` covers them on a machine that has AVX-512.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn avx512_matches_scalar() {
        if !crate::simd::avx512_detected() {
            eprintln!("no AVX-512 here: the AVX-512 set is tested under Miri (.ci/run)");
            return;
        }
        let f = Kernels::for_level(SimdLevel::Avx512);
        assert_eq!(f.level, SimdLevel::Avx512);
        // The checks that reach an AVX-512 kernel (the conversions are the AVX2 kernels,
        // tested at that level).
        matches_scalar(f);
        fused_match_scalar(f);
        int_pv_matches_model(f);
    }

    fn level_matches_scalar(level: SimdLevel) {
        let f = Kernels::for_level(level);
        assert_eq!(f.level, level);
        matches_scalar(f);
        conversions_match_scalar(f);
        fused_match_scalar(f);
        int_pv_matches_model(f);
    }

    /// The integer `P . V` of `f` (table, weights, `pv_madd` per `PV_ROWS` rows, flush) gives
    /// bit for bit what a direct model of the same integer arithmetic gives (`acc + step *
    /// (sum_t w16_t (v_t - zp_t)) as f32`, the sum in i64), and that is within the weights'
    /// rounding bound of the f64 sum: head dims 1..40 (every vector tail), 128 and 300; MHA
    /// and groups of 2 and 3; tiles of 1..32 positions (odd ones end in a half pair, short
    /// ones padded to `PV_ROWS`), with `ldw` the padded tile and 32; a head of zero weights
    /// (skipped) and one with a NaN weight (NaN out). The weights are checked one by one:
    /// `|w16 * step - w| <= step * (1/2 + 2^-8)`, and the largest is 32767 (a tight step).
    fn int_pv_matches_model(f: Kernels) {
        use crate::fused::{KvRow, PvTable, PV_MAX_TILE, PV_ROWS};
        let s = Kernels::scalar();
        // Under Miri (where the AVX-512 `pv_madd` is tested; ~20 s a case) four cases: a
        // scalar-only head, a 32-lane step with a tail, two steps, a group of 3 and of 2.
        let cases: Vec<(usize, usize, usize, usize)> = if cfg!(miri) {
            vec![
                (31, 3, 1, 9),
                (33, 3, 3, 17),
                (64, 2, 1, 32),
                (70, 2, 2, 17),
            ]
        } else {
            (1..=40)
                .map(|d| (d, 3, [1, 3, 2][d % 3], 1 + (d * 7) % 32))
                .chain([
                    (128, 4, 1, 32),
                    (128, 4, 2, 31),
                    (300, 2, 1, 9),
                    (17, 6, 3, 32),
                    // 8-position x 8-head blocks of the SIMD table, with remainders.
                    (5, 8, 1, 32),
                    (3, 9, 1, 17),
                    (16, 16, 2, 24),
                    (7, 11, 1, 8),
                ])
                .collect()
        };
        for (d, kvh, group, n) in cases {
            let heads = kvh * group;
            let nr = n.div_ceil(PV_ROWS) * PV_ROWS;
            let vals: Vec<Vec<i8>> = (0..nr)
                .map(|t| {
                    (0..kvh * d)
                        .map(|j| ((j * 37 + t * 101 + d) % 256) as u8 as i8)
                        .collect()
                })
                .collect();
            let scales: Vec<Vec<f32>> = (0..nr)
                .map(|t| {
                    data(kvh, 70 + t as u32)
                        .iter()
                        .map(|x| x.abs() * 0.05)
                        .collect()
                })
                .collect();
            let zps: Vec<Vec<i8>> = (0..nr)
                .map(|t| {
                    (0..kvh)
                        .map(|g| ((g * 53 + t * 7) % 256) as u8 as i8)
                        .collect()
                })
                .collect();
            let row = |t: usize| KvRow {
                x: &vals[t.min(n - 1)][..],
                scales: &scales[t.min(n - 1)][..],
                zps: &zps[t.min(n - 1)][..],
            };
            let rows: Vec<KvRow<'_, i8>> = (0..nr).map(row).collect();
            let ldp = n + 3;
            let mut p: Vec<f32> = data(heads * ldp, 90 + d as u32)
                .iter()
                .map(|x| x.abs())
                .collect();
            p[ldp..ldp + n].fill(0.0); // head 1: all weights 0
            if heads > 2 {
                p[2 * ldp + n / 2] = f32::NAN; // head 2: NaN
            }
            let a0 = data(heads * d, 91);
            // The table: every level's bit for bit as the scalar one, which is checked
            // against its definition.
            let table = |k: &Kernels| {
                let (mut vs, mut zp) = (
                    vec![f32::NAN; kvh * PV_MAX_TILE],
                    vec![7i16; kvh * PV_MAX_TILE],
                );
                // SAFETY: slice-based kernel on a CPU that runs `k`'s level.
                unsafe { (k.pv_table)(&rows[..n], kvh, &mut vs, &mut zp) };
                (vs, zp)
            };
            let (vs, zp) = table(&s);
            let (vf, zf) = table(&f);
            assert_eq!(
                (vf.map_bits(), zf),
                (vs.map_bits(), zp.clone()),
                "table d {d} kvh {kvh} n {n}"
            );
            for g in 0..kvh {
                for t in 0..PV_MAX_TILE {
                    let (want_s, want_z) = if t < n {
                        (scales[t][g], i16::from(zps[t][g]))
                    } else {
                        (0.0, 0)
                    };
                    assert_eq!(
                        (vs[g * PV_MAX_TILE + t], zp[g * PV_MAX_TILE + t]),
                        (want_s, want_z)
                    );
                }
            }
            let tab = PvTable {
                vs: &vs,
                zp: &zp,
                n,
            };
            for ldw in [nr, PV_MAX_TILE] {
                let run = |k: &Kernels| {
                    let mut w16 = vec![5i16; heads * ldw];
                    let (mut step, mut zt) = (vec![f32::NAN; heads], vec![9i32; heads]);
                    let mut acc = a0.clone();
                    let mut acc32 = vec![0i32; heads * d];
                    // SAFETY: slice-based kernels on a CPU that runs `k`'s level.
                    unsafe {
                        (k.pv_weights)(&p, ldp, group, tab, ldw, &mut w16, &mut step, &mut zt);
                        for u in (0..n).step_by(PV_ROWS) {
                            let v: [KvRow<'_, i8>; PV_ROWS] = core::array::from_fn(|j| rows[u + j]);
                            (k.pv_madd)(&mut acc32, d, group, &w16[u..], ldw, v);
                        }
                        (k.pv_flush)(&mut acc, &mut acc32, d, &step, &zt);
                    }
                    assert!(acc32.iter().all(|&x| x == 0), "flush zeroes acc32");
                    (w16, step.map_bits(), zt, acc.map_bits())
                };
                let (a, b) = (run(&f), run(&s));
                assert_eq!(a, b, "int P.V d {d} group {group} n {n} ldw {ldw}");
                let (w16, step, zt, acc) = (b.0, b.1.unbits(), b.2, b.3.unbits());
                for h in 0..heads {
                    let g = h / group;
                    let what = format!("d {d} group {group} n {n} ldw {ldw} h {h}");
                    if h == 2 && heads > 2 {
                        assert!(
                            step[h].is_nan() && acc[h * d..(h + 1) * d].iter().all(|x| x.is_nan())
                        );
                        continue;
                    }
                    let wh = &w16[h * ldw..(h + 1) * ldw];
                    assert!(wh[n..].iter().all(|&x| x == 0), "{what}: padding");
                    if h == 1 {
                        assert_eq!(step[h], 0.0, "{what}");
                        assert_eq!(
                            acc[d..2 * d],
                            a0[d..2 * d],
                            "{what}: zero weights changed acc"
                        );
                        continue;
                    }
                    let sc = step[h];
                    assert_eq!(
                        wh.iter().map(|x| x.abs()).max(),
                        Some(32767),
                        "{what}: step not tight"
                    );
                    let z: i64 = (0..n)
                        .map(|t| i64::from(wh[t]) * i64::from(zps[t][g]))
                        .sum();
                    assert_eq!(i64::from(zt[h]), z, "{what}: zero-point term");
                    let mut werr = [0f64; PV_MAX_TILE];
                    for t in 0..n {
                        let w = f64::from(p[h * ldp + t] * scales[t][g]);
                        werr[t] = (f64::from(wh[t]) * f64::from(sc) - w).abs();
                        assert!(
                            werr[t] <= f64::from(sc) * (0.5 + 1.0 / 256.0),
                            "{what}: weight {t}"
                        );
                    }
                    for j in 0..d {
                        let x: i64 = (0..n)
                            .map(|t| {
                                i64::from(wh[t])
                                    * (i64::from(vals[t][g * d + j]) - i64::from(zps[t][g]))
                            })
                            .sum();
                        let model = a0[h * d + j] + sc * (x as i32 as f32);
                        assert_eq!(
                            acc[h * d + j].to_bits(),
                            model.to_bits(),
                            "{what}: lane {j}"
                        );
                        let (mut want, mut mag, mut bound) = (f64::from(a0[h * d + j]), 0f64, 0f64);
                        for t in 0..n {
                            let v = f64::from(vals[t][g * d + j]) - f64::from(zps[t][g]);
                            let y = f64::from(p[h * ldp + t]) * f64::from(scales[t][g]) * v;
                            want += y;
                            mag += y.abs();
                            bound += f64::from(sc) * (0.5 + 1.0 / 256.0) * v.abs();
                        }
                        let got = f64::from(acc[h * d + j]);
                        assert!(
                            (got - want).abs() <= bound + 1e-5 * (mag + want.abs()),
                            "{what}: lane {j}: {got} vs {want} (bound {bound})"
                        );
                    }
                }
            }
        }
    }

    /// f32 vectors compared and stored by their bits (NaN equal to itself). Every NaN maps to
    /// one pattern: Rust leaves a NaN result's sign and payload unspecified, and Miri picks
    /// them at random.
    trait Bits {
        fn map_bits(&self) -> Vec<u32>;
    }
    impl Bits for Vec<f32> {
        fn map_bits(&self) -> Vec<u32> {
            self.iter()
                .map(|x| if x.is_nan() { f32::NAN } else { *x }.to_bits())
                .collect()
        }
    }
    trait Unbits {
        fn unbits(&self) -> Vec<f32>;
    }
    impl Unbits for Vec<u32> {
        fn unbits(&self) -> Vec<f32> {
            self.iter().map(|&x| f32::from_bits(x)).collect()
        }
    }

    /// The conversion kernels of `f` give exactly the scalar results (all lengths 0..40, so
    /// every vector tail is covered).
    fn conversions_match_scalar(f: Kernels) {
        let s = Kernels::scalar();
        let x = data(40, 21);
        let bf: Vec<Bf16> = x.iter().map(|&v| Bf16::from_f32(v * 300.0)).collect();
        let hf: Vec<F16> = x.iter().map(|&v| F16::from_f32(v * 300.0)).collect();
        let q: Vec<i8> = (0..40).map(|i| (i * 37 % 256) as u8 as i8).collect();
        for n in lengths(0..40) {
            let (mut a, mut b) = (vec![f32::NAN; n + 1], vec![f32::NAN; n + 1]);
            // SAFETY: slice-based kernels on a CPU that runs `f`'s level.
            unsafe {
                (f.widen_bf16)(&bf[..n], &mut a);
                (s.widen_bf16)(&bf[..n], &mut b);
            }
            assert_eq!(a[..n], b[..n], "bf16 n {n}");
            assert!(a[n].is_nan(), "bf16 wrote past n");
            // SAFETY: as above.
            unsafe {
                (f.widen_f16)(&hf[..n], &mut a);
                (s.widen_f16)(&hf[..n], &mut b);
            }
            assert_eq!(a[..n], b[..n], "f16 n {n}");
            // SAFETY: as above.
            unsafe {
                (f.dequant)(&q[..n], 0.037, -5, &mut a);
                (s.dequant)(&q[..n], 0.037, -5, &mut b);
            }
            assert_eq!(a[..n], b[..n], "dequant n {n}");
            for i in 0..n {
                assert_eq!(b[i], (f32::from(q[i]) + 5.0) * 0.037);
            }
        }
    }

    /// The decode row kernels of `f` (f32, bf16, int8 rows) agree with the scalar ones, and the
    /// scalar ones with an f64 sum, to 1e-5 relative to the sum of magnitudes (plus, for the
    /// integer int8 scores, the query's i16 rounding): head dims 1..40 (every vector tail) and
    /// 128, MHA and groups of 2 and 4; 6 and 7 heads (a remainder after the four-head blocks);
    /// head dims 300 and 520 (several 256-lane integer blocks); every `w`, zero weights.
    fn fused_match_scalar(f: Kernels) {
        use crate::fused::{KvRow, Q16};
        let s = Kernels::scalar();
        // quantize_q16: bit-identical to the scalar version, on heads of zeros, with a NaN,
        // with an infinity, and of every length 1..40 (every vector tail).
        for d in lengths(1..40) {
            let mut q = data(5 * d, 60 + d as u32);
            q[d..2 * d].fill(0.0);
            q[2 * d + d / 2] = f32::NAN;
            q[3 * d] = f32::NEG_INFINITY;
            let run = |k: &Kernels| {
                let (mut a, mut b, mut c) = (vec![7i16; 5 * d], vec![7f32; 5], vec![7i32; 5]);
                // SAFETY: slice-based kernel on a CPU that runs its level.
                unsafe { (k.quantize_q16)(&q, d, &mut a, &mut b, &mut c) };
                (a, b.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), c)
            };
            let (a, b) = (run(&f), run(&s));
            assert_eq!(a, b, "quantize_q16 d {d}");
            assert_eq!(b.1[1], 0, "zero head: scale 0");
            assert!(f32::from_bits(b.1[2]).is_nan() && f32::from_bits(b.1[3]).is_nan());
            for h in [0, 4] {
                let sc = f32::from_bits(b.1[h]);
                for j in 0..d {
                    let x = q[h * d + j];
                    assert!(
                        (f32::from(b.0[h * d + j]) * sc - x).abs() <= sc * 0.5001,
                        "{x}"
                    );
                }
                assert_eq!(
                    b.2[h],
                    b.0[h * d..(h + 1) * d].iter().map(|&x| i32::from(x)).sum()
                );
            }
        }
        // Under Miri (a minute for 128 x 8 heads there) smaller long cases with the same loop
        // shapes: 80 and 97 lanes reach the 64- and 16-lane steps and a tail, 290 the integer
        // scores' second block of 256 lanes.
        let long: &[(usize, usize, usize)] = if cfg!(miri) {
            &[(80, 2, 2), (97, 2, 1), (290, 2, 2)]
        } else {
            &[
                (128, 8, 1),
                (128, 8, 4),
                (24, 6, 3),
                (300, 7, 7),
                (520, 2, 1),
            ]
        };
        for (d, heads, group) in lengths(1..40)
            .map(|d| (d, 4, 1 + d % 3 * (d % 3)))
            .chain(long.iter().copied())
        {
            let group = if heads % group == 0 { group } else { 1 };
            let kvh = heads / group;
            let n = kvh * d;
            let q = data(heads * d, 31 + d as u32);
            let fl: Vec<Vec<f32>> = (0..4).map(|u| data(n, 32 + u + d as u32)).collect();
            let bf: Vec<Vec<Bf16>> = fl
                .iter()
                .map(|r| r.iter().map(|&x| Bf16::from_f32(x)).collect())
                .collect();
            let i8s: Vec<Vec<i8>> = (0..4)
                .map(|u| {
                    (0..n)
                        .map(|j| ((j * 37 + u * 11) % 256) as u8 as i8)
                        .collect()
                })
                .collect();
            let scales: Vec<Vec<f32>> = (0..4).map(|u| data(kvh, 40 + u)).collect();
            let zps: Vec<Vec<i8>> = (0..4)
                .map(|u| {
                    (0..kvh)
                        .map(|g| ((g * 53 + u * 7) % 256) as u8 as i8)
                        .collect()
                })
                .collect();
            let rf = |u: usize| KvRow::dense(&fl[u][..]);
            let rb = |u: usize| KvRow::dense(&bf[u][..]);
            let ri = |u: usize| KvRow {
                x: &i8s[u][..],
                scales: &scales[u][..],
                zps: &zps[u][..],
            };
            // f64 reference of element j of head g of row u, and its magnitude bound.
            let deq = |u: usize, kind: usize, g: usize, j: usize| -> f64 {
                match kind {
                    0 => f64::from(fl[u][g * d + j]),
                    1 => f64::from(bf[u][g * d + j].to_f32()),
                    _ => {
                        (f64::from(i8s[u][g * d + j]) - f64::from(zps[u][g]))
                            * f64::from(scales[u][g])
                    }
                }
            };
            let (mut q16, mut q16_scale, mut q16_sum) =
                (vec![0i16; heads * d], vec![0f32; heads], vec![0i32; heads]);
            // SAFETY: slice-based kernel on a CPU that runs `f`'s level.
            unsafe { (f.quantize_q16)(&q, d, &mut q16, &mut q16_scale, &mut q16_sum) };
            // The query as `f.scores_bf16` takes it.
            #[cfg(target_arch = "x86_64")]
            let q_split = {
                let mut x = q.clone();
                fused::split16(&mut x, d);
                x
            };
            #[cfg(not(target_arch = "x86_64"))]
            let q_split = q.clone();
            let q_bf16 = |k: &Kernels| if k.bf16_split_q { &q_split[..] } else { &q[..] };
            let lds = 3;
            for kind in 0..3 {
                let (mut s1, mut s2) = (vec![f32::NAN; heads * lds], vec![f32::NAN; heads * lds]);
                // SAFETY: slice-based kernels (they check their lengths) on a CPU that runs
                // `f`'s level.
                unsafe {
                    match kind {
                        0 => {
                            (f.scores_f32)(&q, d, group, rf(0), &mut s1, lds);
                            (s.scores_f32)(&q, d, group, rf(0), &mut s2, lds);
                        }
                        1 => {
                            (f.scores_bf16)(q_bf16(&f), d, group, rb(0), &mut s1, lds);
                            (s.scores_bf16)(&q, d, group, rb(0), &mut s2, lds);
                        }
                        _ => {
                            let q16 = Q16 {
                                q: &q16,
                                scale: &q16_scale,
                                sum: &q16_sum,
                            };
                            (f.scores_q16)(q16, d, group, ri(0), &mut s1, lds);
                            (s.scores_q16)(q16, d, group, ri(0), &mut s2, lds);
                        }
                    }
                }
                for h in 0..heads {
                    let g = h / group;
                    let (mut want, mut mag, mut q16_err) = (0f64, 0f64, 0f64);
                    for j in 0..d {
                        let x = f64::from(q[h * d + j]) * deq(0, kind, g, j);
                        want += x;
                        mag += x.abs();
                        // int8: each query element is off by at most half its head's i16 step.
                        q16_err += 0.5 * f64::from(q16_scale[h]) * deq(0, kind, g, j).abs();
                    }
                    let bound = 1e-5 * mag + if kind == 2 { q16_err } else { 0.0 };
                    for got in [s1[h * lds], s2[h * lds]] {
                        assert!(
                            (f64::from(got) - want).abs() <= bound + 1e-30,
                            "scores kind {kind} d {d} group {group} h {h}: {got} vs {want}"
                        );
                    }
                    assert!(s1[h * lds + 1].is_nan(), "wrote between heads");
                    if kind == 2 && f.level == SimdLevel::Avx512 {
                        // The same integer sums and last step as the portable kernel.
                        assert_eq!(s1[h * lds].to_bits(), s2[h * lds].to_bits(), "q16 bits");
                    }
                }
                for w in 1..=4 {
                    let ldp = 5;
                    let mut p = data(heads * ldp, 50 + w as u32);
                    p[ldp..2 * ldp].fill(0.0); // head 1: all weights 0, skipped
                    let a0 = data(heads * d, 51);
                    let (mut a1, mut a2) = (a0.clone(), a0.clone());
                    // SAFETY: as above.
                    unsafe {
                        match kind {
                            0 => {
                                let v = [0, 1, 2, 3].map(rf);
                                (f.axpy_f32)(&mut a1, d, group, &p, ldp, w, v);
                                (s.axpy_f32)(&mut a2, d, group, &p, ldp, w, v);
                            }
                            1 => {
                                let v = [0, 1, 2, 3].map(rb);
                                (f.axpy_bf16)(&mut a1, d, group, &p, ldp, w, v);
                                (s.axpy_bf16)(&mut a2, d, group, &p, ldp, w, v);
                            }
                            _ => {
                                let v = [0, 1, 2, 3].map(ri);
                                (f.axpy_i8)(&mut a1, d, group, &p, ldp, w, v);
                                (s.axpy_i8)(&mut a2, d, group, &p, ldp, w, v);
                            }
                        }
                    }
                    for h in 0..heads {
                        let g = h / group;
                        for j in 0..d {
                            let i = h * d + j;
                            let (mut want, mut mag) = (f64::from(a0[i]), f64::from(a0[i]).abs());
                            for u in 0..w {
                                let x = f64::from(p[h * ldp + u]) * deq(u, kind, g, j);
                                want += x;
                                mag += x.abs();
                            }
                            for got in [a1[i], a2[i]] {
                                assert!(
                                    (f64::from(got) - want).abs() <= 1e-5 * mag,
                                    "axpy kind {kind} d {d} group {group} w {w} at {i}: \
                                     {got} vs {want}"
                                );
                            }
                        }
                    }
                    assert_eq!(a1[d..2 * d], a0[d..2 * d], "head 1 (zero weights) changed");
                }
            }
        }
    }

    fn matches_scalar(f: Kernels) {
        let s = Kernels::scalar();
        // Under Miri (half a minute per length there) three lengths: 40 still has a 16-lane
        // tail after full vectors in `softmax_row` (valid 21 and 40) and `scale`.
        let dims: &[usize] = if cfg!(miri) {
            &[1, 8, 40]
        } else {
            &[1, 7, 8, 64, 72, 100, 128]
        };
        for &d in dims {
            let a = data(d * MR, d as u32);
            let b = data(d * NR, 3 + d as u32);
            let (mut s1, mut s2) = (vec![0f32; MR * 20], vec![0f32; MR * 20]);
            // SAFETY: a holds d*MR floats, b d*NR, s rows of NR at stride 20 (MR*20 floats).
            unsafe {
                (f.qk_tile)(a.as_ptr(), d, b.as_ptr(), s1.as_mut_ptr(), 20);
                (s.qk_tile)(a.as_ptr(), d, b.as_ptr(), s2.as_mut_ptr(), 20);
            }
            close(&s1, &s2, 1e-5);

            let nk = d.min(50);
            let p = data(MR * 50, 5);
            let v = data(nk * 32, 6);
            let (mut o1, mut o2) = (data(MR * 24, 7), data(MR * 24, 7));
            // SAFETY: p rows of nk <= 50 at stride 50; v rows of 16 at stride 32 (nk rows);
            // o rows of 16 at stride 24.
            unsafe {
                (f.pv_tile)(p.as_ptr(), 50, v.as_ptr(), 32, nk, o1.as_mut_ptr(), 24);
                (s.pv_tile)(p.as_ptr(), 50, v.as_ptr(), 32, nk, o2.as_mut_ptr(), 24);
            }
            close(&o1, &o2, 1e-5);

            let mut a1 = data(d, 10);
            let mut a2 = a1.clone();
            // SAFETY: slice-based kernels on a CPU `detect` chose them for.
            unsafe {
                (f.scale)(&mut a1, 0.7);
                (s.scale)(&mut a2, 0.7);
            }
            close(&a1, &a2, 1e-5);

            for (nk, nkp) in [(0, 16), (5, 16), (8, 16), (16, 16), (27, 32), (64, 64)] {
                let stride = d + 5;
                let k = data(nk.max(1) * stride, 16);
                let (mut p1, mut p2) = (vec![f32::NAN; nkp * d], vec![f32::NAN; nkp * d]);
                // SAFETY: as above.
                unsafe {
                    (f.pack_k)(&k, stride, nk, nkp, d, &mut p1);
                    (s.pack_k)(&k, stride, nk, nkp, d, &mut p2);
                }
                assert_eq!(p1, p2, "pack_k d {d} nk {nk}");
                for j in 0..nkp {
                    for x in 0..d {
                        let want = if j < nk { k[j * stride + x] } else { 0.0 };
                        assert_eq!(p2[(j / NR) * d * NR + x * NR + j % NR], want);
                    }
                }
            }

            for valid in [1, d / 2 + 1, d] {
                let (mut r1, mut r2) = (data(d, 15), data(d, 15));
                for m_old in [f32::NEG_INFINITY, 0.5, 30.0] {
                    // SAFETY: as above.
                    let (x1, x2) = unsafe {
                        (
                            (f.softmax_row)(&mut r1, valid, 9.0, m_old),
                            (s.softmax_row)(&mut r2, valid, 9.0, m_old),
                        )
                    };
                    close(&[x1.0, x1.1], &[x2.0, x2.1], 1e-5);
                    close(&r1, &r2, 1e-5);
                    assert!(r1[valid..].iter().all(|&z| z == 0.0));
                }
            }
        }
    }
}
