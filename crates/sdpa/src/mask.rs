//! Which key/value positions each query row sees: causal masking and the sliding window.
//!
//! Query row `i` sits at position `p = start_pos + i`. Causal attention lets it see positions
//! `..=p`, non-causal all `kv_len` positions. A sliding window of `w` positions (causal only)
//! keeps the last `w` of those: positions in `(p - w, p]`, the query's own included. That is
//! llama.cpp's `LLAMA_SWA_TYPE_STANDARD` (`llama_hparams::is_masked_swa` masks key `p0` for
//! query `p1` when `p1 - p0 >= n_swa`), which its `gemma3` architecture uses with
//! `n_swa = gemma3.attention.sliding_window`.
//!
//! Every row's visible positions are one interval, and both its ends grow with the row, so a
//! run of rows `i0..i1` sees the interval from row `i0`'s start to row `i1 - 1`'s end: the
//! code paths read only that (a decode call with a long cache and a short window reads, and
//! sizes its scratch for, the window alone).

use core::num::NonZeroUsize;
use core::ops::Range;

use crate::Shape;

/// The masking rule of a call.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mask {
    causal: bool,
    window: Option<NonZeroUsize>,
    start_pos: usize,
    kv_len: usize,
}

impl Mask {
    /// The rule of `shape` (validated) with causal masking and a window (`None`: unlimited).
    pub(crate) fn new(shape: &Shape, causal: bool, window: Option<NonZeroUsize>) -> Mask {
        Mask {
            causal,
            window,
            start_pos: shape.start_pos,
            kv_len: shape.kv_len(),
        }
    }

    /// Positions query row `i` sees.
    #[inline]
    pub(crate) fn row(&self, i: usize) -> Range<usize> {
        // One past the row's own position (saturating: an empty call's shape may sit at the
        // end of the address range).
        let after = self.start_pos.saturating_add(i).saturating_add(1);
        let end = if self.causal { after } else { self.kv_len };
        let start = self.window.map_or(0, |w| after.saturating_sub(w.get()));
        start..end
    }

    /// Positions some row of `i0..i1` (not empty) sees: the first row's start to the last
    /// row's end.
    #[inline]
    pub(crate) fn rows(&self, i0: usize, i1: usize) -> Range<usize> {
        debug_assert!(i0 < i1);
        self.row(i0).start..self.row(i1 - 1).end
    }

    /// Positions any row of the call (`q_len` rows) reads.
    pub(crate) fn span(&self, q_len: usize) -> Range<usize> {
        self.rows(0, q_len.max(1))
    }

    /// The columns of a tile of `n` positions starting at `t0` that query row `i` sees, as
    /// offsets into the tile (empty when it sees none).
    #[inline]
    pub(crate) fn in_tile(&self, i: usize, t0: usize, n: usize) -> Range<usize> {
        clip(self.row(i), t0, n)
    }

    /// The columns of that tile that some row of `i0..i1` sees.
    #[inline]
    pub(crate) fn rows_in_tile(&self, i0: usize, i1: usize, t0: usize, n: usize) -> Range<usize> {
        clip(self.rows(i0, i1), t0, n)
    }
}

/// `r` as offsets into the tile `t0..t0 + n` (an empty range when they do not meet).
#[inline]
fn clip(r: Range<usize>, t0: usize, n: usize) -> Range<usize> {
    let start = r.start.saturating_sub(t0).min(n);
    let end = r.end.saturating_sub(t0).min(n);
    start..end.max(start)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mask(start_pos: usize, q_len: usize, causal: bool, window: usize) -> Mask {
        let shape = Shape {
            batch: 1,
            q_len,
            heads: 1,
            kv_heads: 1,
            head_dim: 1,
            kv_capacity: start_pos + q_len,
            start_pos,
        };
        Mask::new(&shape, causal, NonZeroUsize::new(window))
    }

    /// The window keeps the last `w` positions up to the row's own, as llama.cpp's
    /// `is_masked_swa` (masked when `p1 - p0 >= w`) does, checked position by position.
    #[test]
    fn window_is_llamacpp_standard_swa() {
        for w in 1..12 {
            let m = mask(5, 6, true, w);
            for i in 0..6 {
                let p1 = 5 + i;
                let r = m.row(i);
                for p0 in 0..11 {
                    let seen = p0 <= p1 && p1 - p0 < w;
                    assert_eq!(r.contains(&p0), seen, "w {w} row {i} key {p0}");
                }
            }
        }
    }

    #[test]
    fn tiles_and_spans() {
        let m = mask(10, 4, true, 3); // rows at 10..14 see 8..=10, 9..=11, 10..=12, 11..=13
        assert_eq!(m.span(4), 8..14);
        assert_eq!(m.in_tile(0, 8, 4), 0..3);
        assert_eq!(m.in_tile(3, 8, 4), 3..4);
        assert_eq!(m.in_tile(3, 0, 8), 8..8);
        assert_eq!(m.rows_in_tile(1, 3, 12, 2), 0..1);
        let full = mask(10, 4, false, 0);
        assert_eq!(full.row(0), 0..14);
        assert_eq!(full.in_tile(2, 12, 16), 0..2);
    }
}
