//! Decode's kernels over a whole K or V position row (all KV heads of one position, contiguous
//! in the cache), reading f32, bf16 or int8 storage directly (widened or dequantized in
//! registers).
//!
//! On the decode path each K/V head vector is used once per query head of its group, so
//! converting it to an f32 buffer first only adds a store and a reload per element (measured
//! slower); and one kernel call per head and position (the previous version) spent ~16% of
//! int8 decode in the loop around the calls. A call here covers every query head of one query
//! row against one position row (scores), or every head's accumulator against four position
//! rows (`acc += P . V`).
//!
//! int8 rows are read here by the f32 axpy ([`axpy_row`]), which takes the values and the
//! weights `p * scale` per head and row and subtracts `sum_u w_u zp_u` once per lane group (the
//! NEON set's `P . V`); the integer kernels of the int8 cache are in [`super::int8`].

use kernel_simd::Simd;

use super::layout::{GroupedHeads, Strided};
use crate::elem::{Bf16, F16};

/// The storage types a position row can have.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum LaneKind {
    F32,
    Bf16,
    F16,
    I8,
}

/// An element type the row kernels read.
pub(crate) trait Lane: Copy {
    /// Which one (the SIMD loads branch on it at compile time).
    const KIND: LaneKind;
    /// `self - zp` as f32 (`zp` is 0 for the dense types).
    fn widen(self, zp: i32) -> f32;
    /// `S::LANES` elements at `p` as f32 (int8 values as they are: the caller applies the
    /// zero point).
    ///
    /// # Safety
    /// `p` is readable for `S::LANES` elements.
    unsafe fn load<S: Simd>(s: S, p: *const Self) -> S::F32;
}

impl Lane for f32 {
    const KIND: LaneKind = LaneKind::F32;
    #[inline(always)]
    unsafe fn load<S: Simd>(s: S, p: *const Self) -> S::F32 {
        // SAFETY: `p` is readable for LANES elements (caller).
        unsafe { s.load(p) }
    }
    #[inline]
    fn widen(self, _: i32) -> f32 {
        self
    }
}

/// The 16-bit float storages: loaded by the token's widening load of the same name, widened
/// exactly by `to_f32`.
macro_rules! half_lane {
    ($($t:ident: $load:ident),*) => {$(
        impl Lane for $t {
            const KIND: LaneKind = LaneKind::$t;
            #[inline(always)]
            unsafe fn load<S: Simd>(s: S, p: *const Self) -> S::F32 {
                // SAFETY: `p` is readable for LANES elements (caller).
                unsafe { s.$load(p.cast()) }
            }
            #[inline]
            fn widen(self, _: i32) -> f32 {
                self.to_f32()
            }
        }
    )*};
}
half_lane!(Bf16: load_bf16, F16: load_f16);

impl Lane for i8 {
    const KIND: LaneKind = LaneKind::I8;
    #[inline(always)]
    unsafe fn load<S: Simd>(s: S, p: *const Self) -> S::F32 {
        // SAFETY: `p` is readable for LANES elements (caller).
        unsafe { s.i32_to_f32(s.load_i8(p)) }
    }
    #[inline]
    fn widen(self, zp: i32) -> f32 {
        (i32::from(self) - zp) as f32
    }
}

/// One K or V position row: `kv_heads` head vectors of `d` elements in `x`, and for the int8
/// cache one scale and zero point per head (`scales` empty for the dense types, which have
/// scale 1 and zero point 0).
#[derive(Clone, Copy)]
pub(crate) struct KvRow<'a, E> {
    pub x: &'a [E],
    pub scales: &'a [f32],
    pub zps: &'a [i8],
}

impl<E: Lane> KvRow<'_, E> {
    /// A dense row (scale 1, zero point 0).
    pub(crate) fn dense(x: &[E]) -> KvRow<'_, E> {
        KvRow {
            x,
            scales: &[],
            zps: &[],
        }
    }

    /// Head `g`'s scale and zero point.
    #[inline]
    pub(crate) fn head(&self, g: usize) -> (f32, i32) {
        if self.scales.is_empty() {
            (1.0, 0)
        } else {
            (self.scales[g], i32::from(self.zps[g]))
        }
    }

    /// Panics unless this row holds `kv_heads` head vectors of `d` elements (and, if scaled,
    /// `kv_heads` scales and zero points).
    fn check(&self, kv_heads: usize, d: usize) {
        assert_eq!(self.x.len(), kv_heads * d, "row length");
        assert!(
            self.scales.is_empty() && self.zps.is_empty()
                || self.scales.len() == kv_heads && self.zps.len() == kv_heads,
            "scales / zero points"
        );
    }
}

/// Checks the arguments shared by the row kernels and returns the number of query heads: `n`
/// elements of query rows (or accumulators) of `hg.d` lanes, position rows `rows`, and a
/// strided operand (the scores or the weights) of `len` elements, read or written at
/// `h * ld + j` for `j < width`.
pub(crate) fn check<E: Lane>(
    n: usize,
    hg: GroupedHeads,
    rows: &[KvRow<'_, E>],
    (len, ld): (usize, usize),
    width: usize,
) -> usize {
    let GroupedHeads { d, group } = hg;
    assert!(d > 0 && group > 0 && n.is_multiple_of(d), "query rows");
    let heads = n / d;
    assert!(heads.is_multiple_of(group), "group");
    for r in rows {
        r.check(heads / group, d);
    }
    assert!(
        heads == 0 || (heads - 1) * ld + width <= len,
        "strided operand too short"
    );
    heads
}

/// `(h, h / group)` for every query head `h < heads` (`heads` a multiple of `group`), in order,
/// without a division per head (the row kernels visit every head once per position row).
#[inline(always)]
pub(crate) fn heads_by_group(heads: usize, group: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..heads / group).flat_map(move |g| (g * group..(g + 1) * group).map(move |h| (h, g)))
}

/// Scores of one query row against one position row: for each query head `h < q.len() / d`,
/// with `g = h / group`, `s[h * lds] = scale_g * sum_j q[h d + j] * (k[g d + j] - zp_g)`
/// (`Strided(s, lds) = out`). Panics if the lengths do not fit.
///
/// # Safety
/// None (safe to call).
pub(crate) unsafe fn scores_row<E: Lane>(
    q: &[f32],
    hg: GroupedHeads,
    k: KvRow<'_, E>,
    out: Strided<&mut [f32]>,
) {
    let (GroupedHeads { d, group }, Strided(s, lds)) = (hg, out);
    let heads = check(q.len(), hg, &[k], (s.len(), lds), 1);
    for (h, g) in heads_by_group(heads, group) {
        let (sc, zp) = k.head(g);
        let kh = &k.x[g * d..(g + 1) * d];
        let dot: f32 = q[h * d..(h + 1) * d]
            .iter()
            .zip(kh)
            .map(|(a, b)| a * b.widen(zp))
            .sum();
        s[h * lds] = sc * dot;
    }
}

/// `acc += P . V` over the `w = v.len()` position rows `v` (one to four): for each head
/// `h < acc.len() / d`, with `g = h / group`, `acc[h d + j] += sum_{u < w} p[h * ldp + u] *
/// scale_{u,g} * (v_u[g d + j] - zp_{u,g})` (`Strided(p, ldp) = weights`). Heads whose `w`
/// weights are all 0 are skipped. Panics if the lengths do not fit.
///
/// # Safety
/// None (safe to call).
pub(crate) unsafe fn axpy_row<E: Lane>(
    acc: &mut [f32],
    hg: GroupedHeads,
    weights: Strided<&[f32]>,
    v: &[KvRow<'_, E>],
) {
    let (GroupedHeads { d, group }, Strided(p, ldp), w) = (hg, weights, v.len());
    assert!((1..=4).contains(&w), "w");
    let heads = check(acc.len(), hg, v, (p.len(), ldp), w);
    for (h, g) in heads_by_group(heads, group) {
        let pw = &p[h * ldp..h * ldp + w];
        if pw.iter().all(|&x| x == 0.0) {
            continue;
        }
        let a = &mut acc[h * d..(h + 1) * d];
        for (u, &pu) in pw.iter().enumerate() {
            let (sc, zp) = v[u].head(g);
            let wu = pu * sc;
            for (x, e) in a.iter_mut().zip(&v[u].x[g * d..(g + 1) * d]) {
                *x += wu * e.widen(zp);
            }
        }
    }
}

/// The arguments of [`axpy_row`] checked (panics as it documents), as its SIMD versions take
/// them: the number of heads, and four rows, rows `u >= v.len()` being row 0 (finite values,
/// weighted 0, so they add exact zeros).
pub(crate) fn axpy_args<'a, E: Lane>(
    acc: &[f32],
    hg: GroupedHeads,
    weights: &Strided<&[f32]>,
    v: &[KvRow<'a, E>],
) -> (usize, [KvRow<'a, E>; 4]) {
    let w = v.len();
    assert!((1..=4).contains(&w), "w");
    assert!(E::KIND != LaneKind::F16, "no SIMD f16 row kernel");
    let heads = check(acc.len(), hg, v, (weights.0.len(), weights.1), w);
    (
        heads,
        core::array::from_fn(|u| if u < w { v[u] } else { v[0] }),
    )
}

/// Head `h`'s weights in the SIMD [`axpy_row`]s: `p[h * ldp + u]` (0 for `u >= w`) times row
/// `u`'s scale of head `g`, and the zero points' share `sum_u w_u zp_u`, which they subtract
/// once per lane instead of a zero point per row and lane; `None` if all weights are 0.
/// Always inlined: once per head of the hot loop (the inliner left it a call there).
#[inline(always)]
pub(crate) fn head_weights<E: Lane>(
    p: &[f32],
    ldp: usize,
    w: usize,
    v: &[KvRow<'_, E>; 4],
    h: usize,
    g: usize,
) -> Option<([f32; 4], f32)> {
    let pw: [f32; 4] = core::array::from_fn(|u| if u < w { p[h * ldp + u] } else { 0.0 });
    if pw == [0.0; 4] {
        return None;
    }
    // An array literal, not `v.map(..)`: the map was compiled as an out-of-line call per head
    // (`try_map`, with a `vzeroupper`) whose result was read back through the stack.
    let sz = [v[0].head(g), v[1].head(g), v[2].head(g), v[3].head(g)];
    let wu: [f32; 4] = core::array::from_fn(|u| pw[u] * sz[u].0);
    Some((wu, (0..4).map(|u| wu[u] * sz[u].1 as f32).sum()))
}

/// Lanes `j0..d` of head `h` in the SIMD [`axpy_row`]s (the vector tail), in scalar code.
#[inline]
pub(crate) fn axpy_tail<E: Lane>(
    acc: &mut [f32],
    h: usize,
    g: usize,
    d: usize,
    j0: usize,
    wu: [f32; 4],
    v: &[KvRow<'_, E>; 4],
) {
    for j in j0..d {
        for (u, r) in v.iter().enumerate() {
            acc[h * d + j] += wu[u] * r.x[g * d + j].widen(r.head(g).1);
        }
    }
}

/// Signature of [`scores_row`] and its SIMD versions.
pub(crate) type ScoresRow<E> = unsafe fn(&[f32], GroupedHeads, KvRow<'_, E>, Strided<&mut [f32]>);
/// Reorders each full 16-lane block of every head (`q.len() / d` heads of `d` lanes) from
/// `x0..x15` to `x0..x3, x8..x11, x4..x7, x12..x15`, the order in which the AVX2 bf16 scores
/// kernel ([`avx2::scores_row_bf16_split`]) widens a 32-byte load of bf16 (`vpunpcklwd` /
/// `vpunpckhwd` against zero: two instructions for 16 lanes instead of four). Lanes past the
/// last full block stay in place.
#[cfg(target_arch = "x86_64")]
pub(crate) fn split16(q: &mut [f32], d: usize) {
    for head in q.chunks_exact_mut(d) {
        for b in head.chunks_exact_mut(16) {
            let x: [f32; 16] = core::array::from_fn(|j| b[j]);
            b[4..8].copy_from_slice(&x[8..12]);
            b[8..12].copy_from_slice(&x[4..8]);
        }
    }
}

/// Signature of [`axpy_row`] and its SIMD versions.
pub(crate) type AxpyRow<E> = unsafe fn(&mut [f32], GroupedHeads, Strided<&[f32]>, &[KvRow<'_, E>]);

/// The body of the SIMD [`scores_row`]s (f32, bf16 and int8 K; int8 K is normally scored by
/// [`super::int8::scores_q16`]): four accumulators of `S::LANES` lanes, then single vectors, then a
/// scalar tail.
#[inline(always)]
fn scores_body<S: Simd, E: Lane>(
    s: S,
    q: &[f32],
    hg: GroupedHeads,
    k: KvRow<'_, E>,
    Strided(out, lds): Strided<&mut [f32]>,
) {
    let (l, GroupedHeads { d, group }) = (S::LANES, hg);
    let heads = check(q.len(), hg, &[k], (out.len(), lds), 1);
    let (d4, d1) = (d / (4 * l) * (4 * l), d / l * l);
    for (h, g) in heads_by_group(heads, group) {
        let (sc, zp) = k.head(g);
        // SAFETY: `h < heads`, `g < heads / group`: query row h and head vector g are `d`
        // elements inside `q` and `k.x` (checked above).
        let (qp, kp) = unsafe { (q.as_ptr().add(h * d), k.x.as_ptr().add(g * d)) };
        let mut acc = [s.zero(); 4];
        let mut j = 0;
        while j < d4 {
            for (u, au) in acc.iter_mut().enumerate() {
                // SAFETY: `j + (u + 1) * LANES <= d4 <= d`: inside both head vectors.
                unsafe {
                    let kv = E::load(s, kp.add(j + l * u));
                    *au = s.fma(s.load(qp.add(j + l * u)), kv, *au);
                }
            }
            j += 4 * l;
        }
        while j < d1 {
            // SAFETY: `j + LANES <= d1 <= d`: inside both head vectors.
            unsafe {
                let kv = E::load(s, kp.add(j));
                acc[0] = s.fma(s.load(qp.add(j)), kv, acc[0]);
            }
            j += l;
        }
        let v = s.add(s.add(acc[0], acc[1]), s.add(acc[2], acc[3]));
        let mut dot = s.reduce_sum(v);
        for j in d1..d {
            dot += q[h * d + j] * k.x[g * d + j].widen(zp);
        }
        out[h * lds] = sc * dot;
    }
}

/// The body of the SIMD [`axpy_row`]s (f32, bf16, int8; not f16): per head, the four rows'
/// weighted values added to the accumulator `S::LANES` lanes at a time, the zero points'
/// share subtracted once per lane group.
#[inline(always)]
fn axpy_body<S: Simd, E: Lane>(
    s: S,
    acc: &mut [f32],
    hg: GroupedHeads,
    weights: Strided<&[f32]>,
    rows: &[KvRow<'_, E>],
) {
    let (l, GroupedHeads { d, group }, w) = (S::LANES, hg, rows.len());
    let (heads, v) = axpy_args(acc, hg, &weights, rows);
    let Strided(p, ldp) = weights;
    let d1 = d / l * l;
    for (h, g) in heads_by_group(heads, group) {
        let Some((wu, zsum)) = head_weights(p, ldp, w, &v, h, g) else {
            continue;
        };
        let wv = wu.map(|x| s.splat(x));
        let zsum = s.splat(zsum);
        // SAFETY: `h < heads`, `g < heads / group`: accumulator h and head vector g of every
        // row are `d` elements inside `acc` and the rows (checked above).
        let (ap, vp) = unsafe {
            (
                acc.as_mut_ptr().add(h * d),
                v.map(|r| r.x.as_ptr().add(g * d)),
            )
        };
        let mut j = 0;
        while j < d1 {
            // SAFETY: `j + LANES <= d1 <= d`: inside the accumulator and every head vector.
            unsafe {
                let mut a = s.load(ap.add(j));
                for u in 0..4 {
                    a = s.fma(wv[u], E::load(s, vp[u].add(j)), a);
                }
                if E::KIND == LaneKind::I8 {
                    a = s.sub(a, zsum);
                }
                s.store(ap.add(j), a);
            }
            j += l;
        }
        if d1 < d {
            // Not a call per head when there is no tail (it stayed out of line).
            axpy_tail(acc, h, g, d, d1, wu, &v);
        }
    }
}

kernel_simd::instantiate! {
    /// [`scores_row`] per ISA (see [`scores_body`]).
    pub(crate) fn scores_simd<E: Lane>(
        q: &[f32],
        hg: GroupedHeads,
        k: KvRow<'_, E>,
        out: Strided<&mut [f32]>
    ) = scores_body;
    /// [`axpy_row`] per ISA (see [`axpy_body`]).
    pub(crate) fn axpy_simd<E: Lane>(
        acc: &mut [f32],
        hg: GroupedHeads,
        weights: Strided<&[f32]>,
        rows: &[KvRow<'_, E>]
    ) = axpy_body;
}
