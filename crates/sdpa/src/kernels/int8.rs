//! The int8 cache's integer kernels, one generic body each (the portable instantiation is the
//! reference the others are tested against), and the table of a tile's V scales.
//!
//! int8 K is scored in integers ([`scores_q16`]): the query rows are quantized to i16 per
//! head ([`quantize_q16`]) and each dot product with `(k - zero_point)` is an exact integer sum,
//! so the query's rounding is the only error added (the scales are applied once per head).
//! int8 V is accumulated in integers on the x86 and portable sets ([`pv_weights`],
//! [`pv_madd`], [`pv_flush`]): per query row, head and tile the weights `p * scale` are
//! quantized to i16 with one step, `sum_t w16_t v_t` is an exact i32 sum, the zero points
//! become one integer `sum_t w16_t zp_t` per head, and the tile is flushed into the f32
//! accumulator once; the weights' rounding is the only error added.
//!
//! The ISA-specific pieces are `kernel_simd`'s integer multiply-adds (`Simd::madd_i16_i8`,
//! `Simd::madd_rows_i8`: `vpmaddwd` on x86); every integer sum is exact, so every level gives
//! the portable level's bits.

use kernel_simd::{abs, non_finite, round_small, Simd};

use crate::kernels::layout::{GroupedHeads, Strided};
use crate::kernels::row::{check, heads_by_group, KvRow};

/// Query heads quantized to i16 for the integer int8 dot product: `q[h d + j] ~= q16[h d + j] *
/// scale[h]`, with `sum[h] = sum_j q16[h d + j]` (exact).
#[derive(Clone, Copy)]
pub(crate) struct Q16<'a> {
    pub q: &'a [i16],
    pub scale: &'a [f32],
    pub sum: &'a [i32],
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

/// A head's i16 step and its inverse, from its largest magnitude and whether it holds a NaN
/// or an infinity; for the latter (or an infinite maximum) `None`, the step is NaN and `out`
/// is zeroed (NaN * 0 rounds to 0).
fn q16_step(mx: f32, non_finite: bool, out: &mut [i16]) -> Option<(f32, f32)> {
    if non_finite || !mx.is_finite() {
        out.fill(0);
        return None;
    }
    let sc = mx / 32767.0;
    Some((sc, if sc > 0.0 { 1.0 / sc } else { 0.0 }))
}

/// `y` rounded half to even, clamped to +-32767; NaN gives 0. Adding and subtracting 1.5 *
/// 2^23 rounds exactly for `|y| < 2^22` (`f32::round*` are libm calls on baseline x86-64:
/// `round` was ~30% of a short int8 decode in a profile); the vector lanes round the same
/// way ([`round_i16_lanes`]).
#[inline]
pub(crate) fn round_i16(y: f32) -> i16 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23
    let y = y.clamp(-32767.0, 32767.0);
    ((y + MAGIC) - MAGIC) as i16 // NaN as i16 is 0
}

/// [`round_i16`] lane-wise, as i32 lanes (non-NaN inputs).
#[inline(always)]
fn round_i16_lanes<S: Simd>(s: S, y: S::F32) -> S::I32 {
    round_small(s, s.max(s.min(y, s.splat(32767.0)), s.splat(-32767.0)))
}

/// The body of [`quantize_q16`].
#[inline(always)]
fn quantize_q16_body<S: Simd>(
    s: S,
    q: &[f32],
    d: usize,
    q16: &mut [i16],
    scale: &mut [f32],
    sum: &mut [i32],
) {
    let l = S::LANES;
    let heads = q16_check(q, d, q16, scale, sum);
    let d1 = d / l * l;
    for h in 0..heads {
        let qh = &q[h * d..(h + 1) * d];
        let (mut mv, mut bad) = (s.zero(), s.zero());
        for j in (0..d1).step_by(l) {
            // SAFETY: `j + LANES <= d1 <= d`: inside the head.
            let x = unsafe { s.load(qh.as_ptr().add(j)) };
            mv = s.max(mv, abs(s, x));
            bad = s.add(bad, non_finite(s, x));
        }
        let (mut mx, mut nan) = (s.reduce_max(mv), s.reduce_sum(bad).is_nan());
        for &x in &qh[d1..] {
            mx = mx.max(x.abs());
            nan |= !x.is_finite();
        }
        let out = &mut q16[h * d..(h + 1) * d];
        let Some((sc, inv)) = q16_step(mx, nan, out) else {
            (scale[h], sum[h]) = (f32::NAN, 0);
            continue;
        };
        let iv = s.splat(inv);
        let mut sv = s.splat_i32(0);
        for j in (0..d1).step_by(l) {
            // SAFETY: `j + LANES <= d1 <= d`: inside the head and its i16 row.
            unsafe {
                let r = round_i16_lanes(s, s.mul(s.load(qh.as_ptr().add(j)), iv));
                s.store_i16(out.as_mut_ptr().add(j), r);
                sv = s.add_i32(sv, r);
            }
        }
        let mut total = s.reduce_sum_i32(sv);
        for j in d1..d {
            out[j] = round_i16(qh[j] * inv);
            total += i32::from(out[j]);
        }
        scale[h] = sc;
        sum[h] = total;
    }
}

/// Lanes per [`madd_block`]: `256 * 32767 * 128 < 2^31`, so a block's sum is exact in i32.
const MADD_BLOCK: usize = 256;

/// `Simd::madd_i16_i8` over lanes `j..end` of one head (`end - j` a multiple of `2 * LANES`,
/// at most [`MADD_BLOCK`]), as `LANES` i32 partial sums.
///
/// # Safety
/// `q` and `k` are readable for `end` elements.
#[inline(always)]
unsafe fn madd_block<S: Simd>(
    s: S,
    q: *const i16,
    k: *const i8,
    mut j: usize,
    end: usize,
) -> S::I32 {
    let step = 2 * S::LANES;
    let mut acc = [s.splat_i32(0); 2];
    while j + 2 * step <= end {
        // SAFETY: `j + 2 * step <= end`: inside both vectors (caller).
        unsafe {
            acc[0] = s.madd_i16_i8(acc[0], q.add(j), k.add(j));
            acc[1] = s.madd_i16_i8(acc[1], q.add(j + step), k.add(j + step));
        }
        j += 2 * step;
    }
    if j < end {
        // SAFETY: `j + step <= end` (both multiples of `step`).
        acc[0] = unsafe { s.madd_i16_i8(acc[0], q.add(j), k.add(j)) };
    }
    s.add_i32(acc[0], acc[1])
}

/// Query head `h`'s score against KV head `g` from the integer dot product of its first `dv`
/// lanes: the other lanes added, the zero point's share taken off (in i64, exact), then
/// scaled (a function, not a closure, so that it is inlined into the SIMD body).
#[inline(always)]
fn score_finish(
    q: Q16<'_>,
    d: usize,
    dv: usize,
    k: KvRow<'_, i8>,
    h: usize,
    g: usize,
    mut dot: i64,
) -> f32 {
    for j in dv..d {
        dot += i64::from(q.q[h * d + j]) * i64::from(k.x[g * d + j]);
    }
    let (sc, zp) = k.head(g);
    let dot = dot - i64::from(zp) * i64::from(q.sum[h]);
    sc * q.scale[h] * dot as f32
}

/// Lanes of the widest level (the stack buffers of [`scores_lanes`]).
const MAX_LANES: usize = 16;

/// `LANES` heads' scores from `h0` on, for a head dimension of at most [`MADD_BLOCK`]:
/// `Simd::madd_i16_i8` over four heads at a time (interleaved), the heads' sums in one
/// `Simd::reduce_sums_i32`, then the zero points and scales in vectors. The sum over all `d` lanes and `zp * qsum` are each at most
/// `256 * 128 * 32767 < 2^30`, so the difference is exact in i32 and converts to the f32
/// that the i64 of [`score_finish`] does; the two multiplies are in its order.
#[inline(always)]
fn scores_lanes<S: Simd>(
    s: S,
    q: Q16<'_>,
    GroupedHeads { d, group }: GroupedHeads,
    dv: usize,
    k: KvRow<'_, i8>,
    Strided(out, lds): Strided<&mut [f32]>,
    h0: usize,
) {
    let l = S::LANES;
    const { assert!(S::LANES <= MAX_LANES && S::LANES.is_multiple_of(4)) };
    // KV head of each lane's query head (one division per LANES heads).
    let mut gs = [0; MAX_LANES];
    let (mut g, mut in_group) = (h0 / group, h0 % group);
    for x in &mut gs[..l] {
        *x = g;
        in_group += 1;
        if in_group == group {
            (g, in_group) = (g + 1, 0);
        }
    }
    let mut acc = [s.splat_i32(0); MAX_LANES];
    let (mut qp, mut kp) = (
        [core::ptr::null(); MAX_LANES],
        [core::ptr::null(); MAX_LANES],
    );
    for u in 0..l {
        (qp[u], kp[u]) = (
            q.q[(h0 + u) * d..][..d].as_ptr(),
            k.x[gs[u] * d..][..d].as_ptr(),
        );
    }
    // Four heads interleaved: independent sums for the pipeline, few enough pointers for the
    // registers (all LANES at once spilled them on AVX-512).
    for c in (0..l).step_by(4) {
        for j in (0..dv).step_by(2 * l) {
            for u in c..c + 4 {
                // SAFETY: `j + 2 * LANES <= dv <= d`: inside both head vectors of lane u.
                acc[u] = unsafe { s.madd_i16_i8(acc[u], qp[u].add(j), kp[u].add(j)) };
            }
        }
    }
    let mut sums = s.reduce_sums_i32(&acc[..l]);
    if dv < d {
        let mut tail = [0i32; MAX_LANES];
        for (u, t) in tail[..l].iter_mut().enumerate() {
            for j in dv..d {
                *t += i32::from(q.q[(h0 + u) * d + j]) * i32::from(k.x[gs[u] * d + j]);
            }
        }
        // SAFETY: `tail` holds LANES i32.
        sums = s.add_i32(sums, unsafe { s.load_i32(tail.as_ptr()) });
    }
    let (qsum, qscale) = (&q.sum[h0..][..l], &q.scale[h0..][..l]);
    let (mut ks, mut zp) = ([0f32; MAX_LANES], [0i8; MAX_LANES]);
    let (ks, zp) = if group == 1 {
        (&k.scales[h0..][..l], &k.zps[h0..][..l])
    } else {
        for u in 0..l {
            (ks[u], zp[u]) = (k.scales[gs[u]], k.zps[gs[u]]);
        }
        (&ks[..l], &zp[..l])
    };
    let mut o = [0f32; MAX_LANES];
    // SAFETY: every buffer and slice read or written holds at least LANES elements.
    unsafe {
        let zq = s.mul_i32(s.load_i8(zp.as_ptr()), s.load_i32(qsum.as_ptr()));
        let dot = s.i32_to_f32(s.sub_i32(sums, zq));
        let sc = s.mul(s.load(ks.as_ptr()), s.load(qscale.as_ptr()));
        s.store(o.as_mut_ptr(), s.mul(sc, dot));
    }
    for (u, &x) in o[..l].iter().enumerate() {
        out[(h0 + u) * lds] = x;
    }
}

/// The body of [`scores_q16`]: for a head dimension of at most [`MADD_BLOCK`], `LANES` heads
/// at a time ([`scores_lanes`]); the other heads one at a time, [`madd_block`] over blocks of
/// at most [`MADD_BLOCK`] lanes summed in i64, the lanes past the last multiple of
/// `2 * LANES` in scalar code. Every sum is exact, so both give the same bits.
#[inline(always)]
fn scores_q16_body<S: Simd>(
    s: S,
    q: Q16<'_>,
    hg: GroupedHeads,
    k: KvRow<'_, i8>,
    Strided(out, lds): Strided<&mut [f32]>,
) {
    let (step, GroupedHeads { d, group }) = (2 * S::LANES, hg);
    let heads = check(q.q.len(), hg, &[k], (out.len(), lds), 1);
    let dv = d / step * step;
    let mut h0 = 0;
    if d <= MADD_BLOCK && !k.scales.is_empty() {
        while h0 + S::LANES <= heads {
            scores_lanes(s, q, hg, dv, k, Strided(&mut *out, lds), h0);
            h0 += S::LANES;
        }
    }
    if h0 == heads {
        return;
    }
    for (h, g) in heads_by_group(heads, group).skip(h0) {
        let (qh, kh) = (&q.q[h * d..][..d], &k.x[g * d..][..d]);
        let mut dot = 0i64;
        for j in (0..dv).step_by(MADD_BLOCK) {
            let end = dv.min(j + MADD_BLOCK);
            // SAFETY: `end <= dv <= d`: inside both head vectors.
            let acc = unsafe { madd_block(s, qh.as_ptr(), kh.as_ptr(), j, end) };
            dot += i64::from(s.reduce_sum_i32(acc));
        }
        out[h * lds] = score_finish(q, d, dv, k, h, g, dot);
    }
}

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

/// The arguments of [`pv_weights`] but the weights' outputs.
#[derive(Clone, Copy)]
pub(crate) struct PvWeightsIn<'a> {
    /// The tile's weights `p[h * ldp + t]` of each query head.
    pub p: &'a [f32],
    pub ldp: usize,
    /// Query heads per KV head.
    pub group: usize,
    pub tab: PvTable<'a>,
}

/// Checks [`pv_weights`]' arguments; returns the tile length and the number of heads.
fn pv_weights_check(
    a: PvWeightsIn<'_>,
    ldw: usize,
    w16: &[i16],
    step: &[f32],
    zterm: &[i32],
) -> (usize, usize) {
    let (n, heads) = (a.tab.n, step.len());
    assert!(
        n >= 1 && n <= ldw && ldw <= PV_MAX_TILE && n <= a.ldp && a.group > 0,
        "tile"
    );
    assert!(
        heads.is_multiple_of(a.group) && zterm.len() == heads,
        "heads"
    );
    assert!(
        heads == 0 || (heads - 1) * a.ldp + n <= a.p.len() && heads * ldw <= w16.len(),
        "weights"
    );
    let table = heads / a.group * PV_MAX_TILE;
    assert!(a.tab.vs.len() >= table && a.tab.zp.len() >= table, "table");
    (n, heads)
}

/// The body of [`pv_weights`]: each head's 32 weights in `PV_MAX_TILE / LANES` vectors (the
/// table is zero past the tile, a short tile's weights are read through a zero-padded copy),
/// once for the largest magnitude and once to round.
#[inline(always)]
fn pv_weights_body<S: Simd>(
    s: S,
    a: PvWeightsIn<'_>,
    ldw: usize,
    w16: &mut [i16],
    step: &mut [f32],
    zterm: &mut [i32],
) {
    const T: usize = PV_MAX_TILE;
    const { assert!(T.is_multiple_of(S::LANES)) };
    let (n, heads) = pv_weights_check(a, ldw, w16, step, zterm);
    let mut pb = [0f32; T];
    for (h, g) in heads_by_group(heads, a.group) {
        let (vs, zp) = (&a.tab.vs[g * T..][..T], &a.tab.zp[g * T..][..T]);
        let ph: &[f32] = if n == T {
            &a.p[h * a.ldp..][..T]
        } else {
            pb[..n].copy_from_slice(&a.p[h * a.ldp..][..n]);
            &pb
        };
        let weight = |t: usize| {
            let (x, y) = (&ph[t..][..S::LANES], &vs[t..][..S::LANES]);
            // SAFETY: `x` and `y` are LANES floats each.
            unsafe { s.mul(s.load(x.as_ptr()), s.load(y.as_ptr())) }
        };
        let (mut mv, mut bad) = (s.zero(), s.zero());
        for t in (0..T).step_by(S::LANES) {
            let x = weight(t);
            mv = s.max(mv, abs(s, x));
            bad = s.add(bad, non_finite(s, x));
        }
        let out = &mut w16[h * ldw..(h + 1) * ldw];
        let bad = s.reduce_sum(bad).is_nan();
        let Some((sc, inv)) = q16_step(s.reduce_max(mv), bad, out) else {
            (step[h], zterm[h]) = (f32::NAN, 0);
            continue;
        };
        let iv = s.splat(inv);
        let mut buf = [0i16; T];
        let mut zv = s.splat_i32(0);
        for t in (0..T).step_by(S::LANES) {
            let r = round_i16_lanes(s, s.mul(weight(t), iv));
            // SAFETY: `t + LANES <= T`: inside `buf` and `zp` (T i16 each).
            unsafe {
                s.store_i16(buf.as_mut_ptr().add(t), r);
                zv = s.add_i32(zv, s.mul_i32(r, s.load_i16(zp.as_ptr().add(t))));
            }
        }
        out.copy_from_slice(&buf[..ldw]);
        step[h] = sc;
        zterm[h] = s.reduce_sum_i32(zv);
    }
}

/// Signature of [`pv_weights`] and its SIMD versions.
pub(crate) type PvWeights = unsafe fn(PvWeightsIn<'_>, usize, &mut [i16], &mut [f32], &mut [i32]);

/// Position rows per [`pv_madd`] call (an even number: its SIMD versions take them in pairs).
pub(crate) const PV_ROWS: usize = 8;
const _: () = assert!(PV_ROWS.is_multiple_of(2) && PV_MAX_TILE.is_multiple_of(PV_ROWS));

/// `acc[j] += sum_u w[u] * v_u[off + j]` (wrapping) for the lanes `j` in `lanes`: [`pv_madd`]'s
/// arithmetic for one head, one lane at a time (its tail).
#[inline]
fn pv_madd_lanes(
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

/// Checks [`pv_madd`]'s arguments (`w` weights at stride `ldw`); returns the number of heads.
fn pv_check(n: usize, d: usize, group: usize, w: usize, ldw: usize, v: &[KvRow<'_, i8>]) -> usize {
    assert!(d > 0 && group > 0 && n.is_multiple_of(d), "accumulators");
    let heads = n / d;
    assert!(heads.is_multiple_of(group), "group");
    assert!(heads == 0 || (heads - 1) * ldw + PV_ROWS <= w, "weights");
    for r in v {
        assert_eq!(r.x.len(), heads / group * d, "row length");
    }
    heads
}

/// The body of [`pv_madd`]: `2 * LANES` lanes a step, the rows in pairs through
/// `Simd::madd_rows_i8` (one reorder a step), the accumulators loaded and stored once per
/// [`PV_ROWS`] rows; lanes past the last multiple of `2 * LANES` in scalar code.
#[inline(always)]
fn pv_madd_body<S: Simd>(
    s: S,
    acc32: &mut [i32],
    hg: GroupedHeads,
    Strided(w16, ldw): Strided<&[i16]>,
    v: [KvRow<'_, i8>; PV_ROWS],
) {
    const P: usize = PV_ROWS / 2;
    let (l, GroupedHeads { d, group }) = (S::LANES, hg);
    let heads = pv_check(acc32.len(), d, group, w16.len(), ldw, &v);
    let dv = d / (2 * l) * (2 * l);
    for (h, g) in heads_by_group(heads, group) {
        let w = &w16[h * ldw..h * ldw + PV_ROWS];
        if w == [0; PV_ROWS] {
            continue;
        }
        // (w_2k, w_2k+1) in each i32 lane: the low i16 pairs with row 2k.
        let wp: [S::I32; P] = core::array::from_fn(|k| {
            s.splat_i32(i32::from(w[2 * k] as u16) | i32::from(w[2 * k + 1]) << 16)
        });
        // SAFETY: `h < heads`, `g < heads / group`: accumulator h and head vector g of every
        // row are `d` elements inside `acc32` and the rows (checked above).
        let (ap, vp) = unsafe {
            (
                acc32.as_mut_ptr().add(h * d),
                v.map(|r| r.x.as_ptr().add(g * d)),
            )
        };
        for j in (0..dv).step_by(2 * l) {
            let mut sums = [s.splat_i32(0); 2];
            for k in 0..P {
                // SAFETY: `j + 2 * LANES <= dv <= d`: inside rows 2k and 2k + 1.
                sums =
                    unsafe { s.madd_rows_i8(sums, wp[k], vp[2 * k].add(j), vp[2 * k + 1].add(j)) };
            }
            let [lo, hi] = s.madd_rows_order(sums);
            // SAFETY: `j + 2 * LANES <= d`: inside accumulator h.
            unsafe {
                s.store_i32(ap.add(j), s.add_i32(s.load_i32(ap.add(j)), lo));
                s.store_i32(ap.add(j + l), s.add_i32(s.load_i32(ap.add(j + l)), hi));
            }
        }
        pv_madd_lanes(&mut acc32[h * d..(h + 1) * d], w, &v, g * d, dv..d);
    }
}

/// Signature of [`pv_madd`] and its SIMD versions.
pub(crate) type PvMadd =
    unsafe fn(&mut [i32], GroupedHeads, Strided<&[i16]>, [KvRow<'_, i8>; PV_ROWS]);

/// Checks [`pv_flush`]'s arguments; returns the number of heads.
fn flush_check(acc: &[f32], acc32: &[i32], d: usize, step: &[f32], zterm: &[i32]) -> usize {
    let heads = step.len();
    assert!(
        d > 0 && zterm.len() == heads && acc.len() == heads * d && acc32.len() == heads * d,
        "flush"
    );
    heads
}

/// The body of [`pv_flush`]: a multiply, then an add (not an FMA), so every level gives the
/// same bits.
#[inline(always)]
fn pv_flush_body<S: Simd>(
    s: S,
    acc: &mut [f32],
    acc32: &mut [i32],
    d: usize,
    step: &[f32],
    zterm: &[i32],
) {
    let l = S::LANES;
    let heads = flush_check(acc, acc32, d, step, zterm);
    let d1 = d / l * l;
    for h in 0..heads {
        if step[h] == 0.0 {
            continue;
        }
        let (sv, zv) = (s.splat(step[h]), s.splat_i32(zterm[h]));
        let (a, a32) = (&mut acc[h * d..(h + 1) * d], &mut acc32[h * d..(h + 1) * d]);
        for j in (0..d1).step_by(l) {
            // SAFETY: `j + LANES <= d1 <= d`: inside both heads' slices.
            unsafe {
                let f = s.i32_to_f32(s.sub_i32(s.load_i32(a32.as_ptr().add(j)), zv));
                let y = s.add(s.load(a.as_ptr().add(j)), s.mul(sv, f));
                s.store(a.as_mut_ptr().add(j), y);
                s.store_i32(a32.as_mut_ptr().add(j), s.splat_i32(0));
            }
        }
        for (x, y) in a[d1..].iter_mut().zip(&mut a32[d1..]) {
            *x += step[h] * (y.wrapping_sub(zterm[h]) as f32);
            *y = 0;
        }
    }
}

/// Signature of [`pv_flush`] and its SIMD versions.
pub(crate) type PvFlush = unsafe fn(&mut [f32], &mut [i32], usize, &[f32], &[i32]);
/// Signature of [`quantize_q16`] and its SIMD versions.
pub(crate) type QuantizeQ16 = unsafe fn(&[f32], usize, &mut [i16], &mut [f32], &mut [i32]);
/// Signature of [`scores_q16`] and its SIMD versions.
pub(crate) type ScoresQ16 = unsafe fn(Q16<'_>, GroupedHeads, KvRow<'_, i8>, Strided<&mut [f32]>);

kernel_simd::instantiate! {
    /// Quantizes the query heads `q` (`heads * d` floats) symmetrically to i16, per head:
    /// `scale[h] = max_j |q[h d + j]| / 32767`, `q16 = round(q * (1 / scale))` (half to
    /// even), `sum[h] = sum_j q16[h d + j]`. A head of zeros gets scale 0; a head with a NaN
    /// or an infinity gets scale NaN (so its scores are NaN, as in f32). Panics if a length
    /// does not fit.
    pub(crate) fn quantize_q16(q: &[f32], d: usize, q16: &mut [i16], scale: &mut [f32], sum: &mut [i32])
        = quantize_q16_body;
    /// The integer scores of one query row against an int8 K position row:
    /// `s[h * lds] = kscale_g * qscale_h * (sum_j q16[h d + j] k[g d + j] - zp_g * qsum_h)`
    /// for each query head `h`, with `g = h / group` and `Strided(s, lds) = out`, the sums
    /// exact in integers. Panics if the lengths do not fit.
    pub(crate) fn scores_q16(
        q: Q16<'_>,
        hg: GroupedHeads,
        k: KvRow<'_, i8>,
        out: Strided<&mut [f32]>
    ) = scores_q16_body;
    /// The i16 weights of the integer `P . V` for one query row and a tile of `n = a.tab.n`
    /// int8 V position rows: for each query head `h < step.len()`, with `g = h / group`, the
    /// weight `w_t = p[h * ldp + t] * vscale_{t,g}` is quantized symmetrically as the query
    /// is ([`quantize_q16`]): `step[h] = max_t |w_t| / 32767`, `w16[h * ldw + t] = round(w_t
    /// / step)`, so that `|w16 * step - w_t| <= step * (1/2 + 2^-8)` (the second term is the
    /// f32 rounding of `w_t * (1 / step)`); `w16[h * ldw + t] = 0` for `n <= t < ldw`, and
    /// `zterm[h] = sum_t w16_t zp_{t,g}` (exact). All-zero weights give step 0; a NaN or
    /// infinite weight gives step NaN (the output is NaN, as in f32). Panics if a length
    /// does not fit.
    pub(crate) fn pv_weights(
        a: PvWeightsIn<'_>,
        ldw: usize,
        w16: &mut [i16],
        step: &mut [f32],
        zterm: &mut [i32]
    ) = pv_weights_body;
    /// Integer `acc32 += W . V` over [`PV_ROWS`] int8 V position rows: for each head `h <
    /// acc32.len() / d`, with `g = h / group`, `acc32[h d + j] += sum_{u < PV_ROWS} w16[h *
    /// ldw + u] * v_u[g d + j]` (`Strided(w16, ldw) = w`; wrapping, exact while the
    /// [`PV_MAX_TILE`] bound holds). Heads whose weights are all 0 are skipped (they would
    /// add 0). Rows with weight 0 may be any valid row. Panics if a length does not fit.
    pub(crate) fn pv_madd(
        acc32: &mut [i32],
        hg: GroupedHeads,
        w: Strided<&[i16]>,
        v: [KvRow<'_, i8>; PV_ROWS]
    ) = pv_madd_body;
    /// Ends a tile of the integer `P . V`: for each head `h < step.len()` with `step[h] !=
    /// 0`, `acc[h d + j] += step[h] * (acc32[h d + j] - zterm[h]) as f32`, and `acc32` is
    /// zeroed for the next tile. Heads with step 0 had all weights 0, so their `acc32` is
    /// still 0. Panics if a length does not fit.
    pub(crate) fn pv_flush(acc: &mut [f32], acc32: &mut [i32], d: usize, step: &[f32], zterm: &[i32])
        = pv_flush_body;
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
