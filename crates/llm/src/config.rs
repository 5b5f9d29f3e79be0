//! `config.json`: the architecture of a Llama-family checkpoint (Llama 3.x, SmolLM2, Qwen2).

use std::path::Path;

use serde::Deserialize;

use crate::arch::Architecture;
use crate::error::{LlmError, Result};

/// Llama 3's `rope_scaling` (`"rope_type": "llama3"`): long wavelengths slowed by `factor`,
/// short ones kept, a smooth blend in between.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Llama3Scaling {
    /// Divisor of the low frequencies (32 for Llama 3.2).
    pub factor: f64,
    /// Wavelengths above `original_max_position_embeddings / low_freq_factor` are scaled.
    pub low_freq_factor: f64,
    /// Wavelengths below `original_max_position_embeddings / high_freq_factor` are kept.
    pub high_freq_factor: f64,
    /// The context length the model was pre-trained with (8192 for Llama 3).
    pub original_max_position_embeddings: f64,
}

/// The architecture, as read from `config.json` and checked.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// `model_type` (`llama`, `qwen2`, `gemma3`, ...), informational.
    pub model_type: String,
    /// The architecture: the Llama family, or one that adds to its block (Gemma 3).
    pub arch: Architecture,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the MLP's hidden layer.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (grouped-query attention when fewer than `num_heads`).
    pub num_kv_heads: usize,
    /// Size of one head.
    pub head_dim: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f32,
    /// RoPE base.
    pub rope_theta: f64,
    /// Llama 3 frequency scaling, if any.
    pub rope_scaling: Option<Llama3Scaling>,
    /// Longest context the model supports.
    pub max_position_embeddings: usize,
    /// Output head shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// q, k and v projections have biases (Qwen2; Llama with `attention_bias`).
    pub qkv_bias: bool,
    /// The output projection has a bias (Llama with `attention_bias`).
    pub o_bias: bool,
    /// Beginning-of-sequence token, if the config names one.
    pub bos_token_id: Option<u32>,
    /// Tokens that end generation (`eos_token_id`, an int or a list).
    pub eos_token_ids: Vec<u32>,
}

/// An int or a list of ints (`eos_token_id`).
#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(u32),
    Many(Vec<u32>),
}

#[derive(Deserialize)]
struct RawScaling {
    #[serde(alias = "type")]
    rope_type: Option<String>,
    factor: Option<f64>,
    low_freq_factor: Option<f64>,
    high_freq_factor: Option<f64>,
    original_max_position_embeddings: Option<f64>,
}

#[derive(Deserialize)]
struct Raw {
    model_type: Option<String>,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    vocab_size: usize,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_scaling: Option<RawScaling>,
    max_position_embeddings: Option<usize>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    hidden_act: Option<String>,
    bos_token_id: Option<OneOrMany>,
    eos_token_id: Option<OneOrMany>,
}

impl LlamaConfig {
    /// Reads and checks `path` (a `config.json`).
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| LlmError::Io {
            path: path.into(),
            source,
        })?;
        Self::from_json(&text).map_err(|message| LlmError::Config {
            path: path.into(),
            message,
        })
    }

    /// Parses and checks the text of a `config.json`; the error says what is wrong.
    pub fn from_json(text: &str) -> std::result::Result<Self, String> {
        let raw: Raw = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let model_type = raw.model_type.unwrap_or_else(|| "llama".into());
        if let Some(act) = &raw.hidden_act {
            if act != "silu" {
                return Err(format!("hidden_act `{act}` is not supported (only silu)"));
            }
        }
        if raw.mlp_bias == Some(true) {
            return Err("mlp_bias = true is not supported".into());
        }
        let num_kv_heads = raw.num_key_value_heads.unwrap_or(raw.num_attention_heads);
        for (name, v) in [
            ("hidden_size", raw.hidden_size),
            ("intermediate_size", raw.intermediate_size),
            ("num_hidden_layers", raw.num_hidden_layers),
            ("num_attention_heads", raw.num_attention_heads),
            ("num_key_value_heads", num_kv_heads),
            ("vocab_size", raw.vocab_size),
        ] {
            if v == 0 {
                return Err(format!("{name} is 0"));
            }
        }
        if !raw.num_attention_heads.is_multiple_of(num_kv_heads) {
            return Err(format!(
                "num_attention_heads ({}) is not a multiple of num_key_value_heads ({num_kv_heads})",
                raw.num_attention_heads
            ));
        }
        let head_dim = match raw.head_dim {
            Some(d) => d,
            None => {
                if !raw.hidden_size.is_multiple_of(raw.num_attention_heads) {
                    return Err(format!(
                        "hidden_size ({}) is not a multiple of num_attention_heads ({}) and no \
                         head_dim is given",
                        raw.hidden_size, raw.num_attention_heads
                    ));
                }
                raw.hidden_size / raw.num_attention_heads
            }
        };
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(format!("head_dim {head_dim} must be even and non-zero"));
        }
        let rope_scaling = match raw.rope_scaling {
            None => None,
            Some(s) => match s.rope_type.as_deref() {
                Some("llama3") => {
                    let get = |v: Option<f64>, name: &str| {
                        v.filter(|x| x.is_finite() && *x > 0.0).ok_or_else(|| {
                            format!("rope_scaling.{name} is missing or not a positive number")
                        })
                    };
                    let sc = Llama3Scaling {
                        factor: get(s.factor, "factor")?,
                        low_freq_factor: get(s.low_freq_factor, "low_freq_factor")?,
                        high_freq_factor: get(s.high_freq_factor, "high_freq_factor")?,
                        original_max_position_embeddings: get(
                            s.original_max_position_embeddings,
                            "original_max_position_embeddings",
                        )?,
                    };
                    if sc.high_freq_factor <= sc.low_freq_factor {
                        return Err(
                            "rope_scaling: high_freq_factor must exceed low_freq_factor".into()
                        );
                    }
                    Some(sc)
                }
                Some("default") => None,
                other => {
                    return Err(format!(
                        "rope_scaling type {other:?} is not supported (only llama3)"
                    ))
                }
            },
        };
        let rope_theta = raw.rope_theta.unwrap_or(10000.0);
        if !(rope_theta.is_finite() && rope_theta > 0.0) {
            return Err(format!("rope_theta {rope_theta} is not a positive number"));
        }
        let rms_norm_eps = raw.rms_norm_eps.unwrap_or(1e-6);
        if !(rms_norm_eps.is_finite() && rms_norm_eps >= 0.0) {
            return Err(format!(
                "rms_norm_eps {rms_norm_eps} is not a non-negative number"
            ));
        }
        let qwen2 = model_type == "qwen2";
        let attention_bias = raw.attention_bias.unwrap_or(false);
        let ids = |v: Option<OneOrMany>| match v {
            None => Vec::new(),
            Some(OneOrMany::One(x)) => vec![x],
            Some(OneOrMany::Many(xs)) => xs,
        };
        let config = LlamaConfig {
            arch: Architecture::Llama,
            hidden_size: raw.hidden_size,
            intermediate_size: raw.intermediate_size,
            num_layers: raw.num_hidden_layers,
            num_heads: raw.num_attention_heads,
            num_kv_heads,
            head_dim,
            vocab_size: raw.vocab_size,
            rms_norm_eps: rms_norm_eps as f32,
            rope_theta,
            rope_scaling,
            max_position_embeddings: raw.max_position_embeddings.unwrap_or(2048).max(1),
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(false),
            qkv_bias: qwen2 || attention_bias,
            o_bias: !qwen2 && attention_bias,
            bos_token_id: ids(raw.bos_token_id).first().copied(),
            eos_token_ids: ids(raw.eos_token_id),
            model_type,
        };
        config.check_sizes()?;
        Ok(config)
    }

    /// Checks that every size the model derives from the configuration is representable:
    /// the attention widths (`num_heads * head_dim`, `num_kv_heads * head_dim`), every weight
    /// matrix's element count and the decode matrices' total, each as f32 bytes within
    /// `isize::MAX` (what a buffer of them can hold). Reading a file then checks each matrix
    /// against the bytes the file has; this only keeps that arithmetic from wrapping.
    ///
    /// # Errors
    /// The first size that overflows, named.
    pub fn check_sizes(&self) -> std::result::Result<(), String> {
        let max = isize::MAX as usize / 4;
        let mul = |a: usize, b: usize, what: &str| {
            a.checked_mul(b).filter(|&n| n <= max).ok_or_else(|| {
                format!(
                    "{what} = {a} x {b} overflows (more than {max} elements): the file's sizes \
                     are corrupt"
                )
            })
        };
        let h = self.hidden_size;
        let q = mul(
            self.num_heads,
            self.head_dim,
            "the query width (heads x head_dim)",
        )?;
        let kv = mul(
            self.num_kv_heads,
            self.head_dim,
            "the key/value width (kv heads x head_dim)",
        )?;
        let attn = mul(h, q.max(kv), "an attention matrix (hidden x query width)")?;
        let ffn = mul(h, self.intermediate_size, "an MLP matrix (hidden x ffn)")?;
        let vocab = mul(self.vocab_size, h, "the embedding (vocab x hidden)")?;
        let per_layer = attn
            .checked_mul(4)
            .and_then(|a| ffn.checked_mul(3).and_then(|f| a.checked_add(f)))
            .filter(|&n| n <= max)
            .ok_or_else(|| format!("one layer's {attn} x 4 + {ffn} x 3 weights overflow"))?;
        let layers = mul(
            self.num_layers,
            per_layer,
            "the layers' weights (layers x per layer)",
        )?;
        layers
            .checked_add(vocab)
            .filter(|&n| n <= max)
            .map(|_| ())
            .ok_or_else(|| format!("{layers} layer weights and {vocab} embedding weights overflow"))
    }

    /// The RoPE inverse frequencies `inv_freq[i]`, `i < head_dim / 2`, in f64: `rope_theta ^
    /// (-2i / head_dim)`, then the Llama 3 scaling rule when configured (as HF's
    /// `_compute_llama3_parameters`).
    pub fn inv_freq(&self) -> Vec<f64> {
        rope_inv_freq(self.head_dim, self.rope_theta, self.rope_scaling.as_ref())
    }

    /// Parameters of the matrices a decode step reads: every layer's seven and the head (the
    /// embedding row it also reads is negligible).
    pub fn matrix_params(&self) -> usize {
        let h = self.hidden_size;
        let q = self.num_heads * self.head_dim;
        let kv = self.num_kv_heads * self.head_dim;
        let per_layer = h * q + 2 * h * kv + q * h + 3 * h * self.intermediate_size;
        self.num_layers * per_layer + self.vocab_size * h
    }
}

/// RoPE inverse frequencies for one head of `head_dim` (see [`LlamaConfig::inv_freq`]).
pub fn rope_inv_freq(head_dim: usize, theta: f64, scaling: Option<&Llama3Scaling>) -> Vec<f64> {
    let half = head_dim / 2;
    (0..half)
        .map(|i| {
            let f = 1.0 / theta.powf((2 * i) as f64 / head_dim as f64);
            match scaling {
                None => f,
                Some(s) => {
                    let low_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
                    let high_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
                    let wavelen = 2.0 * std::f64::consts::PI / f;
                    if wavelen > low_wavelen {
                        f / s.factor
                    } else if wavelen < high_wavelen {
                        f
                    } else {
                        let smooth = (s.original_max_position_embeddings / wavelen
                            - s.low_freq_factor)
                            / (s.high_freq_factor - s.low_freq_factor);
                        (1.0 - smooth) * f / s.factor + smooth * f
                    }
                }
            }
        })
        .collect()
}
