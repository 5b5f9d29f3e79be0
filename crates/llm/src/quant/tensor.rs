//! A block-quantized matrix (rows of blocks in one of the formats of
//! [`crate::quant::format`], HF `[out, in]` orientation), held in the kernels' group layout.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{LlmError, Result};
use crate::quant::format::{QType, QK};
use crate::quant::groups::RowGroups;
use crate::safetensors::Backing;

/// A block-quantized matrix `[rows, cols]` (`cols` a multiple of [`QK`]): `rows` rows of
/// `cols / 32` blocks, held only in the kernels' group layout ([`RowGroups`], packed when
/// the matrix is made). Every reader (decode, prefill, embedding) reads that copy, so the
/// file's bytes are not needed after packing: a mapped file's pages are given back then.
#[derive(Clone)]
pub struct QTensor {
    qtype: QType,
    rows: usize,
    cols: usize,
    path: Arc<PathBuf>,
    groups: RowGroups,
}

impl std::fmt::Debug for QTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QTensor")
            .field("qtype", &self.qtype)
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .field("path", &self.path)
            .finish()
    }
}

impl QTensor {
    /// The `rows * row_bytes(cols)` bytes at `offset` of `backing` (the callers check they
    /// are inside it), packed; a mapping's pages of them are then given back to the system
    /// (`Backing::release`).
    pub(crate) fn from_shared(
        qtype: QType,
        rows: usize,
        cols: usize,
        backing: &Arc<Backing>,
        offset: usize,
        path: &Arc<PathBuf>,
    ) -> QTensor {
        let len = rows * qtype.row_bytes(cols);
        let groups = RowGroups::pack(qtype, rows, cols, &backing.bytes()[offset..offset + len]);
        backing.release(offset, len);
        QTensor {
            qtype,
            rows,
            cols,
            path: path.clone(),
            groups,
        }
    }

    /// A matrix over owned bytes (copied), e.g. written by a test or re-ordered at load.
    ///
    /// # Errors
    /// [`LlmError::InvalidArgument`] when `cols` is not a multiple of 32 or `bytes` is not
    /// `rows` rows of `cols / 32` blocks.
    pub fn from_bytes(qtype: QType, rows: usize, cols: usize, bytes: &[u8]) -> Result<QTensor> {
        if !cols.is_multiple_of(QK) || rows.checked_mul(qtype.row_bytes(cols)) != Some(bytes.len())
        {
            return Err(LlmError::InvalidArgument {
                message: format!(
                    "{} bytes for a {} matrix [{rows}, {cols}] (columns must be a multiple of 32)",
                    bytes.len(),
                    qtype.name()
                ),
            });
        }
        Ok(QTensor {
            qtype,
            rows,
            cols,
            path: Arc::new(PathBuf::from("<memory>")),
            groups: RowGroups::pack(qtype, rows, cols, bytes),
        })
    }

    /// The same matrix with its rows reordered: row `r` of the result is row `order[r]` of
    /// `self` (the path is kept for messages).
    ///
    /// # Errors
    /// [`LlmError::InvalidArgument`] when `order` is not `rows` row indices of `self`.
    pub(crate) fn permute_rows(&self, order: &[usize]) -> Result<QTensor> {
        if order.len() != self.rows || order.iter().any(|&r| r >= self.rows) {
            return Err(LlmError::InvalidArgument {
                message: format!(
                    "a row order of {} rows for a matrix of {} rows",
                    order.len(),
                    self.rows
                ),
            });
        }
        Ok(QTensor {
            groups: self.groups.permute_rows(self.qtype, self.rows, order),
            ..self.clone()
        })
    }

    /// The format.
    pub fn qtype(&self) -> QType {
        self.qtype
    }

    /// Rows (outputs).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns (inputs), a multiple of 32.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.qtype.row_bytes(self.cols)
    }

    /// Row `r` (below [`QTensor::rows`]) dequantized into `out` (`cols` floats), exactly as
    /// the format defines.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        self.groups.dequantize_row(self.qtype, r, out);
    }

    /// The file the matrix comes from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The blocks in the decode kernels' group layout.
    pub fn groups(&self) -> &RowGroups {
        &self.groups
    }

    /// Every weight dequantized, row-major (for tests and references).
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        for (r, o) in out.chunks_exact_mut(self.cols.max(1)).enumerate() {
            self.dequantize_row(r, o);
        }
        out
    }
}
