//! The model's efficiency against this machine's limits: decode against a streaming read of
//! the weights one step reads, prefill against sgemm at the model's largest matmul, each timed
//! in alternating turns with its baseline.

use caching_allocator::CachingAllocator;
use llm::{Llama, Sampler};

use super::{decode, prefill};
use crate::measure::{gbs, interleaved, sgemm, stream_read, Ratios};

/// The model's decode against a streaming read of the weight bytes one step reads (the
/// kernel-level decode figure, against K/V bytes, is [`crate::sdpa::baseline::DecodeEfficiency`]).
#[derive(Clone, Debug, serde::Serialize)]
pub struct WeightReadEfficiency {
    /// Weight bytes one decode step reads.
    pub weight_bytes: usize,
    /// Best streaming read, GB/s.
    pub stream_gbs: f64,
    /// Best decode, GB/s of weights.
    pub decode_gbs: f64,
    /// Its ratios to the baseline (best, median), flattened into the JSON.
    #[serde(flatten)]
    pub ratios: Ratios,
}

/// The model's whole prefill against sgemm at its largest matmul shape (one attention call's:
/// [`crate::sdpa::baseline::PrefillEfficiency`]).
#[derive(Clone, Debug, serde::Serialize)]
pub struct ModelPrefillEfficiency {
    /// FLOPs of one prefill.
    pub flops: f64,
    /// sgemm shape (m, k, n).
    pub sgemm_shape: (usize, usize, usize),
    /// Best sgemm, GFLOP/s.
    pub sgemm_gflops: f64,
    /// Best prefill, GFLOP/s.
    pub prefill_gflops: f64,
    /// Its ratios to the baseline (best, median), flattened into the JSON.
    #[serde(flatten)]
    pub ratios: Ratios,
}

/// The efficiency probes of a model: its prefill of `prompt` or its decode against this
/// machine's limit, `reps` rounds in turns.
pub(super) struct Probe<'a> {
    pub(super) model: &'a mut Llama<CachingAllocator>,
    pub(super) prompt: &'a [u32],
    pub(super) reps: usize,
}

impl Probe<'_> {
    /// Decode against a streaming read of the weight bytes one step reads (greedy decode: a
    /// sampler's sort reads no weights).
    pub(super) fn decode(&mut self) -> Result<WeightReadEfficiency, String> {
        let (model, prompt, reps) = (&mut *self.model, self.prompt, self.reps);
        let wbytes = model.weights().decode_weight_bytes();
        let mut tok = prefill(model, prompt, &mut Sampler::greedy())?;
        let buf = vec![1.0f32; wbytes / 4];
        let mut err = None;
        let mut read = || stream_read(&buf, 1);
        let mut step = || match decode(model, tok, &mut Sampler::greedy()) {
            Ok(t) => tok = t,
            Err(e) => err = err.take().or(Some(e)),
        };
        let rounds = interleaved(reps, &mut [&mut read, &mut step]);
        if let Some(e) = err {
            return Err(e);
        }
        let (stream_gbs, decode_gbs, ratios) =
            Ratios::of_rounds(&rounds, |r| (gbs(wbytes, r[0]), gbs(wbytes, r[1])));
        Ok(WeightReadEfficiency {
            weight_bytes: wbytes,
            stream_gbs,
            decode_gbs,
            ratios,
        })
    }

    /// The whole prefill against sgemm at the model's largest matmul shape.
    pub(super) fn prefill(&mut self) -> Result<ModelPrefillEfficiency, String> {
        let (model, prompt, reps) = (&mut *self.model, self.prompt, self.reps);
        let c = model.config().clone();
        let l = prompt.len();
        let (h, ffn) = (c.hidden_size, c.intermediate_size);
        let per_layer = {
            let q = c.num_heads * c.head_dim;
            let kv = c.num_kv_heads * c.head_dim;
            h * q + 2 * h * kv + q * h + 3 * h * ffn
        };
        let pairs = (l * (l + 1) / 2) as f64;
        let flops = 2.0 * l as f64 * (c.num_layers * per_layer) as f64
            + 2.0 * (c.vocab_size * h) as f64
            + c.num_layers as f64 * 4.0 * (c.head_dim * c.num_heads) as f64 * pairs;
        let (m, k, n) = (l, h, ffn);
        let a = crate::measure::fill(m * k, 3);
        let b = crate::measure::fill(k * n, 4);
        let mut cbuf = vec![0f32; m * n];
        let mut err = None;
        let mut gemm = || sgemm(m, k, n, &a, &b, &mut cbuf);
        let mut run = || {
            if let Err(e) = prefill(model, prompt, &mut Sampler::greedy()) {
                err.get_or_insert(e);
            }
        };
        let rounds = interleaved(reps, &mut [&mut gemm, &mut run]);
        if let Some(e) = err {
            return Err(e);
        }
        let gemm_flops = 2.0 * (m * k * n) as f64;
        let (sgemm_gflops, prefill_gflops, ratios) =
            Ratios::of_rounds(&rounds, |r| (gemm_flops / r[0] / 1e9, flops / r[1] / 1e9));
        Ok(ModelPrefillEfficiency {
            flops,
            sgemm_shape: (m, k, n),
            sgemm_gflops,
            prefill_gflops,
            ratios,
        })
    }
}
