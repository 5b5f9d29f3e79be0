//! `llm`: a Llama-family text generator on the CPU whose every kernel takes its scratch
//! memory from a [`caching_allocator::TempAllocator`], the way ExecuTorch's runtime does.
//!
//! # Architecture
//! - [`LlamaConfig`] reads `config.json` (Llama 3.x, SmolLM2, Qwen2-style: optional q/k/v
//!   bias, tied or separate head, `rope_theta`, Llama 3 `rope_scaling`).
//! - [`safetensors::Checkpoint`] maps `model.safetensors` or the shards of
//!   `model.safetensors.index.json`; [`Weights`] takes every tensor under its HF name and
//!   checks dtype (f32, bf16, f16) and shape, with errors naming file and tensor.
//! - [`gguf::GgufFile`] maps a GGUF file (v2/v3); [`gguf::load_weights`] takes a llama
//!   model's tensors from it (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K,
//!   Q6_K), restoring HF's Q/K row order;
//!   [`gguf_tokenizer::from_gguf`] builds its tokenizer and [`chat`] renders its chat
//!   template (both with the feature `text`, on by default; a client that runs on token ids
//!   can turn it off and build without `tokenizers` and `minijinja`). [`Weights::load`] takes
//!   a `.gguf` file or a checkpoint directory.
//! - Weight matrices are [`matrix::Matrix`]es, dense or block-quantized ([`quant`]: the
//!   formats, their layout for the kernels and the kernels), run as [`matrix::Linear`]
//!   layers whose row kernel each matrix picks; every kernel's result is written over or
//!   added to its output ([`output::Output`]); activations stay f32.
//! - [`Llama`] (alias of [`model::Model`]) is the module: `Llama::new(weights, temp,
//!   &options)` ([`Module`], the one constructor shape of every model type) owns the temp
//!   allocator, the KV cache and the activation buffers. Each forward pass is a sequence of
//!   kernel calls (embed, RMSNorm, linear, RoPE, attention through [`sdpa::attention`],
//!   gating, logits) run by [`runtime::Runtime`], which hands each kernel a
//!   [`runtime::Scratch`] over the temp allocator and resets the allocator after the call.
//!   What a decoder layer does is its architecture's: one module each in [`arch`] (the Llama
//!   family, Gemma 3 from `gemma3` GGUF files) over the shared blocks.
//! - [`generate()`] prefills, then decodes with a [`Sampler`] (greedy, temperature, top-p,
//!   seeded) until a stop token or the token limit.
//!
//! After the first decode step a step makes no heap allocation outside the temp allocator
//! (activations and KV cache are allocated up front; sampling sorts in scratch), provided the
//! model is driven from inside the rayon pool (`rayon::scope` / `ThreadPool::install`):
//! rayon's injector, used when parallel work starts from outside the pool, allocates a queue
//! block every 63 injections.
//!
//! # Example
//! ```
//! use std::sync::Arc;
//! use llm::{caching_temp, shapes, Llama, Module, ModelOptions, Sampler, Weights};
//! use llm::safetensors::DType;
//!
//! let mut config = shapes::named("smollm2-135m").unwrap();
//! config.num_layers = 1; // keep the doc-test small
//! config.vocab_size = 256;
//! let weights = Arc::new(Weights::random(config, DType::BF16, 7)?);
//! let temp = caching_temp(llm::DEFAULT_TEMP_CAP);
//! let mut model = Llama::new(weights, temp, &ModelOptions { context: Some(64), ..Default::default() })?;
//! let logits = model.forward(&[1, 2, 3])?;
//! assert_eq!(logits.len(), 256);
//! let next = model.sample(&mut Sampler::greedy())?;
//! assert!(next < 256);
//! # Ok::<(), llm::LlmError>(())
//! ```

pub mod arch;
pub mod bandwidth;
#[cfg(feature = "text")]
pub mod chat;
pub mod config;
pub mod error;
pub mod generate;
pub mod gguf;
#[cfg(feature = "text")]
pub mod gguf_tokenizer;
pub mod kernels;
mod load;
pub mod matrix;
pub mod model;
pub mod output;
pub mod quant;
pub mod runtime;
pub mod safetensors;
pub mod sample;
pub mod scratch_profile;
pub mod shapes;
#[cfg(feature = "text")]
pub mod tokenizer;
pub mod weights;

pub use config::LlamaConfig;
pub use error::{LlmError, Result};
pub use generate::{generate, GenerateOptions, GenerationStats, StopReason};
pub use model::{caching_temp, Llama, ModelOptions, Module, DEFAULT_TEMP_CAP};
pub use runtime::{Activations, TempRef, TempUsage};
pub use sample::Sampler;
pub use weights::Weights;
