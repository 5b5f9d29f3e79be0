//! This machine's own limits, measured in the same run as the kernel: a plain streaming read
//! (decode's bound) and `matrixmultiply`'s sgemm (prefill's), and the kernel's efficiency
//! against each.
//!
//! The baselines and the method are [`crate::measure`]'s, shared with the `sdpa_speed`
//! example.

use std::hint::black_box;

use crate::measure::{
    best, decode_shape, fill, gbs, interleaved, prefill_flops, prefill_shape, sgemm, stream_read,
    Ratios,
};
use ::sdpa::{Params, SdpaError, Shape};

use super::inputs::{Inputs, SdpaDtype};
use super::SdpaConfig;
use crate::source::TempReset;

/// Decode's efficiency at one KV length.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DecodeEfficiency {
    /// The dtype column.
    pub dtype: SdpaDtype,
    /// KV positions read per call.
    pub kv_len: usize,
    /// Separate layer caches cycled through, so that K/V come from DRAM.
    pub layers: usize,
    /// Bytes of the streaming-read buffer (and about the K/V span).
    pub span_bytes: usize,
    /// Best streaming-read GB/s (the faster of one and four runs per thread).
    pub stream_gbs: f64,
    /// Best kernel GB/s, counting the K and V bytes read (int8: values, scales and zero
    /// points).
    pub kernel_gbs: f64,
    /// Its ratios to the baseline (best, median), flattened into the JSON.
    #[serde(flatten)]
    pub ratios: Ratios,
    /// Best time of one attention call (one layer), milliseconds, the calls made from a
    /// worker of the rayon pool.
    pub ms_per_call: f64,
}

/// Prefill's efficiency at one length.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PrefillEfficiency {
    /// The dtype column.
    pub dtype: SdpaDtype,
    /// Tokens (query rows = KV positions, start_pos 0).
    pub len: usize,
    /// Causal masking (FLOPs count visible pairs only).
    pub causal: bool,
    /// Layer calls timed back to back per round, each on its own inputs (see
    /// [`prefill_efficiency`]).
    pub calls: usize,
    /// Best sgemm GFLOP/s (the best over the sgemm shapes).
    pub sgemm_gflops: f64,
    /// Best kernel GFLOP/s.
    pub kernel_gflops: f64,
    /// Its ratios to the baseline (best, median), flattened into the JSON.
    #[serde(flatten)]
    pub ratios: Ratios,
    /// Best time of one attention call (one layer), milliseconds.
    pub ms_per_call: f64,
}

/// What both efficiency probes run on: the model's heads, head_dim and efficiency settings
/// (`cfg`), a dtype, and the allocator the kernel's scratch comes from (reset after every call).
pub struct Probe<'a> {
    /// The model and the probes' settings (`eff_*`).
    pub cfg: &'a SdpaConfig,
    /// The dtype column.
    pub dtype: SdpaDtype,
    /// The kernel's temp allocator.
    pub temp: &'a (dyn TempReset + Sync),
}

/// Runs `f` on a worker of the current rayon pool (inline when the caller is one, as
/// `allocbench`'s main thread is), as a model's forward pass runs (the llm runner drives its
/// model inside `rayon::scope`), so the kernel's parallel sections start from inside the pool.
/// A parallel section started from outside hands its work to the pool and blocks until a
/// worker wakes it: 20-40 us per section on the project's 2-core VM (an empty `par_iter` of 8
/// items: 24 us from outside, 1.2 us inside), which a model pays once per forward pass rather
/// than once per layer call.
fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    rayon::scope(|_| f())
}

/// The inputs of `layers` layers for calls of shape `sh`, each layer its own data.
fn layer_inputs(
    dtype: SdpaDtype,
    sh: &Shape,
    layers: usize,
) -> Result<Vec<Inputs>, sdpa::SdpaError> {
    (0..layers)
        .map(|l| Inputs::new(dtype, sh, 3 * l as u32 + 1))
        .collect()
}

/// One call of shape `sh` on each layer of `inputs`, each followed by a reset of `temp`; the
/// first error goes to `err`.
fn call_each(
    inputs: &mut [Inputs],
    sh: &Shape,
    temp: &dyn TempReset,
    err: &mut Option<sdpa::SdpaError>,
) {
    let p = Params::default();
    for layer in inputs.iter_mut() {
        if let Err(e) = layer.call(sh, &p, temp) {
            err.get_or_insert(e);
        }
        // SAFETY: nothing from `temp` is used after the call returned, and no other call on it
        // runs (this thread drives it alone).
        unsafe { temp.reset_unchecked() };
    }
    black_box(inputs);
}

/// Measures decode in the probe's dtype at `kv_len` over enough separate layer caches to span
/// `cfg.eff_span_bytes` of K/V (at most 64), against a streaming read of a buffer that size on
/// the same threads, `cfg.eff_rounds` rounds: both count the bytes they must read (for int8,
/// the values, the scales and the zero points). A round's layer calls run on a worker of the current rayon pool (inline when the caller is one), as a
/// model's forward pass does.
pub fn decode_efficiency(probe: &Probe<'_>, kv_len: usize) -> Result<DecodeEfficiency, SdpaError> {
    let (cfg, dtype, temp) = (probe.cfg, probe.dtype, probe.temp);
    let (head_dim, span_bytes) = (cfg.head_dim, cfg.eff_span_bytes);
    let sh = decode_shape(cfg.heads, cfg.kv_heads, head_dim, kv_len.max(1));
    let per_layer = sh.kv_elems()? / head_dim * dtype.kv_bytes_per_head_row(head_dim);
    let layers = span_bytes.div_ceil(per_layer.max(1)).clamp(1, 64);
    let mut inputs = layer_inputs(dtype, &sh, layers)?;
    let stream = fill(span_bytes.div_ceil(4).max(1), 7);
    let mut err = None;
    let rounds = interleaved(
        cfg.eff_rounds,
        &mut [
            &mut || stream_read(&stream, 1),
            &mut || stream_read(&stream, 4),
            &mut || on_pool(|| call_each(&mut inputs, &sh, temp, &mut err)),
        ],
    );
    if let Some(e) = err {
        return Err(e);
    }
    let (sb, kb) = (stream.len() * 4, per_layer * layers);
    // Closures 0 and 1 are the streaming reads (the faster is a round's baseline), 2 the decode.
    let (stream_gbs, kernel_gbs, ratios) =
        Ratios::of_rounds(&rounds, |r| (gbs(sb, r[0].min(r[1])), gbs(kb, r[2])));
    Ok(DecodeEfficiency {
        dtype,
        kv_len,
        layers,
        span_bytes: sb,
        stream_gbs,
        kernel_gbs,
        ratios,
        ms_per_call: best(&rounds, 2) * 1e3 / layers as f64,
    })
}

/// Measures a causal prefill in the probe's dtype of `len` tokens from position 0 against
/// sgemm on each of `cfg.eff_sgemm_shapes` (`m, k, n`; the fastest counts), `cfg.eff_rounds`
/// rounds.
///
/// A round times enough layer calls back to back, each on its own inputs (as a model's layers
/// are), for about the FLOPs of the smallest sgemm (at most 32 calls): a single 1 ms call timed
/// right after a 20 ms sgemm measured the thread pool waking up as much as the kernel (it ran
/// at 30% or 60% of sgemm from one round to the next at 128 tokens). The calls run on a pool
/// worker, as decode's do (at 128 tokens that changed the time per call by under 2%).
pub fn prefill_efficiency(probe: &Probe<'_>, len: usize) -> Result<PrefillEfficiency, SdpaError> {
    let (cfg, dtype, temp) = (probe.cfg, probe.dtype, probe.temp);
    let (sgemm_shapes, reps) = (&cfg.eff_sgemm_shapes, cfg.eff_rounds);
    let sh = prefill_shape(cfg.heads, cfg.kv_heads, cfg.head_dim, len);
    let flops = prefill_flops(&sh, true);
    let smallest_sgemm = sgemm_shapes
        .iter()
        .map(|&(m, k, n)| 2.0 * (m * k * n) as f64)
        .fold(f64::INFINITY, f64::min);
    let calls = ((smallest_sgemm / flops).ceil() as usize).clamp(1, 32);
    let mut inputs = layer_inputs(dtype, &sh, calls)?;
    let mut err = None;
    let mut kernel = || on_pool(|| call_each(&mut inputs, &sh, temp, &mut err));
    // One sgemm per shape, each with its own operands, then the kernel, in turns.
    let mut mats: Vec<_> = sgemm_shapes
        .iter()
        .map(|&(m, k, n)| (fill(m * k, 5), fill(k * n, 6), vec![0f32; m * n]))
        .collect();
    let mut gemms: Vec<Box<dyn FnMut() + '_>> = sgemm_shapes
        .iter()
        .zip(&mut mats)
        .map(|(&(m, k, n), (a, b, c))| Box::new(move || sgemm(m, k, n, a, b, c)) as Box<_>)
        .collect();
    let mut turns: Vec<&mut dyn FnMut()> = gemms.iter_mut().map(|g| g.as_mut() as _).collect();
    turns.push(&mut kernel);
    let shape_count = sgemm_shapes.len();
    let times = interleaved(reps, &mut turns);
    if let Some(e) = err {
        return Err(e);
    }
    let sgemm_at = |r: &[f64]| {
        sgemm_shapes
            .iter()
            .zip(r)
            .map(|(&(m, k, n), t)| 2.0 * (m * k * n) as f64 / t / 1e9)
            .fold(0.0, f64::max)
    };
    let kernel_at = |r: &[f64]| flops * calls as f64 / r[shape_count] / 1e9;
    let (sgemm_gflops, kernel_gflops, ratios) =
        Ratios::of_rounds(&times, |r| (sgemm_at(r), kernel_at(r)));
    let best_call = times
        .iter()
        .map(|r| r[shape_count] / calls as f64)
        .fold(f64::INFINITY, f64::min);
    Ok(PrefillEfficiency {
        dtype,
        len,
        causal: true,
        calls,
        sgemm_gflops,
        kernel_gflops,
        ratios,
        ms_per_call: best_call * 1e3,
    })
}
