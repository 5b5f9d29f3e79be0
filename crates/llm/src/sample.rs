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
        let cut = self.top_p as f64 * sum;
        // The nucleus is a prefix of the ids sorted most likely first (ties by id). The ids
        // whose probability is at least a threshold are such a prefix too, so sorting only
        // them keeps the same nucleus whenever it ends among them: the threshold starts at
        // 2^-10 of the largest probability (1: `exp(0)`) and falls by 2^10 until it does,
        // then to 0 (every id). A top-p sort of Gemma's 262,144 ids costs more than the
        // token's forward pass; the candidates are usually a few hundred.
        let mut threshold = 1.0f32 / 1024.0;
        loop {
            let mut n = 0;
            let mut mass = 0.0f64;
            for (i, &p) in probs.iter().enumerate() {
                if p >= threshold {
                    idx[n] = i as u32;
                    n += 1;
                    mass += p as f64;
                }
            }
            // `mass` sums in id order and `kept` below in sorted order: the sorted sum is
            // the one that decides, `mass` only skips sorts that cannot reach the cut.
            if mass >= cut || threshold == 0.0 {
                let candidates = &mut idx[..n];
                // In-place sort (no allocation): most likely first, ties by id.
                candidates.sort_unstable_by(|&a, &b| {
                    probs[b as usize]
                        .total_cmp(&probs[a as usize])
                        .then(a.cmp(&b))
                });
                if let Some(token) = pick_nucleus(probs, candidates, cut, r, threshold == 0.0) {
                    return Ok(token);
                }
            }
            threshold = if threshold >= f32::MIN_POSITIVE * 1024.0 {
                threshold / 1024.0
            } else {
                0.0
            };
        }
    }
}

/// The token drawn at `r` (uniform in `[0, 1)`) from the nucleus: the shortest prefix of
/// `sorted` (ids, most likely first) whose `probs` sum to at least `cut`; `None` when all of
/// `sorted` sums to less, unless `all` says it holds every id (then the whole of it).
fn pick_nucleus(probs: &[f32], sorted: &[u32], cut: f64, r: f64, all: bool) -> Option<u32> {
    let mut kept = 0.0f64;
    let mut n = 0;
    for &i in sorted {
        kept += probs[i as usize] as f64;
        n += 1;
        if kept >= cut {
            break;
        }
    }
    if kept < cut && !all {
        return None;
    }
    let target = r * kept;
    let mut acc = 0.0f64;
    for &i in &sorted[..n] {
        acc += probs[i as usize] as f64;
        if acc > target {
            return Some(i);
        }
    }
    sorted.first().copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::Runtime;
    use caching_allocator::CachingAllocator;

    /// Top-p as the definition reads, every id sorted: what the candidate filter must equal.
    fn full_sort_top_p(logits: &[f32], t: f32, top_p: f32, rng: &mut Rng) -> u32 {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let probs: Vec<f32> = logits
            .iter()
            .map(|&l| ((l - max) * (1.0 / t)).exp())
            .collect();
        let sum: f64 = probs.iter().map(|&p| p as f64).sum();
        let r = rng.next_f64();
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        idx.sort_by(|&a, &b| {
            probs[b as usize]
                .total_cmp(&probs[a as usize])
                .then(a.cmp(&b))
        });
        let cut = top_p as f64 * sum;
        let (mut kept, mut n) = (0.0f64, 0);
        for &i in &idx {
            kept += probs[i as usize] as f64;
            n += 1;
            if kept >= cut {
                break;
            }
        }
        let mut acc = 0.0f64;
        for &i in &idx[..n] {
            acc += probs[i as usize] as f64;
            if acc > r * kept {
                return i;
            }
        }
        idx[0]
    }

    /// The candidate filter draws the tokens the full sort draws, seed for seed: on peaked,
    /// flat, Zipf-tailed (the nucleus reaching far past the first thresholds) and tied
    /// logits, at temperatures and top-p values from tight to loose.
    #[test]
    fn top_p_equals_the_full_sort() {
        let vocab = 4099;
        let mut rng = Rng::new(3);
        let noise: Vec<f32> = (0..vocab).map(|_| rng.next_f32()).collect();
        let shapes: Vec<Vec<f32>> = vec![
            noise.iter().map(|&u| 20.0 * u).collect(),
            noise.iter().map(|&u| 0.01 * u).collect(),
            (0..vocab).map(|i| -1.2 * ((i + 1) as f32).ln()).collect(),
            (0..vocab)
                .map(|i| -0.3 * ((i % 97 + 1) as f32).ln())
                .collect(),
            noise.iter().map(|&u| (8.0 * u).round()).collect(),
            vec![0.0; vocab],
        ];
        let mut rt = Runtime::new(CachingAllocator::new(1 << 20));
        let mut draws = 0;
        for logits in &shapes {
            for t in [0.3f32, 0.8, 1.0, 2.5] {
                for top_p in [0.05f32, 0.5, 0.9, 0.99, 0.999_9] {
                    let seed = draws as u64;
                    let mut s = Sampler::new(t, top_p, seed).unwrap();
                    let mut reference = Rng::new(seed);
                    for _ in 0..20 {
                        let got = rt.run("sample_top_p", |sc| s.sample(sc, logits)).unwrap();
                        let want = full_sort_top_p(logits, t, top_p, &mut reference);
                        assert_eq!(got, want, "t {t}, top_p {top_p}, draw {draws}");
                        draws += 1;
                    }
                }
            }
        }
    }
}
