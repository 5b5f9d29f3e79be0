//! The decode kernels' layout of a quantized matrix: rows in groups of [`GROUP`], each
//! group's blocks interleaved so that one vector lane holds one row.
//!
//! A group-block (the `b`-th block of the rows `16 g .. 16 g + 16`) holds, in this order:
//! - the 16 rows' f16 scales `d` (32 bytes),
//! - Q4_1 only: the 16 rows' f16 minimums `m` (32 bytes),
//! - the quants, byte position by byte position: for Q4_0 / Q4_1, `qs[j]` of rows 0..16 for
//!   `j = 0..16` (16 x 16 bytes); for Q8_0, `qs[j]` of rows 0..16 for `j = 0..32`.
//!
//! A decode kernel then widens 16 bytes into one vector per byte position and multiplies it
//! by the broadcast `x[j]`: no horizontal sums, and the scales of 16 rows come in one load.
//! Each group-block is as large as 16 of the file's blocks, so the layout streams as many
//! bytes as the file's. The last group is padded with zero rows.

use std::sync::Arc;

use rayon::prelude::*;

use kernel_simd::Level;

use crate::quant::format::{dequantize_block, QType, QK};
use crate::quant::widen::widen_blocks;

/// Rows per group.
pub const GROUP: usize = 16;

/// Bytes of the scales (and Q4_1's minimums) at the start of a group-block.
pub fn scale_bytes(t: QType) -> usize {
    match t {
        QType::Q4_1 => 4 * GROUP,
        // Q4_0, Q8_0 (the only other formats packed in groups).
        _ => 2 * GROUP,
    }
}

/// Bytes of a file block before its quants: the scale, and Q4_1's minimum.
fn quant_offset(t: QType) -> usize {
    2 * (1 + usize::from(t == QType::Q4_1))
}

/// The largest block of any format (Q8_0's).
const MAX_BLOCK_BYTES: usize = 34;

/// Bytes of one group-block: `GROUP` blocks of `t`.
pub fn group_block_bytes(t: QType) -> usize {
    GROUP * t.block_bytes()
}

/// A quantized matrix in the group layout (an owned copy, shared between clones).
#[derive(Clone, Debug)]
pub struct RowGroups {
    bytes: Arc<[u8]>,
    blocks: usize,
    group_bytes: usize,
}

impl RowGroups {
    /// `rows` rows of `cols / 32` blocks of `t`, packed from `src` (the file's layout, row
    /// after row; `src.len() == rows * t.row_bytes(cols)`, which the callers check).
    pub fn pack(t: QType, rows: usize, cols: usize, src: &[u8]) -> RowGroups {
        let row_bytes = t.row_bytes(cols);
        Self::pack_blocks(t, rows, cols, |r, b, blk| {
            blk.copy_from_slice(&src[r * row_bytes + b * t.block_bytes()..][..blk.len()]);
        })
    }

    /// The same matrix with its rows reordered: row `r` of the result is row `order[r]` of
    /// `self` (`order` holds `rows` indices below `rows`, which the callers build).
    pub fn permute_rows(&self, t: QType, rows: usize, order: &[usize]) -> RowGroups {
        Self::pack_blocks(t, rows, self.blocks * QK, |r, b, blk| {
            self.read_block(t, order[r], b, blk);
        })
    }

    /// `rows` rows of `cols / 32` blocks of `t`, block `b` of row `r` written in the file's
    /// layout into the slice `block(r, b, slice)` is given.
    pub(crate) fn pack_blocks(
        t: QType,
        rows: usize,
        cols: usize,
        block: impl Fn(usize, usize, &mut [u8]) + Sync,
    ) -> RowGroups {
        let blocks = cols / QK;
        let bb = t.block_bytes();
        let gbb = group_block_bytes(t);
        let group_bytes = blocks * gbb;
        let groups = rows.div_ceil(GROUP);
        let mut bytes = vec![0u8; groups * group_bytes];
        let quants = bb - quant_offset(t);
        let sb = scale_bytes(t);
        bytes
            .par_chunks_mut(group_bytes.max(1))
            .enumerate()
            .for_each(|(g, dst)| {
                let mut blk = [0u8; MAX_BLOCK_BYTES];
                let blk = &mut blk[..bb];
                for i in 0..GROUP.min(rows - g * GROUP) {
                    for b in 0..blocks {
                        block(g * GROUP + i, b, blk);
                        let gb = &mut dst[b * gbb..][..gbb];
                        gb[2 * i..2 * i + 2].copy_from_slice(&blk[..2]);
                        if t == QType::Q4_1 {
                            gb[2 * GROUP + 2 * i..][..2].copy_from_slice(&blk[2..4]);
                        }
                        for (j, &q) in blk[bb - quants..].iter().enumerate() {
                            gb[sb + j * GROUP + i] = q;
                        }
                    }
                }
            });
        RowGroups {
            bytes: bytes.into(),
            blocks,
            group_bytes,
        }
    }

    /// Block `b` of row `r` in the file's layout (`blk`: `t.block_bytes()` bytes).
    fn read_block(&self, t: QType, r: usize, b: usize, blk: &mut [u8]) {
        let gbb = group_block_bytes(t);
        let gb = &self.bytes[r / GROUP * self.group_bytes + b * gbb..][..gbb];
        gather_lane(t, gb, r % GROUP, blk);
    }

    /// Row `r` (below the row count) dequantized into `out` (`blocks * 32` floats), exactly
    /// as [`dequantize_block`] defines the format.
    pub fn dequantize_row(&self, t: QType, r: usize, out: &mut [f32]) {
        let (g, i) = (r / GROUP, r % GROUP);
        let group = &self.bytes[g * self.group_bytes..][..self.group_bytes];
        // One instantiation per format: the group-block and block sizes are constants, so
        // the lane's bytes are gathered at fixed offsets (the embedding's rows, and the
        // rows of a partial group in prefill).
        match t {
            QType::Q4_0 => dequantize_lane::<{ GROUP * 18 }, 18>(t, group, i, out),
            QType::Q4_1 => dequantize_lane::<{ GROUP * 20 }, 20>(t, group, i, out),
            QType::Q8_0 => dequantize_lane::<{ GROUP * 34 }, 34>(t, group, i, out),
            // Never packed in groups (`QTensor` keeps them row by row): made visible, not
            // guessed, should a caller ever ask.
            _ => out.fill(f32::NAN),
        }
    }

    /// Rows `r0 .. r0 + n` dequantized into `out` (`n * blocks * 32` floats), row after
    /// row, exactly as [`dequantize_block`] defines the format. Whole groups are transposed
    /// back to the file's layout 16 rows at a time (what prefill asks for); other rows are
    /// gathered one by one.
    pub fn dequantize_rows(&self, level: Level, t: QType, r0: usize, n: usize, out: &mut [f32]) {
        let k = self.blocks * QK;
        let mut r = r0;
        while r < r0 + n {
            let o = &mut out[(r - r0) * k..];
            if r.is_multiple_of(GROUP) && r + GROUP <= r0 + n {
                let group = &self.bytes[r / GROUP * self.group_bytes..][..self.group_bytes];
                match t {
                    QType::Q4_0 => dequantize_group::<{ GROUP * 18 }, 18>(level, t, group, k, o),
                    QType::Q4_1 => dequantize_group::<{ GROUP * 20 }, 20>(level, t, group, k, o),
                    QType::Q8_0 => dequantize_group::<{ GROUP * 34 }, 34>(level, t, group, k, o),
                    _ => o[..GROUP * k].fill(f32::NAN),
                }
                r += GROUP;
            } else {
                self.dequantize_row(t, r, &mut o[..k]);
                r += 1;
            }
        }
    }

    /// Every byte of the layout (what a decode step streams).
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Blocks per row.
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// Bytes of one group (its `blocks` group-blocks).
    pub fn group_bytes(&self) -> usize {
        self.group_bytes
    }

    /// Groups `g0 .. g0 + n` (fewer at the end), contiguous.
    pub fn groups(&self, g0: usize, n: usize) -> &[u8] {
        let total = self.bytes.len();
        let begin = (g0 * self.group_bytes).min(total);
        let end = ((g0 + n) * self.group_bytes).min(total);
        &self.bytes[begin..end]
    }
}

/// Lane `i` of every group-block of `group` (group-blocks of `GBB` bytes, file blocks of
/// `BB`: those of `t`) dequantized into `out`, a block of 32 floats per group-block.
#[inline(always)]
fn dequantize_lane<const GBB: usize, const BB: usize>(
    t: QType,
    group: &[u8],
    i: usize,
    out: &mut [f32],
) {
    let (gbs, _) = group.as_chunks::<GBB>();
    let (outs, _) = out.as_chunks_mut::<QK>();
    for (gb, o) in gbs.iter().zip(outs) {
        let mut blk = [0u8; BB];
        gather_lane(t, gb, i, &mut blk);
        dequantize_block(t, &blk, o);
    }
}

/// The 16 rows of `group` (group-blocks of `GBB` bytes, file blocks of `BB`: those of
/// `t`) dequantized into `out` (rows of `k` floats): each group-block's quants transposed
/// back to 16 file blocks, 16 x 16 bytes at a time, and widened on `level`.
#[inline(always)]
fn dequantize_group<const GBB: usize, const BB: usize>(
    level: Level,
    t: QType,
    group: &[u8],
    k: usize,
    out: &mut [f32],
) {
    let (q0, sb) = (quant_offset(t), scale_bytes(t));
    let (gbs, _) = group.as_chunks::<GBB>();
    for (b, gb) in gbs.iter().enumerate() {
        let mut blks = [[0u8; BB]; GROUP];
        for (i, blk) in blks.iter_mut().enumerate() {
            blk[..2].copy_from_slice(&gb[2 * i..2 * i + 2]);
            if t == QType::Q4_1 {
                blk[2..4].copy_from_slice(&gb[2 * GROUP + 2 * i..][..2]);
            }
        }
        // Byte positions 16 at a time: Q8_0's 32 in two squares.
        for (h, square) in gb[sb..]
            .as_chunks::<{ GROUP * GROUP }>()
            .0
            .iter()
            .enumerate()
        {
            let rows = transpose_16x16(square);
            for (blk, row) in blks.iter_mut().zip(&rows) {
                blk[q0 + h * GROUP..][..GROUP].copy_from_slice(row);
            }
        }
        widen_blocks::run(level, t, blks.as_flattened(), &mut out[b * QK..], k);
    }
}

/// `out[i][j] = square[16 j + i]`: a 16 x 16 byte matrix transposed, as four 8 x 8 blocks
/// of eight `u64` rows each.
#[inline(always)]
fn transpose_16x16(square: &[u8; GROUP * GROUP]) -> [[u8; GROUP]; GROUP] {
    let (words, _) = square.as_chunks::<8>();
    let mut out = [[0u8; GROUP]; GROUP];
    for jb in 0..2 {
        for ib in 0..2 {
            // Rows `8 jb + r`, columns `8 ib ..`: word `2 (8 jb + r) + ib`.
            let mut a: [u64; 8] =
                std::array::from_fn(|r| u64::from_le_bytes(words[2 * (8 * jb + r) + ib]));
            transpose_8x8(&mut a);
            for (c, w) in a.iter().enumerate() {
                out[8 * ib + c][8 * jb..8 * jb + 8].copy_from_slice(&w.to_le_bytes());
            }
        }
    }
    out
}

/// An 8 x 8 byte matrix (row `r` = the little-endian bytes of `a[r]`) transposed in place:
/// 4 x 4, 2 x 2 and 1 x 1 blocks swapped across the diagonal in turn.
#[inline(always)]
fn transpose_8x8(a: &mut [u64; 8]) {
    for (s, mask) in [
        (4, 0x0000_0000_ffff_ffff_u64),
        (2, 0x0000_ffff_0000_ffff),
        (1, 0x00ff_00ff_00ff_00ff),
    ] {
        for j in (0..8).filter(|j| j & s == 0) {
            let t = ((a[j] >> (8 * s)) ^ a[j + s]) & mask;
            a[j] ^= t << (8 * s);
            a[j + s] ^= t;
        }
    }
}

/// Lane `i`'s block of the group-block `gb` of `t`, in the file's layout, into `blk`
/// (`t.block_bytes()` bytes).
#[inline(always)]
fn gather_lane(t: QType, gb: &[u8], i: usize, blk: &mut [u8]) {
    blk[..2].copy_from_slice(&gb[2 * i..2 * i + 2]);
    if t == QType::Q4_1 {
        blk[2..4].copy_from_slice(&gb[2 * GROUP + 2 * i..][..2]);
    }
    let (q0, sb) = (quant_offset(t), scale_bytes(t));
    for (j, q) in blk[q0..].iter_mut().enumerate() {
        *q = gb[sb + j * GROUP + i];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_data::data;
    use crate::quant::format::{dequantize_row, quantize_row};

    /// Rows in the file's layout of `rows` rows of `cols` weights of `t`.
    fn file_rows(t: QType, rows: usize, cols: usize) -> Vec<u8> {
        data(rows * cols, (rows * 7 + cols) as u32)
            .chunks_exact(cols)
            .flat_map(|r| quantize_row(t, r).unwrap())
            .collect()
    }

    /// Every row read back from the group layout (a padded last group included), before
    /// and after a row permutation, dequantizes bit for bit as the file's row does.
    #[test]
    fn rows_read_back_exactly_and_permute() {
        for t in [QType::Q4_0, QType::Q4_1, QType::Q8_0] {
            let (rows, cols) = (37, 3 * QK);
            let src = file_rows(t, rows, cols);
            let rb = t.row_bytes(cols);
            let want = |r: usize| {
                let mut o = vec![0f32; cols];
                dequantize_row(t, &src[r * rb..][..rb], &mut o);
                o
            };
            let g = RowGroups::pack(t, rows, cols, &src);
            assert_eq!(g.bytes().len(), 3 * g.group_bytes(), "{t:?}: three groups");
            let order: Vec<usize> = (0..rows).map(|r| (r * 5 + 3) % rows).collect();
            let p = g.permute_rows(t, rows, &order);
            let mut got = vec![0f32; cols];
            // Whole groups (transposed) and single rows (gathered), on every level.
            for level in kernel_simd::available_levels() {
                for (r0, n) in [(0, rows), (3, 34)] {
                    let mut out = vec![0f32; n * cols];
                    g.dequantize_rows(level, t, r0, n, &mut out);
                    for (r, o) in (r0..r0 + n).zip(out.chunks_exact(cols)) {
                        assert_eq!(o, want(r), "{level} {t:?} rows {r0}.., row {r}");
                    }
                }
            }
            for (r, &from) in order.iter().enumerate() {
                g.dequantize_row(t, r, &mut got);
                assert_eq!(got, want(r), "{t:?} row {r}");
                p.dequantize_row(t, r, &mut got);
                assert_eq!(got, want(from), "{t:?} permuted row {r}");
            }
        }
    }
}
