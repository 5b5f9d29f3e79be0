//! The one error type of the crate.

use std::fmt;
use std::path::PathBuf;

use caching_allocator::AllocError;

/// Why loading a checkpoint, building a model or running it failed.
///
/// Every variant about a checkpoint names the file, and the tensor when there is one.
#[derive(Debug)]
#[non_exhaustive]
pub enum LlmError {
    /// Reading a file failed.
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// `config.json` (or the shard index) is not valid JSON, lacks a field or has a bad value.
    Config {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The model directory holds neither `model.safetensors` nor `model.safetensors.index.json`.
    NoWeights {
        /// The directory.
        dir: PathBuf,
    },
    /// A safetensors file is shorter than its header says (or too short for a header).
    Truncated {
        /// The file.
        path: PathBuf,
        /// The tensor whose data runs past the end, if the header itself was whole.
        tensor: Option<String>,
        /// Bytes needed.
        needed: u64,
        /// Bytes in the file.
        len: u64,
    },
    /// A safetensors header is malformed.
    BadHeader {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A tensor the architecture needs is not in the checkpoint.
    MissingTensor {
        /// The tensor's HF name.
        tensor: String,
        /// Where it was looked for (the directory, or the shard the index names).
        path: PathBuf,
    },
    /// A tensor has a dtype this crate does not run (only F32, BF16 and F16 are supported).
    UnsupportedDtype {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// The dtype as the header spells it.
        dtype: String,
    },
    /// A tensor's shape is not the one the configuration implies.
    WrongShape {
        /// The file.
        path: PathBuf,
        /// The tensor.
        tensor: String,
        /// Shape expected from `config.json`.
        expected: Vec<usize>,
        /// Shape in the file.
        actual: Vec<usize>,
    },
    /// `config.json` contradicts the weights (for example more layers in the weights than in the
    /// config, or a vocabulary size different from the embedding's).
    ConfigMismatch {
        /// The file holding the contradicting tensor.
        path: PathBuf,
        /// What contradicts what.
        message: String,
    },
    /// The configuration asks for something this crate does not implement.
    Unsupported {
        /// What.
        message: String,
    },
    /// The prompt (plus the tokens already in the KV cache) does not fit the context.
    ContextOverflow {
        /// Positions already used.
        used: usize,
        /// Tokens asked to add.
        requested: usize,
        /// The context (KV cache) capacity.
        capacity: usize,
    },
    /// A token id is not below the vocabulary size.
    BadToken {
        /// The id.
        token: u32,
        /// The vocabulary size.
        vocab: usize,
    },
    /// The temp allocator refused a kernel's scratch.
    Scratch {
        /// The kernel.
        kernel: &'static str,
        /// Why.
        source: AllocError,
    },
    /// The attention kernel refused its inputs (a bug in this crate if it ever happens).
    Attention(sdpa::SdpaError),
    /// The tokenizer failed to load or to encode/decode.
    Tokenizer {
        /// What failed.
        message: String,
    },
    /// A GGUF file is malformed, truncated, holds a type this crate does not run, or its
    /// metadata contradicts its tensors.
    Gguf {
        /// The file.
        path: PathBuf,
        /// The tensor concerned, if any.
        tensor: Option<String>,
        /// What is wrong (and what to do).
        message: String,
    },
    /// Bad arguments to a library call.
    InvalidArgument {
        /// What is wrong.
        message: String,
    },
}

impl fmt::Display for LlmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LlmError::Io { path, source } => write!(f, "{}: {source}", path.display()),
            LlmError::Config { path, message } => write!(f, "{}: {message}", path.display()),
            LlmError::NoWeights { dir } => write!(
                f,
                "{}: no model.safetensors and no model.safetensors.index.json",
                dir.display()
            ),
            LlmError::Truncated {
                path,
                tensor,
                needed,
                len,
            } => match tensor {
                Some(t) => write!(
                    f,
                    "{}: truncated: tensor `{t}` needs bytes up to {needed} but the file has {len}",
                    path.display()
                ),
                None => write!(
                    f,
                    "{}: truncated: the safetensors header needs {needed} bytes but the file has {len}",
                    path.display()
                ),
            },
            LlmError::BadHeader { path, message } => {
                write!(f, "{}: bad safetensors header: {message}", path.display())
            }
            LlmError::MissingTensor { tensor, path } => {
                write!(f, "{}: missing tensor `{tensor}`", path.display())
            }
            LlmError::UnsupportedDtype {
                path,
                tensor,
                dtype,
            } => write!(
                f,
                "{}: tensor `{tensor}` has dtype {dtype}; supported: F32, BF16, F16",
                path.display()
            ),
            LlmError::WrongShape {
                path,
                tensor,
                expected,
                actual,
            } => write!(
                f,
                "{}: tensor `{tensor}` has shape {actual:?} but config.json implies {expected:?}",
                path.display()
            ),
            LlmError::ConfigMismatch { path, message } => {
                write!(
                    f,
                    "{}: config.json contradicts the weights: {message}",
                    path.display()
                )
            }
            LlmError::Unsupported { message } => write!(f, "unsupported: {message}"),
            LlmError::ContextOverflow {
                used,
                requested,
                capacity,
            } => write!(
                f,
                "{requested} tokens after {used} already in the context exceed its capacity of \
                 {capacity} positions (a prompt longer than the context?)"
            ),
            LlmError::BadToken { token, vocab } => {
                write!(f, "token id {token} is not below the vocabulary size {vocab}")
            }
            LlmError::Scratch { kernel, source } => {
                write!(f, "kernel `{kernel}`: temp allocator refused scratch: {source}")
            }
            LlmError::Attention(e) => write!(f, "attention: {e}"),
            LlmError::Tokenizer { message } => write!(f, "tokenizer: {message}"),
            LlmError::Gguf {
                path,
                tensor,
                message,
            } => match tensor {
                Some(t) => write!(f, "{}: GGUF tensor `{t}`: {message}", path.display()),
                None => write!(f, "{}: GGUF: {message}", path.display()),
            },
            LlmError::InvalidArgument { message } => write!(f, "invalid argument: {message}"),
        }
    }
}

impl std::error::Error for LlmError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LlmError::Io { source, .. } => Some(source),
            LlmError::Scratch { source, .. } => Some(source),
            LlmError::Attention(e) => Some(e),
            _ => None,
        }
    }
}

impl From<sdpa::SdpaError> for LlmError {
    fn from(e: sdpa::SdpaError) -> Self {
        match e {
            sdpa::SdpaError::Scratch(source) => LlmError::Scratch {
                kernel: "attention",
                source,
            },
            e => LlmError::Attention(e),
        }
    }
}

/// The crate's result type.
pub type Result<T, E = LlmError> = std::result::Result<T, E>;
