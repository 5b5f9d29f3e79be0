//! `allocbench llm`: a whole Llama-family model (crate `llm`) generating tokens, its kernels'
//! scratch from every temp-memory source, and its speed against this machine's limits.
//!
//! **Allocator comparison.** One [`llm::Llama`] per source, all sharing one set of weights
//! (random, seeded, bf16, at a named real shape; or a checkpoint). A *round* is: a prefill of
//! the prompt (+ sampling the first token) on every source, then `decode_tokens` decode steps
//! (forward of one token + greedy sampling; the prefill is repeated `prefill_reps` times
//! first), each step run on every source back to back in the
//! order of [`step_order`] (forward, backward, ...), so machine noise hits every source alike.
//! One unmeasured round warms every source up (every scratch size of the run seen once).
//! `x static` is a source's total time over the measured steps over `static`'s; system
//! allocations, page faults and temp bytes are per token.
//!
//! **Efficiency**, with the `caching` source: decode tokens/s times the bytes of weights a
//! step reads, against a streaming read of as many bytes (`sdpa::baseline::stream_read`);
//! prefill FLOP/s against matrixmultiply's sgemm on the model's largest matmul shape. Both
//! timed in alternating turns.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use comfy_table::Table;
use serde_json::{json, Value};

use crate::harness::{Measurement, RunConfig};
use crate::os::{self, Machine};
use crate::report::{
    align_right, fmt_ns, held_cell, markdown_table, memory_cells, Report, TargetCheck, CACHING,
    FLOOR,
};
use crate::sdpa::{finish, step_order, Acc};
use crate::source::{
    Counters, ScratchSource, ScratchWorker, SourceConfig, SourceKind, LLM_ONLY, SOURCES,
};
use ::sdpa::baseline::{best, interleaved, median, sgemm, stream_read};
use llm::safetensors::DType;
use llm::{Llama, ModelOptions, Module, Sampler, TempRef, Weights};

/// ExecuTorch's LLM runner's temp-allocator cap, `1024 * 1024 * 10` (used for both caches).
pub const RUNNER_CAP: usize = 10 << 20;

/// The temp-memory sources of the llm comparison, in table order: [`SOURCES`] entries and
/// [`LLM_ONLY`]'s, all built with [`llm_source_config`] (caps at the runner's 10 MiB).
pub const LLM_SOURCE_NAMES: [&str; 6] = [
    "system",
    "fresh-pages",
    "exact-cache",
    "caching",
    "caching-unbounded",
    "static",
];

/// The source settings of the llm comparison: `exact-cache` and `caching` capped at
/// [`RUNNER_CAP`], as ExecuTorch's LLM runner caps its temp allocator.
pub fn llm_source_config() -> SourceConfig {
    SourceConfig {
        exact_cap: RUNNER_CAP as u32,
        caching_cap: RUNNER_CAP,
    }
}

/// The targets.
pub const WITHIN_STATIC: f64 = 1.01;
/// Decode: fraction of the weight-streaming bound.
pub const DECODE_TARGET: f64 = 0.80;
/// Prefill: fraction of sgemm's GFLOP/s.
pub const PREFILL_TARGET: f64 = 0.50;

/// What `allocbench llm` runs.
#[derive(Clone, Debug, serde::Serialize)]
pub struct LlmConfig {
    /// The named shape (`smollm2-135m`, `llama-3.2-1b`) or the checkpoint directory.
    pub model: String,
    /// A checkpoint directory instead of random weights.
    #[serde(skip)]
    pub model_dir: Option<PathBuf>,
    /// Prompt tokens (random ids, seeded).
    pub prompt_tokens: usize,
    /// Decode steps per round.
    pub decode_tokens: usize,
    /// Prefills per measured round (each on every source, interleaved).
    pub prefill_reps: usize,
    /// Measured rounds (after one warm-up round).
    pub rounds: usize,
    /// Alternating turns of each efficiency measurement.
    pub eff_reps: usize,
    /// Weight and prompt seed.
    pub seed: u64,
}

impl LlmConfig {
    /// The defaults: quick runs 1 measured round, full runs 3.
    pub fn new(quick: bool, shape: &str) -> Self {
        LlmConfig {
            model: shape.into(),
            model_dir: None,
            prompt_tokens: 128,
            decode_tokens: 64,
            prefill_reps: 3,
            rounds: if quick { 1 } else { 3 },
            eff_reps: if quick { 3 } else { 7 },
            seed: 1,
        }
    }
}

/// One source's results on one phase (`llm-prefill` or `llm-decode`).
#[derive(Clone, Debug)]
pub struct LlmRow {
    /// `ns_per_call` is per prefill or per decode token; per-call counts are per token.
    pub m: Measurement,
    /// Total time over the measured steps over `static`'s.
    pub x_static: Option<f64>,
    /// The same over `caching`'s.
    pub x_caching: Option<f64>,
    /// Tokens per second from the median step.
    pub tok_s: f64,
    /// Bytes requested from the temp allocator per token.
    pub temp_bytes_per_token: f64,
}

/// Decode against the streaming read.
#[derive(Clone, Debug, serde::Serialize)]
pub struct DecodeEff {
    /// Weight bytes one decode step reads.
    pub weight_bytes: usize,
    /// Best streaming read, GB/s.
    pub stream_gbs: f64,
    /// Best decode, GB/s of weights.
    pub decode_gbs: f64,
    /// Best over best.
    pub ratio_best: f64,
    /// Median of same-turn ratios.
    pub ratio_median: f64,
}

/// Prefill against sgemm.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PrefillEff {
    /// FLOPs of one prefill.
    pub flops: f64,
    /// sgemm shape (m, k, n).
    pub sgemm_shape: (usize, usize, usize),
    /// Best sgemm, GFLOP/s.
    pub sgemm_gflops: f64,
    /// Best prefill, GFLOP/s.
    pub prefill_gflops: f64,
    /// Best over best.
    pub ratio_best: f64,
    /// Median of same-turn ratios.
    pub ratio_median: f64,
}

/// A whole `allocbench llm` run.
#[derive(Clone, Debug)]
pub struct LlmReport {
    /// Where it ran.
    pub machine: Machine,
    /// The command line.
    pub command: String,
    /// `quick` or `full`.
    pub mode: &'static str,
    /// What ran.
    pub config: LlmConfig,
    /// The model's architecture, as a one-line description.
    pub arch: String,
    /// Rayon threads.
    pub threads: usize,
    /// matrixmultiply's threads, if known.
    pub sgemm_threads: Option<usize>,
    /// The kernels' SIMD path.
    pub isa: String,
    /// Rows: prefill then decode, every source.
    pub rows: Vec<LlmRow>,
    /// Decode efficiency.
    pub decode_eff: Option<DecodeEff>,
    /// Prefill efficiency.
    pub prefill_eff: Option<PrefillEff>,
    /// What could not be measured, with why.
    pub errors: Vec<String>,
    /// Wall time, seconds.
    pub elapsed_s: f64,
    /// Load average at the end.
    pub load_avg_end: f64,
}

/// Per-source, per-phase counters accumulated over measured steps only.
#[derive(Default, Clone, Copy)]
struct PhaseCount {
    sys_allocs: u64,
    counted: bool,
    temp_bytes: u64,
}

/// Loads or generates the weights.
pub fn weights(cfg: &LlmConfig) -> Result<Arc<Weights>, String> {
    let w = match &cfg.model_dir {
        Some(dir) => Weights::load(dir).map_err(|e| e.to_string())?,
        None => {
            let c = llm::shapes::named(&cfg.model).ok_or_else(|| {
                format!(
                    "unknown shape `{}`; known: {}",
                    cfg.model,
                    llm::shapes::NAMES.join(", ")
                )
            })?;
            Weights::random(c, DType::BF16, cfg.seed).map_err(|e| e.to_string())?
        }
    };
    Ok(Arc::new(w))
}

/// Runs the comparison on `kinds` and the efficiency figures; `tick` after every step.
pub fn run(
    cfg: &LlmConfig,
    weights: &Arc<Weights>,
    kinds: &[&SourceKind],
    source_config: &SourceConfig,
    tick: &dyn Fn(),
) -> (
    Vec<LlmRow>,
    Option<DecodeEff>,
    Option<PrefillEff>,
    Vec<String>,
) {
    let c = &weights.config;
    let vocab = c.vocab_size as u64;
    let mut rng = llm::sample::Rng::new(cfg.seed ^ 0x5eed);
    let prompt: Vec<u32> = (0..cfg.prompt_tokens.max(1))
        .map(|_| (rng.next_u64() % vocab) as u32)
        .collect();
    let context = prompt.len() + cfg.decode_tokens + cfg.eff_reps + 8;
    let opts = ModelOptions {
        context: Some(context),
    };
    let mut errors = Vec::new();
    let sources: Vec<Box<dyn ScratchSource>> =
        kinds.iter().map(|k| (k.build)(source_config)).collect();
    let workers: Vec<Box<dyn ScratchWorker + '_>> = sources.iter().map(|s| s.worker()).collect();
    let counters = |i: usize| sources[i].counters().plus(workers[i].counters());
    let mut models = Vec::new();
    for w in &workers {
        match Llama::new(weights.clone(), TempRef(w.as_ref()), &opts) {
            Ok(m) => models.push(m),
            Err(e) => {
                errors.push(format!("building the model: {e}"));
                return (Vec::new(), None, None, errors);
            }
        }
    }
    let n = models.len();
    let new_acc = || Acc {
        steps: Vec::new(),
        faults: 0,
        calls: 0,
        before: Counters {
            system_allocs: Some(0),
            ..Counters::default()
        },
        peak_rss_growth: 0,
        error: None,
    };
    let mut pre: Vec<Acc> = (0..n).map(|_| new_acc()).collect();
    let mut dec: Vec<Acc> = (0..n).map(|_| new_acc()).collect();
    let mut pre_c = vec![PhaseCount::default(); n];
    let mut dec_c = vec![PhaseCount::default(); n];
    let mut next_tok = vec![0u32; n];
    let mut step = 0usize;
    let mut sampler = Sampler::greedy();

    // Round 0 warms up; rounds 1..=rounds are measured.
    for round in 0..=cfg.rounds {
        let measured = round > 0;
        for phase_decode in
            std::iter::once(false).chain(std::iter::repeat_n(true, cfg.decode_tokens))
        {
            for i in step_order(step, n) {
                let (acc, pc) = if phase_decode {
                    (&mut dec[i], &mut dec_c[i])
                } else {
                    (&mut pre[i], &mut pre_c[i])
                };
                if acc.error.is_some() {
                    if measured {
                        acc.steps.push(f64::NAN);
                    }
                    continue;
                }
                let m = &mut models[i];
                let rss = os::rss_bytes();
                if !measured && !phase_decode {
                    os::reset_peak_rss();
                }
                let c0 = counters(i);
                let tb0 = m.temp_usage().bytes;
                let f0 = os::minor_faults();
                let t0 = Instant::now();
                let r = if phase_decode {
                    m.forward(&[next_tok[i]])
                        .map(|_| ())
                        .and_then(|_| m.sample(&mut sampler))
                } else {
                    m.clear();
                    m.forward(&prompt)
                        .map(|_| ())
                        .and_then(|_| m.sample(&mut sampler))
                };
                let dt = t0.elapsed().as_secs_f64();
                let faults = os::minor_faults().saturating_sub(f0);
                let tokens = if phase_decode { 1 } else { prompt.len() as u64 };
                match r {
                    Ok(t) => next_tok[i] = t,
                    Err(e) => {
                        acc.error.get_or_insert(e.to_string());
                    }
                }
                if !measured {
                    acc.peak_rss_growth = acc
                        .peak_rss_growth
                        .max(os::peak_rss_bytes().saturating_sub(rss));
                    continue;
                }
                acc.steps
                    .push(if acc.error.is_some() { f64::NAN } else { dt });
                acc.faults += faults;
                acc.calls += tokens;
                let d = counters(i).since(c0);
                if let Some(a) = d.system_allocs {
                    pc.sys_allocs += a;
                    pc.counted = true;
                }
                pc.temp_bytes += m.temp_usage().bytes - tb0;
            }
            step += 1;
            tick();
        }
    }
    let mut rows = Vec::new();
    for (label, accs, pcs, per_step_tokens) in [
        ("llm-prefill", &pre, &pre_c, prompt.len()),
        ("llm-decode", &dec, &dec_c, 1),
    ] {
        let phase = |i: usize| {
            // The peaks are the temp allocator's, over both phases (one allocator serves both).
            let end = counters(i);
            Counters {
                system_allocs: pcs[i].counted.then_some(pcs[i].sys_allocs),
                peak_reserved: end.peak_reserved,
                peak_live: end.peak_live,
                ..Counters::default()
            }
        };
        let steps_n = accs.first().map_or(0, |a| a.steps.len());
        let out = finish(
            label,
            kinds,
            accs,
            &phase,
            |s: &[f64]| s.iter().map(|x| x * 1e9).collect(),
            steps_n,
        );
        for (i, r) in out.into_iter().enumerate() {
            let med = r.m.ns_per_call.median;
            let tokens = accs[i].calls.max(1) as f64;
            rows.push(LlmRow {
                tok_s: if med > 0.0 {
                    per_step_tokens as f64 * 1e9 / med
                } else {
                    0.0
                },
                temp_bytes_per_token: pcs[i].temp_bytes as f64 / tokens,
                m: r.m,
                x_static: r.x_static,
                x_caching: r.x_caching,
            });
        }
    }
    drop(models);
    drop(workers);
    drop(sources);

    // ---- efficiency, with the runner's default temp allocator ----
    let mut model = match Llama::new(weights.clone(), llm::caching_temp(RUNNER_CAP), &opts) {
        Ok(m) => m,
        Err(e) => {
            errors.push(format!("efficiency model: {e}"));
            return (rows, None, None, errors);
        }
    };
    let wbytes = weights.decode_weight_bytes();
    let decode_eff = (|| -> Result<DecodeEff, String> {
        model.forward(&prompt).map_err(|e| e.to_string())?;
        let buf = vec![1.0f32; wbytes / 4];
        let mut tok = 1u32;
        let mut err = None;
        let mut read = || stream_read(&buf, 1);
        let mut step_fn = || {
            let r = model
                .forward(&[tok])
                .map(|_| ())
                .and_then(|_| model.sample(&mut Sampler::greedy()));
            match r {
                Ok(t) => tok = t,
                Err(e) => {
                    err.get_or_insert(e.to_string());
                }
            }
        };
        let rounds = interleaved(cfg.eff_reps, &mut [&mut read, &mut step_fn]);
        if let Some(e) = err {
            return Err(e);
        }
        let gbs = |t: f64| wbytes as f64 / t / 1e9;
        let ratios: Vec<f64> = rounds.iter().map(|r| r[0] / r[1]).collect();
        Ok(DecodeEff {
            weight_bytes: wbytes,
            stream_gbs: gbs(best(&rounds, 0)),
            decode_gbs: gbs(best(&rounds, 1)),
            ratio_best: best(&rounds, 0) / best(&rounds, 1),
            ratio_median: median(ratios),
        })
    })();
    tick();
    let prefill_eff = (|| -> Result<PrefillEff, String> {
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
        let (m, k, nn) = (l, h, ffn);
        let a = ::sdpa::baseline::fill(m * k, 3);
        let b = ::sdpa::baseline::fill(k * nn, 4);
        let mut cbuf = vec![0f32; m * nn];
        let mut err = None;
        let mut gemm = || sgemm(m, k, nn, &a, &b, &mut cbuf);
        let mut prefill = || {
            model.clear();
            if let Err(e) = model.forward(&prompt) {
                err.get_or_insert(e.to_string());
            }
        };
        let rounds = interleaved(cfg.eff_reps, &mut [&mut gemm, &mut prefill]);
        if let Some(e) = err {
            return Err(e);
        }
        let gflops_gemm = |t: f64| 2.0 * (m * k * nn) as f64 / t / 1e9;
        let ratios: Vec<f64> = rounds
            .iter()
            .map(|r| (flops / r[1]) / (2.0 * (m * k * nn) as f64 / r[0]))
            .collect();
        let sg = gflops_gemm(best(&rounds, 0));
        let pf = flops / best(&rounds, 1) / 1e9;
        Ok(PrefillEff {
            flops,
            sgemm_shape: (m, k, nn),
            sgemm_gflops: sg,
            prefill_gflops: pf,
            ratio_best: pf / sg,
            ratio_median: median(ratios),
        })
    })();
    tick();
    let decode_eff = decode_eff
        .map_err(|e| errors.push(format!("decode efficiency: {e}")))
        .ok();
    let prefill_eff = prefill_eff
        .map_err(|e| errors.push(format!("prefill efficiency: {e}")))
        .ok();
    (rows, decode_eff, prefill_eff, errors)
}

/// Progress units of a run: steps of every round, plus two efficiency figures.
pub fn progress_units(cfg: &LlmConfig) -> usize {
    (cfg.rounds + 1) * cfg.decode_tokens + 1 + cfg.rounds * cfg.prefill_reps.max(1) + 2
}

fn pct(x: f64) -> String {
    format!("{:.0}%", 100.0 * x)
}

impl LlmReport {
    /// The row of `source` in `phase`.
    pub fn get(&self, phase: &str, source: &str) -> Option<&LlmRow> {
        self.rows
            .iter()
            .find(|r| r.m.workload == phase && r.m.source == source)
    }

    /// The comparison table, as Markdown.
    pub fn table(&self) -> Table {
        let mut t = markdown_table(&[
            "phase",
            "source",
            "tok/s",
            "median",
            "x static",
            "x caching",
            "temp B/token",
            "faults/token",
            "sys allocs/token",
            "peak RSS +MiB",
            "peak held/live MiB",
        ]);
        for r in &self.rows {
            let m = &r.m;
            if let Some(e) = &m.error {
                t.add_row(vec![
                    m.workload.clone(),
                    m.source.clone(),
                    format!("FAILED: {e}"),
                ]);
                continue;
            }
            let x = |v: Option<f64>| v.map(|v| format!("{v:.3}")).unwrap_or_else(|| "-".into());
            let [faults, sys, rss] = memory_cells(m);
            let unit = if m.workload == "llm-decode" {
                "/token"
            } else {
                "/prefill"
            };
            t.add_row(vec![
                m.workload.clone(),
                m.source.clone(),
                format!("{:.1}", r.tok_s),
                format!("{}{unit}", fmt_ns(m.ns_per_call.median)),
                x(r.x_static),
                x(r.x_caching),
                format!("{:.0}", r.temp_bytes_per_token),
                faults,
                sys,
                rss,
                held_cell(m),
            ]);
        }
        align_right(&mut t, 2..11);
        t
    }

    /// The efficiency table, as Markdown.
    pub fn efficiency_table(&self) -> Table {
        let mut t = markdown_table(&[
            "phase",
            "model",
            "baseline",
            "ratio (best)",
            "ratio (median)",
        ]);
        if let Some(d) = &self.decode_eff {
            t.add_row(vec![
                "decode".into(),
                format!(
                    "{:.2} GB/s of weights ({:.1} MiB/token)",
                    d.decode_gbs,
                    d.weight_bytes as f64 / (1 << 20) as f64
                ),
                format!("streaming read {:.2} GB/s", d.stream_gbs),
                pct(d.ratio_best),
                pct(d.ratio_median),
            ]);
        }
        if let Some(p) = &self.prefill_eff {
            t.add_row(vec![
                format!("prefill {}", self.config.prompt_tokens),
                format!("{:.1} GFLOP/s", p.prefill_gflops),
                format!(
                    "sgemm {}x{}x{} {:.1} GFLOP/s",
                    p.sgemm_shape.0, p.sgemm_shape.1, p.sgemm_shape.2, p.sgemm_gflops
                ),
                pct(p.ratio_best),
                pct(p.ratio_median),
            ]);
        }
        t
    }

    /// The headline: what `caching` buys against `system` and `fresh-pages`, per phase
    /// (their total time over `caching`'s over the same steps).
    pub fn headline(&self) -> Vec<String> {
        let mut out = Vec::new();
        for phase in ["llm-decode", "llm-prefill"] {
            for rival in ["system", "fresh-pages", "exact-cache"] {
                if let Some(x) = self.get(phase, rival).and_then(|r| r.x_caching) {
                    out.push(format!(
                        "{phase}: caching is {x:.3}x as fast as {rival} (total time over the same steps)"
                    ));
                }
            }
        }
        out
    }

    /// The targets, met or missed as measured.
    pub fn targets(&self) -> Vec<TargetCheck> {
        let mut out = Vec::new();
        for phase in ["llm-decode", "llm-prefill"] {
            let Some(r) = self.get(phase, CACHING) else {
                continue;
            };
            out.push(TargetCheck {
                target: format!(
                    "caching (10 MiB cap) within {WITHIN_STATIC:.2}x of static on {phase}"
                ),
                measured: match (&r.m.error, r.x_static) {
                    (Some(e), _) => format!("failed: {e}"),
                    (None, Some(x)) => format!("{x:.3}x"),
                    (None, None) => "no static row".into(),
                },
                met: if r.m.error.is_some() {
                    Some(false)
                } else {
                    r.x_static.map(|x| x <= WITHIN_STATIC)
                },
            });
            out.push(TargetCheck {
                target: format!(
                    "caching: 0 page faults and 0 system allocations per token on {phase}"
                ),
                measured: format!(
                    "{:.3} faults/token, {} system allocations/token",
                    r.m.faults_per_call,
                    r.m.sys_allocs_per_call
                        .map(|x| format!("{x:.3}"))
                        .unwrap_or_else(|| "?".into())
                ),
                met: Some(r.m.faults_per_call == 0.0 && r.m.sys_allocs_per_call == Some(0.0)),
            });
        }
        if let Some(d) = &self.decode_eff {
            out.push(TargetCheck {
                target: format!(
                    "decode >= {} of the weight-streaming bound ({} threads)",
                    pct(DECODE_TARGET),
                    self.threads
                ),
                measured: format!(
                    "{:.2} vs {:.2} GB/s: {} (median of same-turn ratios; best {})",
                    d.decode_gbs,
                    d.stream_gbs,
                    pct(d.ratio_median),
                    pct(d.ratio_best)
                ),
                met: Some(d.ratio_median >= DECODE_TARGET),
            });
        }
        if let Some(p) = &self.prefill_eff {
            out.push(TargetCheck {
                target: format!(
                    "prefill >= {} of sgemm GFLOP/s ({} threads)",
                    pct(PREFILL_TARGET),
                    self.threads
                ),
                measured: format!(
                    "{:.1} vs {:.1} GFLOP/s: {} (median of same-turn ratios; best {})",
                    p.prefill_gflops,
                    p.sgemm_gflops,
                    pct(p.ratio_median),
                    pct(p.ratio_best)
                ),
                met: Some(p.ratio_median >= PREFILL_TARGET),
            });
        }
        out
    }

    /// The targets table.
    pub fn targets_table(&self) -> Table {
        crate::report::targets_table(&self.targets())
    }

    /// The measurements as a harness [`Report`] (for the SVG plot).
    pub fn as_report(&self) -> Report {
        Report {
            machine: self.machine.clone(),
            command: self.command.clone(),
            mode: self.mode,
            run: RunConfig {
                warmup_rounds: 1,
                rounds: self.config.rounds,
                round_target: std::time::Duration::ZERO,
                calibration_calls: 0,
                max_round_calls: 0,
            },
            sources: SourceConfig::default(),
            workloads: self.workloads(),
            measurements: self.rows.iter().map(|r| r.m.clone()).collect(),
            threads: self.threads,
            elapsed_s: self.elapsed_s,
        }
    }

    /// (label, what one step is).
    pub fn workloads(&self) -> Vec<(String, String)> {
        vec![
            (
                "llm-prefill".into(),
                format!(
                    "{}: prefill of {} tokens + sampling",
                    self.config.model, self.config.prompt_tokens
                ),
            ),
            (
                "llm-decode".into(),
                format!(
                    "{}: one decode token (forward + greedy sampling), {} per round",
                    self.config.model, self.config.decode_tokens
                ),
            ),
        ]
    }

    /// Every figure, with units, as JSON.
    pub fn to_json(&self) -> Value {
        let fig = |v: f64, unit: &str| json!({ "value": v, "unit": unit });
        let rows: Vec<Value> = self
            .rows
            .iter()
            .map(|r| {
                let m = &r.m;
                let unit = if m.workload == "llm-decode" {
                    "ns/token"
                } else {
                    "ns/prefill"
                };
                json!({
                    "phase": m.workload,
                    "source": m.source,
                    "error": m.error,
                    "tokens_per_second": fig(r.tok_s, "tok/s (median step)"),
                    "time": {
                        "median": fig(m.ns_per_call.median, unit),
                        "min": fig(m.ns_per_call.min, unit),
                        "max": fig(m.ns_per_call.max, unit),
                    },
                    "ratio_to_static": r.x_static.map(|x| fig(x, "x (total time over the same steps)")),
                    "ratio_to_caching": r.x_caching.map(|x| fig(x, "x (total time over the same steps)")),
                    "temp_bytes_per_token": fig(r.temp_bytes_per_token, "bytes/token"),
                    "minor_page_faults_per_token": fig(m.faults_per_call, "faults/token"),
                    "system_allocations_per_token": m.sys_allocs_per_call.map(|x| fig(x, "allocations/token")),
                    "peak_rss_growth_warmup": fig(m.peak_rss_growth as f64, "bytes"),
                    "peak_reserved": m.peak_reserved.map(|x| fig(x as f64, "bytes (both phases)")),
                    "peak_live": m.peak_live.map(|x| fig(x as f64, "bytes (both phases)")),
                })
            })
            .collect();
        json!({
            "tool": "allocbench",
            "subcommand": "llm",
            "command": self.command,
            "mode": self.mode,
            "machine": self.machine,
            "cores": self.machine.cores,
            "threads": self.threads,
            "sgemm_threads": self.sgemm_threads,
            "kernels": self.isa,
            "config": self.config,
            "architecture": self.arch,
            "workloads": self.workloads().iter()
                .map(|(n, d)| json!({"name": n, "step": d})).collect::<Vec<_>>(),
            "elapsed": fig(self.elapsed_s, "s"),
            "load_average_end": self.load_avg_end,
            "measurements": rows,
            "headline": self.headline(),
            "efficiency": {
                "decode": self.decode_eff,
                "prefill": self.prefill_eff,
                "errors": self.errors,
            },
            "targets": self.targets(),
        })
    }
}

/// Looks an llm source up by name.
pub fn find_source(name: &str) -> Option<&'static SourceKind> {
    LLM_SOURCE_NAMES
        .contains(&name)
        .then(|| SOURCES.iter().chain(LLM_ONLY).find(|k| k.name == name))?
}

/// Every llm source, in table order.
pub fn llm_sources() -> Vec<&'static SourceKind> {
    LLM_SOURCE_NAMES
        .iter()
        .filter_map(|n| find_source(n))
        .collect()
}

/// The floor's name, for callers that check it is selected.
pub const FLOOR_SOURCE: &str = FLOOR;

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny model through the whole run: rows for every (phase, source), ratios against
    /// static, zero system allocations per token for the cache in steady state, JSON units.
    #[test]
    fn smoke_run_on_a_tiny_model() {
        let mut c = llm::shapes::named("smollm2-135m").unwrap();
        c.hidden_size = 64;
        c.num_heads = 4;
        c.num_kv_heads = 2;
        c.head_dim = 16;
        c.intermediate_size = 96;
        c.num_layers = 2;
        c.vocab_size = 300;
        let w = Arc::new(Weights::random(c, DType::BF16, 3).unwrap());
        let cfg = LlmConfig {
            model: "tiny".into(),
            model_dir: None,
            prompt_tokens: 12,
            decode_tokens: 4,
            prefill_reps: 2,
            rounds: 1,
            eff_reps: 1,
            seed: 1,
        };
        let kinds: Vec<&SourceKind> = ["caching", "static", "system"]
            .iter()
            .map(|n| find_source(n).unwrap())
            .collect();
        let (rows, dec, pre, errors) = run(&cfg, &w, &kinds, &SourceConfig::default(), &|| {});
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(rows.len(), 6);
        let caching = rows
            .iter()
            .find(|r| r.m.workload == "llm-decode" && r.m.source == "caching")
            .unwrap();
        assert_eq!(caching.m.sys_allocs_per_call, Some(0.0));
        assert!(caching.x_static.is_some() && caching.tok_s > 0.0);
        assert!(caching.temp_bytes_per_token > 0.0);
        let system = rows
            .iter()
            .find(|r| r.m.workload == "llm-decode" && r.m.source == "system")
            .unwrap();
        assert!(
            system.m.sys_allocs_per_call.unwrap() > 0.0,
            "system mallocs every kernel's scratch"
        );
        let prefill = rows
            .iter()
            .find(|r| r.m.workload == "llm-prefill" && r.m.source == "static")
            .unwrap();
        assert!(prefill.m.ns_per_call.median > 0.0);
        assert!(dec.is_some() && pre.is_some());
        let report = LlmReport {
            machine: Machine::detect(),
            command: "test".into(),
            mode: "quick",
            config: cfg,
            arch: "tiny".into(),
            threads: 2,
            sgemm_threads: None,
            isa: "test".into(),
            rows,
            decode_eff: dec,
            prefill_eff: pre,
            errors,
            elapsed_s: 0.0,
            load_avg_end: 0.0,
        };
        let j = report.to_json();
        assert_eq!(j["measurements"][0]["time"]["median"]["unit"], "ns/prefill");
        assert_eq!(
            j["measurements"][0]["minor_page_faults_per_token"]["unit"],
            "faults/token"
        );
        let t = report.targets();
        assert!(t
            .iter()
            .any(|c| c.target.contains("within 1.01x of static on llm-decode")));
        assert!(report
            .headline()
            .iter()
            .any(|h| h.contains("as fast as system")));
    }
}
