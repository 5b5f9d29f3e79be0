//! How a call splits its work and lays out its one scratch buffer.

use crate::mask::Mask;
use crate::{Dtype, KvCache, Params, SdpaError, Shape, ROW_PATH_MAX_Q_LEN};

/// Rows of the register-blocked micro-kernels (query rows per strip).
pub(crate) const MR: usize = 6;
/// Columns of the micro-kernels (KV positions per K panel, head-dim lanes per V strip).
pub(crate) const NR: usize = 16;
/// Largest query block of the tiled path (a multiple of `MR`).
pub(crate) const BQ: usize = 192;
/// Largest KV tile of the tiled path (a multiple of `NR`).
pub(crate) const BK: usize = 64;
/// Largest KV tile (positions scored before a softmax update) of the row path.
pub(crate) const ROW_TILE: usize = 32;
/// Work items per thread the row path aims for when its work is long (so rayon can balance
/// uneven progress).
const ROW_ITEMS_PER_THREAD: usize = 4;
/// K and V elements each work item must still read for the row path to split a thread's share
/// of a sequence into several items: below that (and always on one thread) a thread gets one
/// item. Every extra item costs a cold start of its K/V streams, a partial state to merge and,
/// on one thread, buys nothing. SmolLM2-135M's decode (3 KV heads of 64: 384 elements per
/// position, 100-200 positions) took 4 chunks per thread of 32-50 positions; one chunk per
/// thread made llm's decode attention calls about 0.91x as long at 1 thread (3 of 4
/// alternated runs faster) and 0.95x at 2 (5 of 5), on a shared 2-core AMD EPYC whose K/V
/// reads come from DRAM. Models with long rows keep their split (32 KV heads of 128 reach
/// this at 8 positions).
const ROW_BALANCE_MIN_ELEMS: usize = 1 << 16;
/// Fewest positions in a row-path chunk.
const ROW_MIN_CHUNK: usize = 32;
/// Floats per 64-byte line: every scratch region starts on a line.
const LINE_FLOATS: usize = 16;
/// Positions whose V rows the row path accumulates in one pass.
pub(crate) const V_GROUP: usize = 4;

/// Which inputs a call must convert to f32 in scratch (none for an all-f32 call, whose
/// scratch is unchanged from the f32-only kernel).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct Conv {
    /// Q is not f32.
    pub q: bool,
    /// K and V are not f32 (a 16-bit dtype or the int8 cache).
    pub kv: bool,
    /// K and V are f16: the row path converts their head vectors into buffers (the other
    /// dtypes are read by the row kernels directly).
    pub kv_bufs: bool,
    /// K is the int8 cache: the row path quantizes the query rows to i16 for the integer dot
    /// product.
    pub q16: bool,
}

impl Conv {
    pub(crate) fn of(dtype: Dtype, kv: KvCache) -> Conv {
        Conv {
            q: dtype != Dtype::F32,
            kv: dtype != Dtype::F32 || kv == KvCache::Int8,
            kv_bufs: dtype == Dtype::F16 && kv == KvCache::Dense,
            q16: kv == KvCache::Int8,
        }
    }
}

/// Which code path a call takes, with its blocking.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// Decode and short queries: each sequence's KV range (the positions its rows see) split
    /// into chunks, each chunk processing all heads of a position row together; partial
    /// results merged at the end.
    Rows {
        /// Chunks per sequence (work items = `batch * chunks_per_batch`).
        chunks_per_batch: usize,
        /// Positions per chunk (the last one may be shorter).
        chunk_len: usize,
        /// Positions scored per softmax update.
        tile: usize,
    },
    /// Prefill: work items `(batch, head, q-block)`, each walking KV tiles with an online
    /// softmax and packed, register-blocked tiles.
    Tiled {
        /// Query rows per block (the last one may be shorter).
        q_block: usize,
        /// Number of query blocks per sequence and head.
        q_blocks: usize,
        /// KV positions per tile.
        kv_block: usize,
    },
}

/// The work split and scratch layout of a call, a pure function of the shape and thread count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The code path and its blocking.
    pub path: Path,
    /// Worker threads the scratch has a slice for.
    pub threads: usize,
    /// Bytes of the one scratch buffer (0: nothing to compute, nothing requested).
    pub total_bytes: usize,
    /// Bytes of each worker's slice.
    pub thread_bytes: usize,
    /// Bytes of each chunk's partial result (row path; 0 for the tiled path).
    pub chunk_bytes: usize,
    /// Number of partial results (row path: `batch * chunks_per_batch`; 0 for the tiled path).
    pub chunks: usize,
    /// Bytes at the start of the buffer holding the worker-slot flags.
    pub(crate) flag_bytes: usize,
    /// Which inputs are converted in scratch.
    pub(crate) conv: Conv,
}

#[inline]
pub(crate) fn round_up(x: usize, m: usize) -> usize {
    x.div_ceil(m).saturating_mul(m)
}

/// Carves `ws` into the regions that start at the increasing offsets `starts`: region `i` is
/// `ws[starts[i]..starts[i + 1]]`, the last one runs to the end of `ws`. Panics if the offsets
/// decrease or pass the end.
pub(crate) fn regions<const N: usize>(ws: &mut [f32], starts: [usize; N]) -> [&mut [f32]; N] {
    let mut at = starts[0];
    let mut rest = &mut ws[at..];
    core::array::from_fn(|i| {
        let end = starts.get(i + 1).copied().unwrap_or(at + rest.len());
        let (region, tail) = core::mem::take(&mut rest).split_at_mut(end - at);
        (rest, at) = (tail, end);
        region
    })
}

/// Offsets (in floats, from the start of a worker slice) of the tiled path's regions.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TiledLayout {
    /// Query rows per block, padded to `MR`.
    pub bq_pad: usize,
    /// Head dim padded to `NR`.
    pub d_pad: usize,
    /// KV positions per tile (a multiple of `NR`).
    pub bk: usize,
    pub qp: usize,
    pub kp: usize,
    pub vp: usize,
    pub s: usize,
    pub o: usize,
    pub m: usize,
    pub l: usize,
    /// K tile converted to f32 `[bk][d]` before packing (length 0 without conversion).
    pub kt: usize,
    pub floats: usize,
}

impl TiledLayout {
    /// The layout of a call whose rows together read `span` positions.
    pub(crate) fn new(shape: &Shape, span: usize, conv: Conv) -> Self {
        let d = shape.head_dim;
        let bq_pad = round_up(shape.q_len.min(BQ), MR);
        let d_pad = round_up(d, NR);
        let bk = round_up(span.min(BK), NR);
        let mut at = 0usize;
        let mut take = |n: usize| {
            let o = at;
            at = at.saturating_add(round_up(n, LINE_FLOATS));
            o
        };
        let qp = take(bq_pad.saturating_mul(d));
        let kp = take(d.saturating_mul(bk));
        let vp = take(bk.saturating_mul(d_pad));
        let s = take(bq_pad.saturating_mul(bk));
        let o = take(bq_pad.saturating_mul(d_pad));
        let m = take(bq_pad);
        let l = take(bq_pad);
        let kt = take(if conv.kv { bk.saturating_mul(d) } else { 0 });
        TiledLayout {
            bq_pad,
            d_pad,
            bk,
            qp,
            kp,
            vp,
            s,
            o,
            m,
            l,
            kt,
            floats: at,
        }
    }
}

/// Offsets (in floats) of the row path's regions: the worker slice holds the score tile (and,
/// when inputs need converting, the converted Q rows; for f16 K/V one K head vector and
/// `V_GROUP` V head vectors; for the int8 cache the Q rows quantized to i16 with their scales
/// and sums, and the integer `P . V`'s i32 accumulators, i16 weights, steps, zero-point terms
/// and transposed V scales and zero points); each chunk's partial result holds the running
/// max, the running sum and the accumulator.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RowsLayout {
    /// Query rows per sequence: `q_len * heads`.
    pub nq: usize,
    /// Worker slice: converted Q `[nq, d]` (length 0 without conversion), after the scores
    /// `[nq, tile]` at 0.
    pub qc: usize,
    /// Worker slice: one converted K head vector `[d]`.
    pub kc: usize,
    /// Worker slice: converted V head vectors of `V_GROUP` positions `[V_GROUP][d]`.
    pub vc: usize,
    /// Worker slice: Q rows as i16 `[nq, d]` (two per float).
    pub q16: usize,
    /// Worker slice: their scales `[nq]`.
    pub q16_scale: usize,
    /// Worker slice: their sums `[nq]` (i32).
    pub q16_sum: usize,
    /// Worker slice (int8 cache): the integer `P . V`'s accumulators `[nq, d]` (i32).
    pub pv32: usize,
    /// Worker slice: the tile's i16 weights `[nq, pv_ldw]` (two per float).
    pub pv_w16: usize,
    /// Worker slice: their steps `[nq]`.
    pub pv_step: usize,
    /// Worker slice: their zero-point terms `[nq]` (i32).
    pub pv_zterm: usize,
    /// Worker slice: the tile's V scales per KV head `[kv_heads, PV_MAX_TILE]`.
    pub pv_vs: usize,
    /// Worker slice: its zero points `[kv_heads, PV_MAX_TILE]` (i16, two per float).
    pub pv_zp: usize,
    /// Weights per query head in `pv_w16`: the tile rounded up to `PV_ROWS` (`pv_madd` reads
    /// that many).
    pub pv_ldw: usize,
    /// Floats of a worker slice.
    pub thread_floats: usize,
    /// Chunk partial offsets.
    pub m: usize,
    pub l: usize,
    pub acc: usize,
    pub chunk_floats: usize,
}

impl RowsLayout {
    pub(crate) fn new(shape: &Shape, tile: usize, conv: Conv) -> Self {
        let nq = shape.q_len.saturating_mul(shape.heads);
        let s_floats = round_up(nq.saturating_mul(tile), LINE_FLOATS);
        let d = shape.head_dim;
        let qc = s_floats;
        let q_floats = if conv.q { nq.saturating_mul(d) } else { 0 };
        let kc = qc.saturating_add(round_up(q_floats, LINE_FLOATS));
        let kv_row = if conv.kv_bufs { d } else { 0 }; // one head vector
        let vc = kc.saturating_add(round_up(kv_row, LINE_FLOATS));
        let q16 = vc.saturating_add(round_up(kv_row.saturating_mul(V_GROUP), LINE_FLOATS));
        let (q16_floats, q16_heads) = if conv.q16 {
            (nq.saturating_mul(d).div_ceil(2), nq)
        } else {
            (0, 0)
        };
        let q16_scale = q16.saturating_add(round_up(q16_floats, LINE_FLOATS));
        let q16_sum = q16_scale.saturating_add(round_up(q16_heads, LINE_FLOATS));
        let pv32 = q16_sum.saturating_add(round_up(q16_heads, LINE_FLOATS));
        // The integer P . V (int8 cache): the same regions on every kernel set, so the
        // scratch size does not depend on the SIMD level (NEON leaves them unused).
        let pv_ldw = round_up(tile, crate::kernels::int8::PV_ROWS);
        let (pv_acc_floats, pv_w_floats) = if conv.q16 {
            (nq.saturating_mul(d), nq.saturating_mul(pv_ldw).div_ceil(2))
        } else {
            (0, 0)
        };
        let pv_w16 = pv32.saturating_add(round_up(pv_acc_floats, LINE_FLOATS));
        let pv_step = pv_w16.saturating_add(round_up(pv_w_floats, LINE_FLOATS));
        let pv_zterm = pv_step.saturating_add(round_up(q16_heads, LINE_FLOATS));
        let tab = if conv.q16 {
            shape
                .kv_heads
                .saturating_mul(crate::kernels::int8::PV_MAX_TILE)
        } else {
            0
        };
        let pv_vs = pv_zterm.saturating_add(round_up(q16_heads, LINE_FLOATS));
        let pv_zp = pv_vs.saturating_add(round_up(tab, LINE_FLOATS));
        let thread_floats = pv_zp.saturating_add(round_up(tab.div_ceil(2), LINE_FLOATS));
        let m = 0;
        let l = round_up(nq, LINE_FLOATS);
        let acc = l.saturating_add(round_up(nq, LINE_FLOATS));
        let chunk_floats =
            acc.saturating_add(round_up(nq.saturating_mul(shape.head_dim), LINE_FLOATS));
        RowsLayout {
            nq,
            qc,
            kc,
            vc,
            q16,
            q16_scale,
            q16_sum,
            pv32,
            pv_w16,
            pv_step,
            pv_zterm,
            pv_vs,
            pv_zp,
            pv_ldw,
            thread_floats,
            m,
            l,
            acc,
            chunk_floats,
        }
    }
}

impl Plan {
    /// The plan of a call with this shape on a pool of `threads` threads.
    ///
    /// # Errors
    /// The shape's error, if it is invalid (see [`Shape::validate`]).
    pub fn for_shape(shape: &Shape, threads: usize) -> Result<Plan, SdpaError> {
        Plan::for_call(shape, threads, Dtype::F32, KvCache::Dense)
    }

    /// The plan of a call with this shape, element type and KV cache kind on a pool of
    /// `threads` threads.
    ///
    /// # Errors
    /// The shape's error, if it is invalid (see [`Shape::validate`]).
    pub fn for_call(
        shape: &Shape,
        threads: usize,
        dtype: Dtype,
        kv: KvCache,
    ) -> Result<Plan, SdpaError> {
        Plan::for_params(shape, &Params::default(), threads, dtype, kv)
    }

    /// The plan of a call with this shape, these options (of which the sliding window
    /// matters), element type and KV cache kind on a pool of `threads` threads.
    ///
    /// # Errors
    /// The shape's error, if it is invalid (see [`Shape::validate`]), else the options' (see
    /// [`Params`]).
    pub fn for_params(
        shape: &Shape,
        params: &Params,
        threads: usize,
        dtype: Dtype,
        kv: KvCache,
    ) -> Result<Plan, SdpaError> {
        shape.validate()?;
        params.checked_scale(shape.head_dim)?;
        let mask = Mask::new(shape, params.causal, params.window);
        Ok(Plan::new(shape, &mask, threads.max(1), Conv::of(dtype, kv)))
    }

    /// Assumes a validated shape and `threads >= 1`. Sizes saturate instead of overflowing
    /// (a saturated request then fails in the allocator, never here).
    pub(crate) fn new(shape: &Shape, mask: &Mask, threads: usize, conv: Conv) -> Plan {
        // The positions the call reads: all `kv_len`, or fewer under a sliding window.
        let span = mask.span(shape.q_len).len();
        let empty = shape.batch == 0 || shape.q_len == 0;
        let flag_bytes = round_up(threads.saturating_mul(4), 64);
        if shape.q_len <= ROW_PATH_MAX_Q_LEN {
            let max_chunks = span.div_ceil(ROW_MIN_CHUNK).max(1);
            // K and V elements of one thread's share of the positions.
            let share = shape
                .batch
                .saturating_mul(span)
                .saturating_mul(2 * shape.kv_heads)
                .saturating_mul(shape.head_dim)
                / threads;
            let per_thread = if threads == 1 {
                1
            } else {
                (share / ROW_BALANCE_MIN_ELEMS).clamp(1, ROW_ITEMS_PER_THREAD)
            };
            let want = threads
                .saturating_mul(per_thread)
                .div_ceil(shape.batch.max(1));
            let chunks_per_batch = want.clamp(1, max_chunks);
            let chunk_len = span.div_ceil(chunks_per_batch).max(1);
            let chunks_per_batch = span.div_ceil(chunk_len).max(1);
            let tile = chunk_len.min(ROW_TILE);
            let lay = RowsLayout::new(shape, tile, conv);
            let thread_bytes = lay.thread_floats.saturating_mul(4);
            let chunk_bytes = lay.chunk_floats.saturating_mul(4);
            let chunks = shape.batch.saturating_mul(chunks_per_batch);
            let total_bytes = if empty {
                0
            } else {
                flag_bytes
                    .saturating_add(thread_bytes.saturating_mul(threads))
                    .saturating_add(chunk_bytes.saturating_mul(chunks))
            };
            Plan {
                path: Path::Rows {
                    chunks_per_batch,
                    chunk_len,
                    tile,
                },
                threads,
                total_bytes,
                thread_bytes,
                chunk_bytes,
                chunks,
                flag_bytes,
                conv,
            }
        } else {
            let lay = TiledLayout::new(shape, span, conv);
            let q_block = lay.bq_pad.min(BQ);
            let q_blocks = shape.q_len.div_ceil(q_block);
            let thread_bytes = lay.floats.saturating_mul(4);
            let total_bytes = if empty {
                0
            } else {
                flag_bytes.saturating_add(thread_bytes.saturating_mul(threads))
            };
            Plan {
                path: Path::Tiled {
                    q_block,
                    q_blocks,
                    kv_block: lay.bk,
                },
                threads,
                total_bytes,
                thread_bytes,
                chunk_bytes: 0,
                chunks: 0,
                flag_bytes,
                conv,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(kv_heads: usize, head_dim: usize, kv_len: usize) -> Shape {
        Shape {
            batch: 1,
            q_len: 1,
            heads: kv_heads * 3,
            kv_heads,
            head_dim,
            kv_capacity: kv_len,
            start_pos: kv_len - 1,
        }
    }

    fn chunks(shape: &Shape, threads: usize) -> usize {
        match Plan::for_shape(shape, threads).unwrap().path {
            Path::Rows {
                chunks_per_batch, ..
            } => chunks_per_batch,
            Path::Tiled { .. } => unreachable!("a decode shape"),
        }
    }

    /// Short rows (SmolLM2-135M: 3 KV heads of 64) get one chunk per thread, and one chunk on
    /// one thread; long rows (32 KV heads of 128) and long caches are split into up to 4 items
    /// per thread, never into chunks under 32 positions.
    #[test]
    fn row_path_splits_only_long_work() {
        for kv in [100, 200] {
            assert_eq!(chunks(&decode(3, 64, kv), 1), 1, "kv {kv}");
            assert_eq!(chunks(&decode(3, 64, kv), 2), 2, "kv {kv}");
        }
        assert_eq!(chunks(&decode(3, 64, 4096), 1), 1);
        assert_eq!(chunks(&decode(3, 64, 4096), 2), 8);
        assert_eq!(chunks(&decode(32, 128, 1024), 2), 8);
        assert_eq!(chunks(&decode(32, 128, 64), 2), 2);
    }
}
