//! The kernel sets and their dispatch table: one [`Kernels`] per SIMD level, filled once per
//! call from [`simd_level`].
//!
//! - [`scalar`]: the portable kernels, and the reference the others are tested against;
//! - [`tile`]: the prefill micro-kernels and the online-softmax step, one generic body each;
//! - [`row`]: decode's row kernels (scores and `acc += P . V` over a whole position row), the
//!   portable ones and one generic body each;
//! - [`int8`]: the int8 cache's integer kernels (i16 query, integer scores and `P . V`), one
//!   generic body each, whose portable instantiation is the portable set's;
//! - [`convert`]: bf16 / f16 / int8 tiles to f32;
//! - `avx2`: what stays per ISA on x86 (register transposes, the bf16 split-query scores,
//!   prefetches), used by the AVX2 and AVX-512 sets; the per-ISA integer multiply-adds are
//!   `kernel_simd` primitives, so no other ISA has a file here;
//! - `tests`: every level against the portable set.
//!
//! The generic bodies are written over `kernel_simd::Simd` and instantiated per ISA by
//! `kernel_simd::instantiate!`.
//!
//! Packed layouts used by the tile kernels (`MR = 6` rows, `NR = 16` columns):
//! - packed Q strip: `[d][MR]` (the MR rows of a strip interleaved, so the micro-kernel reads
//!   one stream);
//! - packed K panel: `[d][NR]` (NR consecutive KV positions of one head, transposed);
//! - packed V tile: `[t][d_pad]` row-major, head dim padded to a multiple of NR with zeros.

pub(crate) mod convert;
pub(crate) mod int8;
pub(crate) mod layout;
pub(crate) mod row;
pub(crate) mod scalar;
pub(crate) mod tile;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(test)]
pub(crate) mod tests;

use crate::elem::{Bf16, F16};
use crate::simd::{simd_level, SimdLevel};
use int8::{PvFlush, PvMadd, PvTableFn, PvWeights, QuantizeQ16, ScoresQ16};
use layout::Strided;
use row::{AxpyRow, ScoresRow};

/// The kernel set of a call. Every function pointer is `unsafe` because the SIMD versions
/// require the CPU features checked by [`Kernels::for_level`], on top of each kernel's own
/// pointer contract (documented on the scalar version, which the SIMD ones match).
#[derive(Clone, Copy)]
pub(crate) struct Kernels {
    /// `S[MR x NR] = Qstrip . Kpanel`: see [`scalar::qk_tile`].
    pub qk_tile: unsafe fn(*const f32, usize, *const f32, *mut f32, usize),
    /// `O[MR x NR] += P[MR x nk] . V[nk x NR]`: see [`scalar::pv_tile`].
    pub pv_tile: unsafe fn(Strided<*const f32>, Strided<*const f32>, usize, Strided<*mut f32>),
    /// Online-softmax step of one row: see [`scalar::softmax_row`].
    pub softmax_row: unsafe fn(&mut [f32], usize, f32, f32) -> (f32, f32),
    /// `x *= a`.
    pub scale: unsafe fn(&mut [f32], f32),
    /// Packs a K tile into panels: see [`scalar::pack_k`].
    pub pack_k: unsafe fn(&[f32], scalar::KTile, &mut [f32]),
    /// Prefetches rows of a strided tensor towards L2: see [`scalar::prefetch_rows`].
    pub prefetch_rows: unsafe fn(*const u8, usize, usize, usize, usize, usize),
    /// bf16 to f32: see [`convert::widen_bf16`].
    pub widen_bf16: unsafe fn(&[Bf16], &mut [f32]),
    /// f16 to f32: see [`convert::widen_f16`].
    pub widen_f16: unsafe fn(&[F16], &mut [f32]),
    /// int8 to f32: see [`convert::dequant`].
    pub dequant: unsafe fn(&[i8], f32, i8, &mut [f32]),
    /// Decode's scores against one f32 K position row: see [`row::scores_row`].
    pub scores_f32: ScoresRow<f32>,
    /// The same on a bf16 K row; with `bf16_split_q`, `q` in the order of `row::split16`.
    pub scores_bf16: ScoresRow<Bf16>,
    /// Whether `scores_bf16` takes its query rows reordered by `row::split16`.
    pub bf16_split_q: bool,
    /// The same on an int8 K row, with the query quantized to i16 (an integer dot product):
    /// see [`int8::scores_q16`].
    pub scores_q16: ScoresQ16,
    /// Quantizes query rows to i16 for `scores_q16`: see [`int8::quantize_q16`].
    pub quantize_q16: QuantizeQ16,
    /// Decode's `acc += P . V` over f32 V position rows: see [`row::axpy_row`].
    pub axpy_f32: AxpyRow<f32>,
    /// The same on bf16 V rows.
    pub axpy_bf16: AxpyRow<Bf16>,
    /// The same on int8 V rows (used when `int_pv` is false).
    pub axpy_i8: AxpyRow<i8>,
    /// Whether decode computes an int8 cache's `P . V` in integers (`int8::pv_weights`,
    /// then `pv_madd` per four V rows, `pv_flush` per tile) instead of with `axpy_i8`.
    pub int_pv: bool,
    /// The integer `P . V`'s table of a tile's V scales and zero points: see
    /// [`int8::pv_table`].
    pub pv_table: PvTableFn,
    /// The integer `P . V`'s i16 weights of a tile: see [`int8::pv_weights`].
    pub pv_weights: PvWeights,
    /// Integer `acc32 += W . V` over four int8 V rows: see [`int8::pv_madd`].
    pub pv_madd: PvMadd,
    /// Ends a tile of the integer `P . V`: see [`int8::pv_flush`].
    pub pv_flush: PvFlush,
    /// Which set this is.
    pub level: SimdLevel,
}

/// The generic kernels instantiated for one ISA (`$isa`: `avx2`, `avx512` or `neon`, the
/// functions `kernel_simd::instantiate!` writes), the portable set for the rest. The kernels
/// of `tile` and `int8` fill the field of their own name.
macro_rules! generic_set {
    ($isa:ident, $level:expr) => {
        Kernels {
            widen_bf16: convert::widen_bf16_simd::$isa,
            widen_f16: convert::widen_f16_simd::$isa,
            dequant: convert::dequant_simd::$isa,
            scores_f32: row::scores_simd::$isa,
            scores_bf16: row::scores_simd::$isa,
            bf16_split_q: false,
            axpy_f32: row::axpy_simd::$isa,
            axpy_bf16: row::axpy_simd::$isa,
            axpy_i8: row::axpy_simd::$isa,
            level: $level,
            ..generic_set!(@named $isa, tile: qk_tile pv_tile softmax_row scale,
                int8: scores_q16 quantize_q16 pv_weights pv_madd pv_flush)
        }
    };
    (@named $isa:ident, $($m:ident: $($f:ident)*),*) => {
        Kernels {
            $($($f: $m::$f::$isa,)*)*
            ..Kernels::scalar()
        }
    };
}

impl Kernels {
    /// The kernel set of [`simd_level`]: the best this CPU runs within the caps.
    pub(crate) fn detect() -> Kernels {
        Kernels::for_level(simd_level())
    }

    /// The kernel set of `level`, which must be one of `available_simd_levels()` (any other
    /// gives the portable set).
    pub(crate) fn for_level(level: SimdLevel) -> Kernels {
        match level {
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 if level.is_available() => Kernels {
                // The bf16 scores on the split query.
                scores_bf16: avx2::scores_row_bf16_split,
                bf16_split_q: true,
                ..Kernels::x86_common(generic_set!(avx2, level))
            },
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 if level.is_available() => {
                Kernels::x86_common(generic_set!(avx512, level))
            }
            #[cfg(target_arch = "aarch64")]
            SimdLevel::Neon if level.is_available() => Kernels {
                // NEON keeps the f32 `P . V` (its axpy converts in registers).
                int_pv: false,
                ..generic_set!(neon, level)
            },
            _ => Kernels::scalar(),
        }
    }

    /// `set` with the x86-64 kernels that are AVX2 on both x86 levels: the transposes (of
    /// `pack_k` and the int8 scale table) and the prefetches.
    #[cfg(target_arch = "x86_64")]
    fn x86_common(set: Kernels) -> Kernels {
        Kernels {
            pack_k: avx2::pack_k,
            prefetch_rows: avx2::prefetch_rows,
            pv_table: avx2::pv_table,
            ..set
        }
    }

    /// One online-softmax step of a query row over a tile: raw scores `srow` (those in `vis`
    /// visible, the others masked to weight 0; none visible leaves only zeros) become `P`, and
    /// the row's running max `m`, running sum `l` and unnormalised accumulator `acc` are
    /// rescaled to the new max. Masked scores are never read.
    #[inline]
    pub(crate) fn softmax_update(
        &self,
        srow: &mut [f32],
        vis: core::ops::Range<usize>,
        c: f32,
        m: &mut f32,
        l: &mut f32,
        acc: &mut [f32],
    ) {
        if vis.is_empty() {
            srow.fill(0.0);
            return;
        }
        let (masked, seen) = srow.split_at_mut(vis.start);
        masked.fill(0.0);
        // SAFETY: slice-based kernel; a set is only built for a level this CPU runs.
        let (mn, sum) = unsafe { (self.softmax_row)(seen, vis.len(), c, *m) };
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
            scores_f32: row::scores_row,
            scores_bf16: row::scores_row,
            bf16_split_q: false,
            scores_q16: int8::scores_q16::portable,
            quantize_q16: int8::quantize_q16::portable,
            axpy_f32: row::axpy_row,
            axpy_bf16: row::axpy_row,
            axpy_i8: row::axpy_row,
            int_pv: true,
            pv_table: int8::pv_table,
            pv_weights: int8::pv_weights::portable,
            pv_madd: int8::pv_madd::portable,
            pv_flush: int8::pv_flush::portable,
            level: SimdLevel::Portable,
        }
    }
}

/// Whether calls made now on this thread use SIMD kernels (a level above portable), for
/// reports; [`simd_level`] says which.
pub fn simd_enabled() -> bool {
    Kernels::detect().level != SimdLevel::Portable
}
