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

use crate::quant::{dequantize_block, QType, QK};

/// Rows per group.
pub const GROUP: usize = 16;

/// Bytes of the scales (and Q4_1's minimums) at the start of a group-block.
pub fn scale_bytes(t: QType) -> usize {
    match t {
        QType::Q4_1 => 4 * GROUP,
        QType::Q4_0 | QType::Q8_0 => 2 * GROUP,
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
    fn pack_blocks(
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
        let (g, i) = (r / GROUP, r % GROUP);
        let gb = &self.bytes[g * self.group_bytes + b * gbb..][..gbb];
        blk[..2].copy_from_slice(&gb[2 * i..2 * i + 2]);
        if t == QType::Q4_1 {
            blk[2..4].copy_from_slice(&gb[2 * GROUP + 2 * i..][..2]);
        }
        let (q0, sb) = (quant_offset(t), scale_bytes(t));
        for (j, q) in blk[q0..].iter_mut().enumerate() {
            *q = gb[sb + j * GROUP + i];
        }
    }

    /// Row `r` (below the row count) dequantized into `out` (`blocks * 32` floats), exactly
    /// as [`dequantize_block`] defines the format.
    pub fn dequantize_row(&self, t: QType, r: usize, out: &mut [f32]) {
        let mut blk = [0u8; MAX_BLOCK_BYTES];
        let blk = &mut blk[..t.block_bytes()];
        let mut w = [0f32; QK];
        for (b, o) in out.chunks_exact_mut(QK).take(self.blocks).enumerate() {
            self.read_block(t, r, b, blk);
            dequantize_block(t, blk, &mut w);
            o.copy_from_slice(&w);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_data::data;
    use crate::quant::{dequantize_row, quantize_row};

    /// Rows in the file's layout of `rows` rows of `cols` weights of `t`.
    fn file_rows(t: QType, rows: usize, cols: usize) -> Vec<u8> {
        data(rows * cols, (rows * 7 + cols) as u32)
            .chunks_exact(cols)
            .flat_map(|r| quantize_row(t, r))
            .collect()
    }

    /// Every row read back from the group layout (a padded last group included), before
    /// and after a row permutation, dequantizes bit for bit as the file's row does.
    #[test]
    fn rows_read_back_exactly_and_permute() {
        for t in [QType::Q4_0, QType::Q4_1, QType::Q8_0] {
            let (rows, cols) = (21, 3 * QK);
            let src = file_rows(t, rows, cols);
            let rb = t.row_bytes(cols);
            let want = |r: usize| {
                let mut o = vec![0f32; cols];
                dequantize_row(t, &src[r * rb..][..rb], &mut o);
                o
            };
            let g = RowGroups::pack(t, rows, cols, &src);
            assert_eq!(g.bytes().len(), 2 * g.group_bytes(), "{t:?}: two groups");
            let order: Vec<usize> = (0..rows).map(|r| (r * 5 + 3) % rows).collect();
            let p = g.permute_rows(t, rows, &order);
            let mut got = vec![0f32; cols];
            for (r, &from) in order.iter().enumerate() {
                g.dequantize_row(t, r, &mut got);
                assert_eq!(got, want(r), "{t:?} row {r}");
                p.dequantize_row(t, r, &mut got);
                assert_eq!(got, want(from), "{t:?} permuted row {r}");
            }
        }
    }
}
