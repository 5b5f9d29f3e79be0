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

use crate::quant::{QType, QK};

/// Rows per group.
pub const GROUP: usize = 16;

/// Bytes of the scales (and Q4_1's minimums) at the start of a group-block.
pub fn scale_bytes(t: QType) -> usize {
    match t {
        QType::Q4_1 => 4 * GROUP,
        QType::Q4_0 | QType::Q8_0 => 2 * GROUP,
    }
}

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
        let blocks = cols / QK;
        let bb = t.block_bytes();
        let gbb = group_block_bytes(t);
        let group_bytes = blocks * gbb;
        let groups = rows.div_ceil(GROUP);
        let row_bytes = blocks * bb;
        let mut bytes = vec![0u8; groups * group_bytes];
        let quants = bb - 2 * (1 + usize::from(t == QType::Q4_1));
        let sb = scale_bytes(t);
        bytes
            .par_chunks_mut(group_bytes.max(1))
            .enumerate()
            .for_each(|(g, dst)| {
                for i in 0..GROUP.min(rows - g * GROUP) {
                    let row = &src[(g * GROUP + i) * row_bytes..][..row_bytes];
                    for (b, blk) in row.chunks_exact(bb).enumerate() {
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
