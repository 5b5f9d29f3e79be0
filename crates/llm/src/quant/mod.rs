//! Block-quantized weights: ggml's block formats ([`mod@format`], one file each in
//! `formats/`), a matrix of them ([`QTensor`]), held in groups of 16 interleaved rows
//! ([`groups`]) of blocks of 32 of the group formats ([`group_format`]: the file's blocks,
//! or the K-quants' sub-blocks repacked with f32 scales), and their kernels: decode in
//! [`group_matvec`], prefill's widening in [`widen`].

pub mod format;
mod formats;
pub mod group_format;
pub mod group_matvec;
pub mod groups;
mod tensor;
pub mod widen;

pub use format::{QType, QK, QK_K};
pub use tensor::QTensor;
