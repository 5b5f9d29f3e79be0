//! Prefill, then decode until a stop token or the token limit.

use std::time::Instant;

use caching_allocator::TempReset;

use crate::error::{LlmError, Result};
use crate::model::Llama;
use crate::sample::Sampler;

/// Options of one generation.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    /// At most this many new tokens (stop tokens are not counted or emitted).
    pub max_new_tokens: usize,
    /// Tokens that end the generation (by default the config's `eos_token_id`s).
    pub stop_tokens: Vec<u32>,
}

/// Why generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// A stop token was sampled.
    StopToken,
    /// `max_new_tokens` were generated.
    MaxTokens,
    /// The KV cache is full.
    ContextFull,
}

/// Timings and counts of one generation.
#[derive(Clone, Copy, Debug)]
pub struct GenerationStats {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Tokens generated (emitted).
    pub generated: usize,
    /// Seconds of the prefill forward pass.
    pub prefill_s: f64,
    /// Seconds from the start to the first sampled token.
    pub time_to_first_token_s: f64,
    /// Seconds of the decode steps (forward of one token + sampling), after the first token.
    pub decode_s: f64,
    /// Decode steps run (forward passes of one token).
    pub decode_steps: usize,
    /// Why it stopped.
    pub stop: StopReason,
}

impl GenerationStats {
    /// Prompt tokens per second of prefill.
    pub fn prefill_tok_s(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_s.max(1e-12)
    }

    /// Decode steps per second.
    pub fn decode_tok_s(&self) -> f64 {
        self.decode_steps as f64 / self.decode_s.max(1e-12)
    }
}

/// Runs `prompt` through `model` (from position 0), then samples up to
/// `options.max_new_tokens` tokens, calling `on_token` with each (stop tokens excluded).
pub fn generate<A: TempReset>(
    model: &mut Llama<A>,
    prompt: &[u32],
    sampler: &mut Sampler,
    options: &GenerateOptions,
    mut on_token: impl FnMut(u32) -> Result<()>,
) -> Result<GenerationStats> {
    if prompt.is_empty() {
        return Err(LlmError::InvalidArgument {
            message: "empty prompt".into(),
        });
    }
    model.clear();
    let t0 = Instant::now();
    model.forward(prompt)?;
    let prefill_s = t0.elapsed().as_secs_f64();
    let mut stats = GenerationStats {
        prompt_tokens: prompt.len(),
        generated: 0,
        prefill_s,
        time_to_first_token_s: 0.0,
        decode_s: 0.0,
        decode_steps: 0,
        stop: StopReason::MaxTokens,
    };
    if options.max_new_tokens == 0 {
        stats.time_to_first_token_s = prefill_s;
        return Ok(stats);
    }
    let mut tok = model.sample(sampler)?;
    stats.time_to_first_token_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    loop {
        if options.stop_tokens.contains(&tok) {
            stats.stop = StopReason::StopToken;
            break;
        }
        on_token(tok)?;
        stats.generated += 1;
        if stats.generated >= options.max_new_tokens {
            stats.stop = StopReason::MaxTokens;
            break;
        }
        if model.position() >= model.capacity() {
            stats.stop = StopReason::ContextFull;
            break;
        }
        model.forward(&[tok])?;
        tok = model.sample(sampler)?;
        stats.decode_steps += 1;
    }
    stats.decode_s = t1.elapsed().as_secs_f64();
    Ok(stats)
}
