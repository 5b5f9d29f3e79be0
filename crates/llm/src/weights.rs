//! The weights of a Llama-family model under HF names, checked against the configuration:
//! from a checkpoint directory, or random (seeded) for benchmarks.

use std::path::{Path, PathBuf};

use rayon::prelude::*;

use crate::config::LlamaConfig;
use crate::error::{LlmError, Result};
use crate::matrix::Matrix;
use crate::safetensors::{f32_to_bf16, f32_to_f16, Backing, Checkpoint, DType, Tensor};

/// One decoder layer's weights.
#[derive(Debug)]
pub struct LayerWeights {
    /// `input_layernorm.weight`, widened.
    pub input_norm: Vec<f32>,
    /// `self_attn.q_proj.weight`, `[heads * head_dim, hidden]`.
    pub q: Matrix,
    /// `self_attn.k_proj.weight`, `[kv_heads * head_dim, hidden]`.
    pub k: Matrix,
    /// `self_attn.v_proj.weight`, `[kv_heads * head_dim, hidden]`.
    pub v: Matrix,
    /// `self_attn.o_proj.weight`, `[hidden, heads * head_dim]`.
    pub o: Matrix,
    /// q/k/v biases (Qwen2, `attention_bias`).
    pub q_bias: Option<Vec<f32>>,
    /// See `q_bias`.
    pub k_bias: Option<Vec<f32>>,
    /// See `q_bias`.
    pub v_bias: Option<Vec<f32>>,
    /// o bias (`attention_bias` on Llama).
    pub o_bias: Option<Vec<f32>>,
    /// `post_attention_layernorm.weight`, widened.
    pub post_norm: Vec<f32>,
    /// `mlp.gate_proj.weight`, `[ffn, hidden]`.
    pub gate: Matrix,
    /// `mlp.up_proj.weight`, `[ffn, hidden]`.
    pub up: Matrix,
    /// `mlp.down_proj.weight`, `[hidden, ffn]`.
    pub down: Matrix,
    /// Gemma 3's RMSNorm over each query head before RoPE (`attn_q_norm`, `[head_dim]`).
    pub q_norm: Option<Vec<f32>>,
    /// Gemma 3's RMSNorm over each key head before RoPE (`attn_k_norm`, `[head_dim]`).
    pub k_norm: Option<Vec<f32>>,
    /// Gemma 3's norm of the attention output before the residual add
    /// (`post_attention_norm`, `[hidden]`).
    pub attn_out_norm: Option<Vec<f32>>,
    /// Gemma 3's norm of the MLP output before the residual add (`post_ffw_norm`,
    /// `[hidden]`).
    pub mlp_out_norm: Option<Vec<f32>>,
}

/// All weights of a model, shapes checked against its [`LlamaConfig`].
#[derive(Debug)]
pub struct Weights {
    /// The architecture.
    pub config: LlamaConfig,
    /// `model.embed_tokens.weight`, `[vocab, hidden]`.
    pub embed: Matrix,
    /// The decoder layers.
    pub layers: Vec<LayerWeights>,
    /// `model.norm.weight`, widened.
    pub norm: Vec<f32>,
    /// `lm_head.weight`, or the embedding when tied.
    pub head: Matrix,
}

impl Weights {
    /// Loads `dir/config.json` and the safetensors weights of `dir`.
    pub fn load_dir(dir: &Path) -> Result<Weights> {
        let config = LlamaConfig::from_file(&dir.join("config.json"))?;
        let ckpt = Checkpoint::open(dir)?;
        Self::from_checkpoint(config, &ckpt)
    }

    /// Takes every tensor the configuration needs from `ckpt`, checking names, dtypes and
    /// shapes, and that the checkpoint has no layer beyond `num_hidden_layers`.
    pub fn from_checkpoint(config: LlamaConfig, ckpt: &Checkpoint) -> Result<Weights> {
        let c = &config;
        let h = c.hidden_size;
        let qd = c.num_heads * c.head_dim;
        let kvd = c.num_kv_heads * c.head_dim;
        let get = |name: &str, shape: &[usize]| -> Result<Tensor> {
            let t = ckpt.require(name)?;
            if t.shape() != shape {
                return Err(LlmError::WrongShape {
                    path: t.path().into(),
                    tensor: name.into(),
                    expected: shape.to_vec(),
                    actual: t.shape().to_vec(),
                });
            }
            Ok(t)
        };
        // The embedding first: its shape is where a config/weights contradiction shows.
        let embed = ckpt.require("model.embed_tokens.weight")?;
        if embed.shape() != [c.vocab_size, h] {
            return Err(LlmError::ConfigMismatch {
                path: embed.path().into(),
                message: format!(
                    "vocab_size {} and hidden_size {h} imply model.embed_tokens.weight [{}, {h}], \
                     but it is {:?}",
                    c.vocab_size,
                    c.vocab_size,
                    embed.shape()
                ),
            });
        }
        let extra = format!("model.layers.{}.", c.num_layers);
        if let Some(name) = ckpt.names().find(|n| n.starts_with(&extra)) {
            return Err(LlmError::ConfigMismatch {
                path: ckpt.path_of(name),
                message: format!(
                    "num_hidden_layers is {} but the weights have `{name}`",
                    c.num_layers
                ),
            });
        }
        // Nine tensors a layer: a layer count the checkpoint cannot fill is refused before
        // anything is sized by it.
        let tensors = ckpt.names().count();
        if c.num_layers > tensors / 9 {
            return Err(LlmError::ConfigMismatch {
                path: embed.path().into(),
                message: format!(
                    "num_hidden_layers is {} but the weights have {tensors} tensors, room for at \
                     most {} layers of 9",
                    c.num_layers,
                    tensors / 9
                ),
            });
        }
        let vec = |name: &str, n: usize| get(name, &[n]).map(|t| t.to_f32());
        let opt_vec = |name: &str, n: usize, want: bool| -> Result<Option<Vec<f32>>> {
            if want {
                vec(name, n).map(Some)
            } else {
                Ok(None)
            }
        };
        let mut layers = Vec::with_capacity(c.num_layers);
        for i in 0..c.num_layers {
            let p = format!("model.layers.{i}.");
            let n = |s: &str| format!("{p}{s}");
            layers.push(LayerWeights {
                input_norm: vec(&n("input_layernorm.weight"), h)?,
                q: get(&n("self_attn.q_proj.weight"), &[qd, h])?.into(),
                k: get(&n("self_attn.k_proj.weight"), &[kvd, h])?.into(),
                v: get(&n("self_attn.v_proj.weight"), &[kvd, h])?.into(),
                o: get(&n("self_attn.o_proj.weight"), &[h, qd])?.into(),
                q_bias: opt_vec(&n("self_attn.q_proj.bias"), qd, c.qkv_bias)?,
                k_bias: opt_vec(&n("self_attn.k_proj.bias"), kvd, c.qkv_bias)?,
                v_bias: opt_vec(&n("self_attn.v_proj.bias"), kvd, c.qkv_bias)?,
                o_bias: opt_vec(&n("self_attn.o_proj.bias"), h, c.o_bias)?,
                post_norm: vec(&n("post_attention_layernorm.weight"), h)?,
                gate: get(&n("mlp.gate_proj.weight"), &[c.intermediate_size, h])?.into(),
                up: get(&n("mlp.up_proj.weight"), &[c.intermediate_size, h])?.into(),
                down: get(&n("mlp.down_proj.weight"), &[h, c.intermediate_size])?.into(),
                q_norm: None,
                k_norm: None,
                attn_out_norm: None,
                mlp_out_norm: None,
            });
        }
        let norm = vec("model.norm.weight", h)?;
        let embed = Matrix::from(embed);
        let head = if c.tie_word_embeddings {
            embed.clone()
        } else {
            get("lm_head.weight", &[c.vocab_size, h])?.into()
        };
        Ok(Weights {
            config,
            embed,
            layers,
            norm,
            head,
        })
    }

    /// Random weights (seeded, generated in memory, in parallel) of `dtype`: matrices uniform
    /// in `±1/sqrt(in)`, embedding uniform in `±1`, norms 1 (Gemma 3's too), biases small.
    pub fn random(config: LlamaConfig, dtype: DType, seed: u64) -> Result<Weights> {
        let c = &config;
        let h = c.hidden_size;
        let qd = c.num_heads * c.head_dim;
        let kvd = c.num_kv_heads * c.head_dim;
        let mut next = 0u64;
        let mut mat = |rows: usize, cols: usize, scale: f32| -> Result<Matrix> {
            next += 1;
            random_tensor(
                dtype,
                &[rows, cols],
                scale,
                seed ^ next.wrapping_mul(0x9e37_79b9),
            )
            .map(Matrix::from)
        };
        let embed = mat(c.vocab_size, h, 1.0)?;
        let mut layers = Vec::with_capacity(c.num_layers);
        let inv = |n: usize| 1.0 / (n as f32).sqrt();
        // Gemma 3's extra norms, all 1, when the architecture has them.
        let gemma = matches!(c.arch, crate::arch::Architecture::Gemma3(_));
        let ones = |n: usize| gemma.then(|| vec![1.0f32; n]);
        for _ in 0..c.num_layers {
            let bias = |n: usize, on: bool| on.then(|| vec![0.01f32; n]);
            layers.push(LayerWeights {
                input_norm: vec![1.0; h],
                q: mat(qd, h, inv(h))?,
                k: mat(kvd, h, inv(h))?,
                v: mat(kvd, h, inv(h))?,
                o: mat(h, qd, inv(qd))?,
                q_bias: bias(qd, c.qkv_bias),
                k_bias: bias(kvd, c.qkv_bias),
                v_bias: bias(kvd, c.qkv_bias),
                o_bias: bias(h, c.o_bias),
                post_norm: vec![1.0; h],
                gate: mat(c.intermediate_size, h, inv(h))?,
                up: mat(c.intermediate_size, h, inv(h))?,
                down: mat(h, c.intermediate_size, inv(c.intermediate_size))?,
                q_norm: ones(c.head_dim),
                k_norm: ones(c.head_dim),
                attn_out_norm: ones(h),
                mlp_out_norm: ones(h),
            });
        }
        let head = if c.tie_word_embeddings {
            embed.clone()
        } else {
            mat(c.vocab_size, h, inv(h))?
        };
        Ok(Weights {
            config,
            embed,
            layers,
            norm: vec![1.0; h],
            head,
        })
    }

    /// Bytes of the matrices a decode step reads (every layer's seven, and the head).
    pub fn decode_weight_bytes(&self) -> usize {
        let mut b = self.head.bytes().len();
        for l in &self.layers {
            for t in [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down] {
                b += t.bytes().len();
            }
        }
        b
    }

    /// Where the weights came from (the first layer's q file), for messages.
    pub fn origin(&self) -> PathBuf {
        self.embed.path().into()
    }
}

/// A tensor of uniform random values in `±scale`, generated in parallel from `seed`.
pub fn random_tensor(dtype: DType, shape: &[usize], scale: f32, seed: u64) -> Result<Tensor> {
    let numel: usize = shape.iter().product();
    let mut backing = Backing::zeroed(numel * dtype.size());
    let bytes = backing
        .bytes_mut()
        .ok_or_else(|| LlmError::InvalidArgument {
            message: "random tensor backing is not owned".into(),
        })?;
    const CHUNK: usize = 1 << 16;
    let es = dtype.size();
    bytes
        .par_chunks_mut(CHUNK * es)
        .enumerate()
        .for_each(|(ci, chunk)| {
            let mut rng =
                crate::sample::Rng::new(seed ^ (ci as u64).wrapping_mul(0xa076_1d64_78bd_642f));
            for e in chunk.chunks_exact_mut(es) {
                let v = (rng.next_f32() * 2.0 - 1.0) * scale;
                match dtype {
                    DType::F32 => e.copy_from_slice(&v.to_le_bytes()),
                    DType::BF16 => e.copy_from_slice(&f32_to_bf16(v).to_le_bytes()),
                    DType::F16 => e.copy_from_slice(&f32_to_f16(v).to_le_bytes()),
                }
            }
        });
    Tensor::from_backing(dtype, shape, backing, "<random>")
}
