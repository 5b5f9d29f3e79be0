//! Block-quantized weights: ggml's block formats ([`mod@format`], one file each in
//! `formats/`), a matrix of them ([`QTensor`]) held in one of two layouts ([`Layout`]), and
//! the decode kernels of each: Q4_0, Q4_1, Q8_0, and Q5_0, Q4_K and Q6_K transcoded at load
//! into blocks of 32 of the group formats ([`group_format`]), in groups of 16 interleaved
//! rows ([`groups`], their kernels in [`group_matvec`], prefill's widening in [`widen`]);
//! the other formats (Q5_1, Q5_K) row by row ([`row_matvec`]).

pub mod format;
mod formats;
pub mod group_format;
pub mod group_matvec;
pub mod groups;
pub mod row_matvec;
mod tensor;
pub mod widen;

pub use format::{QType, QK, QK_K};
pub use tensor::{Layout, QTensor};
