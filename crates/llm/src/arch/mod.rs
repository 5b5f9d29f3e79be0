//! The architectures, one module each over the shared blocks of [`crate::model`]
//! (RMSNorm, linear layers, attention through `sdpa` with the temp allocator, a gated MLP,
//! RoPE): [`llama`] (Llama 3.x, SmolLM2, Qwen2-style) and [`gemma3`]. Each module says what
//! one decoder layer does with those blocks (its `forward`) and what the model adds around
//! the layers (the embedding scale, the RoPE tables); [`Architecture`] names which one a
//! configuration is, and `forward_layer` runs layer `i` of it.
//!
//! Adding an architecture is adding its module here (its layer `forward`, and its GGUF
//! metadata and tensor names when it comes from GGUF, as [`gemma3`] does) and a variant of
//! [`Architecture`].

use caching_allocator::TempReset;

use crate::config::LlamaConfig;
use crate::error::Result;
use crate::model::blocks::{Cache, Step};
use crate::model::Buffers;
use crate::runtime::Runtime;
use crate::weights::LayerWeights;

pub mod gemma3;
pub mod llama;

pub use gemma3::Gemma3;

/// Which architecture a configuration describes, with what it adds to the Llama block.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Architecture {
    /// The Llama family: pre-norm blocks, SwiGLU, one RoPE base (the default).
    #[default]
    Llama,
    /// Gemma 3: q/k norms, post-norms, GELU (tanh) gating, scaled embeddings, sliding-window
    /// (local) layers with their own RoPE base between global ones.
    Gemma3(Gemma3),
}

impl Architecture {
    /// The name `general.architecture` gives it.
    pub fn name(&self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Gemma3(_) => "gemma3",
        }
    }

    /// What the embedding rows are multiplied by (`None`: used as they are).
    pub fn embed_scale(&self, c: &LlamaConfig) -> Option<f32> {
        match self {
            Architecture::Llama => None,
            Architecture::Gemma3(_) => Some(gemma3::embed_scale(c)),
        }
    }

    /// Whether the blocks norm their outputs before the residual add (a buffer for the
    /// projection is then needed).
    pub fn has_post_norms(&self) -> bool {
        matches!(self, Architecture::Gemma3(_))
    }
}

/// The RoPE inverse-frequency tables a model's layers use: the global one (every layer of
/// a Llama) and, for architectures with local layers, theirs.
#[derive(Clone, Debug, Default)]
pub struct RopeTables {
    /// The configuration's `rope_theta` (and scaling).
    pub global: Vec<f64>,
    /// The local (sliding-window) layers' table; empty when there are none.
    pub local: Vec<f64>,
}

impl RopeTables {
    /// The tables of configuration `c`.
    pub fn of(c: &LlamaConfig) -> RopeTables {
        RopeTables {
            global: c.inv_freq(),
            local: match &c.arch {
                Architecture::Llama => Vec::new(),
                Architecture::Gemma3(g) => {
                    crate::config::rope_inv_freq(c.head_dim, g.rope_local_theta, None)
                }
            },
        }
    }
}

/// One decoder layer's inputs: its index, weights and configuration, the positions the
/// forward pass appends.
pub(crate) struct Layer<'w> {
    /// The layer's index (local or global for Gemma 3).
    pub index: usize,
    /// The model's configuration.
    pub config: &'w LlamaConfig,
    /// The layer's weights.
    pub weights: &'w LayerWeights,
    /// The positions this forward pass appends.
    pub step: Step,
}

/// Runs `layer` of its configuration's architecture: reads and updates the residual stream
/// `b.x`, appends the step's K/V rows to `cache`.
pub(crate) fn forward_layer<A: TempReset>(
    rt: &mut Runtime<A>,
    layer: Layer<'_>,
    b: &mut Buffers,
    cache: Cache<'_>,
    rope: &RopeTables,
) -> Result<()> {
    match &layer.config.arch {
        Architecture::Llama => llama::forward(rt, layer, b, cache, &rope.global),
        Architecture::Gemma3(g) => gemma3::forward(rt, g, layer, b, cache, rope),
    }
}
