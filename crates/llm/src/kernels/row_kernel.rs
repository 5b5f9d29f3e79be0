//! How a weight matrix's rows are read ([`Kernel`]): the row kernel its kind picks, once per
//! matrix (f32, bf16 or f16 rows widened in registers, or groups of quantized rows), and the
//! rows it widens for the prefill matmul.

use std::ops::Range;

use kernel_simd::Level;

use crate::kernels::row_jobs;
use crate::kernels::simd::{self as dense, Rows};
use crate::quant::groups::GROUP;
use crate::quant::QTensor;

/// How a matrix's rows are read: the choice of row kernel, made once per matrix.
#[derive(Clone, Copy)]
pub(crate) enum Kernel<'w> {
    /// f32, bf16 or f16 rows, widened in registers.
    Dense(Rows<'w>),
    /// Quantized rows, in groups of 16 ([`crate::quant::groups`]), dequantized in registers.
    Quant(&'w QTensor),
}

impl Kernel<'_> {
    /// Elements of the matrix.
    pub(crate) fn len(self) -> usize {
        match self {
            Kernel::Dense(Rows::F32(d)) => d.len(),
            Kernel::Dense(Rows::Bf16(d) | Rows::F16(d)) => d.len(),
            Kernel::Quant(q) => q.rows() * q.cols(),
        }
    }

    /// Whether [`Kernel::f32_rows`] widens into its buffer (so the prefill matmul takes a
    /// scratch block per task) rather than borrowing f32 weights.
    pub(crate) fn widens(self) -> bool {
        !matches!(self, Kernel::Dense(Rows::F32(_)))
    }

    /// Rows `rows` (`k` floats each) as f32: borrowed from f32 weights, or widened (exactly
    /// dequantized) into `buf`, which holds `rows.len() * k` floats when
    /// [`Kernel::widens`].
    pub(crate) fn f32_rows<'b>(
        self,
        level: Level,
        rows: Range<usize>,
        k: usize,
        buf: &'b mut [f32],
    ) -> &'b [f32]
    where
        Self: 'b,
    {
        let span = rows.start * k..rows.end * k;
        if let Kernel::Dense(Rows::F32(d)) = self {
            return &d[span];
        }
        let buf = &mut buf[..rows.len() * k];
        match self {
            Kernel::Dense(Rows::Bf16(d)) => dense::widen::run(level, &d[span], true, buf),
            Kernel::Dense(Rows::F16(d)) => dense::widen::run(level, &d[span], false, buf),
            Kernel::Dense(Rows::F32(_)) => {}
            Kernel::Quant(q) => q.dequantize_rows(level, rows.start, rows.len(), buf),
        }
        buf
    }

    /// Whether the rows are bf16 (whose kernels read `x`'s pair blocks).
    pub(crate) fn bf16(self) -> bool {
        matches!(self, Kernel::Dense(Rows::Bf16(_)))
    }

    /// Rows per parallel task of a decode kernel over `n` rows: whole groups for quantized
    /// rows.
    pub(crate) fn chunk(self, n: usize) -> usize {
        match self {
            Kernel::Dense(_) => row_jobs::chunk(n, 8, 4),
            Kernel::Quant(_) => row_jobs::chunk(n, 4, GROUP),
        }
    }
}
