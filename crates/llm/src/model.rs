//! The model: built from weights and a temp allocator; holds its KV cache and activation
//! buffers (the "planned memory"), and runs every kernel through the runtime. What a decoder
//! layer does is its architecture's ([`crate::arch`]), over the shared blocks (`model/blocks.rs`).

use std::sync::Arc;

use caching_allocator::{CachingAllocator, Config, TempReset, DEFAULT_WORKING_SET_SLACK};

use crate::arch::{self, Layer, RopeTables};
use crate::error::{LlmError, Result};
use crate::kernels::norm_gate;
use crate::matrix::Linear;
use crate::output::Output;
use crate::runtime::{Activations, Runtime, TempUsage};
use crate::sample::Sampler;
use crate::weights::Weights;
use crate::LlamaConfig;
use blocks::{Cache, RmsNorm, Step};

pub(crate) mod blocks;

/// The default temp-allocator cap: ExecuTorch's LLM runner uses `1024 * 1024 * 10`.
pub const DEFAULT_TEMP_CAP: usize = 10 << 20;

/// The runner's default temp allocator: a [`CachingAllocator`] keeping at most `cap` idle
/// bytes (use [`DEFAULT_TEMP_CAP`] for ExecuTorch's 10 MiB).
pub fn caching_temp(cap: usize) -> CachingAllocator {
    CachingAllocator::with_config(
        Config::default()
            .max_cached_bytes(cap)
            // Reset after every kernel, a few blocks live together, shapes that grow with the
            // context: hold the working set, not one block per class.
            .working_set_slack(Some(DEFAULT_WORKING_SET_SLACK)),
    )
}

/// Options of a module.
#[derive(Clone, Debug, Default)]
pub struct ModelOptions {
    /// KV-cache positions (the context); `None`: `min(max_position_embeddings, 4096)`.
    pub context: Option<usize>,
    /// What the 4-bit decode matvecs multiply: f32 (exact, the default) or int8 (opt-in,
    /// inexact; see [`Activations`]).
    pub activations: Activations,
}

/// The constructor shape every model type shares (ExecuTorch's uniform `Module` constructors):
/// weights plus the temp allocator the kernels take their scratch from.
pub trait Module<A: TempReset>: Sized {
    /// The weights this module type runs.
    type Weights;

    /// Builds the module. Allocates the KV cache; activations are allocated at the first
    /// forward pass (and grow only for a longer prefill).
    fn new(weights: Arc<Self::Weights>, temp: A, options: &ModelOptions) -> Result<Self>;
}

/// Activation buffers, sized for `rows` positions at a time; the layers of every
/// architecture work in them.
#[derive(Default)]
pub(crate) struct Buffers {
    rows: usize,
    logit_rows: usize,
    /// The residual stream, `[rows, hidden]`.
    pub x: Vec<f32>,
    /// A block's normed input, `[rows, hidden]`.
    pub xn: Vec<f32>,
    /// Queries, `[rows, heads * head_dim]`.
    pub q: Vec<f32>,
    /// Attention output, the same shape.
    pub attn: Vec<f32>,
    /// The MLP's gate (then gated) projection, `[rows, ffn]`.
    pub gate: Vec<f32>,
    /// The MLP's up projection, `[rows, ffn]`.
    pub up: Vec<f32>,
    /// A block's output before its post-norm, `[rows, hidden]` (empty without post-norms).
    pub proj: Vec<f32>,
    logits: Vec<f32>,
}

/// A decoder-only model of any architecture of [`crate::arch`] (the Llama family, Gemma 3)
/// with its KV cache.
pub struct Model<A> {
    w: Arc<Weights>,
    rt: Runtime<A>,
    rope: RopeTables,
    k_cache: Vec<Vec<f32>>,
    v_cache: Vec<Vec<f32>>,
    capacity: usize,
    pos: usize,
    bufs: Buffers,
    /// Rows of logits the last forward produced.
    last_logit_rows: usize,
}

/// The model under its first architecture's name (the Llama family), kept for its users:
/// it runs every architecture.
pub type Llama<A> = Model<A>;

impl<A: TempReset> Module<A> for Model<A> {
    type Weights = Weights;

    fn new(weights: Arc<Weights>, temp: A, options: &ModelOptions) -> Result<Self> {
        let c = &weights.config;
        let capacity = options
            .context
            .unwrap_or(c.max_position_embeddings.min(4096));
        if capacity == 0 {
            return Err(LlmError::InvalidArgument {
                message: "context of 0 positions".into(),
            });
        }
        let kv = capacity
            .checked_mul(c.num_kv_heads * c.head_dim)
            .ok_or_else(|| LlmError::InvalidArgument {
                message: format!("context {capacity} too large"),
            })?;
        Ok(Model {
            rope: RopeTables::of(c),
            k_cache: (0..c.num_layers).map(|_| vec![0.0; kv]).collect(),
            v_cache: (0..c.num_layers).map(|_| vec![0.0; kv]).collect(),
            capacity,
            pos: 0,
            bufs: Buffers::default(),
            last_logit_rows: 0,
            rt: {
                let mut rt = Runtime::new(temp);
                rt.set_activations(options.activations);
                rt
            },
            w: weights,
        })
    }
}

impl<A: TempReset> Model<A> {
    /// The architecture.
    pub fn config(&self) -> &LlamaConfig {
        &self.w.config
    }

    /// The weights.
    pub fn weights(&self) -> &Arc<Weights> {
        &self.w
    }

    /// The temp allocator.
    pub fn temp(&self) -> &A {
        self.rt.temp()
    }

    /// Starts recording the kernels' scratch per phase and kernel name (see
    /// [`crate::scratch_profile`]).
    pub fn enable_scratch_profile(&mut self) {
        self.rt.enable_profile();
    }

    /// The scratch profile, when enabled.
    pub fn scratch_profile(&self) -> Option<&crate::scratch_profile::ScratchProfile> {
        self.rt.profile()
    }

    /// What the kernels asked of the temp allocator so far.
    pub fn temp_usage(&self) -> TempUsage {
        self.rt.usage()
    }

    /// Positions in the KV cache.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// KV-cache capacity (the context).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Forgets the sequence: the next forward starts at position 0.
    pub fn clear(&mut self) {
        self.pos = 0;
        self.last_logit_rows = 0;
    }

    /// Grows the activation buffers for `rows` positions (no-op once large enough).
    fn ensure(&mut self, rows: usize, logit_rows: usize) {
        let c = &self.w.config;
        let b = &mut self.bufs;
        if b.rows < rows {
            let h = c.hidden_size;
            b.x.resize(rows * h, 0.0);
            b.xn.resize(rows * h, 0.0);
            b.q.resize(rows * c.num_heads * c.head_dim, 0.0);
            b.attn.resize(rows * c.num_heads * c.head_dim, 0.0);
            b.gate.resize(rows * c.intermediate_size, 0.0);
            b.up.resize(rows * c.intermediate_size, 0.0);
            if c.arch.has_post_norms() {
                b.proj.resize(rows * h, 0.0);
            }
            b.rows = rows;
        }
        if b.logit_rows < logit_rows {
            b.logits.resize(logit_rows * c.vocab_size, 0.0);
            b.logit_rows = logit_rows;
        }
    }

    /// Appends `tokens` to the sequence and returns the logits of the last one (`vocab`).
    pub fn forward(&mut self, tokens: &[u32]) -> Result<&[f32]> {
        self.run(tokens, false)?;
        Ok(&self.bufs.logits[..self.w.config.vocab_size])
    }

    /// Appends `tokens` and returns the logits of every one (`tokens.len() * vocab`).
    pub fn forward_all(&mut self, tokens: &[u32]) -> Result<&[f32]> {
        self.run(tokens, true)?;
        Ok(&self.bufs.logits[..tokens.len() * self.w.config.vocab_size])
    }

    /// Chooses the next token from the last forward's last logits (a kernel call named
    /// [`Sampler::kernel_name`]: the probabilities and top-p's sort take their scratch from
    /// the temp allocator).
    pub fn sample(&mut self, sampler: &mut Sampler) -> Result<u32> {
        if self.last_logit_rows == 0 {
            return Err(LlmError::InvalidArgument {
                message: "sample before any forward pass".into(),
            });
        }
        let v = self.w.config.vocab_size;
        let logits = &self.bufs.logits[(self.last_logit_rows - 1) * v..][..v];
        self.rt
            .run(sampler.kernel_name(), |s| sampler.sample(s, logits))
    }

    /// One forward pass over `tokens` appended at the current position: the embedding (scaled
    /// when the architecture says so), each decoder layer as its architecture runs it
    /// ([`arch::forward_layer`]), the final norm and the head over the last row (every row
    /// with `all_logits`).
    fn run(&mut self, tokens: &[u32], all_logits: bool) -> Result<()> {
        let m = tokens.len();
        if m == 0 {
            return Err(LlmError::InvalidArgument {
                message: "forward of no tokens".into(),
            });
        }
        if self.pos + m > self.capacity {
            return Err(LlmError::ContextOverflow {
                used: self.pos,
                requested: m,
                capacity: self.capacity,
            });
        }
        let vocab = self.w.config.vocab_size;
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(LlmError::BadToken { token: t, vocab });
        }
        let logit_rows = if all_logits { m } else { 1 };
        self.ensure(m, logit_rows);
        let w = self.w.clone();
        let c = &w.config;
        let h = c.hidden_size;
        let step = Step {
            start: self.pos,
            rows: m,
        };
        self.rt.set_phase(if m == 1 { "decode" } else { "prefill" });
        let b = &mut self.bufs;
        let rt = &mut self.rt;
        rt.run("embed", |_| w.embed.embed(tokens, &mut b.x[..m * h]))?;
        if let Some(factor) = c.arch.embed_scale(c) {
            rt.run("embed_scale", |_| {
                norm_gate::scale(&mut b.x[..m * h], factor);
                Ok(())
            })?;
        }
        for (index, weights) in w.layers.iter().enumerate() {
            let layer = Layer {
                index,
                config: c,
                weights,
                step,
            };
            let cache = Cache {
                k: &mut self.k_cache[index],
                v: &mut self.v_cache[index],
                capacity: self.capacity,
            };
            arch::forward_layer(rt, layer, b, cache, &self.rope)?;
        }
        // Final norm and head over the rows whose logits are wanted.
        let first = m - logit_rows;
        RmsNorm::new(&w.norm, c.rms_norm_eps).forward(
            rt,
            &b.x[first * h..m * h],
            logit_rows,
            &mut b.xn,
        )?;
        let head = Linear::new(&w.head, None);
        rt.run("logits", |s| {
            head.forward(s, &b.xn, logit_rows, &mut b.logits, Output::Overwrite)
        })?;
        self.pos += m;
        self.last_logit_rows = logit_rows;
        Ok(())
    }
}
