//! The prefill micro-kernels and the online-softmax step, one generic body each, instantiated
//! for AVX2, AVX-512 and NEON. Same contracts as the portable versions in [`super::scalar`].
//!
//! Packed layouts (`MR = 6` rows, `NR = 16` columns): a panel row of NR floats is
//! `NR / S::LANES` vectors (one on AVX-512, two on AVX2, four on NEON), so the `MR x NR`
//! block is `MR * NR / S::LANES` accumulators.

use kernel_simd::Simd;

use super::layout::Strided;
use crate::plan::{MR, NR};

/// Most vectors per panel row (NEON's 4 lanes).
const MAX_V: usize = 4;

/// The `MR x NR` block in registers: row `r` is `c[r][..NR / S::LANES]`.
type Block<S> = [[<S as Simd>::F32; MAX_V]; MR];

/// Vectors per panel row, checked against the layouts at compile time.
#[inline(always)]
const fn vectors<S: Simd>() -> usize {
    const { assert!(NR.is_multiple_of(S::LANES) && NR / S::LANES <= MAX_V) };
    NR / S::LANES
}

/// `c[r] += sum_{x < k} a[r * a_rs + x * a_cs] * b[x * ldb..][..NR]` for `r < MR`: the FMA
/// loop of both micro-kernels (inlined into each, so the strides fold to constants where
/// they are).
///
/// # Safety
/// `a` readable at every offset named, `b` for rows `x < k` of NR floats.
#[inline(always)]
#[allow(clippy::too_many_arguments)] // two strided operands and the token
unsafe fn fma_block<S: Simd>(
    s: S,
    mut c: Block<S>,
    k: usize,
    a: *const f32,
    a_rs: usize,
    a_cs: usize,
    b: *const f32,
    ldb: usize,
) -> Block<S> {
    let nv = vectors::<S>();
    for x in 0..k {
        let bv: [S::F32; MAX_V] = core::array::from_fn(|j| {
            if j < nv {
                // SAFETY: `x < k`, `j < NR / LANES`: row `x` of `b` is readable for NR floats
                // (caller).
                unsafe { s.load(b.add(x * ldb + j * S::LANES)) }
            } else {
                s.zero()
            }
        });
        for (r, cr) in c.iter_mut().enumerate() {
            // SAFETY: `r < MR`, `x < k`: readable (caller).
            let ar = s.splat(unsafe { *a.add(r * a_rs + x * a_cs) });
            for j in 0..nv {
                cr[j] = s.fma(ar, bv[j], cr[j]);
            }
        }
    }
    c
}

/// Stores the block into rows `r < MR` of NR floats at `o + r * ldo`.
///
/// # Safety
/// Those rows are writable.
#[inline(always)]
unsafe fn store_block<S: Simd>(s: S, c: &Block<S>, o: *mut f32, ldo: usize) {
    for (r, cr) in c.iter().enumerate() {
        for (j, v) in cr.iter().enumerate().take(vectors::<S>()) {
            // SAFETY: row `r < MR` of `o` is writable for NR floats (caller), `j < NR / LANES`.
            unsafe { s.store(o.add(r * ldo + j * S::LANES), *v) };
        }
    }
}

/// The body of `qk_tile`: see [`super::scalar::qk_tile`].
///
/// # Safety
/// The contract of [`super::scalar::qk_tile`].
#[inline(always)]
unsafe fn qk_tile_body<S: Simd>(
    s: S,
    a: *const f32,
    d: usize,
    b: *const f32,
    out: *mut f32,
    lds: usize,
) {
    // SAFETY: the packed strip holds `a[x * MR + r]`, the panel rows `b[x * NR..][..NR]` for
    // `x < d`, and `out` has MR writable rows (the caller's `qk_tile` contract).
    unsafe {
        let c = fma_block(s, [[s.zero(); MAX_V]; MR], d, a, 1, MR, b, NR);
        store_block(s, &c, out, lds);
    }
}

/// The body of `pv_tile`: see [`super::scalar::pv_tile`].
///
/// # Safety
/// The contract of [`super::scalar::pv_tile`].
#[inline(always)]
unsafe fn pv_tile_body<S: Simd>(
    s: S,
    p: Strided<*const f32>,
    v: Strided<*const f32>,
    nk: usize,
    o: Strided<*mut f32>,
) {
    let (Strided(p, ldp), Strided(v, ldv), Strided(o, ldo)) = (p, v, o);
    let nv = vectors::<S>();
    let c: Block<S> = core::array::from_fn(|r| {
        core::array::from_fn(|j| {
            if j < nv {
                // SAFETY: row `r < MR` of `o` is readable for NR floats (caller).
                unsafe { s.load(o.add(r * ldo + j * S::LANES)) }
            } else {
                s.zero()
            }
        })
    });
    // SAFETY: `p[r * ldp + t]` for `r < MR`, `t < nk`, the V rows `v[t * ldv..][..NR]` and MR
    // rows of `o` are valid (the caller's `pv_tile` contract).
    unsafe {
        let c = fma_block(s, c, nk, p, ldp, 1, v, ldv);
        store_block(s, &c, o, ldo);
    }
}

/// The body of `softmax_row`: see [`super::scalar::softmax_row`]. The vector tail goes through
/// a buffer padded with -1000 (whose `exp2` is 0), so every exponential is the polynomial's.
#[inline(always)]
fn softmax_row_body<S: Simd>(
    s: S,
    row: &mut [f32],
    valid: usize,
    c: f32,
    m_old: f32,
) -> (f32, f32) {
    const { assert!(S::LANES <= 16) };
    let l = S::LANES;
    let (vis, rest) = row.split_at_mut(valid);
    let cv = s.splat(c);
    let mut mv = s.splat(m_old);
    let mut chunks = vis.chunks_exact_mut(l);
    for ch in &mut chunks {
        // SAFETY: `ch` is LANES floats.
        unsafe {
            let y = s.mul(s.load(ch.as_ptr()), cv);
            s.store(ch.as_mut_ptr(), y);
            mv = s.max(mv, y);
        }
    }
    let mut mx = s.reduce_max(mv);
    for x in chunks.into_remainder() {
        *x *= c;
        mx = mx.max(*x);
    }
    let mv = s.splat(mx);
    let mut sv = s.zero();
    let mut chunks = vis.chunks_exact_mut(l);
    for ch in &mut chunks {
        // SAFETY: `ch` is LANES floats.
        unsafe {
            let e = s.exp2_neg(s.sub(s.load(ch.as_ptr()), mv));
            s.store(ch.as_mut_ptr(), e);
            sv = s.add(sv, e);
        }
    }
    let mut sum = s.reduce_sum(sv);
    let tail = chunks.into_remainder();
    if !tail.is_empty() {
        let mut buf = [-1000.0f32; 16];
        buf[..tail.len()].copy_from_slice(tail);
        // SAFETY: `buf` holds 16 >= LANES floats.
        unsafe {
            let e = s.exp2_neg(s.sub(s.load(buf.as_ptr()), mv));
            s.store(buf.as_mut_ptr(), e);
        }
        for (x, e) in tail.iter_mut().zip(buf) {
            *x = e;
            sum += e;
        }
    }
    rest.fill(0.0);
    (mx, sum)
}

/// The body of `scale`: `x *= a`.
#[inline(always)]
fn scale_body<S: Simd>(s: S, x: &mut [f32], a: f32) {
    let av = s.splat(a);
    let mut chunks = x.chunks_exact_mut(S::LANES);
    for ch in &mut chunks {
        // SAFETY: `ch` is LANES floats.
        unsafe { s.store(ch.as_mut_ptr(), s.mul(s.load(ch.as_ptr()), av)) };
    }
    for e in chunks.into_remainder() {
        *e *= a;
    }
}

kernel_simd::instantiate! {
    /// `S[MR x NR] = Qstrip . Kpanel` per ISA.
    pub(crate) unsafe fn qk_tile(a: *const f32, d: usize, b: *const f32, out: *mut f32, lds: usize)
        = qk_tile_body;
    /// `O[MR x NR] += P[MR x nk] . V[nk x NR]` per ISA.
    pub(crate) unsafe fn pv_tile(p: Strided<*const f32>, v: Strided<*const f32>, nk: usize,
        o: Strided<*mut f32>) = pv_tile_body;
    /// One online-softmax step of a row per ISA.
    pub(crate) fn softmax_row(row: &mut [f32], valid: usize, c: f32, m_old: f32) -> (f32, f32)
        = softmax_row_body;
    /// `x *= a` per ISA.
    pub(crate) fn scale(x: &mut [f32], a: f32) = scale_body;
}
