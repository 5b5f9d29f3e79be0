//! The decode path (short queries): each sequence's KV range is split into chunks processed in
//! parallel; a chunk walks its positions in order and handles all heads of a position row
//! together, so K and V stream through memory in runs of `kv_heads * head_dim` floats. Each
//! chunk leaves a partial softmax state (running max, running sum, unnormalised accumulator)
//! that a second parallel pass merges into `out`.

use rayon::prelude::*;

use crate::plan::{Path, Plan, RowsLayout};
use crate::sync::{Scratch, SharedOut};
use crate::Args;

/// Positions whose V rows are accumulated in one pass.
const V_GROUP: usize = 4;
/// Merges of at most this many partial floats run on the calling thread.
const SERIAL_MERGE_FLOATS: usize = 1 << 18;

pub(crate) fn run(a: &Args<'_>, plan: &Plan, scratch: &Scratch, out: &mut [f32]) {
    let Path::Rows {
        chunks_per_batch: cpb,
        chunk_len,
        tile,
    } = plan.path
    else {
        unreachable!("rows::run called with a tiled plan")
    };
    let sh = a.shape;
    let lay = RowsLayout::new(&sh, tile);
    let kv_len = sh.kv_len();
    let run_item = |item: usize| {
        let b = item / cpb;
        let c0 = (item % cpb) * chunk_len;
        let c1 = kv_len.min(c0 + chunk_len);
        let mut slot = scratch.claim();
        // SAFETY: chunk `item` belongs to this work item alone during this parallel pass, and
        // `chunk` writes every float of it (m, l, acc) before reading any.
        let part = unsafe { scratch.chunk(item) };
        chunk(a, &lay, tile, slot.floats(), part, b, c0, c1);
    };
    let items = sh.batch * cpb;
    if items == 1 {
        run_item(0); // not worth a round trip through the pool
    } else {
        (0..items).into_par_iter().for_each(run_item);
    }

    // Merge the chunks' partial states into `out`: on the calling thread when that is cheap
    // (decode), saving a second round trip through the pool.
    let d = sh.head_dim;
    let nq = lay.nq;
    let merge_floats = sh.batch * nq * d * cpb;
    if merge_floats <= SERIAL_MERGE_FLOATS {
        for (br, dst) in out.chunks_exact_mut(d).enumerate() {
            merge(&lay, scratch, cpb, d, br / nq, br % nq, dst);
        }
    } else {
        let out = SharedOut::new(out);
        (0..sh.batch * nq)
            .into_par_iter()
            .with_min_len(8)
            .for_each(|br| {
                // SAFETY: row `br` of `out` is written by this iteration alone; `out` outlives
                // the parallel section.
                let dst = unsafe { out.range(br * d, d) };
                merge(&lay, scratch, cpb, d, br / nq, br % nq, dst);
            });
    }
}

/// Merges the partial states of sequence `b`'s chunks for query row `r` into `dst`.
fn merge(
    lay: &RowsLayout,
    scratch: &Scratch,
    cpb: usize,
    d: usize,
    b: usize,
    r: usize,
    dst: &mut [f32],
) {
    let part = |c: usize| {
        // SAFETY: the chunk pass has finished and nothing writes chunks any more, so shared
        // references to them are sound; it wrote all their m, l and acc rows.
        unsafe { scratch.chunk_ref(b * cpb + c) }
    };
    let mut mx = f32::NEG_INFINITY;
    for c in 0..cpb {
        mx = mx.max(part(c)[lay.m + r]);
    }
    dst.fill(0.0);
    let mut sum = 0.0;
    for c in 0..cpb {
        let p = part(c);
        let mc = p[lay.m + r];
        if mc == f32::NEG_INFINITY {
            continue; // this chunk saw no position of row r
        }
        let w = (mc - mx).exp2();
        sum += p[lay.l + r] * w;
        for (x, y) in dst
            .iter_mut()
            .zip(&p[lay.acc + r * d..lay.acc + (r + 1) * d])
        {
            *x += y * w;
        }
    }
    let inv = 1.0 / sum;
    for x in dst.iter_mut() {
        *x *= inv;
    }
}

/// Processes positions `c0..c1` of sequence `b` into the partial state `part`, with the
/// score tile in the worker slice `s`.
#[allow(clippy::too_many_arguments)]
fn chunk(
    a: &Args<'_>,
    lay: &RowsLayout,
    tile: usize,
    s: &mut [f32],
    part: &mut [f32],
    b: usize,
    c0: usize,
    c1: usize,
) {
    let sh = &a.shape;
    let kern = &a.kernels;
    let (d, heads, nq) = (sh.head_dim, sh.heads, lay.nq);
    let group = heads / sh.kv_heads;
    let row_len = sh.kv_heads * d;
    let (m, rest) = part.split_at_mut(lay.l);
    let (l, acc) = rest.split_at_mut(lay.acc - lay.l);
    let (m, l, acc) = (&mut m[..nq], &mut l[..nq], &mut acc[..nq * d]);
    m.fill(f32::NEG_INFINITY);
    l.fill(0.0);
    acc.fill(0.0);
    let s = &mut s[..nq * tile];
    let qb = &a.q[b * nq * d..(b + 1) * nq * d];
    let kv_off = |t: usize| (b * sh.kv_capacity + t) * row_len;

    let mut t0 = c0;
    while t0 < c1 {
        let nb = tile.min(c1 - t0);
        // Scores: one K position row (all kv heads, contiguous) at a time.
        for u in 0..nb {
            let krow = &a.k[kv_off(t0 + u)..kv_off(t0 + u) + row_len];
            for (r, qr) in qb.chunks_exact(d).enumerate() {
                let kvh = (r % heads) / group;
                // SAFETY: slice-based kernel (equal lengths d); kernel set from `detect`.
                s[r * tile + u] = unsafe { (kern.dot)(qr, &krow[kvh * d..(kvh + 1) * d]) };
            }
        }
        // Online softmax per query row; P overwrites the scores.
        for r in 0..nq {
            let srow = &mut s[r * tile..r * tile + nb];
            let vis = a.visible(r / heads, t0, nb);
            if vis == 0 {
                srow.fill(0.0);
                continue;
            }
            // SAFETY: slice-based kernel; kernel set from `detect`.
            let (mn, sum) = unsafe { (kern.softmax_row)(srow, vis, a.c, m[r]) };
            let alpha = (m[r] - mn).exp2();
            l[r] = l[r] * alpha + sum;
            if alpha != 1.0 {
                // SAFETY: slice-based kernel; kernel set from `detect`.
                unsafe { (kern.scale)(&mut acc[r * d..(r + 1) * d], alpha) };
            }
            m[r] = mn;
        }
        // acc += P . V, V_GROUP position rows at a time (each read contiguously).
        let mut u = 0;
        while u < nb {
            let w = V_GROUP.min(nb - u);
            let vrow = |j: usize| {
                let t = t0 + u + j.min(w - 1);
                &a.v[kv_off(t)..kv_off(t) + row_len]
            };
            let vrows: [&[f32]; V_GROUP] = core::array::from_fn(vrow);
            for (r, ar) in acc.chunks_exact_mut(d).enumerate() {
                let kvh = (r % heads) / group;
                let p: [f32; V_GROUP] =
                    core::array::from_fn(|j| if j < w { s[r * tile + u + j] } else { 0.0 });
                if p == [0.0; V_GROUP] {
                    continue;
                }
                let vs = vrows.map(|vr| &vr[kvh * d..(kvh + 1) * d]);
                // SAFETY: slice-based kernel (equal lengths d); kernel set from `detect`.
                unsafe { (kern.axpy4)(ar, p, vs) };
            }
            u += w;
        }
        t0 += nb;
    }
}
