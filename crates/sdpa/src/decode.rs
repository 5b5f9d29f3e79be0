//! The decode path (short queries): each sequence's KV range is split into chunks processed in
//! parallel; a chunk walks its positions in order and handles all heads of a position row
//! together, so K and V stream through memory in runs of `kv_heads * head_dim` floats. Each
//! chunk leaves a partial softmax state (running max, running sum, unnormalised accumulator)
//! that a second parallel pass merges into `out`.

use rayon::prelude::*;

use crate::elem::Element;
use crate::inputs::as_f32;
use crate::kernels::int8::{PvTable, PvWeightsIn, PV_MAX_TILE, PV_ROWS, Q16};
use crate::kernels::layout::{GroupedHeads, Strided};
use crate::kernels::row::KvRow;
use crate::plan::{regions, Path, Plan, RowsLayout, ROW_TILE, V_GROUP};
use crate::sync::{Scratch, SharedOut};
use crate::Args;

// A row-path tile fits the integer P . V's i32 bound and is whole `pv_madd` calls.
const _: () = assert!(ROW_TILE <= PV_MAX_TILE && ROW_TILE.is_multiple_of(PV_ROWS));

/// f16 K and V rows (converted head by head) are prefetched this many positions ahead: their
/// per-head conversion loop issues too few loads at a time for the hardware prefetcher alone.
const PREFETCH_AHEAD: usize = 16;
/// The row kernels (f32, bf16, int8) prefetch only position rows shorter than this many
/// bytes (a page, which the hardware prefetcher's streams do not cross). Long rows (32 heads
/// of 128 bf16: 8 KiB) stream well without hints, and prefetching them measured slower (K and
/// V 16 positions ahead, or V during the K pass; kv 4096). Short rows (SmolLM2-135M's 3 KV
/// heads of 64 f32: 768 bytes, a new page every 5 positions, a chunk of 20-40 positions)
/// left the row path waiting on memory: prefetching each position's V row during the K pass
/// (so the V pass finds it in cache) and the K row [`SHORT_ROW_PREFETCH_AHEAD`] positions
/// ahead made llm's decode attention calls 0.85x as long (medians of 6 paired runs each at 1
/// and 2 threads, every pair faster; about 72 -> 59 µs a call, 14% -> 11% of decode time) on
/// the real model at 128-192 positions (a shared 2-core AMD EPYC, load 4-5).
const SHORT_ROW_BYTES: usize = 4096;
/// How far ahead the K pass prefetches short K position rows (see [`SHORT_ROW_BYTES`]).
const SHORT_ROW_PREFETCH_AHEAD: usize = 8;
/// Lanes of the output merged at a time (a stack buffer, so a non-f32 output needs no
/// scratch).
const MERGE_LANES: usize = 64;
/// Merges of at most this many partial floats run on the calling thread.
const SERIAL_MERGE_FLOATS: usize = 1 << 18;

pub(crate) fn run<T: Element>(a: &Args<'_, T>, plan: &Plan, scratch: &Scratch, out: &mut [T]) {
    let Path::Rows {
        chunks_per_batch: cpb,
        chunk_len,
        tile,
    } = plan.path
    else {
        unreachable!("decode::run called with a tiled plan")
    };
    let sh = a.shape;
    let lay = RowsLayout::new(&sh, tile, plan.conv);
    // The positions some query row sees (all of them, or the sliding window's).
    let span = a.mask.span(sh.q_len);
    let run_item = |item: usize| {
        let b = item / cpb;
        let c0 = span.start + (item % cpb) * chunk_len;
        let c1 = span.end.min(c0 + chunk_len);
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
fn merge<T: Element>(
    lay: &RowsLayout,
    scratch: &Scratch,
    cpb: usize,
    d: usize,
    b: usize,
    r: usize,
    dst: &mut [T],
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
    let weight = |c: usize| {
        let mc = part(c)[lay.m + r];
        // A chunk that saw no position of row r has m = -inf: weight 0.
        if mc == f32::NEG_INFINITY {
            0.0
        } else {
            (mc - mx).exp2()
        }
    };
    let sum: f32 = (0..cpb).map(|c| part(c)[lay.l + r] * weight(c)).sum();
    let inv = 1.0 / sum;
    let mut tmp = [0f32; MERGE_LANES];
    for x0 in (0..d).step_by(MERGE_LANES) {
        let n = MERGE_LANES.min(d - x0);
        let tmp = &mut tmp[..n];
        tmp.fill(0.0);
        for c in 0..cpb {
            let w = weight(c);
            if w == 0.0 {
                continue;
            }
            let acc = &part(c)[lay.acc + r * d + x0..][..n];
            for (x, y) in tmp.iter_mut().zip(acc) {
                *x += y * w;
            }
        }
        for (o, x) in dst[x0..x0 + n].iter_mut().zip(tmp.iter()) {
            *o = T::from_f32(x * inv);
        }
    }
}

/// Processes positions `c0..c1` of sequence `b` into the partial state `part`, with the
/// score tile in the worker slice `s`.
#[allow(clippy::too_many_arguments)]
fn chunk<T: Element>(
    a: &Args<'_, T>,
    lay: &RowsLayout,
    tile: usize,
    ws: &mut [f32],
    part: &mut [f32],
    b: usize,
    c0: usize,
    c1: usize,
) {
    let sh = &a.shape;
    let kern = &a.kernels;
    let (d, heads, nq) = (sh.head_dim, sh.heads, lay.nq);
    let group = heads / sh.kv_heads;
    let hg = GroupedHeads { d, group };
    let row_len = sh.kv_heads * d; // one position row of K or V
    let [m, l, acc] = regions(part, [lay.m, lay.l, lay.acc]);
    let (m, l, acc) = (&mut m[..nq], &mut l[..nq], &mut acc[..nq * d]);
    m.fill(f32::NEG_INFINITY);
    l.fill(0.0);
    acc.fill(0.0);
    // The worker slice: scores, then the conversion buffers (empty for f32 inputs).
    let [s, qbuf, kbuf, vbuf, q16, q16_scale, q16_sum, pv32, pv_w16, pv_step, pv_zterm, pv_vs, pv_zp] =
        regions(
            ws,
            [
                0,
                lay.qc,
                lay.kc,
                lay.vc,
                lay.q16,
                lay.q16_scale,
                lay.q16_sum,
                lay.pv32,
                lay.pv_w16,
                lay.pv_step,
                lay.pv_zterm,
                lay.pv_vs,
                lay.pv_zp,
            ],
        );
    let s = &mut s[..nq * tile];
    let q_src = &a.q[b * nq * d..(b + 1) * nq * d];
    // Dense bf16 K on a kernel set that wants it: the query rows in `split16` order.
    let split = kern.bf16_split_q && T::DTYPE == crate::Dtype::Bf16 && !a.k.is_int8();
    let qb: &[f32] = if split {
        as_f32(kern, q_src, qbuf);
        let qb = &mut qbuf[..nq * d];
        #[cfg(target_arch = "x86_64")]
        crate::kernels::row::split16(qb, d);
        qb
    } else {
        as_f32(kern, q_src, qbuf)
    };
    let kv_off = |t: usize| (b * sh.kv_capacity + t) * row_len;

    // f32, bf16 and int8 K/V are read by the row kernels (one call per query row and
    // position row, all heads); f16 through the conversion buffers, head by head.
    let reads_rows = a.k.reads_rows();
    // Short position rows read by the row kernels are prefetched (see `SHORT_ROW_BYTES`).
    let row_bytes = if a.k.is_int8() {
        row_len
    } else {
        row_len * size_of::<T>()
    };
    let prefetch_short_rows = reads_rows && row_bytes < SHORT_ROW_BYTES;
    // Floats of one query row's heads.
    let hd = heads * d;
    // The int8 cache: Q rows quantized to i16 once per chunk (empty regions otherwise).
    let (q16, q16_scale, q16_sum) = (as_i16(q16), &mut q16_scale[..], as_i32(q16_sum));
    if lay.q16_scale > lay.q16 {
        // SAFETY: slice-based kernel (checks its lengths); kernel set from `detect`.
        unsafe { (kern.quantize_q16)(qb, d, q16, q16_scale, q16_sum) };
    }
    // The int8 cache's integer P . V (kernel sets with `int_pv`): i32 accumulators per query
    // row, zeroed here and by every flush.
    let int_v = a.v.int8().filter(|_| kern.int_pv && lay.pv_w16 > lay.pv32);
    let (pv32, pv_w16) = (as_i32(pv32), as_i16(pv_w16));
    let (pv_zterm, pv_zp) = (as_i32(pv_zterm), as_i16(pv_zp));
    if int_v.is_some() {
        pv32[..nq * d].fill(0);
    }
    let mut t0 = c0;
    while t0 < c1 {
        let nb = tile.min(c1 - t0);
        // Scores: one K position row (all kv heads, contiguous) at a time.
        for u in 0..nb {
            let t = t0 + u;
            if !reads_rows && t + PREFETCH_AHEAD < c1 {
                a.k.prefetch(kern, kv_off(t + PREFETCH_AHEAD), row_len, 1, row_len);
                a.v.prefetch(kern, kv_off(t + PREFETCH_AHEAD), row_len, 1, row_len);
            }
            if prefetch_short_rows {
                if t + SHORT_ROW_PREFETCH_AHEAD < c1 {
                    let ahead = kv_off(t + SHORT_ROW_PREFETCH_AHEAD);
                    a.k.prefetch(kern, ahead, row_len, 1, row_len);
                }
                // This position's V row, for the V pass after the tile's scores.
                a.v.prefetch(kern, kv_off(t), row_len, 1, row_len);
            }
            if reads_rows {
                for i in 0..sh.q_len {
                    let qi = &qb[i * hd..(i + 1) * hd];
                    let q16 = (lay.q16_scale > lay.q16).then(|| Q16 {
                        q: &q16[i * hd..(i + 1) * hd],
                        scale: &q16_scale[i * heads..(i + 1) * heads],
                        sum: &q16_sum[i * heads..(i + 1) * heads],
                    });
                    let si = &mut s[i * heads * tile + u..];
                    let t = b * sh.kv_capacity + t;
                    a.k.scores_row(kern, qi, q16, hg, t, Strided(si, tile));
                }
                continue;
            }
            // f16: each head vector converted into `kbuf` (D floats, so it stays in L1 while
            // the query heads of its group use it), then scored by the f32 row kernel.
            let off = kv_off(t);
            for kvh in 0..sh.kv_heads {
                let kh = KvRow::dense(a.k.load(kern, d, off + kvh * d, d, kbuf));
                for i in 0..sh.q_len {
                    let r0 = i * heads + kvh * group; // the group's first query row
                    let qg = &qb[r0 * d..(r0 + group) * d];
                    let sg = &mut s[r0 * tile + u..];
                    // SAFETY: slice-based kernel (checks its lengths); kernel set from `detect`.
                    unsafe { (kern.scores_f32)(qg, hg, kh, Strided(sg, tile)) };
                }
            }
        }
        // Online softmax per query row; P overwrites the scores.
        for r in 0..nq {
            let srow = &mut s[r * tile..r * tile + nb];
            let vis = a.mask.in_tile(r / heads, t0, nb);
            let acc_r = &mut acc[r * d..(r + 1) * d];
            kern.softmax_update(srow, vis, a.c, &mut m[r], &mut l[r], acc_r);
        }
        // int8 V in integers: the tile's V scales and zero points transposed once; per query
        // row and head the tile's weights `p * vscale` as i16 (one step each); `acc32 += W .
        // V` PV_ROWS position rows at a time (each read contiguously); one flush into `acc`
        // per tile (before the next softmax update can rescale `acc`).
        if let Some(vc) = int_v {
            let ldw = lay.pv_ldw;
            let first = b * sh.kv_capacity + t0;
            // Rows past the tile repeat its last row (weight 0, so they add exact zeros).
            let rows: [KvRow<'_, i8>; ROW_TILE] = core::array::from_fn(|u| {
                crate::inputs::Kv::<T>::int8_row(vc, first + u.min(nb - 1), sh.kv_heads, d)
            });
            // SAFETY: slice-based kernel (checks its lengths); set from `detect`.
            unsafe { (kern.pv_table)(&rows[..nb], sh.kv_heads, pv_vs, pv_zp) };
            let tab = PvTable {
                vs: pv_vs,
                zp: pv_zp,
                n: nb,
            };
            for i in 0..sh.q_len {
                // SAFETY: slice-based kernel (checks its lengths); set from `detect`.
                unsafe {
                    (kern.pv_weights)(
                        PvWeightsIn {
                            p: &s[i * heads * tile..],
                            ldp: tile,
                            group,
                            tab,
                        },
                        ldw,
                        &mut pv_w16[i * heads * ldw..(i + 1) * heads * ldw],
                        &mut pv_step[i * heads..(i + 1) * heads],
                        &mut pv_zterm[i * heads..(i + 1) * heads],
                    )
                };
            }
            for u in (0..nb).step_by(PV_ROWS) {
                let vr: [KvRow<'_, i8>; PV_ROWS] = core::array::from_fn(|j| rows[u + j]);
                for i in 0..sh.q_len {
                    let w = &pv_w16[i * heads * ldw + u..(i + 1) * heads * ldw];
                    // SAFETY: slice-based kernel (checks its lengths); set from `detect`.
                    unsafe {
                        (kern.pv_madd)(&mut pv32[i * hd..(i + 1) * hd], hg, Strided(w, ldw), vr)
                    };
                }
            }
            for i in 0..sh.q_len {
                let (st, zt) = (
                    &pv_step[i * heads..(i + 1) * heads],
                    &pv_zterm[i * heads..(i + 1) * heads],
                );
                let (acc_i, pv_i) = (
                    &mut acc[i * hd..(i + 1) * hd],
                    &mut pv32[i * hd..(i + 1) * hd],
                );
                // SAFETY: as above.
                unsafe { (kern.pv_flush)(acc_i, pv_i, d, st, zt) };
            }
            t0 += nb;
            continue;
        }
        // acc += P . V, V_GROUP position rows at a time (each read contiguously).
        let mut u = 0;
        while u < nb {
            let w = V_GROUP.min(nb - u);
            if reads_rows {
                let rows: [usize; V_GROUP] =
                    core::array::from_fn(|j| b * sh.kv_capacity + t0 + u + j);
                for i in 0..sh.q_len {
                    let acc_i = &mut acc[i * hd..(i + 1) * hd];
                    let p = &s[i * heads * tile + u..];
                    a.v.axpy_row(kern, acc_i, hg, Strided(p, tile), &rows[..w]);
                }
                u += w;
                continue;
            }
            // f16: head by head, converted into `vbuf` (V_GROUP x D floats, L1-resident).
            for kvh in 0..sh.kv_heads {
                let offs: [usize; V_GROUP] =
                    core::array::from_fn(|j| kv_off(t0 + u + j.min(w - 1)) + kvh * d);
                let mut vbufs = vbuf.chunks_mut(d);
                let vs: [KvRow<'_, f32>; V_GROUP] = core::array::from_fn(|j| {
                    KvRow::dense(a.v.load(kern, d, offs[j], d, vbufs.next().unwrap_or_default()))
                });
                for i in 0..sh.q_len {
                    let r0 = i * heads + kvh * group;
                    let acc_g = &mut acc[r0 * d..(r0 + group) * d];
                    let p = &s[r0 * tile + u..];
                    // SAFETY: slice-based kernel (checks its lengths); kernel set from `detect`.
                    unsafe { (kern.axpy_f32)(acc_g, hg, Strided(p, tile), &vs[..w]) };
                }
            }
            u += w;
        }
        t0 += nb;
    }
}

/// A scratch region of floats reused as i16 (twice as many).
fn as_i16(x: &mut [f32]) -> &mut [i16] {
    // SAFETY: the `2 * len` i16 cover exactly the bytes of `x`; f32's alignment is a multiple
    // of i16's; every bit pattern is a valid i16 (and, as for the floats, the kernels write
    // each value before reading it); the returned borrow replaces `x`'s for its lifetime.
    unsafe { core::slice::from_raw_parts_mut(x.as_mut_ptr().cast(), x.len() * 2) }
}

/// A scratch region of floats reused as i32.
fn as_i32(x: &mut [f32]) -> &mut [i32] {
    // SAFETY: as in `as_i16`, with the same size and alignment as f32.
    unsafe { core::slice::from_raw_parts_mut(x.as_mut_ptr().cast(), x.len()) }
}
