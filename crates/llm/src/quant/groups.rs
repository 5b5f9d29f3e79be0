//! The decode kernels' layout of a quantized matrix: rows in groups of [`GROUP`], each
//! group's blocks interleaved so that one vector lane holds one row.
//!
//! A group-block (the `b`-th block of 32 weights of the rows `16 g .. 16 g + 16`, in one of
//! the [`GroupFormat`]s) holds, in this order:
//! - each header word of the 16 rows' blocks (16 f16 or f32 scales; for Q4_1 and Q4_1F32
//!   then the 16 minimums, for Q8_0F32x2 the 16 second scales),
//! - the quants, byte position by byte position: for the 4-bit formats, `qs[j]` of rows
//!   0..16 for `j = 0..16` (16 x 16 bytes); for the 8-bit ones, `qs[j]` of rows 0..16 for
//!   `j = 0..32`.
//!
//! A decode kernel then widens 16 bytes into one vector per byte position and multiplies it
//! by the broadcast `x[j]`: no horizontal sums, and the scales of 16 rows come in one load.
//! Each group-block is as large as 16 of its format's blocks (the file's, or for a repacked
//! K-quant its [`GroupFormat`]'s). The last group is padded with zero rows.

use std::sync::Arc;

use rayon::prelude::*;

use kernel_simd::Level;

use crate::quant::format::{QType, QK};
use crate::quant::formats::{q4_k, q5_k, q6_k};
use crate::quant::group_format::dequantize_block;
pub use crate::quant::group_format::GroupFormat;
use crate::quant::widen::widen_blocks;

/// Rows per group.
pub const GROUP: usize = 16;

/// Bytes of the header words at the start of a group-block.
pub fn scale_bytes(f: GroupFormat) -> usize {
    GROUP * f.header_bytes()
}

/// The largest block of any format (Q8_0F32x2's).
const MAX_BLOCK_BYTES: usize = GroupFormat::Q8_0F32x2.block_bytes();

/// Bytes of one group-block: `GROUP` blocks of `f`.
pub fn group_block_bytes(f: GroupFormat) -> usize {
    GROUP * f.block_bytes()
}

/// A quantized matrix in the group layout (an owned copy, shared between clones).
#[derive(Clone, Debug)]
pub struct RowGroups {
    bytes: Arc<[u8]>,
    blocks: usize,
    group_bytes: usize,
}

impl RowGroups {
    /// `rows` rows of `cols / 32` blocks of `f`, packed from `src` (rows of blocks of `f`
    /// one after another, as the file holds the ggml formats of [`GroupFormat`]; `src.len() == rows * cols /
    /// 32 * f.block_bytes()`, which the callers check).
    pub fn pack(f: GroupFormat, rows: usize, cols: usize, src: &[u8]) -> RowGroups {
        let bb = f.block_bytes();
        let row_bytes = cols / QK * bb;
        Self::pack_blocks(f, rows, cols, |r, b, blk| {
            blk.copy_from_slice(&src[r * row_bytes + b * bb..][..bb]);
        })
    }

    /// `rows` rows of `cols` weights of `t` from the file's layout (`src`, whose length the
    /// callers check: `rows * t.row_bytes(cols)`), in the group format `t` is read in
    /// ([`GroupFormat::of`]): as the file has them, or each block transcoded or repacked by
    /// its format's file (Q4_K to Q4_1F32, Q5_K to Q5_1F32, Q6_K to Q8_0F32x2).
    pub fn from_file(t: QType, rows: usize, cols: usize, src: &[u8]) -> (RowGroups, GroupFormat) {
        let f = GroupFormat::of(t);
        let (rb, bb, per) = (t.row_bytes(cols), t.block_bytes(), t.block_len() / QK);
        // The file block (a block of 32, or the super-block) holding block `b` of row `r`.
        let at = |r: usize, b: usize| &src[r * rb + b / per * bb..][..bb];
        let groups = match t {
            QType::Q4_0 | QType::Q4_1 | QType::Q5_0 | QType::Q5_1 | QType::Q8_0 => {
                RowGroups::pack(f, rows, cols, src)
            }
            QType::Q4_K => Self::pack_blocks(f, rows, cols, |r, b, blk| {
                q4_k::to_q4_1_f32(at(r, b), b % per, blk);
            }),
            QType::Q6_K => Self::pack_blocks(f, rows, cols, |r, b, blk| {
                q6_k::to_q8_0_f32x2(at(r, b), b % per, blk);
            }),
            QType::Q5_K => Self::pack_blocks(f, rows, cols, |r, b, blk| {
                q5_k::to_q5_1_f32(at(r, b), b % per, blk);
            }),
        };
        (groups, f)
    }

    /// The same matrix with its rows reordered: row `r` of the result is row `order[r]` of
    /// `self` (`order` holds `rows` indices below `rows`, which the callers build).
    pub fn permute_rows(&self, f: GroupFormat, rows: usize, order: &[usize]) -> RowGroups {
        Self::pack_blocks(f, rows, self.blocks * QK, |r, b, blk| {
            self.read_block(f, order[r], b, blk);
        })
    }

    /// `rows` rows of `cols / 32` blocks of `f`, block `b` of row `r` written by `block(r,
    /// b, slice)` into the slice (`f.block_bytes()` bytes) it is given.
    pub(crate) fn pack_blocks(
        f: GroupFormat,
        rows: usize,
        cols: usize,
        block: impl Fn(usize, usize, &mut [u8]) + Sync,
    ) -> RowGroups {
        let blocks = cols / QK;
        let bb = f.block_bytes();
        let gbb = group_block_bytes(f);
        let group_bytes = blocks * gbb;
        let groups = rows.div_ceil(GROUP);
        let mut bytes = vec![0u8; groups * group_bytes];
        let (hb, wb, sb) = (f.header_bytes(), f.word_bytes(), scale_bytes(f));
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
                        for (w, word) in blk[..hb].chunks_exact(wb).enumerate() {
                            gb[(w * GROUP + i) * wb..][..wb].copy_from_slice(word);
                        }
                        for (j, &q) in blk[hb..].iter().enumerate() {
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

    /// Block `b` of row `r` as a block of `f` (`blk`: `f.block_bytes()` bytes).
    fn read_block(&self, f: GroupFormat, r: usize, b: usize, blk: &mut [u8]) {
        let gbb = group_block_bytes(f);
        let gb = &self.bytes[r / GROUP * self.group_bytes + b * gbb..][..gbb];
        gather_lane(f, gb, r % GROUP, blk);
    }

    /// Row `r` (below the row count) dequantized into `out` (`blocks * 32` floats), exactly
    /// as [`dequantize_block`] defines the format.
    pub fn dequantize_row(&self, f: GroupFormat, r: usize, out: &mut [f32]) {
        let (g, i) = (r / GROUP, r % GROUP);
        let group = &self.bytes[g * self.group_bytes..][..self.group_bytes];
        // One instantiation per format: the group-block and block sizes are constants, so
        // the lane's bytes are gathered at fixed offsets (the embedding's rows, and the
        // rows of a partial group in prefill).
        match f {
            GroupFormat::Q4_0 => dequantize_lane::<{ GROUP * 18 }, 18>(f, group, i, out),
            GroupFormat::Q4_1 => dequantize_lane::<{ GROUP * 20 }, 20>(f, group, i, out),
            GroupFormat::Q5_0 => dequantize_lane::<{ GROUP * 22 }, 22>(f, group, i, out),
            GroupFormat::Q5_1 => dequantize_lane::<{ GROUP * 24 }, 24>(f, group, i, out),
            GroupFormat::Q8_0 => dequantize_lane::<{ GROUP * 34 }, 34>(f, group, i, out),
            GroupFormat::Q4_1F32 => dequantize_lane::<{ GROUP * 24 }, 24>(f, group, i, out),
            GroupFormat::Q5_1F32 => dequantize_lane::<{ GROUP * 28 }, 28>(f, group, i, out),
            GroupFormat::Q8_0F32x2 => dequantize_lane::<{ GROUP * 40 }, 40>(f, group, i, out),
        }
    }

    /// Rows `r0 .. r0 + n` dequantized into `out` (`n * blocks * 32` floats), row after
    /// row, exactly as [`dequantize_block`] defines the format. Whole groups are transposed
    /// back to blocks 16 rows at a time (what prefill asks for); other rows are gathered
    /// one by one.
    pub fn dequantize_rows(
        &self,
        level: Level,
        f: GroupFormat,
        r0: usize,
        n: usize,
        out: &mut [f32],
    ) {
        let k = self.blocks * QK;
        let mut r = r0;
        while r < r0 + n {
            let o = &mut out[(r - r0) * k..];
            if r.is_multiple_of(GROUP) && r + GROUP <= r0 + n {
                let group = &self.bytes[r / GROUP * self.group_bytes..][..self.group_bytes];
                match f {
                    GroupFormat::Q4_0 => {
                        dequantize_group::<{ GROUP * 18 }, 18>(level, f, group, k, o)
                    }
                    GroupFormat::Q4_1 => {
                        dequantize_group::<{ GROUP * 20 }, 20>(level, f, group, k, o)
                    }
                    GroupFormat::Q5_0 => {
                        dequantize_group::<{ GROUP * 22 }, 22>(level, f, group, k, o)
                    }
                    GroupFormat::Q5_1 => {
                        dequantize_group::<{ GROUP * 24 }, 24>(level, f, group, k, o)
                    }
                    GroupFormat::Q8_0 => {
                        dequantize_group::<{ GROUP * 34 }, 34>(level, f, group, k, o)
                    }
                    GroupFormat::Q4_1F32 => {
                        dequantize_group::<{ GROUP * 24 }, 24>(level, f, group, k, o)
                    }
                    GroupFormat::Q5_1F32 => {
                        dequantize_group::<{ GROUP * 28 }, 28>(level, f, group, k, o)
                    }
                    GroupFormat::Q8_0F32x2 => {
                        dequantize_group::<{ GROUP * 40 }, 40>(level, f, group, k, o)
                    }
                }
                r += GROUP;
            } else {
                self.dequantize_row(f, r, &mut o[..k]);
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

/// Lane `i` of every group-block of `group` (group-blocks of `GBB` bytes, blocks of `BB`:
/// those of `f`) dequantized into `out`, a block of 32 floats per group-block.
#[inline(always)]
fn dequantize_lane<const GBB: usize, const BB: usize>(
    f: GroupFormat,
    group: &[u8],
    i: usize,
    out: &mut [f32],
) {
    let (gbs, _) = group.as_chunks::<GBB>();
    let (outs, _) = out.as_chunks_mut::<QK>();
    for (gb, o) in gbs.iter().zip(outs) {
        let mut blk = [0u8; BB];
        gather_lane(f, gb, i, &mut blk);
        dequantize_block(f, &blk, o);
    }
}

/// The 16 rows of `group` (group-blocks of `GBB` bytes, blocks of `BB`: those of `f`)
/// dequantized into `out` (rows of `k` floats): each group-block transposed back to 16
/// blocks (the quants 16 x 16 bytes at a time), and widened on `level`.
#[inline(always)]
fn dequantize_group<const GBB: usize, const BB: usize>(
    level: Level,
    f: GroupFormat,
    group: &[u8],
    k: usize,
    out: &mut [f32],
) {
    let (hb, wb, sb) = (f.header_bytes(), f.word_bytes(), scale_bytes(f));
    let (gbs, _) = group.as_chunks::<GBB>();
    for (b, gb) in gbs.iter().enumerate() {
        let mut blks = [[0u8; BB]; GROUP];
        for (i, blk) in blks.iter_mut().enumerate() {
            for w in 0..f.header_words() {
                blk[w * wb..][..wb].copy_from_slice(&gb[(w * GROUP + i) * wb..][..wb]);
            }
        }
        // Byte positions 16 at a time: the 8-bit formats' 32 in two squares.
        for (h, square) in gb[sb..]
            .as_chunks::<{ GROUP * GROUP }>()
            .0
            .iter()
            .enumerate()
        {
            let rows = transpose_16x16(square);
            for (blk, row) in blks.iter_mut().zip(&rows) {
                blk[hb + h * GROUP..][..GROUP].copy_from_slice(row);
            }
        }
        widen_blocks::run(level, f, blks.as_flattened(), &mut out[b * QK..], k);
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

/// Lane `i`'s block of the group-block `gb` of `f`, into `blk` (`f.block_bytes()` bytes).
#[inline(always)]
fn gather_lane(f: GroupFormat, gb: &[u8], i: usize, blk: &mut [u8]) {
    let (hb, wb, sb) = (f.header_bytes(), f.word_bytes(), scale_bytes(f));
    for w in 0..f.header_words() {
        blk[w * wb..][..wb].copy_from_slice(&gb[(w * GROUP + i) * wb..][..wb]);
    }
    for (j, q) in blk[hb..].iter_mut().enumerate() {
        *q = gb[sb + j * GROUP + i];
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_data::file_rows;
    use crate::quant::format::dequantize_row;

    /// Every row read back from the group layout (a padded last group included), before
    /// and after a row permutation, dequantizes bit for bit as the file's row does, in every
    /// format packed in groups (the transcoded and repacked ones included).
    #[test]
    fn rows_read_back_exactly_and_permute() {
        for t in QType::ALL {
            let (rows, cols) = (37, 3 * t.block_len());
            let src = file_rows(t, rows, cols, (rows * 7 + cols) as u32);
            let rb = t.row_bytes(cols);
            let want = |r: usize| {
                let mut o = vec![0f32; cols];
                dequantize_row(t, &src[r * rb..][..rb], &mut o);
                o
            };
            let (g, f) = RowGroups::from_file(t, rows, cols, &src);
            assert_eq!(g.bytes().len(), 3 * g.group_bytes(), "{t:?}: three groups");
            let order: Vec<usize> = (0..rows).map(|r| (r * 5 + 3) % rows).collect();
            let p = g.permute_rows(f, rows, &order);
            let mut got = vec![0f32; cols];
            // Whole groups (transposed) and single rows (gathered), on every level.
            for level in kernel_simd::available_levels() {
                for (r0, n) in [(0, rows), (3, 34)] {
                    let mut out = vec![0f32; n * cols];
                    g.dequantize_rows(level, f, r0, n, &mut out);
                    for (r, o) in (r0..r0 + n).zip(out.chunks_exact(cols)) {
                        assert_eq!(
                            bits(o),
                            bits(&want(r)),
                            "{level} {t:?} rows {r0}.., row {r}"
                        );
                    }
                }
            }
            for (r, &from) in order.iter().enumerate() {
                g.dequantize_row(f, r, &mut got);
                assert_eq!(bits(&got), bits(&want(r)), "{t:?} row {r}");
                p.dequantize_row(f, r, &mut got);
                assert_eq!(bits(&got), bits(&want(from)), "{t:?} permuted row {r}");
            }
        }
    }

    /// The bits of each value (so that `-0.0` and `0.0` differ, and NaN equals itself).
    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }
}
