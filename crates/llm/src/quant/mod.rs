//! Block-quantized weights: ggml's block formats ([`mod@format`], one file each in
//! `formats/`), a matrix of them ([`QTensor`]) held in one of two layouts ([`Layout`]), and
//! the decode kernels of each: Q4_0, Q4_1 and Q8_0 in groups of 16 interleaved rows
//! ([`groups`], their kernels in [`group_matvec`], prefill's widening in [`widen`]); the
//! other formats row by row ([`row_matvec`]).

pub mod format;
mod formats;
pub mod group_matvec;
pub mod groups;
pub mod row_matvec;
mod tensor;
pub mod widen;

pub use format::{QType, QK, QK_K};
pub use tensor::{Layout, QTensor};
