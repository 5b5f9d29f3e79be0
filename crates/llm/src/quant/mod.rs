//! Block-quantized weights: ggml's block formats ([`mod@format`]), a matrix of them
//! ([`QTensor`]), the decode kernels' layout of its rows ([`groups`]), the decode kernels
//! over that layout ([`group_matvec`]) and prefill's widening of whole blocks ([`widen`]).

pub mod format;
pub mod group_matvec;
pub mod groups;
mod tensor;
pub mod widen;

pub use format::{QType, QK};
pub use tensor::QTensor;
