//! The Llama family's decoder layer (Llama 3.x, SmolLM2, Qwen2-style): pre-norm attention and
//! SwiGLU MLP, each adding its output projection to the residual stream.
//!
//! `x += o(attention(rope(q(n1(x))), rope(k(n1(x))), v(n1(x))))`, then
//! `x += down(silu(gate(n2(x))) * up(n2(x)))`, with `n1` = `input_layernorm` (GGUF
//! `attn_norm`) and `n2` = `post_attention_layernorm` (GGUF `ffn_norm`). Its GGUF metadata
//! (`llama.*`) and tensor names are read by [`crate::gguf::GgufFile::llama_config`] and
//! [`crate::gguf::weights_from`]; its `config.json` by [`crate::LlamaConfig`].

use caching_allocator::TempReset;

use super::Layer;
use crate::error::Result;
use crate::model::blocks::{
    Activation, Attention, AttentionBuffers, Cache, Mlp, MlpBuffers, RmsNorm, Sink,
};
use crate::model::Buffers;
use crate::runtime::Runtime;

/// Runs one layer over `layer.step`'s rows of the residual stream `b.x`.
pub(crate) fn forward<A: TempReset>(
    rt: &mut Runtime<A>,
    layer: Layer<'_>,
    b: &mut Buffers,
    cache: Cache<'_>,
    inv_freq: &[f64],
) -> Result<()> {
    let Layer {
        config: c,
        weights: lw,
        step,
        ..
    } = layer;
    let m = step.rows;
    let norm = |weight| RmsNorm::new(weight, c.rms_norm_eps);
    norm(&lw.input_norm).forward(rt, &b.x, m, &mut b.xn)?;
    Attention::new(c, lw, inv_freq).forward(
        rt,
        step,
        &b.xn,
        AttentionBuffers {
            q: &mut b.q,
            attn: &mut b.attn,
        },
        cache,
        Sink::Residual(&mut b.x),
    )?;
    norm(&lw.post_norm).forward(rt, &b.x, m, &mut b.xn)?;
    let bufs = MlpBuffers {
        gate: &mut b.gate,
        up: &mut b.up,
    };
    Mlp::new(lw, Activation::Silu).forward(rt, step, &b.xn, bufs, Sink::Residual(&mut b.x))
}
