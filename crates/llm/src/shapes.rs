//! Named real-model shapes for benchmarks with random weights.

use crate::arch::Architecture;
use crate::config::{Llama3Scaling, LlamaConfig};

/// The shapes [`named`] knows.
pub const NAMES: &[&str] = &["smollm2-135m", "llama-3.2-1b"];

/// The configuration of a named shape: `smollm2-135m` or `llama-3.2-1b` (public configs).
pub fn named(name: &str) -> Option<LlamaConfig> {
    let base = |hidden, layers, heads, kv, ffn, vocab, theta, scaling| LlamaConfig {
        model_type: "llama".into(),
        arch: Architecture::Llama,
        hidden_size: hidden,
        intermediate_size: ffn,
        num_layers: layers,
        num_heads: heads,
        num_kv_heads: kv,
        head_dim: hidden / heads,
        vocab_size: vocab,
        rms_norm_eps: 1e-5,
        rope_theta: theta,
        rope_scaling: scaling,
        max_position_embeddings: 8192,
        tie_word_embeddings: true,
        qkv_bias: false,
        o_bias: false,
        bos_token_id: None,
        eos_token_ids: Vec::new(),
    };
    match name {
        "smollm2-135m" => Some(base(576, 30, 9, 3, 1536, 49152, 100_000.0, None)),
        "llama-3.2-1b" => Some(base(
            2048,
            16,
            32,
            8,
            8192,
            128_256,
            500_000.0,
            Some(Llama3Scaling {
                factor: 32.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192.0,
            }),
        )),
        _ => None,
    }
}
