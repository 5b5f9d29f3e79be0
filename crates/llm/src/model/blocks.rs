//! The shared blocks of a decoder layer, in the manner of candle-transformers'
//! `models/llama.rs`: [`Attention`], [`Mlp`] and [`RmsNorm`] over [`Linear`] layers (weights
//! and the kernel that runs them), each with a `forward` over one [`Step`] of positions. The
//! architectures ([`crate::arch`]) put them together. Every kernel call goes through the
//! [`Runtime`], so each takes its scratch from the temp allocator and is reset after it.

use caching_allocator::TempReset;

use crate::config::LlamaConfig;
use crate::error::{LlmError, Result};
use crate::kernels::{self, norm_gate, Heads};
use crate::matrix::{Job, Linear};
use crate::output::Output;
use crate::runtime::Runtime;
use crate::weights::LayerWeights;

/// The positions a forward pass appends: `start..start + rows` of the sequence.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Step {
    /// The first new position (the tokens already in the KV cache).
    pub start: usize,
    /// New positions (1 for a decode step).
    pub rows: usize,
}

impl Step {
    /// Whether this is a one-token decode step (whose kernels fuse several matvecs into one
    /// parallel section).
    fn is_decode(self) -> bool {
        self.rows == 1
    }
}

/// RMSNorm with its weight.
#[derive(Clone, Copy)]
pub(crate) struct RmsNorm<'w> {
    weight: &'w [f32],
    eps: f32,
}

impl<'w> RmsNorm<'w> {
    /// A norm over `weight.len()` features.
    pub fn new(weight: &'w [f32], eps: f32) -> Self {
        RmsNorm { weight, eps }
    }

    /// `out = rmsnorm(x)` over `rows` rows.
    pub fn forward<A: TempReset>(
        &self,
        rt: &mut Runtime<A>,
        x: &[f32],
        rows: usize,
        out: &mut [f32],
    ) -> Result<()> {
        let dim = self.weight.len();
        rt.run("rmsnorm", |s| {
            kernels::rmsnorm(s, x, rows, dim, self.weight, self.eps, out)
        })
    }

    /// `x = rmsnorm(x)` over each `weight.len()` slice of `x` (per-head q/k norms).
    fn forward_heads<A: TempReset>(
        &self,
        rt: &mut Runtime<A>,
        x: &mut [f32],
        kernel: &'static str,
    ) -> Result<()> {
        rt.run(kernel, |s| {
            norm_gate::rmsnorm_heads(s, x, self.weight, self.eps)
        })
    }

    /// `stream += rmsnorm(x)` over `rows` rows (a post-norm before the residual add).
    fn add_to<A: TempReset>(
        &self,
        rt: &mut Runtime<A>,
        x: &[f32],
        rows: usize,
        stream: &mut [f32],
    ) -> Result<()> {
        rt.run("rmsnorm_add", |s| {
            norm_gate::rmsnorm_add(s, x, rows, self.weight, self.eps, stream)
        })
    }
}

/// Where a block's last projection goes.
pub(crate) enum Sink<'b> {
    /// Added to the residual stream `[rows, hidden]` (Llama: fused into the projection).
    Residual(&'b mut [f32]),
    /// Written to `out` `[rows, hidden]`, then `norm(out)` added to `stream` (Gemma 3's
    /// post-attention and post-feedforward norms).
    PostNorm {
        /// The projection's output.
        out: &'b mut [f32],
        /// The norm applied before the add.
        norm: RmsNorm<'b>,
        /// The residual stream.
        stream: &'b mut [f32],
    },
}

impl Sink<'_> {
    /// Runs `layer` over `rows` rows of `x` into this sink.
    fn project<A: TempReset>(
        self,
        rt: &mut Runtime<A>,
        layer: &Linear<'_>,
        x: &[f32],
        rows: usize,
    ) -> Result<()> {
        match self {
            Sink::Residual(stream) => rt.run("linear", |s| {
                layer.forward(s, x, rows, stream, Output::AddTo)
            }),
            Sink::PostNorm { out, norm, stream } => {
                let n = rows * layer.out_features();
                rt.run("linear", |s| {
                    layer.forward(s, x, rows, &mut out[..n], Output::Overwrite)
                })?;
                norm.add_to(rt, &out[..n], rows, stream)
            }
        }
    }
}

/// One layer's KV cache.
pub(crate) struct Cache<'c> {
    /// K rows, `[capacity, kv_heads * head_dim]`.
    pub k: &'c mut [f32],
    /// V rows, the same shape.
    pub v: &'c mut [f32],
    /// Positions the cache holds.
    pub capacity: usize,
}

/// Self-attention: q/k/v projections, optional per-head q/k norms, RoPE, SDPA over the KV
/// cache (optionally over a sliding window), output projection.
pub(crate) struct Attention<'w> {
    q: Linear<'w>,
    k: Linear<'w>,
    v: Linear<'w>,
    o: Linear<'w>,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    /// RoPE inverse frequencies, `head_dim / 2`.
    inv_freq: &'w [f64],
    qk_norm: Option<(RmsNorm<'w>, RmsNorm<'w>)>,
    params: sdpa::Params,
}

/// The attention block's own activation buffers.
pub(crate) struct AttentionBuffers<'b> {
    /// Queries, `[rows, heads * head_dim]`.
    pub q: &'b mut [f32],
    /// SDPA's output, the same shape.
    pub attn: &'b mut [f32],
}

impl<'w> Attention<'w> {
    /// Layer `lw`'s attention under `c`, rotating with `inv_freq`: causal, scaled by
    /// `1 / sqrt(head_dim)`, no window, no q/k norms.
    pub fn new(c: &LlamaConfig, lw: &'w LayerWeights, inv_freq: &'w [f64]) -> Self {
        Attention {
            q: Linear::new(&lw.q, lw.q_bias.as_deref()),
            k: Linear::new(&lw.k, lw.k_bias.as_deref()),
            v: Linear::new(&lw.v, lw.v_bias.as_deref()),
            o: Linear::new(&lw.o, lw.o_bias.as_deref()),
            heads: c.num_heads,
            kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            inv_freq,
            qk_norm: None,
            params: sdpa::Params::default(),
        }
    }

    /// RMSNorms over each query and key head, before RoPE.
    pub fn with_qk_norm(self, q: RmsNorm<'w>, k: RmsNorm<'w>) -> Self {
        Attention {
            qk_norm: Some((q, k)),
            ..self
        }
    }

    /// The scale of the scores.
    pub fn with_scale(mut self, scale: f32) -> Self {
        self.params.scale = Some(scale);
        self
    }

    /// A sliding window of `window` positions (the query's included), when `Some`.
    pub fn with_window(mut self, window: Option<usize>) -> Self {
        if let Some(w) = window {
            self.params = self.params.with_window(w);
        }
        self
    }

    /// Appends `step`'s K/V rows to `cache` and sends the attention output of the normed
    /// input `xn` to `sink`.
    pub fn forward<A: TempReset>(
        &self,
        rt: &mut Runtime<A>,
        step: Step,
        xn: &[f32],
        b: AttentionBuffers<'_>,
        cache: Cache<'_>,
        sink: Sink<'_>,
    ) -> Result<()> {
        let (m, start) = (step.rows, step.start);
        let (qd, kvd) = (self.heads * self.head_dim, self.kv_heads * self.head_dim);
        let kv_rows = start * kvd..(start + m) * kvd;
        let projections = [
            (&self.q, &mut b.q[..m * qd]),
            (&self.k, &mut cache.k[kv_rows.clone()]),
            (&self.v, &mut cache.v[kv_rows.clone()]),
        ];
        if step.is_decode() {
            // q, k and v in one parallel section.
            let jobs = projections.map(|(layer, out)| Job {
                layer: *layer,
                out,
                output: Output::Overwrite,
            });
            rt.run("linear_qkv", |s| Linear::forward_many(s, xn, jobs))?;
        } else {
            for (layer, out) in projections {
                rt.run("linear", |s| {
                    layer.forward(s, xn, m, out, Output::Overwrite)
                })?;
            }
        }
        if let Some((qn, kn)) = &self.qk_norm {
            qn.forward_heads(rt, &mut b.q[..m * qd], "q_norm")?;
            kn.forward_heads(rt, &mut cache.k[kv_rows.clone()], "k_norm")?;
        }
        rt.run("rope", |s| {
            let q = Heads {
                data: b.q,
                heads: self.heads,
            };
            let k = Heads {
                data: &mut cache.k[kv_rows.clone()],
                heads: self.kv_heads,
            };
            kernels::rope(s, self.inv_freq, start..start + m, q, k)
        })?;
        rt.run("attention", |s| {
            let shape = sdpa::Shape {
                batch: 1,
                q_len: m,
                heads: self.heads,
                kv_heads: self.kv_heads,
                head_dim: self.head_dim,
                kv_capacity: cache.capacity,
                start_pos: start,
            };
            sdpa::attention(
                &b.q[..m * qd],
                cache.k,
                cache.v,
                &mut b.attn[..m * qd],
                &shape,
                &self.params,
                &s.allocator(),
            )
            .map_err(LlmError::from)
        })?;
        sink.project(rt, &self.o, b.attn, m)
    }
}

/// The gating activation of a gated MLP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Activation {
    /// SwiGLU: `silu(gate) * up` (Llama).
    Silu,
    /// GELU (tanh approximation) gating: `gelu_tanh(gate) * up` (Gemma).
    GeluTanh,
}

/// A gated MLP: `down(act(gate(x)) * up(x))`.
pub(crate) struct Mlp<'w> {
    gate: Linear<'w>,
    up: Linear<'w>,
    down: Linear<'w>,
    activation: Activation,
}

/// The MLP block's own activation buffers.
pub(crate) struct MlpBuffers<'b> {
    /// `[rows, ffn]`: the gate projection, then the gated product.
    pub gate: &'b mut [f32],
    /// `[rows, ffn]`: the up projection (prefill, and decode without a fused kernel).
    pub up: &'b mut [f32],
}

impl<'w> Mlp<'w> {
    /// Layer `lw`'s MLP with `activation`.
    pub fn new(lw: &'w LayerWeights, activation: Activation) -> Self {
        Mlp {
            gate: Linear::new(&lw.gate, None),
            up: Linear::new(&lw.up, None),
            down: Linear::new(&lw.down, None),
            activation,
        }
    }

    /// The gating in place over `rows * ffn` values.
    fn gating(&self, gate: &mut [f32], up: &[f32]) {
        match self.activation {
            Activation::Silu => kernels::swiglu(gate, up),
            Activation::GeluTanh => norm_gate::geglu(gate, up),
        }
    }

    /// The gating kernel's name (for the scratch profile).
    fn gating_name(&self) -> &'static str {
        match self.activation {
            Activation::Silu => "swiglu",
            Activation::GeluTanh => "geglu",
        }
    }

    /// Sends the MLP's output for `step`'s rows of the normed input `xn` to `sink`.
    pub fn forward<A: TempReset>(
        &self,
        rt: &mut Runtime<A>,
        step: Step,
        xn: &[f32],
        b: MlpBuffers<'_>,
        sink: Sink<'_>,
    ) -> Result<()> {
        let m = step.rows;
        let n = m * self.gate.out_features();
        match (step.is_decode(), self.activation) {
            (true, Activation::Silu) => {
                // Gate, up and SwiGLU in one parallel section.
                rt.run("linear_swiglu", |s| {
                    Linear::forward_swiglu(s, xn, &self.gate, &self.up, &mut b.gate[..n])
                })?;
            }
            (true, _) => {
                // Gate and up in one parallel section, then the gating.
                let jobs = [
                    Job {
                        layer: self.gate,
                        out: &mut b.gate[..n],
                        output: Output::Overwrite,
                    },
                    Job {
                        layer: self.up,
                        out: &mut b.up[..n],
                        output: Output::Overwrite,
                    },
                ];
                rt.run("linear_gate_up", |s| Linear::forward_many(s, xn, jobs))?;
                rt.run(self.gating_name(), |_| {
                    self.gating(&mut b.gate[..n], &b.up[..n]);
                    Ok(())
                })?;
            }
            (false, _) => {
                rt.run("linear", |s| {
                    self.gate.forward(s, xn, m, b.gate, Output::Overwrite)
                })?;
                rt.run("linear", |s| {
                    self.up.forward(s, xn, m, b.up, Output::Overwrite)
                })?;
                rt.run(self.gating_name(), |_| {
                    self.gating(&mut b.gate[..n], &b.up[..n]);
                    Ok(())
                })?;
            }
        }
        sink.project(rt, &self.down, b.gate, m)
    }
}
