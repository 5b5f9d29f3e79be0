//! Named real-model shapes for benchmarks with random weights.

use crate::arch::{gemma3, Architecture, Gemma3};
use crate::config::{Llama3Scaling, LlamaConfig};

/// The shapes [`named`] knows.
pub const NAMES: &[&str] = &["smollm2-135m", "llama-3.2-1b", "gemma3-270m"];

/// The configuration of a named shape: `smollm2-135m`, `llama-3.2-1b` or `gemma3-270m`
/// (public configs; Gemma 3 270M as its GGUF's metadata gives it).
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
        "gemma3-270m" => Some(LlamaConfig {
            model_type: "gemma3".into(),
            arch: Architecture::Gemma3(Gemma3 {
                sliding_window: 512,
                global_every: gemma3::GLOBAL_EVERY,
                rope_local_theta: gemma3::ROPE_LOCAL_THETA,
                query_pre_attn_scalar: 256.0,
            }),
            head_dim: 256,
            rms_norm_eps: 1e-6,
            max_position_embeddings: 32_768,
            ..base(640, 18, 4, 1, 2048, 262_144, 1_000_000.0, None)
        }),
        _ => None,
    }
}
