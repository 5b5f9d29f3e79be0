//! The blocks of a decoder layer, in the manner of candle-transformers' `models/llama.rs`:
//! [`Attention`], [`Mlp`] and [`RmsNorm`] over [`Linear`] layers (weights and the kernel that
//! runs them), each with a `forward` over one [`Step`] of positions. Every kernel call goes
//! through the [`Runtime`], so each takes its scratch from the temp allocator and is reset
//! after it.

use caching_allocator::TempReset;

use crate::error::{LlmError, Result};
use crate::kernels::{self, Heads};
use crate::matrix::{Job, Linear};
use crate::output::Output;
use crate::runtime::Runtime;
use crate::weights::LayerWeights;
use crate::LlamaConfig;

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

    /// A pre-norm block's input: `xn = rmsnorm(stream)` over `rows` rows, handed back with
    /// the residual stream the block adds to.
    pub fn pre_norm<'b, A: TempReset>(
        &self,
        rt: &mut Runtime<A>,
        stream: &'b mut [f32],
        rows: usize,
        xn: &'b mut [f32],
    ) -> Result<Residual<'b>> {
        self.forward(rt, stream, rows, xn)?;
        Ok(Residual { xn, stream })
    }
}

/// One layer's KV cache and the rotary table the attention block reads.
pub(crate) struct Cache<'c> {
    /// K rows, `[capacity, kv_heads * head_dim]`.
    pub k: &'c mut [f32],
    /// V rows, the same shape.
    pub v: &'c mut [f32],
    /// Positions the cache holds.
    pub capacity: usize,
    /// RoPE inverse frequencies, `head_dim / 2`.
    pub inv_freq: &'c [f64],
}

/// Self-attention: q/k/v projections, RoPE, SDPA over the KV cache, output projection.
pub(crate) struct Attention<'w> {
    q: Linear<'w>,
    k: Linear<'w>,
    v: Linear<'w>,
    o: Linear<'w>,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

/// What a block reads and where it adds its output: the pre-norm and the residual stream.
pub(crate) struct Residual<'b> {
    /// The normed input, `[rows, hidden]`.
    pub xn: &'b [f32],
    /// The residual stream the block's last projection adds to, `[rows, hidden]`.
    pub stream: &'b mut [f32],
}

/// The attention block's own activation buffers.
pub(crate) struct AttentionBuffers<'b> {
    /// Queries, `[rows, heads * head_dim]`.
    pub q: &'b mut [f32],
    /// SDPA's output, the same shape.
    pub attn: &'b mut [f32],
}

impl<'w> Attention<'w> {
    /// Layer `lw`'s attention under `c`.
    pub fn new(c: &LlamaConfig, lw: &'w LayerWeights) -> Self {
        Attention {
            q: Linear::new(&lw.q, lw.q_bias.as_deref()),
            k: Linear::new(&lw.k, lw.k_bias.as_deref()),
            v: Linear::new(&lw.v, lw.v_bias.as_deref()),
            o: Linear::new(&lw.o, lw.o_bias.as_deref()),
            heads: c.num_heads,
            kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
        }
    }

    /// Appends `step`'s K/V rows to `cache` and adds the attention output to the residual.
    pub fn forward<A: TempReset>(
        &self,
        rt: &mut Runtime<A>,
        step: Step,
        io: Residual<'_>,
        b: AttentionBuffers<'_>,
        cache: Cache<'_>,
    ) -> Result<()> {
        let (m, start) = (step.rows, step.start);
        let (qd, kvd) = (self.heads * self.head_dim, self.kv_heads * self.head_dim);
        let kv_rows = start * kvd..(start + m) * kvd;
        let xn = io.xn;
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
        rt.run("rope", |s| {
            let q = Heads {
                data: b.q,
                heads: self.heads,
            };
            let k = Heads {
                data: &mut cache.k[kv_rows.clone()],
                heads: self.kv_heads,
            };
            kernels::rope(s, cache.inv_freq, start..start + m, q, k)
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
                &sdpa::Params::default(),
                &s.allocator(),
            )
            .map_err(LlmError::from)
        })?;
        rt.run("linear", |s| {
            self.o.forward(s, b.attn, m, io.stream, Output::AddTo)
        })
    }
}

/// The SwiGLU MLP: `down(silu(gate(x)) * up(x))`.
pub(crate) struct Mlp<'w> {
    gate: Linear<'w>,
    up: Linear<'w>,
    down: Linear<'w>,
}

/// The MLP block's own activation buffers.
pub(crate) struct MlpBuffers<'b> {
    /// `[rows, ffn]`: the gate projection, then the SwiGLU product.
    pub gate: &'b mut [f32],
    /// `[rows, ffn]`: the up projection (prefill only).
    pub up: &'b mut [f32],
}

impl<'w> Mlp<'w> {
    /// Layer `lw`'s MLP under `c`.
    pub fn new(lw: &'w LayerWeights) -> Self {
        Mlp {
            gate: Linear::new(&lw.gate, None),
            up: Linear::new(&lw.up, None),
            down: Linear::new(&lw.down, None),
        }
    }

    /// Adds the MLP's output for `step`'s rows to the residual.
    pub fn forward<A: TempReset>(
        &self,
        rt: &mut Runtime<A>,
        step: Step,
        io: Residual<'_>,
        b: MlpBuffers<'_>,
    ) -> Result<()> {
        let (m, xn) = (step.rows, io.xn);
        let ffn = self.gate.out_features();
        match step.is_decode() {
            true => {
                // Gate, up and SwiGLU in one parallel section.
                rt.run("linear_swiglu", |s| {
                    Linear::forward_swiglu(s, xn, &self.gate, &self.up, &mut b.gate[..ffn])
                })?;
            }
            false => {
                rt.run("linear", |s| {
                    self.gate.forward(s, xn, m, b.gate, Output::Overwrite)
                })?;
                rt.run("linear", |s| {
                    self.up.forward(s, xn, m, b.up, Output::Overwrite)
                })?;
                rt.run("swiglu", |_| {
                    kernels::swiglu(&mut b.gate[..m * ffn], &b.up[..m * ffn]);
                    Ok(())
                })?;
            }
        }
        rt.run("linear", |s| {
            self.down.forward(s, b.gate, m, io.stream, Output::AddTo)
        })
    }
}
