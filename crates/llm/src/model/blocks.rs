//! The blocks of a decoder layer, in the manner of candle-transformers' `models/llama.rs`: a
//! [`Linear`] layer (weights and the kernel that runs them), [`Attention`], [`Mlp`] and
//! [`RmsNorm`], each with a `forward` over one [`Step`] of positions. Every kernel call goes
//! through the [`Runtime`], so each takes its scratch from the temp allocator and is reset
//! after it.

use caching_allocator::{TempAllocator, TempReset};

use crate::error::{LlmError, Result};
use crate::kernels;
use crate::matrix::{self, Matrix};
use crate::runtime::{Runtime, Scratch};
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

/// How a layer's result meets its output buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Output {
    /// `out = result`.
    Overwrite,
    /// `out += result` (a residual add fused into the kernel).
    AddTo,
}

/// A linear layer `out = x W^T + bias` over `[rows, in_features]` activations. Its weights
/// are a [`Matrix`]: dense (f32, bf16 or f16 rows, widened by the kernels) or quantized blocks
/// (Q4_0, Q4_1, Q8_0, dequantized in registers); [`matrix`] picks the kernel for each.
#[derive(Clone, Copy)]
pub(crate) struct Linear<'w> {
    weight: &'w Matrix,
    bias: Option<&'w [f32]>,
    out_features: usize,
    in_features: usize,
}

impl<'w> Linear<'w> {
    /// A layer over `w` (`[out_features, in_features]`, checked by the kernels).
    pub fn new(
        w: &'w Matrix,
        bias: Option<&'w [f32]>,
        out_features: usize,
        in_features: usize,
    ) -> Self {
        Linear {
            weight: w,
            bias,
            out_features,
            in_features,
        }
    }

    /// `out (+)= x W^T + bias` over `rows` rows of `x`.
    pub fn forward<A: TempAllocator + ?Sized>(
        &self,
        s: &Scratch<'_, A>,
        x: &[f32],
        rows: usize,
        out: &mut [f32],
        output: Output,
    ) -> Result<()> {
        matrix::linear(
            s,
            x,
            rows,
            self.weight,
            self.out_features,
            self.in_features,
            self.bias,
            out,
            output == Output::AddTo,
        )
    }

    /// This layer as one job of a fused decode matvec ([`matrix::linear_many`]).
    fn job<'a>(&self, out: &'a mut [f32]) -> matrix::Job<'a>
    where
        'w: 'a,
    {
        matrix::Job {
            w: self.weight,
            n: self.out_features,
            bias: self.bias,
            out: &mut out[..self.out_features],
            accumulate: false,
        }
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

/// The attention block's activation buffers.
pub(crate) struct AttentionBuffers<'b> {
    /// The normed input, `[rows, hidden]`.
    pub xn: &'b [f32],
    /// Queries, `[rows, heads * head_dim]`.
    pub q: &'b mut [f32],
    /// SDPA's output, the same shape.
    pub attn: &'b mut [f32],
    /// The residual stream the output projection adds to, `[rows, hidden]`.
    pub residual: &'b mut [f32],
}

impl<'w> Attention<'w> {
    /// Layer `lw`'s attention under `c`.
    pub fn new(c: &LlamaConfig, lw: &'w LayerWeights) -> Self {
        let (h, qd, kvd) = (
            c.hidden_size,
            c.num_heads * c.head_dim,
            c.num_kv_heads * c.head_dim,
        );
        Attention {
            q: Linear::new(&lw.q, lw.q_bias.as_deref(), qd, h),
            k: Linear::new(&lw.k, lw.k_bias.as_deref(), kvd, h),
            v: Linear::new(&lw.v, lw.v_bias.as_deref(), kvd, h),
            o: Linear::new(&lw.o, lw.o_bias.as_deref(), h, qd),
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
        b: AttentionBuffers<'_>,
        cache: Cache<'_>,
    ) -> Result<()> {
        let (m, start) = (step.rows, step.start);
        let (qd, kvd) = (self.heads * self.head_dim, self.kv_heads * self.head_dim);
        let kv_rows = start * kvd..(start + m) * kvd;
        let hidden = self.q.in_features;
        if step.is_decode() {
            // q, k and v in one parallel section.
            rt.run("linear_qkv", |s| {
                matrix::linear_many(
                    s,
                    b.xn,
                    hidden,
                    [
                        self.q.job(&mut b.q[..qd]),
                        self.k.job(&mut cache.k[kv_rows.clone()]),
                        self.v.job(&mut cache.v[kv_rows.clone()]),
                    ],
                )
            })?;
        } else {
            rt.run("linear", |s| {
                self.q.forward(s, b.xn, m, b.q, Output::Overwrite)
            })?;
            rt.run("linear", |s| {
                let out = &mut cache.k[kv_rows.clone()];
                self.k.forward(s, b.xn, m, out, Output::Overwrite)
            })?;
            rt.run("linear", |s| {
                let out = &mut cache.v[kv_rows.clone()];
                self.v.forward(s, b.xn, m, out, Output::Overwrite)
            })?;
        }
        rt.run("rope", |s| {
            kernels::rope(
                s,
                b.q,
                self.heads,
                &mut cache.k[kv_rows.clone()],
                self.kv_heads,
                self.head_dim,
                m,
                start,
                cache.inv_freq,
            )
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
            self.o.forward(s, b.attn, m, b.residual, Output::AddTo)
        })
    }
}

/// The SwiGLU MLP: `down(silu(gate(x)) * up(x))`.
pub(crate) struct Mlp<'w> {
    gate: Linear<'w>,
    up: Linear<'w>,
    down: Linear<'w>,
}

/// The MLP block's activation buffers.
pub(crate) struct MlpBuffers<'b> {
    /// The normed input, `[rows, hidden]`.
    pub xn: &'b [f32],
    /// `[rows, ffn]`: the gate projection, then the SwiGLU product.
    pub gate: &'b mut [f32],
    /// `[rows, ffn]`: the up projection (prefill only).
    pub up: &'b mut [f32],
    /// The residual stream the down projection adds to, `[rows, hidden]`.
    pub residual: &'b mut [f32],
}

impl<'w> Mlp<'w> {
    /// Layer `lw`'s MLP under `c`.
    pub fn new(c: &LlamaConfig, lw: &'w LayerWeights) -> Self {
        let (h, ffn) = (c.hidden_size, c.intermediate_size);
        Mlp {
            gate: Linear::new(&lw.gate, None, ffn, h),
            up: Linear::new(&lw.up, None, ffn, h),
            down: Linear::new(&lw.down, None, h, ffn),
        }
    }

    /// Adds the MLP's output for `step`'s rows to the residual.
    pub fn forward<A: TempReset>(
        &self,
        rt: &mut Runtime<A>,
        step: Step,
        b: MlpBuffers<'_>,
    ) -> Result<()> {
        let m = step.rows;
        let (h, ffn) = (self.gate.in_features, self.gate.out_features);
        match step.is_decode() {
            true => {
                // Gate, up and SwiGLU in one parallel section.
                rt.run("linear_swiglu", |s| {
                    let (gate, up) = (self.gate.weight, self.up.weight);
                    matrix::linear_swiglu(s, b.xn, h, gate, up, ffn, &mut b.gate[..ffn])
                })?;
            }
            false => {
                rt.run("linear", |s| {
                    self.gate.forward(s, b.xn, m, b.gate, Output::Overwrite)
                })?;
                rt.run("linear", |s| {
                    self.up.forward(s, b.xn, m, b.up, Output::Overwrite)
                })?;
                rt.run("swiglu", |_| {
                    kernels::swiglu(&mut b.gate[..m * ffn], &b.up[..m * ffn]);
                    Ok(())
                })?;
            }
        }
        rt.run("linear", |s| {
            self.down.forward(s, b.gate, m, b.residual, Output::AddTo)
        })
    }
}
