//! The portable kernel set: scalar Rust with the contracts every SIMD version matches (and
//! the reference the tests hold them to).

use crate::kernels::layout::Strided;
use crate::plan::{MR, NR};

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

/// `o[r * ldo + j] += sum_{t < nk} p[r * ldp + t] * v[t * ldv + j]` for `r < MR`, `j < NR`,
/// with `p = Strided(p, ldp)`, `v = Strided(v, ldv)` and `o = Strided(o, ldo)`.
///
/// # Safety
/// `p` readable for rows `r < MR` of `nk` floats at `p + r * ldp`; `v` readable for rows
/// `t < nk` of `NR` floats at `v + t * ldv`; `o` readable and writable for rows `r < MR` of
/// `NR` floats at `o + r * ldo`, not overlapping `p` or `v`.
pub(crate) unsafe fn pv_tile(
    p: Strided<*const f32>,
    v: Strided<*const f32>,
    nk: usize,
    o: Strided<*mut f32>,
) {
    let (Strided(p, ldp), Strided(v, ldv), Strided(o, ldo)) = (p, v, o);
    for r in 0..MR {
        // SAFETY: row `r` of `o` is valid for NR floats and not aliased (caller).
        let orow = unsafe { &mut *o.add(r * ldo).cast::<[f32; NR]>() };
        for t in 0..nk {
            // SAFETY: `r < MR`, `t < nk`: within the caller-guaranteed extents.
            let (pv, vr) = unsafe { (*p.add(r * ldp + t), &*v.add(t * ldv).cast::<[f32; NR]>()) };
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
pub(crate) unsafe fn softmax_row(s: &mut [f32], valid: usize, c: f32, m_old: f32) -> (f32, f32) {
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

/// The layout of a K tile for [`pack_k`]: `nk` rows of `d` floats, row `j` at `j * stride`,
/// packed into `nkp` columns (a multiple of NR; columns `nk..nkp` are zero).
#[derive(Clone, Copy, Debug)]
pub(crate) struct KTile {
    pub stride: usize,
    pub nk: usize,
    pub nkp: usize,
    pub d: usize,
}

impl KTile {
    /// Panics unless `k` holds the tile's rows and `kp` its panels.
    pub(crate) fn check(&self, k: &[f32], kp: &[f32]) {
        let KTile { stride, nk, nkp, d } = *self;
        assert!(nk <= nkp && nkp.is_multiple_of(NR) && kp.len() >= nkp * d);
        assert!(nk == 0 || k.len() >= (nk - 1) * stride + d);
    }
}

/// Packs the rows of a K tile into NR-column panels: element `x` of row `j` goes to
/// `kp[(j / NR) * d * NR + x * NR + j % NR]`. Panics if `k` or `kp` is too short, or `nkp`
/// is not a multiple of NR.
///
/// # Safety
/// None (safe to call).
pub(crate) unsafe fn pack_k(k: &[f32], t: KTile, kp: &mut [f32]) {
    t.check(k, kp);
    pack_k_rows(k, t, 0..t.nkp, kp);
}

/// The rows `j` in `rows` of [`pack_k`] (zeros for `j >= nk`), one element at a time; the
/// AVX2 version packs 8x8 blocks and finishes with this.
pub(crate) fn pack_k_rows(k: &[f32], t: KTile, rows: core::ops::Range<usize>, kp: &mut [f32]) {
    let KTile { stride, nk, d, .. } = t;
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
