//! The prefill path: work items `(batch, head, q-block)`, each walking KV tiles with an online
//! softmax, with packed Q/K/V tiles and register-blocked micro-kernels.

use rayon::prelude::*;

use crate::elem::Element;
use crate::inputs::{as_f32, Kv};
use crate::kernels::layout::Strided;
use crate::kernels::scalar::KTile;
use crate::plan::{regions, round_up, Path, Plan, TiledLayout, MR, NR};
use crate::sync::{Scratch, SharedOut};
use crate::Args;

pub(crate) fn run<T: Element>(a: &Args<'_, T>, plan: &Plan, scratch: &Scratch, out: &mut [T]) {
    let Path::Tiled {
        q_block, q_blocks, ..
    } = plan.path
    else {
        unreachable!("prefill::run called with a row plan")
    };
    let sh = a.shape;
    let lay = TiledLayout::new(&sh, a.mask.span(sh.q_len).len(), plan.conv);
    let out = SharedOut::new(out);
    let items = sh.batch * sh.heads * q_blocks;
    let block_of = |item: usize| {
        // Later q blocks see more positions (causal): start them first.
        let qb = q_blocks - 1 - item % q_blocks;
        let bh = item / q_blocks;
        let i0 = qb * q_block;
        Block {
            b: bh / sh.heads,
            h: bh % sh.heads,
            i0,
            rows: q_block.min(sh.q_len - i0),
        }
    };
    let run_item = |item: usize| {
        let mut slot = scratch.claim();
        // Rayon usually runs a worker's items in index order: the next one's first reads are
        // prefetched during this one's last tile.
        let next = (item + 1 < items).then(|| block_of(item + 1));
        block(a, &lay, slot.floats(), block_of(item), next, &out);
    };
    if items == 1 {
        run_item(0); // not worth a round trip through the pool
    } else {
        (0..items).into_par_iter().for_each(run_item);
    }
}

/// One work item: query rows `i0..i0 + rows` of head `h` of sequence `b`.
#[derive(Clone, Copy)]
struct Block {
    b: usize,
    h: usize,
    i0: usize,
    rows: usize,
}

/// Prefetches the query rows and the first K/V tile of `blk`: they are strided in memory,
/// which the hardware prefetcher follows poorly, so requesting them together overlaps the
/// misses.
fn prefetch_start<T: Element>(a: &Args<'_, T>, lay: &TiledLayout, blk: Block) {
    let sh = &a.shape;
    let (kern, d) = (&a.kernels, sh.head_dim);
    let kvh = blk.h / (sh.heads / sh.kv_heads);
    let q_off = ((blk.b * sh.q_len + blk.i0) * sh.heads + blk.h) * d;
    let seen = a.mask.rows(blk.i0, blk.i0 + blk.rows);
    let kv_off = ((blk.b * sh.kv_capacity + seen.start) * sh.kv_heads + kvh) * d;
    let kv_rows = seen.len().min(lay.bk);
    let stride = sh.kv_heads * d;
    let z = size_of::<T>();
    // SAFETY: a hint only, for addresses the kernel checks lie inside `q` (passed with its
    // length in bytes); kernel set from `detect`.
    unsafe {
        (kern.prefetch_rows)(
            a.q.as_ptr().cast(),
            size_of_val(a.q),
            q_off * z,
            sh.heads * d * z,
            blk.rows,
            d * z,
        );
    }
    a.k.prefetch(kern, kv_off, stride, kv_rows, d);
    a.v.prefetch(kern, kv_off, stride, kv_rows, d);
}

/// Computes `out[b, i0..i0 + rows, h, :]` for `blk` using the worker slice `ws`; during its
/// last KV tile, prefetches the start of `next`.
fn block<T: Element>(
    a: &Args<'_, T>,
    lay: &TiledLayout,
    ws: &mut [f32],
    blk: Block,
    next_item: Option<Block>,
    out: &SharedOut<T>,
) {
    let Block { b, h, i0, rows } = blk;
    let sh = &a.shape;
    let kern = &a.kernels;
    let d = sh.head_dim;
    let dp = lay.d_pad;
    let bk = lay.bk;
    let kvh = h / (sh.heads / sh.kv_heads);
    let rows_p = round_up(rows, MR);
    let strips = rows_p / MR;
    debug_assert!(rows_p <= lay.bq_pad);

    // Carve the worker slice (regions are in increasing offset order).
    let [qp, kp, vp, s, o, m, l, kt] = regions(
        ws,
        [lay.qp, lay.kp, lay.vp, lay.s, lay.o, lay.m, lay.l, lay.kt],
    );
    let l = &mut l[..lay.bq_pad];
    let qp = &mut qp[..rows_p * d];
    let o = &mut o[..rows_p * dp];
    let s = &mut s[..rows_p * bk];

    // The positions some row of the block sees: tiles start at the first (under a sliding
    // window, positions before it are never read).
    let seen = a.mask.rows(i0, i0 + rows);
    let kv_hi = seen.end;
    let kv_row = |t: usize| ((b * sh.kv_capacity + t) * sh.kv_heads + kvh) * d;
    let stride = sh.kv_heads * d;
    let q_off = |i: usize| ((b * sh.q_len + i) * sh.heads + h) * d;
    let q_row = |i: usize| &a.q[q_off(i)..q_off(i) + d];
    let convert_kv = a.k.converts();
    prefetch_start(a, lay, blk);

    // Pack the query block: strip-major, `[strip][x][MR]`, pad rows zero.
    for st in 0..strips {
        let dst = &mut qp[st * d * MR..(st + 1) * d * MR];
        if (st + 1) * MR <= rows {
            // Full strip: write the destination in order, reading the MR rows side by side.
            let src: [&[T]; MR] = core::array::from_fn(|r| q_row(i0 + st * MR + r));
            for (x, out6) in dst.chunks_exact_mut(MR).enumerate() {
                for (o, row) in out6.iter_mut().zip(&src) {
                    *o = row[x].to_f32();
                }
            }
            continue;
        }
        for r in 0..MR {
            let row = st * MR + r;
            if row < rows {
                for (x, &val) in q_row(i0 + row).iter().enumerate() {
                    dst[x * MR + r] = val.to_f32();
                }
            } else {
                for x in 0..d {
                    dst[x * MR + r] = 0.0;
                }
            }
        }
    }
    o.fill(0.0);
    m[..rows_p].fill(f32::NEG_INFINITY);
    l[..rows_p].fill(0.0);

    let mut t0 = seen.start;
    while t0 < kv_hi {
        let nk = bk.min(kv_hi - t0);
        let nkp = round_up(nk, NR);

        // Pack K: panel-major `[panel][x][NR]`, pad columns zero.
        let kp = &mut kp[..nkp * d];
        // f32 K is packed straight from the cache; other K is first converted, row by row,
        // into the `[nk][d]` tile `kt` of the worker slice (the one scratch region that needs).
        let (k_tile, k_stride) = match &a.k {
            Kv::Dense(x) if !convert_kv => (as_f32(kern, &x[kv_row(t0)..], &mut []), stride),
            _ => {
                for (t, dst) in kt[..nk * d].chunks_exact_mut(d).enumerate() {
                    a.k.load_into(kern, d, kv_row(t0 + t), d, dst);
                }
                (&kt[..nk * d], d)
            }
        };
        let tile = KTile {
            stride: k_stride,
            nk,
            nkp,
            d,
        };
        // SAFETY: slice-based kernel; kernel set from `detect`.
        unsafe { (kern.pack_k)(k_tile, tile, kp) };
        // Start fetching the next tile's K and V rows while this one is computed.
        let next = (kv_hi - t0 - nk).min(bk);
        if next > 0 {
            a.k.prefetch(kern, kv_row(t0 + nk), stride, next, d);
            a.v.prefetch(kern, kv_row(t0 + nk), stride, next, d);
        } else {
            // Last tile: fetch the output rows this item writes at the end.
            let (o_ptr, o_len) = out.as_raw_bytes();
            let z = size_of::<T>();
            // SAFETY: a hint only, for addresses the kernel checks lie inside `out` (passed
            // with its length in bytes); kernel set from `detect`.
            unsafe {
                (kern.prefetch_rows)(o_ptr, o_len, q_off(i0) * z, sh.heads * d * z, rows, d * z)
            };
        }
        if next == 0 {
            if let Some(n) = next_item {
                prefetch_start(a, lay, n);
            }
        }
        // Pack V: `[t][dp]`, pad lanes zero (their O columns are never output; zero keeps
        // them finite rather than poison).
        let vp = &mut vp[..nk * dp];
        for t in 0..nk {
            let dst = &mut vp[t * dp..(t + 1) * dp];
            a.v.load_into(kern, d, kv_row(t0 + t), d, dst);
            dst[d..].fill(0.0);
        }

        // Columns of this tile visible to some row of each strip: one interval (a prefix when
        // causal, narrower under a sliding window), so panels and P columns outside it are
        // skipped (they would be all masked).
        let strip_vis = |st: usize| {
            let r0 = i0 + st * MR;
            a.mask
                .rows_in_tile(r0, i0 + (st * MR + MR).min(rows), t0, nk)
        };

        // S = Q . K^T over the tile: every (strip, panel) pair is one micro-kernel call.
        for st in 0..strips {
            let cols = strip_vis(st);
            for p in cols.start / NR..cols.end.div_ceil(NR) {
                let qs = &qp[st * d * MR..(st + 1) * d * MR];
                let kpan = &kp[p * d * NR..(p + 1) * d * NR];
                let dst = &mut s[st * MR * bk + p * NR..];
                assert!(dst.len() >= (MR - 1) * bk + NR);
                // SAFETY: `qs` holds d * MR floats, `kpan` d * NR, and `dst` (asserted) rows
                // r < MR of NR floats at stride bk; the three are disjoint regions of `ws`.
                // The kernel set was chosen by `Kernels::detect` for this CPU.
                unsafe { (kern.qk_tile)(qs.as_ptr(), d, kpan.as_ptr(), dst.as_mut_ptr(), bk) };
            }
        }

        // Online softmax per row; P overwrites S (zeros where masked or padding). A row reads
        // only its `vis` visible scores, all inside the panels computed for its strip.
        for r in 0..rows_p {
            let srow = &mut s[r * bk..r * bk + nk];
            let vis = if r < rows {
                a.mask.in_tile(i0 + r, t0, nk)
            } else {
                0..0
            };
            let o_r = &mut o[r * dp..(r + 1) * dp];
            kern.softmax_update(srow, vis, a.c, &mut m[r], &mut l[r], o_r);
        }

        // O += P . V: every (strip, 16-lane column block) is one micro-kernel call.
        for st in 0..strips {
            // Columns outside `strip_vis` are zero in every row of the strip: skip them.
            let cols = strip_vis(st);
            let nk = cols.len();
            if nk == 0 {
                continue;
            }
            let ps = &s[st * MR * bk + cols.start..];
            assert!(ps.len() >= (MR - 1) * bk + nk);
            for dc in 0..dp / NR {
                let vs = &vp[cols.start * dp + dc * NR..];
                assert!(vs.len() >= (nk - 1) * dp + NR);
                let os = &mut o[st * MR * dp + dc * NR..];
                assert!(os.len() >= (MR - 1) * dp + NR);
                // SAFETY: the asserts show P rows r < MR have nk floats at stride bk (from the
                // strip's first visible column), V rows t < nk (from the same column) have 16 floats at stride dp, O rows r < MR have 16 floats at stride
                // dp; O is a region of `ws` disjoint from S and V. Kernel set from `detect`.
                unsafe {
                    let (p, v) = (Strided(ps.as_ptr(), bk), Strided(vs.as_ptr(), dp));
                    (kern.pv_tile)(p, v, nk, Strided(os.as_mut_ptr(), dp))
                };
            }
        }
        t0 += nk;
    }

    // Normalise and write out.
    for r in 0..rows {
        let inv = 1.0 / l[r];
        let off = ((b * sh.q_len + i0 + r) * sh.heads + h) * d;
        // SAFETY: work item (b, h, q-block) is the only writer of rows i0..i0 + rows of head h
        // of sequence b, so this range is disjoint from every other item's; `out` outlives
        // the parallel section that calls this.
        let dst = unsafe { out.range(off, d) };
        for (x, y) in dst.iter_mut().zip(&o[r * dp..r * dp + d]) {
            *x = T::from_f32(y * inv);
        }
    }
}
