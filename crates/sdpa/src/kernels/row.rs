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

use kernel_simd::Simd;

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

impl Lane for Bf16 {
    const KIND: LaneKind = LaneKind::Bf16;
    #[inline(always)]
    unsafe fn load<S: Simd>(s: S, p: *const Self) -> S::F32 {
        // SAFETY: `p` is readable for LANES elements (caller).
        unsafe { s.load_bf16(p.cast()) }
    }
    #[inline]
    fn widen(self, _: i32) -> f32 {
        self.to_f32()
    }
}

impl Lane for F16 {
    const KIND: LaneKind = LaneKind::F16;
    #[inline(always)]
    unsafe fn load<S: Simd>(s: S, p: *const Self) -> S::F32 {
        // SAFETY: `p` is readable for LANES elements (caller).
        unsafe { s.load_f16(p.cast()) }
    }
    #[inline]
    fn widen(self, _: i32) -> f32 {
        self.to_f32()
    }
}

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
pub(crate) fn pv_table_check(rows: &[KvRow<'_, i8>], kv_heads: usize, vs: &[f32], zp: &[i16]) {
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
pub(crate) fn pv_table_from(
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
pub(crate) fn pv_weights_check(
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
pub(crate) fn flush_check(
    acc: &[f32],
    acc32: &[i32],
    d: usize,
    step: &[f32],
    zterm: &[i32],
) -> usize {
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
pub(crate) fn q16_check(q: &[f32], d: usize, q16: &[i16], scale: &[f32], sum: &[i32]) -> usize {
    assert!(d > 0 && q.len().is_multiple_of(d), "query rows");
    let heads = q.len() / d;
    assert!(
        q16.len() >= q.len() && scale.len() >= heads && sum.len() >= heads,
        "outputs"
    );
    heads
}

/// A head's i16 scale and its inverse, from its largest magnitude and whether it holds a NaN.
pub(crate) fn q16_scale(mx: f32, nan: bool) -> (f32, f32) {
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
pub(crate) fn round_i16(y: f32) -> i16 {
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

/// The body of the SIMD [`scores_row`]s (f32, bf16 and int8 K; int8 K is normally scored by
/// [`scores_row_q16`]): four accumulators of `S::LANES` lanes, then single vectors, then a
/// scalar tail.
#[inline(always)]
fn scores_body<S: Simd, E: Lane>(
    s: S,
    q: &[f32],
    d: usize,
    group: usize,
    k: KvRow<'_, E>,
    out: &mut [f32],
    lds: usize,
) {
    let l = S::LANES;
    let heads = check(q.len(), d, group, &[k], out.len(), lds, 1);
    let (d4, d1) = (d / (4 * l) * (4 * l), d / l * l);
    for h in 0..heads {
        let g = h / group;
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
#[allow(clippy::too_many_arguments)] // the `AxpyRow` signature, plus the token
fn axpy_body<S: Simd, E: Lane>(
    s: S,
    acc: &mut [f32],
    d: usize,
    group: usize,
    p: &[f32],
    ldp: usize,
    w: usize,
    v: [KvRow<'_, E>; 4],
) {
    let l = S::LANES;
    let (heads, v) = axpy_args(acc, d, group, p, ldp, w, v);
    let d1 = d / l * l;
    for h in 0..heads {
        let g = h / group;
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
        axpy_tail(acc, h, g, d, d1, wu, &v);
    }
}

kernel_simd::instantiate! {
    /// [`scores_row`] per ISA (see [`scores_body`]).
    pub(crate) fn scores_simd<E: Lane>(
        q: &[f32],
        d: usize,
        group: usize,
        k: KvRow<'_, E>,
        out: &mut [f32],
        lds: usize
    ) = scores_body;
    /// [`axpy_row`] per ISA (see [`axpy_body`]).
    pub(crate) fn axpy_simd<E: Lane>(
        acc: &mut [f32],
        d: usize,
        group: usize,
        p: &[f32],
        ldp: usize,
        w: usize,
        v: [KvRow<'_, E>; 4]
    ) = axpy_body;
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
