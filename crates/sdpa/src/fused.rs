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
//! int8 K is scored in integers ([`scores_row_q16`]): the query rows are quantized to i16 per
//! head ([`quantize_q16`]) and each dot product with `(k - zero_point)` is an exact integer sum,
//! so the query's rounding is the only error added (the scales are applied once per head).
//! int8 V is accumulated in integers on the AVX2 and portable sets ([`pv_weights`],
//! [`pv_madd`], [`pv_flush`]): per query row, head and tile the weights `p * scale` are
//! quantized to i16 with one step, `sum_t w16_t v_t` is an exact i32 sum, the zero points
//! become one integer `sum_t w16_t zp_t` per head, and the tile is flushed into the f32
//! accumulator once; the weights' rounding is the only error added. The NEON set keeps the
//! f32 axpy ([`axpy_row`]), which takes the values and the weights `p * scale` per head and
//! row and subtracts `sum_u w_u zp_u` once per lane group.

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
}

impl Lane for f32 {
    const KIND: LaneKind = LaneKind::F32;
    #[inline]
    fn widen(self, _: i32) -> f32 {
        self
    }
}

impl Lane for Bf16 {
    const KIND: LaneKind = LaneKind::Bf16;
    #[inline]
    fn widen(self, _: i32) -> f32 {
        self.to_f32()
    }
}

impl Lane for F16 {
    const KIND: LaneKind = LaneKind::F16;
    #[inline]
    fn widen(self, _: i32) -> f32 {
        self.to_f32()
    }
}

impl Lane for i8 {
    const KIND: LaneKind = LaneKind::I8;
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

/// Checks the arguments shared by both kernels and returns the number of query heads: `n`
/// floats of query rows (or accumulators) of `d` lanes, `group` query heads per KV head, rows
/// `rows`, and a strided operand (`s` or `p`) of `len` floats read or written at
/// `h * ld + j` for `j < width`.
pub(crate) fn check<E: Lane>(
    n: usize,
    d: usize,
    group: usize,
    rows: &[KvRow<'_, E>],
    len: usize,
    ld: usize,
    width: usize,
) -> usize {
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

/// Scores of one query row against one position row: for each query head `h < q.len() / d`,
/// with `g = h / group`, `s[h * lds] = scale_g * sum_j q[h d + j] * (k[g d + j] - zp_g)`.
/// Panics if the lengths do not fit.
///
/// # Safety
/// None (safe to call).
pub(crate) unsafe fn scores_row<E: Lane>(
    q: &[f32],
    d: usize,
    group: usize,
    k: KvRow<'_, E>,
    s: &mut [f32],
    lds: usize,
) {
    let heads = check(q.len(), d, group, &[k], s.len(), lds, 1);
    for h in 0..heads {
        let g = h / group;
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

/// `acc += P . V` over up to four position rows: for each head `h < acc.len() / d`, with
/// `g = h / group`, `acc[h d + j] += sum_{u < w} p[h * ldp + u] * scale_{u,g} *
/// (v_u[g d + j] - zp_{u,g})`. Rows `u >= w` (`1 <= w <= 4`) and heads whose `w` weights are
/// all 0 are skipped. Panics if the lengths do not fit.
///
/// # Safety
/// None (safe to call).
pub(crate) unsafe fn axpy_row<E: Lane>(
    acc: &mut [f32],
    d: usize,
    group: usize,
    p: &[f32],
    ldp: usize,
    w: usize,
    v: [KvRow<'_, E>; 4],
) {
    assert!((1..=4).contains(&w), "w");
    let heads = check(acc.len(), d, group, &v[..w], p.len(), ldp, w);
    for h in 0..heads {
        let g = h / group;
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
/// them: the number of heads, and the four rows with rows `u >= w` replaced by row 0 (finite
/// values, weighted 0, so they add exact zeros).
pub(crate) fn axpy_args<'a, E: Lane>(
    acc: &[f32],
    d: usize,
    group: usize,
    p: &[f32],
    ldp: usize,
    w: usize,
    v: [KvRow<'a, E>; 4],
) -> (usize, [KvRow<'a, E>; 4]) {
    assert!((1..=4).contains(&w), "w");
    assert!(E::KIND != LaneKind::F16, "no SIMD f16 row kernel");
    let heads = check(acc.len(), d, group, &v[..w], p.len(), ldp, w);
    (
        heads,
        core::array::from_fn(|u| if u < w { v[u] } else { v[0] }),
    )
}

/// Head `h`'s weights in the SIMD [`axpy_row`]s: `p[h * ldp + u]` (0 for `u >= w`) times row
/// `u`'s scale of head `g`, and the zero points' share `sum_u w_u zp_u`, which they subtract
/// once per lane instead of a zero point per row and lane; `None` if all weights are 0.
#[inline]
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
    let sz = v.map(|r| r.head(g));
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
pub(crate) type ScoresRow<E> = unsafe fn(&[f32], usize, usize, KvRow<'_, E>, &mut [f32], usize);
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

/// Signature of [`quantize_q16`] and its SIMD versions.
pub(crate) type QuantizeQ16 = unsafe fn(&[f32], usize, &mut [i16], &mut [f32], &mut [i32]);
/// Signature of [`scores_row_q16`] and its SIMD versions.
pub(crate) type ScoresQ16 = unsafe fn(Q16<'_>, usize, usize, KvRow<'_, i8>, &mut [f32], usize);
/// Signature of [`axpy_row`] and its SIMD versions.
pub(crate) type AxpyRow<E> =
    unsafe fn(&mut [f32], usize, usize, &[f32], usize, usize, [KvRow<'_, E>; 4]);

/// Most positions the integer `P . V` ([`pv_madd`]) accumulates between two flushes
/// ([`pv_flush`]): a row-path tile. With `|w16| <= 32767` and `|v| <= 128`, both the i32 sum
/// `sum_t w16_t v_t` and the zero-point term are at most `32 * 128 * 32767 < 2^27`, so
/// neither they nor their difference can overflow an i32.
pub(crate) const PV_MAX_TILE: usize = 32;
const _: () = assert!(2 * (PV_MAX_TILE as u64) * 128 * 32767 < 1 << 31);

/// A tile's V scales and zero points per KV head, transposed for [`pv_weights`]:
/// `vs[g * PV_MAX_TILE + t]`, `zp[g * PV_MAX_TILE + t]` for position `t` of the tile, 0 for
/// `t >= n` (so padded positions get weight 0). Written by [`pv_table`] once per tile and read
/// by every query row and head.
#[derive(Clone, Copy)]
pub(crate) struct PvTable<'a> {
    pub vs: &'a [f32],
    pub zp: &'a [i16],
    /// Positions in the tile (`1..=PV_MAX_TILE`).
    pub n: usize,
}

/// Fills a [`PvTable`] from the tile's `n = rows.len()` position rows (`kv_heads` heads
/// each): `vs` and `zp` must hold `kv_heads * PV_MAX_TILE` entries, which are all written.
/// Panics if a length does not fit.
///
/// # Safety
/// None (safe to call).
pub(crate) unsafe fn pv_table(
    rows: &[KvRow<'_, i8>],
    kv_heads: usize,
    vs: &mut [f32],
    zp: &mut [i16],
) {
    pv_table_from(rows, kv_heads, vs, zp, 0, 0);
}

/// Checks [`pv_table`]'s arguments.
fn pv_table_check(rows: &[KvRow<'_, i8>], kv_heads: usize, vs: &[f32], zp: &[i16]) {
    assert!((1..=PV_MAX_TILE).contains(&rows.len()), "tile");
    assert!(
        vs.len() >= kv_heads * PV_MAX_TILE && zp.len() >= kv_heads * PV_MAX_TILE,
        "table"
    );
    for r in rows {
        assert!(r.scales.len() >= kv_heads && r.zps.len() >= kv_heads, "row");
    }
}

/// [`pv_table`] for the entries its SIMD versions leave: positions `t >= t0` of every head,
/// heads `g >= g0` of positions `t < t0`, and the zero padding.
fn pv_table_from(
    rows: &[KvRow<'_, i8>],
    kv_heads: usize,
    vs: &mut [f32],
    zp: &mut [i16],
    t0: usize,
    g0: usize,
) {
    pv_table_check(rows, kv_heads, vs, zp);
    let n = rows.len();
    for (t, r) in rows.iter().enumerate() {
        let g_from = if t < t0 { g0 } else { 0 };
        for g in g_from..kv_heads {
            vs[g * PV_MAX_TILE + t] = r.scales[g];
            zp[g * PV_MAX_TILE + t] = i16::from(r.zps[g]);
        }
    }
    if n < PV_MAX_TILE {
        for g in 0..kv_heads {
            vs[g * PV_MAX_TILE + n..(g + 1) * PV_MAX_TILE].fill(0.0);
            zp[g * PV_MAX_TILE + n..(g + 1) * PV_MAX_TILE].fill(0);
        }
    }
}

/// Signature of [`pv_table`] and its SIMD versions.
pub(crate) type PvTableFn = unsafe fn(&[KvRow<'_, i8>], usize, &mut [f32], &mut [i16]);

/// The i16 weights of the integer `P . V` for one query row and a tile of `n = tab.n` int8 V
/// position rows: for each query head `h < step.len()`, with `g = h / group`, the weight
/// `w_t = p[h * ldp + t] * vscale_{t,g}` is quantized symmetrically as the query is
/// ([`quantize_q16`]): `step[h] = max_t |w_t| / 32767`, `w16[h * ldw + t] = round(w_t /
/// step)`, so that `|w16 * step - w_t| <= step * (1/2 + 2^-8)` (the second term is the f32
/// rounding of `w_t * (1 / step)`); `w16[h * ldw + t] = 0` for `n <= t < ldw`, and
/// `zterm[h] = sum_t w16_t zp_{t,g}` (exact). All-zero weights give step 0; a NaN or
/// infinite weight gives step NaN (the output is NaN, as in f32). Panics if a length does
/// not fit.
///
/// # Safety
/// None (safe to call).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn pv_weights(
    p: &[f32],
    ldp: usize,
    group: usize,
    tab: PvTable<'_>,
    ldw: usize,
    w16: &mut [i16],
    step: &mut [f32],
    zterm: &mut [i32],
) {
    let (n, heads) = pv_weights_check(p, ldp, group, tab, ldw, w16, step, zterm);
    for h in 0..heads {
        let g = h / group;
        let (vs, zp) = (
            &tab.vs[g * PV_MAX_TILE..][..n],
            &tab.zp[g * PV_MAX_TILE..][..n],
        );
        let mut w = [0f32; PV_MAX_TILE];
        let (mut mx, mut nan) = (0f32, false);
        for t in 0..n {
            w[t] = p[h * ldp + t] * vs[t];
            mx = mx.max(w[t].abs());
            nan |= w[t].is_nan();
        }
        let (sc, inv) = q16_scale(mx, nan);
        let out = &mut w16[h * ldw..(h + 1) * ldw];
        let mut z = 0i32;
        for t in 0..n {
            out[t] = round_i16(w[t] * inv);
            // No overflow: |sum| <= PV_MAX_TILE * 32767 * 128 (see `PV_MAX_TILE`).
            z += i32::from(out[t]) * i32::from(zp[t]);
        }
        out[n..].fill(0);
        step[h] = sc;
        zterm[h] = z;
    }
}

/// Checks [`pv_weights`]' arguments; returns the tile length and the number of heads.
#[allow(clippy::too_many_arguments)]
fn pv_weights_check(
    p: &[f32],
    ldp: usize,
    group: usize,
    tab: PvTable<'_>,
    ldw: usize,
    w16: &[i16],
    step: &[f32],
    zterm: &[i32],
) -> (usize, usize) {
    let (n, heads) = (tab.n, step.len());
    assert!(
        n >= 1 && n <= ldw && ldw <= PV_MAX_TILE && n <= ldp && group > 0,
        "tile"
    );
    assert!(heads.is_multiple_of(group) && zterm.len() == heads, "heads");
    assert!(
        heads == 0 || (heads - 1) * ldp + n <= p.len() && heads * ldw <= w16.len(),
        "weights"
    );
    let table = heads / group * PV_MAX_TILE;
    assert!(tab.vs.len() >= table && tab.zp.len() >= table, "table");
    (n, heads)
}

/// Signature of [`pv_weights`] and its SIMD versions.
pub(crate) type PvWeights =
    unsafe fn(&[f32], usize, usize, PvTable<'_>, usize, &mut [i16], &mut [f32], &mut [i32]);

/// Position rows per [`pv_madd`] call (an even number: its SIMD versions take them in pairs).
pub(crate) const PV_ROWS: usize = 8;
const _: () = assert!(PV_ROWS.is_multiple_of(2) && PV_MAX_TILE.is_multiple_of(PV_ROWS));

/// Integer `acc32 += W . V` over [`PV_ROWS`] int8 V position rows: for each head `h <
/// acc32.len() / d`, with `g = h / group`, `acc32[h d + j] += sum_{u < PV_ROWS} w16[h * ldw +
/// u] * v_u[g d + j]` (wrapping; exact while the [`PV_MAX_TILE`] bound holds). Heads whose
/// weights are all 0 are skipped (they would add 0). Rows with weight 0 may be any valid row. Panics if a
/// length does not fit.
///
/// # Safety
/// None (safe to call).
pub(crate) unsafe fn pv_madd(
    acc32: &mut [i32],
    d: usize,
    group: usize,
    w16: &[i16],
    ldw: usize,
    v: [KvRow<'_, i8>; PV_ROWS],
) {
    let heads = pv_check(acc32.len(), d, group, w16.len(), ldw, &v);
    for h in 0..heads {
        let g = h / group;
        let w = &w16[h * ldw..h * ldw + PV_ROWS];
        if w == [0; PV_ROWS] {
            continue;
        }
        pv_madd_lanes(&mut acc32[h * d..(h + 1) * d], w, &v, g * d, 0..d);
    }
}

/// `acc[j] += sum_u w[u] * v_u[off + j]` (wrapping) for the lanes `j` in `lanes`: [`pv_madd`]'s
/// arithmetic for one head, one lane at a time, also the tail of its SIMD versions.
#[inline]
pub(crate) fn pv_madd_lanes(
    acc: &mut [i32],
    w: &[i16],
    v: &[KvRow<'_, i8>],
    off: usize,
    lanes: core::ops::Range<usize>,
) {
    for j in lanes {
        let mut x = acc[j];
        for (u, r) in v.iter().enumerate() {
            x = x.wrapping_add(i32::from(w[u]) * i32::from(r.x[off + j]));
        }
        acc[j] = x;
    }
}

/// Checks [`pv_madd`]'s arguments; returns the number of heads.
pub(crate) fn pv_check(
    n: usize,
    d: usize,
    group: usize,
    w: usize,
    ldw: usize,
    v: &[KvRow<'_, i8>],
) -> usize {
    assert!(d > 0 && group > 0 && n.is_multiple_of(d), "accumulators");
    let heads = n / d;
    assert!(heads.is_multiple_of(group), "group");
    assert!(heads == 0 || (heads - 1) * ldw + PV_ROWS <= w, "weights");
    for r in v {
        assert_eq!(r.x.len(), heads / group * d, "row length");
    }
    heads
}

/// Ends a tile of the integer `P . V`: for each head `h < step.len()` with `step[h] != 0`,
/// `acc[h d + j] += step[h] * (acc32[h d + j] - zterm[h]) as f32` (a multiply, then an add:
/// the SIMD versions match it bit for bit), and `acc32` is zeroed for the next tile. Heads
/// with step 0 had all weights 0, so their `acc32` is still 0. Panics if a length does not
/// fit.
///
/// # Safety
/// None (safe to call).
pub(crate) unsafe fn pv_flush(
    acc: &mut [f32],
    acc32: &mut [i32],
    d: usize,
    step: &[f32],
    zterm: &[i32],
) {
    let heads = flush_check(acc, acc32, d, step, zterm);
    for h in 0..heads {
        if step[h] == 0.0 {
            continue;
        }
        let a = &mut acc[h * d..(h + 1) * d];
        for (x, y) in a.iter_mut().zip(&mut acc32[h * d..(h + 1) * d]) {
            *x += step[h] * (y.wrapping_sub(zterm[h]) as f32);
            *y = 0;
        }
    }
}

/// Checks [`pv_flush`]'s arguments; returns the number of heads.
fn flush_check(acc: &[f32], acc32: &[i32], d: usize, step: &[f32], zterm: &[i32]) -> usize {
    let heads = step.len();
    assert!(
        d > 0 && zterm.len() == heads && acc.len() == heads * d && acc32.len() == heads * d,
        "flush"
    );
    heads
}

/// Signature of [`pv_madd`] and its SIMD versions.
pub(crate) type PvMadd =
    unsafe fn(&mut [i32], usize, usize, &[i16], usize, [KvRow<'_, i8>; PV_ROWS]);
/// Signature of [`pv_flush`] and its SIMD versions.
pub(crate) type PvFlush = unsafe fn(&mut [f32], &mut [i32], usize, &[f32], &[i32]);

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use super::{check, KvRow, Lane, LaneKind};
    use crate::elem::Bf16;
    use crate::kernels::avx2::hsum;
    use core::arch::x86_64::*;

    /// 8 elements at `p` as f32 (int8 values as they are: the caller applies the zero point).
    /// f16 is not read here (the AVX2 set does not assume F16C).
    ///
    /// # Safety
    /// AVX2; `p` readable for 8 elements.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load8<E: Lane>(p: *const E) -> __m256 {
        match E::KIND {
            // SAFETY: 8 f32 (32 bytes) at `p` are readable (caller).
            LaneKind::F32 => unsafe { _mm256_loadu_ps(p.cast()) },
            LaneKind::Bf16 => {
                // SAFETY: 8 bf16 (16 bytes) at `p` are readable (caller).
                let h = unsafe { _mm_loadu_si128(p.cast()) };
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
            }
            LaneKind::I8 => {
                // SAFETY: 8 int8 (8 bytes) at `p` are readable (caller).
                let q = unsafe { _mm_loadl_epi64(p.cast()) };
                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q))
            }
            LaneKind::F16 => unreachable!("no AVX2 f16 row kernel"),
        }
    }

    /// AVX2 version of [`super::scores_row`] for f32 and bf16 (int8 K is scored by
    /// [`scores_row_q16`]).
    ///
    /// # Safety
    /// The CPU supports AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn scores_row<E: Lane>(
        q: &[f32],
        d: usize,
        group: usize,
        k: KvRow<'_, E>,
        s: &mut [f32],
        lds: usize,
    ) {
        assert!(E::KIND == LaneKind::F32 || E::KIND == LaneKind::Bf16);
        let heads = check(q.len(), d, group, &[k], s.len(), lds, 1);
        let (d32, d8) = (d / 32 * 32, d / 8 * 8);
        for h in 0..heads {
            let g = h / group;
            let (sc, zp) = k.head(g);
            // SAFETY: `h < heads`, `g < heads / group`: query row h and head vector g are
            // `d` elements inside `q` and `k.x` (checked above).
            let (qp, kp) = unsafe { (q.as_ptr().add(h * d), k.x.as_ptr().add(g * d)) };
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut j = 0;
            while j < d32 {
                for (u, au) in acc.iter_mut().enumerate() {
                    // SAFETY: `j + 8u + 8 <= d32 <= d`: inside both head vectors.
                    unsafe {
                        let kv = load8(kp.add(j + 8 * u));
                        *au = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(j + 8 * u)), kv, *au);
                    }
                }
                j += 32;
            }
            while j < d8 {
                // SAFETY: `j + 8 <= d8 <= d`: inside both head vectors.
                unsafe {
                    let kv = load8(kp.add(j));
                    acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(j)), kv, acc[0]);
                }
                j += 8;
            }
            let v = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
            let mut dot = hsum(v);
            for j in d8..d {
                dot += q[h * d + j] * k.x[g * d + j].widen(zp);
            }
            s[h * lds] = sc * dot;
        }
    }

    /// [`scores_row`] for bf16 K with `q` in the order of [`super::split16`]: each 32-byte load
    /// of 16 bf16 is widened by `vpunpcklwd` / `vpunpckhwd` against zero, giving lanes
    /// `0..4, 8..12` and `4..8, 12..16`, which the split query matches.
    ///
    /// # Safety
    /// The CPU supports AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn scores_row_bf16_split(
        q: &[f32],
        d: usize,
        group: usize,
        k: KvRow<'_, Bf16>,
        s: &mut [f32],
        lds: usize,
    ) {
        assert!(k.scales.is_empty(), "bf16 rows are dense");
        let heads = check(q.len(), d, group, &[k], s.len(), lds, 1);
        let d16 = d / 16 * 16;
        let zero = _mm256_setzero_si256();
        for h in 0..heads {
            let g = h / group;
            // SAFETY: `h < heads`, `g < heads / group`: query row h and head vector g are
            // `d` elements inside `q` and `k.x` (checked above).
            let (qp, kp) = unsafe { (q.as_ptr().add(h * d), k.x.as_ptr().add(g * d)) };
            let mut acc = [_mm256_setzero_ps(); 2];
            let mut j = 0;
            while j < d16 {
                // SAFETY: `j + 16 <= d16 <= d`: 16 bf16 and 16 floats inside both vectors.
                unsafe {
                    let x = _mm256_loadu_si256(kp.add(j).cast());
                    let lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, x));
                    let hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, x));
                    acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(j)), lo, acc[0]);
                    acc[1] = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(j + 8)), hi, acc[1]);
                }
                j += 16;
            }
            let mut dot = hsum(_mm256_add_ps(acc[0], acc[1]));
            for j in d16..d {
                dot += q[h * d + j] * k.x[g * d + j].to_f32();
            }
            s[h * lds] = dot;
        }
    }

    /// AVX2 version of [`super::axpy_row`] (not for f16).
    ///
    /// # Safety
    /// The CPU supports AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn axpy_row<E: Lane>(
        acc: &mut [f32],
        d: usize,
        group: usize,
        p: &[f32],
        ldp: usize,
        w: usize,
        v: [KvRow<'_, E>; 4],
    ) {
        let (heads, v) = super::axpy_args(acc, d, group, p, ldp, w, v);
        let d8 = d / 8 * 8;
        for h in 0..heads {
            let g = h / group;
            let Some((wu, zsum)) = super::head_weights(p, ldp, w, &v, h, g) else {
                continue;
            };
            let wv = wu.map(|x| _mm256_set1_ps(x));
            let zsum = _mm256_set1_ps(zsum);
            // SAFETY: `h < heads`, `g < heads / group`: accumulator h and head vector g of
            // every row are `d` elements inside `acc` and the rows (checked above).
            let (ap, vp) = unsafe {
                (
                    acc.as_mut_ptr().add(h * d),
                    v.map(|r| r.x.as_ptr().add(g * d)),
                )
            };
            let mut j = 0;
            while j < d8 {
                // SAFETY: `j + 8 <= d8 <= d`: inside the accumulator and every head vector.
                unsafe {
                    let mut a = _mm256_loadu_ps(ap.add(j));
                    for u in 0..4 {
                        a = _mm256_fmadd_ps(wv[u], load8(vp[u].add(j)), a);
                    }
                    if E::KIND == LaneKind::I8 {
                        a = _mm256_sub_ps(a, zsum);
                    }
                    _mm256_storeu_ps(ap.add(j), a);
                }
                j += 8;
            }
            super::axpy_tail(acc, h, g, d, d8, wu, &v);
        }
    }

    /// AVX2 version of [`super::pv_table`] (the same entries): blocks of 8 positions x 8
    /// heads transposed in registers (the scales as floats, the zero points as bytes, then
    /// widened to i16); the remaining positions and heads in scalar code.
    ///
    /// # Safety
    /// The CPU supports AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn pv_table(
        rows: &[KvRow<'_, i8>],
        kv_heads: usize,
        vs: &mut [f32],
        zp: &mut [i16],
    ) {
        use super::PV_MAX_TILE as T;
        super::pv_table_check(rows, kv_heads, vs, zp);
        let (t8, g8) = (rows.len() / 8 * 8, kv_heads / 8 * 8);
        for t in (0..t8).step_by(8) {
            let r = &rows[t..t + 8];
            for g in (0..g8).step_by(8) {
                // SAFETY: `g + 8 <= g8 <= kv_heads <= scales.len(), zps.len()` of every row
                // (checked above): 8 floats and 8 bytes readable at `g`.
                let (sc, z): ([__m256; 8], [__m128i; 8]) = unsafe {
                    (
                        core::array::from_fn(|k| _mm256_loadu_ps(r[k].scales.as_ptr().add(g))),
                        core::array::from_fn(|k| _mm_loadl_epi64(r[k].zps.as_ptr().add(g).cast())),
                    )
                };
                let cols = crate::kernels::avx2::transpose8(sc);
                // Bytes: after these, 64-bit half `j % 2` of `w[j / 2]` is head g + j's rows.
                let a = [
                    _mm_unpacklo_epi8(z[0], z[1]),
                    _mm_unpacklo_epi8(z[2], z[3]),
                    _mm_unpacklo_epi8(z[4], z[5]),
                    _mm_unpacklo_epi8(z[6], z[7]),
                ];
                let b = [
                    _mm_unpacklo_epi16(a[0], a[1]),
                    _mm_unpackhi_epi16(a[0], a[1]),
                    _mm_unpacklo_epi16(a[2], a[3]),
                    _mm_unpackhi_epi16(a[2], a[3]),
                ];
                let w = [
                    _mm_unpacklo_epi32(b[0], b[2]),
                    _mm_unpackhi_epi32(b[0], b[2]),
                    _mm_unpacklo_epi32(b[1], b[3]),
                    _mm_unpackhi_epi32(b[1], b[3]),
                ];
                for (j, c) in cols.into_iter().enumerate() {
                    let o = (g + j) * T + t;
                    // SAFETY: `o + 8 <= (g + j + 1) * T <= kv_heads * T <= vs.len()` (as
                    // `t + 8 <= t8 <= T`; checked above).
                    unsafe { _mm256_storeu_ps(vs.as_mut_ptr().add(o), c) };
                }
                for (k, x) in w.into_iter().enumerate() {
                    let x = _mm256_cvtepi8_epi16(x);
                    let o = (g + 2 * k) * T + t;
                    // SAFETY: as above, for heads g + 2k and g + 2k + 1 (`o + T + 8 <=
                    // kv_heads * T <= zp.len()`).
                    unsafe {
                        _mm_storeu_si128(zp.as_mut_ptr().add(o).cast(), _mm256_castsi256_si128(x));
                        _mm_storeu_si128(
                            zp.as_mut_ptr().add(o + T).cast(),
                            _mm256_extracti128_si256::<1>(x),
                        );
                    }
                }
            }
        }
        // Heads g8.. of positions ..t8, positions t8.. of every head, and the padding.
        super::pv_table_from(rows, kv_heads, vs, zp, t8, g8);
    }

    /// AVX2 version of [`super::pv_weights`], bit for bit: the same products, maximum and
    /// scale; the clamp and `vcvtps2dq` (half to even) round as `round_i16` does. Each head's
    /// weights are 32 lanes (the table is zero past the tile).
    ///
    /// # Safety
    /// The CPU supports AVX2 and FMA.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn pv_weights(
        p: &[f32],
        ldp: usize,
        group: usize,
        tab: super::PvTable<'_>,
        ldw: usize,
        w16: &mut [i16],
        step: &mut [f32],
        zterm: &mut [i32],
    ) {
        use super::PV_MAX_TILE as T;
        let (n, heads) = super::pv_weights_check(p, ldp, group, tab, ldw, w16, step, zterm);
        let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
        let (hi, lo) = (_mm256_set1_ps(32767.0), _mm256_set1_ps(-32767.0));
        // Lanes t >= n stay 0: weight p * 0 with p = 0.
        let mut pb = [0f32; T];
        for h in 0..heads {
            let g = h / group;
            let (vs, zp) = (&tab.vs[g * T..(g + 1) * T], &tab.zp[g * T..(g + 1) * T]);
            // A full tile's weights are read in place, a shorter one's through `pb`.
            let ph: &[f32] = if n == T {
                &p[h * ldp..h * ldp + T]
            } else {
                for (x, y) in pb.iter_mut().zip(&p[h * ldp..h * ldp + n]) {
                    *x = *y;
                }
                &pb
            };
            let (mut mv, mut nanv) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            let w: [__m256; 4] = core::array::from_fn(|k| {
                // SAFETY: `8k + 8 <= 32 = T`: inside `ph` and `vs` (T floats each).
                let x = unsafe {
                    _mm256_mul_ps(
                        _mm256_loadu_ps(ph.as_ptr().add(8 * k)),
                        _mm256_loadu_ps(vs.as_ptr().add(8 * k)),
                    )
                };
                mv = _mm256_max_ps(mv, _mm256_and_ps(x, abs));
                nanv = _mm256_or_ps(nanv, _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x));
                x
            });
            let nan = _mm256_movemask_ps(nanv) != 0;
            let (sc, inv) = super::q16_scale(crate::kernels::avx2::hmax(mv), nan);
            let out = &mut w16[h * ldw..(h + 1) * ldw];
            if sc.is_nan() {
                // As the scalar version (NaN * 0 rounds to 0), not vcvtps2dq's 0x80000000.
                out.fill(0);
                (step[h], zterm[h]) = (sc, 0);
                continue;
            }
            let iv = _mm256_set1_ps(inv);
            let r = w.map(|x| {
                _mm256_cvtps_epi32(_mm256_max_ps(_mm256_min_ps(_mm256_mul_ps(x, iv), hi), lo))
            });
            // packs interleaves the 128-bit halves: a0-3 b0-3 a4-7 b4-7.
            let q = [
                _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(r[0], r[1])),
                _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(r[2], r[3])),
            ];
            let mut buf = [0i16; T];
            let dst: &mut [i16] = if ldw == T { out } else { &mut buf };
            // SAFETY: `dst` and `zp` are 32 i16 (64 bytes): two 32-byte halves each.
            let z = unsafe {
                _mm256_storeu_si256(dst.as_mut_ptr().cast(), q[0]);
                _mm256_storeu_si256(dst.as_mut_ptr().add(16).cast(), q[1]);
                _mm256_add_epi32(
                    _mm256_madd_epi16(q[0], _mm256_loadu_si256(zp.as_ptr().cast())),
                    _mm256_madd_epi16(q[1], _mm256_loadu_si256(zp.as_ptr().add(16).cast())),
                )
            };
            let zero = _mm256_setzero_si256();
            if ldw < T {
                for (x, y) in w16[h * ldw..(h + 1) * ldw].iter_mut().zip(&buf) {
                    *x = *y;
                }
            }
            step[h] = sc;
            zterm[h] = _mm_cvtsi128_si32(hsum4_epi32([z, zero, zero, zero]));
        }
    }

    /// AVX2 version of [`super::pv_madd`] (the same i32 sums, so the same bits). Two
    /// positions at a time: their int8 values interleaved bytewise (`vpunpcklbw` /
    /// `vpunpckhbw`), sign-extended to 16 i16 lanes `(v_u[j], v_u+1[j])` (`vpmovsxbw`) and
    /// multiplied by the i32 broadcast of the weight pair `(w_u, w_u+1)` with `vpmaddwd`,
    /// which adds each lane pair: 8 lanes of `w_u v_u + w_u+1 v_u+1` per instruction; the
    /// accumulators are loaded and stored once per [`super::PV_ROWS`] rows.
    ///
    /// # Safety
    /// The CPU supports AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn pv_madd(
        acc32: &mut [i32],
        d: usize,
        group: usize,
        w16: &[i16],
        ldw: usize,
        v: [KvRow<'_, i8>; super::PV_ROWS],
    ) {
        const P: usize = super::PV_ROWS / 2;
        let heads = super::pv_check(acc32.len(), d, group, w16.len(), ldw, &v);
        let (d8, d16) = (d / 8 * 8, d / 16 * 16);
        for h in 0..heads {
            let g = h / group;
            let w = &w16[h * ldw..h * ldw + super::PV_ROWS];
            if w == [0; super::PV_ROWS] {
                continue;
            }
            // (w_2k, w_2k+1) as i32 lanes: the low i16 pairs with row 2k.
            let wp: [__m256i; P] = core::array::from_fn(|k| {
                _mm256_set1_epi32(i32::from(w[2 * k] as u16) | i32::from(w[2 * k + 1]) << 16)
            });
            // SAFETY: `h < heads`, `g < heads / group`: accumulator h and head vector g of
            // every row are `d` elements inside `acc32` and the rows (checked above).
            let (ap, vp) = unsafe {
                (
                    acc32.as_mut_ptr().add(h * d),
                    v.map(|r| r.x.as_ptr().add(g * d)),
                )
            };
            let mut j = 0;
            while j < d16 {
                let (mut lo, mut hi) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                for k in 0..P {
                    // SAFETY: `j + 16 <= d16 <= d`: 16 lanes inside rows 2k and 2k + 1.
                    let (a, b) = unsafe {
                        (
                            _mm_loadu_si128(vp[2 * k].add(j).cast()),
                            _mm_loadu_si128(vp[2 * k + 1].add(j).cast()),
                        )
                    };
                    let l = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(a, b));
                    let u = _mm256_cvtepi8_epi16(_mm_unpackhi_epi8(a, b));
                    lo = _mm256_add_epi32(lo, _mm256_madd_epi16(l, wp[k]));
                    hi = _mm256_add_epi32(hi, _mm256_madd_epi16(u, wp[k]));
                }
                // SAFETY: `j + 16 <= d`: 16 lanes inside accumulator h.
                unsafe {
                    let a0 = _mm256_loadu_si256(ap.add(j).cast());
                    let a1 = _mm256_loadu_si256(ap.add(j + 8).cast());
                    _mm256_storeu_si256(ap.add(j).cast(), _mm256_add_epi32(a0, lo));
                    _mm256_storeu_si256(ap.add(j + 8).cast(), _mm256_add_epi32(a1, hi));
                }
                j += 16;
            }
            if j < d8 {
                let mut lo = _mm256_setzero_si256();
                for k in 0..P {
                    // SAFETY: `j + 8 <= d8 <= d`: 8 lanes inside rows 2k and 2k + 1.
                    let (a, b) = unsafe {
                        (
                            _mm_loadl_epi64(vp[2 * k].add(j).cast()),
                            _mm_loadl_epi64(vp[2 * k + 1].add(j).cast()),
                        )
                    };
                    let l = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(a, b));
                    lo = _mm256_add_epi32(lo, _mm256_madd_epi16(l, wp[k]));
                }
                // SAFETY: `j + 8 <= d`: 8 lanes inside accumulator h.
                unsafe {
                    let a0 = _mm256_loadu_si256(ap.add(j).cast());
                    _mm256_storeu_si256(ap.add(j).cast(), _mm256_add_epi32(a0, lo));
                }
                j += 8;
            }
            super::pv_madd_lanes(&mut acc32[h * d..(h + 1) * d], w, &v, g * d, j..d);
        }
    }

    /// AVX2 version of [`super::pv_flush`], bit for bit (`vcvtdq2ps` rounds as `as f32`;
    /// a multiply then an add, not an FMA, as the scalar code).
    ///
    /// # Safety
    /// The CPU supports AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn pv_flush(
        acc: &mut [f32],
        acc32: &mut [i32],
        d: usize,
        step: &[f32],
        zterm: &[i32],
    ) {
        let heads = super::flush_check(acc, acc32, d, step, zterm);
        let d8 = d / 8 * 8;
        let zero = _mm256_setzero_si256();
        for h in 0..heads {
            if step[h] == 0.0 {
                continue;
            }
            let (sv, zv) = (_mm256_set1_ps(step[h]), _mm256_set1_epi32(zterm[h]));
            let (a, a32) = (&mut acc[h * d..(h + 1) * d], &mut acc32[h * d..(h + 1) * d]);
            for j in (0..d8).step_by(8) {
                // SAFETY: `j + 8 <= d8 <= d`: 8 lanes inside both heads' slices.
                unsafe {
                    let x = _mm256_loadu_si256(a32.as_ptr().add(j).cast());
                    let f = _mm256_cvtepi32_ps(_mm256_sub_epi32(x, zv));
                    let y = _mm256_add_ps(_mm256_loadu_ps(a.as_ptr().add(j)), _mm256_mul_ps(sv, f));
                    _mm256_storeu_ps(a.as_mut_ptr().add(j), y);
                    _mm256_storeu_si256(a32.as_mut_ptr().add(j).cast(), zero);
                }
            }
            for (x, y) in a[d8..].iter_mut().zip(&mut a32[d8..]) {
                *x += step[h] * (y.wrapping_sub(zterm[h]) as f32);
                *y = 0;
            }
        }
    }

    /// AVX2 version of [`super::quantize_q16`], with the same results (`vcvtps2dq` rounds half
    /// to even, as `round_i16` does).
    ///
    /// # Safety
    /// The CPU supports AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn quantize_q16(
        q: &[f32],
        d: usize,
        q16: &mut [i16],
        scale: &mut [f32],
        sum: &mut [i32],
    ) {
        let heads = super::q16_check(q, d, q16, scale, sum);
        let (d8, d16) = (d / 8 * 8, d / 16 * 16);
        let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
        let ones = _mm256_set1_epi16(1);
        for h in 0..heads {
            let qh = &q[h * d..(h + 1) * d];
            let (mut mv, mut nanv) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            for j in (0..d8).step_by(8) {
                // SAFETY: `j + 8 <= d8 <= d`: inside the head.
                let x = unsafe { _mm256_loadu_ps(qh.as_ptr().add(j)) };
                mv = _mm256_max_ps(mv, _mm256_and_ps(x, abs));
                nanv = _mm256_or_ps(nanv, _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x));
            }
            let mut mx = crate::kernels::avx2::hmax(mv);
            let mut nan = _mm256_movemask_ps(nanv) != 0;
            for &x in &qh[d8..] {
                mx = mx.max(x.abs());
                nan |= x.is_nan();
            }
            let (sc, inv) = super::q16_scale(mx, nan);
            let out = &mut q16[h * d..(h + 1) * d];
            if sc.is_nan() {
                // As the scalar version (NaN * 0 rounds to 0), not vcvtps2dq's 0x80000000.
                out.fill(0);
                (scale[h], sum[h]) = (sc, 0);
                continue;
            }
            let iv = _mm256_set1_ps(inv);
            let mut sv = _mm256_setzero_si256();
            for j in (0..d16).step_by(16) {
                // SAFETY: `j + 16 <= d16 <= d`: inside the head and its i16 row.
                unsafe {
                    let a =
                        _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(qh.as_ptr().add(j)), iv));
                    let b = _mm256_cvtps_epi32(_mm256_mul_ps(
                        _mm256_loadu_ps(qh.as_ptr().add(j + 8)),
                        iv,
                    ));
                    // packs interleaves the 128-bit halves: a0-3 b0-3 a4-7 b4-7.
                    let p = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(a, b));
                    _mm256_storeu_si256(out.as_mut_ptr().add(j).cast(), p);
                    sv = _mm256_add_epi32(sv, _mm256_madd_epi16(p, ones));
                }
            }
            let z = _mm256_setzero_si256();
            let mut sums = [0i32; 4];
            // SAFETY: `sums` is 16 writable bytes.
            unsafe { _mm_storeu_si128(sums.as_mut_ptr().cast(), hsum4_epi32([sv, z, z, z])) };
            let mut total = sums[0];
            for j in d16..d {
                out[j] = super::round_i16(qh[j] * inv);
                total += i32::from(out[j]);
            }
            scale[h] = sc;
            sum[h] = total;
        }
    }

    /// `sum_j q[j] k[j]` over the first `n` lanes (`n` a multiple of 16) as 8 i32 partial
    /// sums: `vpmaddwd` on the i16 query and the int8 values widened to i16, 16 lanes per
    /// instruction. Exact if `n <= 256` (at most `256 * 32767 * 128 < 2^31` in all).
    ///
    /// # Safety
    /// AVX2; `q` readable for `n` i16, `k` for `n` bytes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn madd_block(q: *const i16, k: *const i8, n: usize) -> __m256i {
        let mut acc = [_mm256_setzero_si256(); 2];
        let mut j = 0;
        while j + 32 <= n {
            for (u, au) in acc.iter_mut().enumerate() {
                // SAFETY: `j + 16u + 16 <= n`: inside both vectors (caller).
                unsafe {
                    let kv = _mm256_cvtepi8_epi16(_mm_loadu_si128(k.add(j + 16 * u).cast()));
                    let qv = _mm256_loadu_si256(q.add(j + 16 * u).cast());
                    *au = _mm256_add_epi32(*au, _mm256_madd_epi16(qv, kv));
                }
            }
            j += 32;
        }
        if j < n {
            // SAFETY: `j + 16 <= n` (both multiples of 16).
            unsafe {
                let kv = _mm256_cvtepi8_epi16(_mm_loadu_si128(k.add(j).cast()));
                let qv = _mm256_loadu_si256(q.add(j).cast());
                acc[0] = _mm256_add_epi32(acc[0], _mm256_madd_epi16(qv, kv));
            }
        }
        _mm256_add_epi32(acc[0], acc[1])
    }

    /// The sums of the 8 lanes of each of `a`, as 4 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn hsum4_epi32(a: [__m256i; 4]) -> __m128i {
        let x = _mm256_hadd_epi32(a[0], a[1]);
        let y = _mm256_hadd_epi32(a[2], a[3]);
        let z = _mm256_hadd_epi32(x, y);
        _mm_add_epi32(_mm256_castsi256_si128(z), _mm256_extracti128_si256::<1>(z))
    }

    /// AVX2 version of [`super::scores_row_q16`]. Heads go four at a time (one horizontal
    /// reduction for the four) when `d <= 256`; the sums are exact integers (i32 within
    /// blocks of 256 lanes, i64 across blocks and for the zero point's share).
    ///
    /// # Safety
    /// The CPU supports AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn scores_row_q16(
        q: super::Q16<'_>,
        d: usize,
        group: usize,
        k: KvRow<'_, i8>,
        s: &mut [f32],
        lds: usize,
    ) {
        let heads = check(q.q.len(), d, group, &[k], s.len(), lds, 1);
        let d16 = d / 16 * 16;
        // The KV head of query head `h` (the four-head loop steps it without dividing).
        let kv_head = |h: usize| h / group;
        let finish = |s: &mut [f32], h: usize, g: usize, mut dot: i64| {
            for j in d16..d {
                dot += i64::from(q.q[h * d + j]) * i64::from(k.x[g * d + j]);
            }
            let (sc, zp) = k.head(g);
            let dot = dot - i64::from(zp) * i64::from(q.sum[h]);
            s[h * lds] = sc * q.scale[h] * dot as f32;
        };
        let mut h = 0;
        if d16 <= 256 {
            // kv_head(h) and h's index in its group, stepped along with h (no division).
            let (mut g, mut in_group) = (0, 0);
            while h + 4 <= heads {
                let gs: [usize; 4] = core::array::from_fn(|_| {
                    let gu = g;
                    in_group += 1;
                    if in_group == group {
                        (g, in_group) = (g + 1, 0);
                    }
                    gu
                });
                debug_assert!((0..4).all(|u| gs[u] == kv_head(h + u)));
                let acc: [__m256i; 4] = core::array::from_fn(|u| {
                    // SAFETY: `h + u < heads`, `gs[u] < heads / group`: query row h + u and
                    // head vector gs[u] are `d >= d16` elements inside `q.q` and `k.x`
                    // (checked above); AVX2 is enabled here.
                    unsafe {
                        madd_block(
                            q.q.as_ptr().add((h + u) * d),
                            k.x.as_ptr().add(gs[u] * d),
                            d16,
                        )
                    }
                });
                let sums = hsum4_epi32(acc);
                if d16 == d && !k.scales.is_empty() {
                    // No tail: the four scores at once, `(sum - zp * qsum) * kscale * qscale`
                    // in f64 (exact up to the last product, as the i64 path).
                    let (ks, zs): ([f32; 4], [i32; 4]) = if group == 1 {
                        let zp = &k.zps[h..h + 4];
                        (
                            k.scales[h..h + 4].try_into().unwrap_or_default(),
                            core::array::from_fn(|u| i32::from(zp[u])),
                        )
                    } else {
                        (gs.map(|g| k.scales[g]), gs.map(|g| i32::from(k.zps[g])))
                    };
                    let (qs, qsum) = (&q.scale[h..h + 4], &q.sum[h..h + 4]);
                    // SAFETY: `ks`, `zs`, `qs` and `qsum` are 4 elements (16 bytes) each.
                    let (ks, zs, qs, qsum) = unsafe {
                        (
                            _mm256_cvtps_pd(_mm_loadu_ps(ks.as_ptr())),
                            _mm256_cvtepi32_pd(_mm_loadu_si128(zs.as_ptr().cast())),
                            _mm256_cvtps_pd(_mm_loadu_ps(qs.as_ptr())),
                            _mm256_cvtepi32_pd(_mm_loadu_si128(qsum.as_ptr().cast())),
                        )
                    };
                    let dot = _mm256_sub_pd(_mm256_cvtepi32_pd(sums), _mm256_mul_pd(zs, qsum));
                    let r = _mm256_cvtpd_ps(_mm256_mul_pd(dot, _mm256_mul_pd(ks, qs)));
                    let mut out = [0f32; 4];
                    // SAFETY: `out` is 16 writable bytes.
                    unsafe { _mm_storeu_ps(out.as_mut_ptr(), r) };
                    for (u, x) in out.into_iter().enumerate() {
                        s[(h + u) * lds] = x;
                    }
                } else {
                    let mut sums4 = [0i32; 4];
                    // SAFETY: `sums4` is 16 writable bytes.
                    unsafe { _mm_storeu_si128(sums4.as_mut_ptr().cast(), sums) };
                    for u in 0..4 {
                        finish(s, h + u, gs[u], i64::from(sums4[u]));
                    }
                }
                h += 4;
            }
        }
        for h in h..heads {
            let g = kv_head(h);
            // SAFETY: `h < heads`, `g < heads / group`: query row h and head vector g are `d`
            // elements inside `q.q` and `k.x` (checked above).
            let (qp, kp) = unsafe { (q.q.as_ptr().add(h * d), k.x.as_ptr().add(g * d)) };
            let mut dot = 0i64;
            let mut j = 0;
            while j < d16 {
                let n = (d16 - j).min(256);
                // SAFETY: lanes `j..j + n` are inside both head vectors; `n <= 256`.
                let a = unsafe { madd_block(qp.add(j), kp.add(j), n) };
                let a = hsum4_epi32([
                    a,
                    _mm256_setzero_si256(),
                    _mm256_setzero_si256(),
                    _mm256_setzero_si256(),
                ]);
                dot += i64::from(_mm_cvtsi128_si32(a));
                j += n;
            }
            finish(s, h, g, dot);
        }
    }
}

#[cfg(target_arch = "aarch64")]
pub(crate) mod neon {
    use super::{check, KvRow, Lane, LaneKind};
    use core::arch::aarch64::*;

    /// 8 elements at `p` as two f32 vectors (int8 values as they are: the caller applies the
    /// zero point). f16 is not read here.
    ///
    /// # Safety
    /// NEON; `p` readable for 8 elements.
    #[inline]
    #[target_feature(enable = "neon")]
    unsafe fn load8<E: Lane>(p: *const E) -> [float32x4_t; 2] {
        match E::KIND {
            LaneKind::F32 => {
                let p = p.cast::<f32>();
                // SAFETY: 8 f32 at `p` are readable (caller).
                unsafe { [vld1q_f32(p), vld1q_f32(p.add(4))] }
            }
            LaneKind::Bf16 => {
                // SAFETY: 8 bf16 (16 bytes) at `p` are readable (caller).
                let h = unsafe { vld1q_u16(p.cast()) };
                [
                    vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(h))),
                    vreinterpretq_f32_u32(vshll_high_n_u16::<16>(h)),
                ]
            }
            LaneKind::I8 => {
                // SAFETY: 8 int8 (8 bytes) at `p` are readable (caller).
                let q = vmovl_s8(unsafe { vld1_s8(p.cast()) });
                [
                    vcvtq_f32_s32(vmovl_s16(vget_low_s16(q))),
                    vcvtq_f32_s32(vmovl_high_s16(q)),
                ]
            }
            LaneKind::F16 => unreachable!("no NEON f16 row kernel"),
        }
    }

    /// NEON version of [`super::scores_row`] for f32 and bf16.
    ///
    /// # Safety
    /// None beyond NEON being present.
    #[target_feature(enable = "neon")]
    pub(crate) unsafe fn scores_row<E: Lane>(
        q: &[f32],
        d: usize,
        group: usize,
        k: KvRow<'_, E>,
        s: &mut [f32],
        lds: usize,
    ) {
        assert!(E::KIND == LaneKind::F32 || E::KIND == LaneKind::Bf16);
        let heads = check(q.len(), d, group, &[k], s.len(), lds, 1);
        let d8 = d / 8 * 8;
        for h in 0..heads {
            let g = h / group;
            let (sc, zp) = k.head(g);
            // SAFETY: `h < heads`, `g < heads / group`: query row h and head vector g are
            // `d` elements inside `q` and `k.x` (checked above).
            let (qp, kp) = unsafe { (q.as_ptr().add(h * d), k.x.as_ptr().add(g * d)) };
            let mut acc = [vdupq_n_f32(0.0); 2];
            let mut j = 0;
            while j < d8 {
                // SAFETY: `j + 8 <= d8 <= d`: inside both head vectors.
                unsafe {
                    let kv = load8(kp.add(j));
                    acc[0] = vfmaq_f32(acc[0], vld1q_f32(qp.add(j)), kv[0]);
                    acc[1] = vfmaq_f32(acc[1], vld1q_f32(qp.add(j + 4)), kv[1]);
                }
                j += 8;
            }
            let mut dot = vaddvq_f32(vaddq_f32(acc[0], acc[1]));
            for j in d8..d {
                dot += q[h * d + j] * k.x[g * d + j].widen(zp);
            }
            s[h * lds] = sc * dot;
        }
    }

    /// NEON version of [`super::axpy_row`] (not for f16).
    ///
    /// # Safety
    /// None beyond NEON being present.
    #[target_feature(enable = "neon")]
    pub(crate) unsafe fn axpy_row<E: Lane>(
        acc: &mut [f32],
        d: usize,
        group: usize,
        p: &[f32],
        ldp: usize,
        w: usize,
        v: [KvRow<'_, E>; 4],
    ) {
        let (heads, v) = super::axpy_args(acc, d, group, p, ldp, w, v);
        let d8 = d / 8 * 8;
        for h in 0..heads {
            let g = h / group;
            let Some((wu, zsum)) = super::head_weights(p, ldp, w, &v, h, g) else {
                continue;
            };
            let zsum = vdupq_n_f32(zsum);
            // SAFETY: `h < heads`, `g < heads / group`: accumulator h and head vector g of
            // every row are `d` elements inside `acc` and the rows (checked above).
            let (ap, vp) = unsafe {
                (
                    acc.as_mut_ptr().add(h * d),
                    v.map(|r| r.x.as_ptr().add(g * d)),
                )
            };
            let mut j = 0;
            while j < d8 {
                // SAFETY: `j + 8 <= d8 <= d`: inside the accumulator and every head vector.
                unsafe {
                    let mut a = [vld1q_f32(ap.add(j)), vld1q_f32(ap.add(j + 4))];
                    for u in 0..4 {
                        let x = load8(vp[u].add(j));
                        a[0] = vfmaq_n_f32(a[0], x[0], wu[u]);
                        a[1] = vfmaq_n_f32(a[1], x[1], wu[u]);
                    }
                    if E::KIND == LaneKind::I8 {
                        a = [vsubq_f32(a[0], zsum), vsubq_f32(a[1], zsum)];
                    }
                    vst1q_f32(ap.add(j), a[0]);
                    vst1q_f32(ap.add(j + 4), a[1]);
                }
                j += 8;
            }
            super::axpy_tail(acc, h, g, d, d8, wu, &v);
        }
    }
}

/// Query heads quantized to i16 for the integer int8 dot product: `q[h d + j] ~= q16[h d + j] *
/// scale[h]`, with `sum[h] = sum_j q16[h d + j]` (exact).
#[derive(Clone, Copy)]
pub(crate) struct Q16<'a> {
    pub q: &'a [i16],
    pub scale: &'a [f32],
    pub sum: &'a [i32],
}

/// Quantizes the query heads `q` (`heads * d` floats) symmetrically to i16, per head:
/// `scale[h] = max_j |q[h d + j]| / 32767`, `q16 = round(q * (1 / scale))` (half to even).
/// A head of zeros gets scale 0; a head with a NaN or an infinity gets scale NaN (so its
/// scores are NaN, as in f32). Panics if a length does not fit.
///
/// # Safety
/// None (safe to call).
pub(crate) unsafe fn quantize_q16(
    q: &[f32],
    d: usize,
    q16: &mut [i16],
    scale: &mut [f32],
    sum: &mut [i32],
) {
    let heads = q16_check(q, d, q16, scale, sum);
    for h in 0..heads {
        let qh = &q[h * d..(h + 1) * d];
        let mx = qh.iter().fold(0f32, |m, x| m.max(x.abs()));
        let (sc, inv) = q16_scale(mx, qh.iter().any(|x| x.is_nan()));
        let mut s = 0i32;
        for (o, &x) in q16[h * d..(h + 1) * d].iter_mut().zip(qh) {
            *o = round_i16(x * inv);
            s += i32::from(*o);
        }
        scale[h] = sc;
        sum[h] = s;
    }
}

/// Checks the lengths of [`quantize_q16`]'s arguments; returns the number of heads.
fn q16_check(q: &[f32], d: usize, q16: &[i16], scale: &[f32], sum: &[i32]) -> usize {
    assert!(d > 0 && q.len().is_multiple_of(d), "query rows");
    let heads = q.len() / d;
    assert!(
        q16.len() >= q.len() && scale.len() >= heads && sum.len() >= heads,
        "outputs"
    );
    heads
}

/// A head's i16 scale and its inverse, from its largest magnitude and whether it holds a NaN.
fn q16_scale(mx: f32, nan: bool) -> (f32, f32) {
    if nan || !mx.is_finite() {
        return (f32::NAN, 0.0);
    }
    let sc = mx / 32767.0;
    (sc, if sc > 0.0 { 1.0 / sc } else { 0.0 })
}

/// `y` rounded half to even (as `_mm256_cvtps_epi32` does, so the SIMD versions agree
/// bit for bit), clamped to +-32767; NaN gives 0. Adding and subtracting 1.5 * 2^23 rounds
/// exactly for `|y| < 2^22` (`f32::round*` are libm calls on baseline x86-64: `round` was
/// ~30% of a short int8 decode in a profile).
#[inline]
fn round_i16(y: f32) -> i16 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23
    let y = y.clamp(-32767.0, 32767.0);
    ((y + MAGIC) - MAGIC) as i16 // NaN as i16 is 0
}

/// Integer version of [`scores_row`] for an int8 K row and i16 query heads:
/// `s[h * lds] = kscale_g * qscale_h * (sum_j q16[h d + j] k[g d + j] - zp_g * qsum_h)`, the
/// sums exact in integers.
///
/// # Safety
/// None (safe to call).
pub(crate) unsafe fn scores_row_q16(
    q: Q16<'_>,
    d: usize,
    group: usize,
    k: KvRow<'_, i8>,
    s: &mut [f32],
    lds: usize,
) {
    let heads = check(q.q.len(), d, group, &[k], s.len(), lds, 1);
    for h in 0..heads {
        let g = h / group;
        let (sc, zp) = k.head(g);
        let dot: i64 = q.q[h * d..(h + 1) * d]
            .iter()
            .zip(&k.x[g * d..(g + 1) * d])
            .map(|(&a, &b)| i64::from(a) * i64::from(b))
            .sum();
        let dot = dot - i64::from(zp) * i64::from(q.sum[h]);
        s[h * lds] = sc * q.scale[h] * dot as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_i16_is_round_ties_even_clamped() {
        let mut x = 0x1234_5678u32;
        let mut vals = vec![
            0.5,
            -0.5,
            1.5,
            -2.5,
            0.499_999_97,
            -0.499_999_97,
            32766.5,
            4e4,
            -4e4,
        ];
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            vals.push((x as i32) as f32 / 65536.0);
        }
        for y in vals {
            let want = y.round_ties_even().clamp(-32767.0, 32767.0) as i16;
            assert_eq!(round_i16(y), want, "{y}");
        }
        assert_eq!(round_i16(f32::NAN), 0);
    }
}
