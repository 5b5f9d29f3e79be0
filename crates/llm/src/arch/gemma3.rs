//! Gemma 3 (`general.architecture = gemma3`): its decoder layer over the shared blocks, and
//! its hyperparameters and tensors from GGUF.
//!
//! One layer, as llama.cpp's `gemma3` graph and the reference implementation run it:
//! - `a = o(attention(rope(qn(q(n1(x)))), rope(kn(k(n1(x)))), v(n1(x))))`, `x += pa(a)`;
//! - `f = down(gelu_tanh(gate(n2(x))) * up(n2(x)))`, `x += pf(f)`;
//!
//! with RMSNorms `n1` = `attn_norm`, `qn`/`kn` = `attn_q_norm`/`attn_k_norm` (over each
//! head's `head_dim`), `pa` = `post_attention_norm`, `n2` = `ffn_norm`, `pf` =
//! `post_ffw_norm`. The embedding rows are multiplied by `sqrt(hidden)`; the head is the
//! embedding (tied, no `output.weight`); the final norm is `output_norm`. There is no logit
//! softcapping in Gemma 3.
//!
//! **Norm weights.** Gemma's RMSNorm multiplies by `1 + w`; llama.cpp's converter
//! (`convert_hf_to_gguf.py`, `Gemma3Model.norm_shift = 1.0`) adds the 1 to every
//! `*norm.weight` when it writes the GGUF, so the weights in the file are used as they are.
//!
//! **From the metadata** (`gemma3.*`): `block_count`, `embedding_length`,
//! `feed_forward_length`, `attention.head_count`, `attention.head_count_kv`,
//! `attention.key_length` (= `value_length`: the head dimension, 256 for 270M, not
//! `hidden / heads`), `rope.freq_base` (the global layers' RoPE base, 1e6),
//! `attention.sliding_window` (512), `attention.layer_norm_rms_epsilon` (1e-6),
//! `context_length`.
//!
//! **From the architecture's definition** (not in the metadata; llama.cpp's
//! `llama-model.cpp` sets them for `LLM_ARCH_GEMMA3`, as Gemma 3's `config.json`
//! `sliding_window_pattern` and `rope_local_base_freq` do):
//! - the layer pattern: every 6th layer (indices 5, 11, 17, ...) is global, the others local
//!   (llama.cpp's `set_swa_pattern(6)`; HF's `layer_types`);
//! - the local layers' RoPE base, 10,000 (`rope_freq_base_train_swa`);
//! - the attention scale `1 / sqrt(query_pre_attn_scalar)`, `query_pre_attn_scalar` = the
//!   head dimension (llama.cpp's `f_attention_scale`; `hidden / heads` for the 62-layer 27B
//!   model only).
//!
//! A local layer's query at position `p` sees the keys at `p - window + 1 ..= p` (llama.cpp's
//! standard sliding window, `sdpa::Params::with_window`); a global layer sees `0 ..= p`.
//! q and k rows are used in the file's order: the converter does not permute them for
//! Gemma (its RoPE is the NeoX, rotate-half, one this crate runs).

use caching_allocator::TempReset;

use super::{Architecture, Layer, RopeTables};
use crate::config::LlamaConfig;
use crate::error::{LlmError, Result};
use crate::gguf::{GgufFile, HeadShape, Value};
use crate::model::blocks::{
    Activation, Attention, AttentionBuffers, Cache, Mlp, MlpBuffers, RmsNorm, Sink,
};
use crate::model::Buffers;
use crate::runtime::Runtime;
use crate::weights::{LayerWeights, Weights};

/// Every this-many-th layer is global (Gemma 3's definition; not in the metadata).
pub const GLOBAL_EVERY: usize = 6;

/// The local layers' RoPE base (Gemma 3's definition; not in the metadata).
pub const ROPE_LOCAL_THETA: f64 = 10_000.0;

/// What Gemma 3 adds to the Llama configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Gemma3 {
    /// `attention.sliding_window`: the positions a local layer's query sees, itself included.
    pub sliding_window: usize,
    /// Layer `i` is global when `(i + 1)` is a multiple of this ([`GLOBAL_EVERY`]).
    pub global_every: usize,
    /// The local layers' RoPE base ([`ROPE_LOCAL_THETA`]).
    pub rope_local_theta: f64,
    /// Queries are scaled by `1 / sqrt(query_pre_attn_scalar)`.
    pub query_pre_attn_scalar: f64,
}

impl Gemma3 {
    /// Whether layer `index` attends over the sliding window (with the local RoPE base).
    pub fn is_local(&self, index: usize) -> bool {
        !(index + 1).is_multiple_of(self.global_every)
    }

    /// The attention's scale.
    pub fn attention_scale(&self) -> f32 {
        (1.0 / self.query_pre_attn_scalar.sqrt()) as f32
    }
}

/// The embedding scale, `sqrt(hidden)` (in f32, as llama.cpp's `ggml_scale` takes it).
pub fn embed_scale(c: &LlamaConfig) -> f32 {
    (c.hidden_size as f32).sqrt()
}

/// A layer norm Gemma 3 needs that [`LayerWeights`] holds as optional.
fn required<'w>(v: &'w Option<Vec<f32>>, layer: usize, what: &str) -> Result<&'w [f32]> {
    v.as_deref().ok_or_else(|| LlmError::InvalidArgument {
        message: format!(
            "gemma3 layer {layer} has no {what} weight (load the model with its GGUF)"
        ),
    })
}

/// Runs one layer over `layer.step`'s rows of the residual stream `b.x`.
pub(crate) fn forward<A: TempReset>(
    rt: &mut Runtime<A>,
    g: &Gemma3,
    layer: Layer<'_>,
    b: &mut Buffers,
    cache: Cache<'_>,
    rope: &RopeTables,
) -> Result<()> {
    let Layer {
        index,
        config: c,
        weights: lw,
        step,
    } = layer;
    let m = step.rows;
    let norm = |weight| RmsNorm::new(weight, c.rms_norm_eps);
    let local = g.is_local(index);
    let inv_freq = if local { &rope.local } else { &rope.global };
    let q_norm = norm(required(&lw.q_norm, index, "attn_q_norm")?);
    let k_norm = norm(required(&lw.k_norm, index, "attn_k_norm")?);
    let attn_out_norm = norm(required(&lw.attn_out_norm, index, "post_attention_norm")?);
    let mlp_out_norm = norm(required(&lw.mlp_out_norm, index, "post_ffw_norm")?);

    norm(&lw.input_norm).forward(rt, &b.x, m, &mut b.xn)?;
    let attention = Attention::new(c, lw, inv_freq)
        .with_qk_norm(q_norm, k_norm)
        .with_scale(g.attention_scale())
        .with_window(local.then_some(g.sliding_window));
    let bufs = AttentionBuffers {
        q: &mut b.q,
        attn: &mut b.attn,
    };
    let sink = Sink::PostNorm {
        out: &mut b.proj,
        norm: attn_out_norm,
        stream: &mut b.x,
    };
    attention.forward(rt, step, &b.xn, bufs, cache, sink)?;

    norm(&lw.post_norm).forward(rt, &b.x, m, &mut b.xn)?;
    let bufs = MlpBuffers {
        gate: &mut b.gate,
        up: &mut b.up,
    };
    let sink = Sink::PostNorm {
        out: &mut b.proj,
        norm: mlp_out_norm,
        stream: &mut b.x,
    };
    Mlp::new(lw, Activation::GeluTanh).forward(rt, step, &b.xn, bufs, sink)
}

/// The hyperparameters of a `gemma3` GGUF file (see the module docs for which come from the
/// metadata and which from the architecture's definition).
pub fn config_from_gguf(f: &GgufFile) -> Result<LlamaConfig> {
    let key = |k: &str| format!("gemma3.{k}");
    let need = |k: &str| f.meta_required("gemma3", k);
    let HeadShape {
        hidden,
        heads,
        kv_heads,
        head_dim,
    } = f.head_shape("gemma3")?;
    for k in ["attention.value_length", "rope.dimension_count"] {
        if let Some(d) = f.meta_usize(&key(k))? {
            if d != head_dim {
                return Err(f.meta_err(format!(
                    "gemma3.{k} {d} differs from the head dimension {head_dim} \
                     (gemma3.attention.key_length): not supported"
                )));
            }
        }
    }
    for k in [
        "rope.scaling.type",
        "rope.scaling.factor",
        "final_logit_softcapping",
        "attn_logit_softcapping",
    ] {
        if let Some(v) = f.get(&key(k)) {
            let harmless = match k {
                "rope.scaling.type" => v.as_str() == Some("none"),
                "rope.scaling.factor" => v.as_f64() == Some(1.0),
                _ => false,
            };
            if !harmless {
                return Err(f.meta_err(format!(
                    "metadata `gemma3.{k}` = {v:?} is not supported (Gemma 3 270M and 1B have \
                     neither RoPE scaling nor softcapping)"
                )));
            }
        }
    }
    let sliding_window = need("attention.sliding_window")?;
    let rope_theta = f.meta_f64(&key("rope.freq_base"))?.unwrap_or(10_000.0);
    if !(rope_theta.is_finite() && rope_theta > 0.0) {
        return Err(f.meta_err(format!(
            "gemma3.rope.freq_base {rope_theta} is not positive"
        )));
    }
    let eps = f
        .meta_f64(&key("attention.layer_norm_rms_epsilon"))?
        .unwrap_or(1e-6);
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(f.meta_err(format!("rms epsilon {eps} is not a non-negative number")));
    }
    let num_layers = need("block_count")?;
    let vocab = f
        .meta_usize(&key("vocab_size"))?
        .or_else(|| {
            f.get("tokenizer.ggml.tokens")
                .and_then(Value::as_array)
                .map(<[Value]>::len)
        })
        .or_else(|| f.tensor_shape("token_embd.weight").map(|s| s[0]))
        .ok_or_else(|| f.meta_err("no gemma3.vocab_size and no token list".into()))?;
    let id = |k: &str| -> Result<Option<u32>> {
        Ok(f.meta_usize(&format!("tokenizer.ggml.{k}"))?
            .map(|v| v as u32))
    };
    // llama.cpp's `f_attention_scale`: the head dimension, but hidden / heads for the 27B
    // model (62 layers), whose `query_pre_attn_scalar` differs from its head dimension.
    let query_pre_attn_scalar = if num_layers == 62 {
        (hidden / heads) as f64
    } else {
        head_dim as f64
    };
    let config = LlamaConfig {
        model_type: "gemma3".into(),
        arch: Architecture::Gemma3(Gemma3 {
            sliding_window,
            global_every: GLOBAL_EVERY,
            rope_local_theta: ROPE_LOCAL_THETA,
            query_pre_attn_scalar,
        }),
        hidden_size: hidden,
        intermediate_size: need("feed_forward_length")?,
        num_layers,
        num_heads: heads,
        num_kv_heads: kv_heads,
        head_dim,
        vocab_size: vocab,
        rms_norm_eps: eps as f32,
        rope_theta,
        rope_scaling: None,
        max_position_embeddings: f
            .meta_usize(&key("context_length"))?
            .unwrap_or(131_072)
            .max(1),
        tie_word_embeddings: f.tensor_shape("output.weight").is_none(),
        qkv_bias: false,
        o_bias: false,
        bos_token_id: id("bos_token_id")?,
        eos_token_ids: id("eos_token_id")?.into_iter().collect(),
    };
    config
        .check_sizes()
        .map_err(|m| f.meta_err(format!("the gemma3.* metadata: {m}")))?;
    Ok(config)
}

/// Tensors of one gemma3 block: six norms, four attention and three MLP matrices.
const TENSORS_PER_BLOCK: usize = 13;

/// The weights of a `gemma3` GGUF file under llama.cpp's names, shapes checked against the
/// metadata; the head is the embedding unless the file has `output.weight`.
pub fn weights_from_gguf(f: &GgufFile) -> Result<Weights> {
    let c = config_from_gguf(f)?;
    let (h, hd) = (c.hidden_size, c.head_dim);
    let (qd, kvd, ffn) = (c.num_heads * hd, c.num_kv_heads * hd, c.intermediate_size);
    f.check_block_count("gemma3.block_count", c.num_layers, TENSORS_PER_BLOCK)?;
    let embed = f.require_matrix("token_embd.weight", &[c.vocab_size, h])?;
    let mut layers = Vec::with_capacity(c.num_layers);
    for i in 0..c.num_layers {
        let n = |s: &str| format!("blk.{i}.{s}");
        let mat = |s: &str, shape: &[usize]| f.require_matrix(&n(s), shape);
        let vec = |s: &str, len: usize| f.require_vector(&n(s), len);
        layers.push(LayerWeights {
            input_norm: vec("attn_norm.weight", h)?,
            q: mat("attn_q.weight", &[qd, h])?,
            k: mat("attn_k.weight", &[kvd, h])?,
            v: mat("attn_v.weight", &[kvd, h])?,
            o: mat("attn_output.weight", &[h, qd])?,
            q_bias: None,
            k_bias: None,
            v_bias: None,
            o_bias: None,
            post_norm: vec("ffn_norm.weight", h)?,
            gate: mat("ffn_gate.weight", &[ffn, h])?,
            up: mat("ffn_up.weight", &[ffn, h])?,
            down: mat("ffn_down.weight", &[h, ffn])?,
            q_norm: Some(vec("attn_q_norm.weight", hd)?),
            k_norm: Some(vec("attn_k_norm.weight", hd)?),
            attn_out_norm: Some(vec("post_attention_norm.weight", h)?),
            mlp_out_norm: Some(vec("post_ffw_norm.weight", h)?),
        });
    }
    let norm = f.require_vector("output_norm.weight", h)?;
    let head = if c.tie_word_embeddings {
        embed.clone()
    } else {
        f.require_matrix("output.weight", &[c.vocab_size, h])?
    };
    Ok(Weights {
        config: c,
        embed,
        layers,
        norm,
        head,
    })
}
