//! Choosing the next token: greedy, temperature, top-p, seeded.

use crate::error::{LlmError, Result};
use crate::runtime::Scratch;
use caching_allocator::TempAllocator;

/// A small seeded generator (SplitMix64): reproducible across platforms.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
    }

    /// Uniform in `[0, 1)`, 53 bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// How tokens are chosen.
#[derive(Clone, Debug)]
pub struct Sampler {
    /// 0 (or below) means greedy: the most likely token (the lowest id on ties).
    pub temperature: f32,
    /// Nucleus sampling: keep the most likely tokens whose probabilities sum to at least
    /// `top_p` (1 keeps all).
    pub top_p: f32,
    rng: Rng,
}

impl Sampler {
    /// A sampler; `temperature <= 0` is greedy.
    ///
    /// # Errors
    /// [`LlmError::InvalidArgument`] for a NaN temperature or `top_p` outside `(0, 1]`.
    pub fn new(temperature: f32, top_p: f32, seed: u64) -> Result<Sampler> {
        if temperature.is_nan() || !(top_p > 0.0 && top_p <= 1.0) {
            return Err(LlmError::InvalidArgument {
                message: format!(
                    "temperature {temperature} must be a number and top_p {top_p} in (0, 1]"
                ),
            });
        }
        Ok(Sampler {
            temperature,
            top_p,
            rng: Rng::new(seed),
        })
    }

    /// Greedy decoding.
    pub fn greedy() -> Sampler {
        Sampler {
            temperature: 0.0,
            top_p: 1.0,
            rng: Rng::new(0),
        }
    }

    /// The kernel name a model runs this sampler's calls under, for the scratch profile:
    /// `sample_greedy` (no scratch), `sample_temperature` (the probabilities: 4 bytes per
    /// vocabulary entry) or `sample_top_p` (those and the sorted candidate ids: 8 bytes per
    /// entry, 2 MiB for a 262,144-token vocabulary).
    pub fn kernel_name(&self) -> &'static str {
        if self.temperature <= 0.0 || !self.temperature.is_finite() {
            "sample_greedy"
        } else if self.top_p >= 1.0 {
            "sample_temperature"
        } else {
            "sample_top_p"
        }
    }

    /// Picks a token from `logits`; top-p sorts candidate indices in scratch (no heap).
    pub fn sample<A: TempAllocator + ?Sized>(
        &mut self,
        s: &Scratch<'_, A>,
        logits: &[f32],
    ) -> Result<u32> {
        if logits.is_empty() {
            return Err(LlmError::InvalidArgument {
                message: "no logits to sample from".into(),
            });
        }
        let argmax = || {
            let mut best = 0;
            for (i, &v) in logits.iter().enumerate() {
                if v > logits[best] {
                    best = i;
                }
            }
            best as u32
        };
        if self.temperature <= 0.0 || !self.temperature.is_finite() {
            return Ok(argmax());
        }
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let probs = s.f32s(logits.len())?;
        let inv_t = 1.0 / self.temperature;
        let mut sum = 0.0f64;
        for (p, &l) in probs.iter_mut().zip(logits) {
            *p = ((l - max) * inv_t).exp();
            sum += *p as f64;
        }
        if !(sum.is_finite() && sum > 0.0) {
            return Ok(argmax());
        }
        let r = self.rng.next_f64();
        if self.top_p >= 1.0 {
            let target = r * sum;
            let mut acc = 0.0f64;
            for (i, &p) in probs.iter().enumerate() {
                acc += p as f64;
                if acc > target {
                    return Ok(i as u32);
                }
            }
            return Ok(argmax());
        }
        let idx = s.u32s(logits.len())?;
        for (i, v) in idx.iter_mut().enumerate() {
            *v = i as u32;
        }
        // In-place sort (no allocation): most likely first, ties by id.
        idx.sort_unstable_by(|&a, &b| {
            probs[b as usize]
                .total_cmp(&probs[a as usize])
                .then(a.cmp(&b))
        });
        let cut = self.top_p as f64 * sum;
        let mut kept = 0.0f64;
        let mut n = 0;
        for &i in idx.iter() {
            kept += probs[i as usize] as f64;
            n += 1;
            if kept >= cut {
                break;
            }
        }
        let target = r * kept;
        let mut acc = 0.0f64;
        for &i in &idx[..n] {
            acc += probs[i as usize] as f64;
            if acc > target {
                return Ok(i);
            }
        }
        Ok(idx[0])
    }
}
