//! `allocbench llm`: a whole Llama-family model (crate `llm`) generating tokens, its kernels'
//! scratch from every temp-memory source, and its speed against this machine's limits.
//!
//! **Allocator comparison.** One [`llm::Llama`] per source, all sharing one set of weights
//! (random, seeded, bf16, at a named real shape; or a checkpoint). Every source is warmed up
//! in turn (a prefill and the decode steps: every scratch size of the run seen once). A
//! measured *round* is `prefill_reps` prefills of the prompt (+ sampling the first token),
//! then `decode_tokens` decode steps (forward of one token + greedy sampling), each step run
//! on every source back to back in the order of [`crate::steps::step_order`] (forward,
//! backward, ...), so machine noise hits every source alike. `x static` is the median of a
//! source's step-by-step time over `static`'s; system allocations, page faults and temp bytes
//! are per token.
//!
//! **Efficiency**, with the `caching` source: decode tokens/s times the bytes of weights a
//! step reads, against a streaming read of as many bytes ([`crate::measure::stream_read`]);
//! prefill FLOP/s against matrixmultiply's sgemm on the model's largest matmul shape. Both
//! timed in alternating turns.

use std::path::PathBuf;
use std::sync::Arc;

use comfy_table::Table;
use serde_json::json;

use crate::harness::Measurement;
use crate::measure::{best, interleaved, median, sgemm, stream_read, Ratios};
use crate::report::{
    align_right, comparison_table, efficiency_check, goal, markdown_table, pct, within_static,
    Column, RunInfo, Section, TargetCheck, CACHING,
};
use crate::source::{
    ScratchSource, ScratchWorker, SourceConfig, SourceKind, LLM_ONLY, RUNNER_CAP, SOURCES,
};
use crate::steps::{KernelRun, Steps};
use llm::safetensors::DType;
use llm::scratch_profile::ScratchProfile;
use llm::{Llama, ModelOptions, Module, Sampler, TempRef, Weights};

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

/// What `allocbench llm` runs.
#[derive(Clone, Debug, serde::Serialize)]
pub struct LlmConfig {
    /// The named shape (`smollm2-135m`, `llama-3.2-1b`) or the checkpoint directory.
    pub model: String,
    /// Real weights instead of random ones: a .gguf file or a checkpoint directory.
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
    /// The defaults: quick runs 1 measured round of 32 decode tokens, full runs 3 of 64
    /// (`allocbench llm` takes its count from `--decode-tokens`).
    pub fn new(quick: bool, shape: &str) -> Self {
        LlmConfig {
            model: shape.into(),
            model_dir: None,
            prompt_tokens: 128,
            decode_tokens: if quick { 32 } else { 64 },
            prefill_reps: 3,
            rounds: if quick { 1 } else { 3 },
            eff_reps: if quick { 3 } else { 7 },
            seed: 1,
        }
    }

    /// Tests: the [`TINY`] shape, a 12-token prompt, 4 decode tokens, one round.
    pub fn tiny() -> Self {
        LlmConfig {
            model: TINY.into(),
            model_dir: None,
            prompt_tokens: 12,
            decode_tokens: 4,
            prefill_reps: 2,
            rounds: 1,
            eff_reps: 1,
            seed: 1,
        }
    }
}

/// The shape name of a tiny model for tests (2 layers, hidden 64, vocab 300).
pub const TINY: &str = "tiny";

/// The tiny model's configuration: smollm2-135m's, shrunk.
fn tiny_config() -> Option<llm::LlamaConfig> {
    let mut c = llm::shapes::named("smollm2-135m")?;
    c.hidden_size = 64;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 16;
    c.intermediate_size = 96;
    c.num_layers = 2;
    c.vocab_size = 300;
    Some(c)
}

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

/// What the comparison and the efficiency probes of one `allocbench llm` run measured:
/// prefill then decode rows, every source (time per prefill or per decode token; faults,
/// system allocations and temp bytes per token; peaks over both phases, as one temp
/// allocator serves both).
pub type LlmRun = KernelRun<Option<WeightReadEfficiency>, Option<ModelPrefillEfficiency>>;

/// A model whose kernels take their scratch from a source's worker.
type Model<'w> = Llama<TempRef<'w, dyn ScratchWorker + 'w>>;

/// Loads or generates the weights.
pub fn weights(cfg: &LlmConfig) -> Result<Arc<Weights>, String> {
    let w = match &cfg.model_dir {
        Some(dir) => Weights::load(dir).map_err(|e| e.to_string())?,
        None => {
            let shape = if cfg.model == TINY {
                tiny_config()
            } else {
                llm::shapes::named(&cfg.model)
            };
            let c = shape.ok_or_else(|| {
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

/// The prompt: `prompt_tokens` random ids (seeded).
fn prompt(cfg: &LlmConfig, weights: &Weights) -> Vec<u32> {
    let vocab = weights.config.vocab_size as u64;
    let mut rng = llm::sample::Rng::new(cfg.seed ^ 0x5eed);
    (0..cfg.prompt_tokens.max(1))
        .map(|_| (rng.next_u64() % vocab) as u32)
        .collect()
}

/// Runs the comparison on `kinds`, then the scratch profile and the efficiency figures;
/// `tick` after every step. The profile: the kernels' scratch per phase and kernel name over
/// one prefill of the prompt and the round's decode tokens, with the runner's default temp
/// allocator.
pub fn run(
    cfg: &LlmConfig,
    weights: &Arc<Weights>,
    kinds: &[&SourceKind],
    source_config: &SourceConfig,
    tick: &dyn Fn(),
) -> (LlmRun, Option<ScratchProfile>) {
    let prompt = prompt(cfg, weights);
    let opts = ModelOptions {
        context: Some(prompt.len() + cfg.decode_tokens + cfg.eff_reps + 8),
    };
    let mut out = LlmRun::default();
    match compare(cfg, weights, &prompt, &opts, kinds, source_config, tick) {
        Ok(rows) => out.rows = rows,
        Err(e) => {
            out.errors.push(format!("building the model: {e}"));
            return (out, None);
        }
    }
    // ---- profile and efficiency, with the runner's default temp allocator ----
    let model = || {
        Llama::new(weights.clone(), llm::caching_temp(RUNNER_CAP), &opts).map_err(|e| e.to_string())
    };
    let profile = model().and_then(|mut m| {
        m.enable_scratch_profile();
        let mut tok = prefill(&mut m, &prompt)?;
        for _ in 0..cfg.decode_tokens {
            tok = decode(&mut m, tok)?;
        }
        Ok(m.scratch_profile().cloned().unwrap_or_default())
    });
    let mut model = match model() {
        Ok(m) => m,
        Err(e) => {
            out.errors.push(format!("efficiency model: {e}"));
            return (out, None);
        }
    };
    let mut probe = Probe {
        model: &mut model,
        prompt: &prompt,
        reps: cfg.eff_reps,
    };
    let decode_eff = probe.decode();
    tick();
    let prefill_eff = probe.prefill();
    tick();
    let errors = &mut out.errors;
    let profile = profile
        .map_err(|e| errors.push(format!("scratch profile: {e}")))
        .ok();
    out.decode_eff = decode_eff
        .map_err(|e| errors.push(format!("decode efficiency: {e}")))
        .ok();
    out.prefill_eff = prefill_eff
        .map_err(|e| errors.push(format!("prefill efficiency: {e}")))
        .ok();
    (out, profile)
}

/// A prefill of `prompt` from an empty cache, then the first token sampled (greedy).
fn prefill<A: caching_allocator::TempReset>(
    m: &mut Llama<A>,
    prompt: &[u32],
) -> Result<u32, String> {
    m.clear();
    m.forward(prompt).map_err(|e| e.to_string())?;
    m.sample(&mut Sampler::greedy()).map_err(|e| e.to_string())
}

/// One decode step: the forward pass of `tok`, then the next token sampled (greedy).
fn decode<A: caching_allocator::TempReset>(m: &mut Llama<A>, tok: u32) -> Result<u32, String> {
    m.forward(&[tok]).map_err(|e| e.to_string())?;
    m.sample(&mut Sampler::greedy()).map_err(|e| e.to_string())
}

/// The allocator comparison: one model per source, warmed up in turn, then the measured
/// rounds' prefills and decode steps interleaved over the sources.
fn compare(
    cfg: &LlmConfig,
    weights: &Arc<Weights>,
    prompt: &[u32],
    opts: &ModelOptions,
    kinds: &[&SourceKind],
    source_config: &SourceConfig,
    tick: &dyn Fn(),
) -> Result<Vec<Measurement>, String> {
    let sources: Vec<Box<dyn ScratchSource>> =
        kinds.iter().map(|k| (k.build)(source_config)).collect();
    let workers: Vec<Box<dyn ScratchWorker + '_>> = sources.iter().map(|s| s.worker()).collect();
    let mut models: Vec<Model<'_>> = workers
        .iter()
        .map(|w| Llama::new(weights.clone(), TempRef(w.as_ref()), opts))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let counters = |i: usize| sources[i].counters().plus(workers[i].counters());
    let mut pre = Steps::new(kinds, &counters);
    let mut dec = Steps::new(kinds, &counters);
    // The next token of each source's model, and its temp bytes per phase (measured steps).
    let mut next_tok = vec![0u32; models.len()];
    let mut temp = vec![[0u64; 2]; models.len()];
    // Warm-up: one round per source, in turn (every scratch size of the run seen once).
    for (i, m) in models.iter_mut().enumerate() {
        pre.warm_up(i, || {
            next_tok[i] = prefill(m, prompt)?;
            Ok(())
        });
        dec.warm_up(i, || {
            for _ in 0..cfg.decode_tokens {
                next_tok[i] = decode(m, next_tok[i])?;
            }
            Ok(())
        });
    }
    // One measured step of `phase` (0 prefill, 1 decode) on source `i`, its temp bytes counted.
    let mut step = |i: usize, phase: usize| {
        let m = &mut models[i];
        let b0 = m.temp_usage().bytes;
        next_tok[i] = match phase {
            0 => prefill(m, prompt)?,
            _ => decode(m, next_tok[i])?,
        };
        temp[i][phase] += m.temp_usage().bytes - b0;
        Ok(if phase == 0 { prompt.len() as u64 } else { 1 })
    };
    for _ in 0..cfg.rounds {
        for _ in 0..cfg.prefill_reps.max(1) {
            pre.step(|i| step(i, 0));
            tick();
        }
        for _ in 0..cfg.decode_tokens {
            dec.step(|i| step(i, 1));
            tick();
        }
    }
    let ns = |t: &[f64]| t.iter().map(|x| x * 1e9).collect();
    let mut rows = pre.measurements("llm-prefill", "prefill", ns);
    rows.extend(dec.measurements("llm-decode", "token", ns));
    let n = kinds.len();
    for (k, r) in rows.iter_mut().enumerate() {
        r.temp_bytes_per_call = Some(temp[k % n][k / n] as f64 / r.calls_total.max(1) as f64);
    }
    Ok(rows)
}

/// The efficiency probes of a model: its prefill of `prompt` or its decode against this
/// machine's limit, `reps` rounds in turns.
struct Probe<'a> {
    model: &'a mut Llama<caching_allocator::CachingAllocator>,
    prompt: &'a [u32],
    reps: usize,
}

impl Probe<'_> {
    /// Decode against a streaming read of the weight bytes one step reads.
    fn decode(&mut self) -> Result<WeightReadEfficiency, String> {
        let (model, prompt, reps) = (&mut *self.model, self.prompt, self.reps);
        let wbytes = model.weights().decode_weight_bytes();
        let mut tok = prefill(model, prompt)?;
        let buf = vec![1.0f32; wbytes / 4];
        let mut err = None;
        let mut read = || stream_read(&buf, 1);
        let mut step = || match decode(model, tok) {
            Ok(t) => tok = t,
            Err(e) => err = err.take().or(Some(e)),
        };
        let rounds = interleaved(reps, &mut [&mut read, &mut step]);
        if let Some(e) = err {
            return Err(e);
        }
        let gbs = |t: f64| wbytes as f64 / t / 1e9;
        let ratios: Vec<f64> = rounds.iter().map(|r| r[0] / r[1]).collect();
        Ok(WeightReadEfficiency {
            weight_bytes: wbytes,
            stream_gbs: gbs(best(&rounds, 0)),
            decode_gbs: gbs(best(&rounds, 1)),
            ratios: Ratios {
                ratio_best: best(&rounds, 0) / best(&rounds, 1),
                ratio_median: median(&ratios),
            },
        })
    }

    /// The whole prefill against sgemm at the model's largest matmul shape.
    fn prefill(&mut self) -> Result<ModelPrefillEfficiency, String> {
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
            if let Err(e) = prefill(model, prompt) {
                err.get_or_insert(e);
            }
        };
        let rounds = interleaved(reps, &mut [&mut gemm, &mut run]);
        if let Some(e) = err {
            return Err(e);
        }
        let gemm_flops = 2.0 * (m * k * n) as f64;
        let ratios: Vec<f64> = rounds
            .iter()
            .map(|r| (flops / r[1]) / (gemm_flops / r[0]))
            .collect();
        let sg = gemm_flops / best(&rounds, 0) / 1e9;
        let pf = flops / best(&rounds, 1) / 1e9;
        Ok(ModelPrefillEfficiency {
            flops,
            sgemm_shape: (m, k, n),
            sgemm_gflops: sg,
            prefill_gflops: pf,
            ratios: Ratios {
                ratio_best: pf / sg,
                ratio_median: median(&ratios),
            },
        })
    }
}

/// Progress units of a run: the measured steps, plus two efficiency figures.
pub fn progress_units(cfg: &LlmConfig) -> usize {
    cfg.rounds * (cfg.decode_tokens + cfg.prefill_reps.max(1)) + 2
}

/// The model's architecture in one line.
fn describe(cfg: &LlmConfig, weights: &Weights) -> String {
    let c = &weights.config;
    format!(
        "{}: hidden {}, {} layers, {} heads, {} kv heads, head_dim {}, FFN {}, vocab {}, {}, \
         rope_theta {}{}; {:?} weights, {:.1} MiB read per decode token",
        cfg.model,
        c.hidden_size,
        c.num_layers,
        c.num_heads,
        c.num_kv_heads,
        c.head_dim,
        c.intermediate_size,
        c.vocab_size,
        if c.tie_word_embeddings {
            "tied"
        } else {
            "separate head"
        },
        c.rope_theta,
        if c.rope_scaling.is_some() {
            " (llama3 scaling)"
        } else {
            ""
        },
        weights.layers.first().map_or("no", |l| l.q.type_name()),
        weights.decode_weight_bytes() as f64 / (1 << 20) as f64
    )
}

/// Runs `allocbench llm` on `kinds` in this process and reports it as a [`Section`]; only an
/// error when the weights could not be had.
pub fn run_part(cfg: &LlmConfig, quick: bool, kinds: &[&SourceKind]) -> Section {
    let started = std::time::Instant::now();
    let weights = match weights(cfg) {
        Ok(w) => w,
        Err(e) => return Section::failed(format!("llm: {e}")),
    };
    let ready_s = started.elapsed().as_secs_f64();
    let pb = crate::output::progress_bar(progress_units(cfg));
    pb.set_message("llm");
    // On a rayon worker, as `llm generate` runs: the kernels' parallel sections then start
    // inside the pool instead of waking the main thread through a latch after each of the
    // ~240 sections per token. Inline when the main thread is a member
    // ([`crate::parts::init_threads`]); this covers a single-thread pool, which keeps its own worker.
    let (r, profile) =
        rayon::scope(|_| run(cfg, &weights, kinds, &llm_source_config(), &|| pb.inc(1)));
    pb.finish_and_clear();
    let info = RunInfo::now(quick, rayon::current_num_threads(), started);
    let about = Setup {
        cfg,
        arch: describe(cfg, &weights),
        isa: format!("{:?}", ::llm::kernels::isa()),
        threads: info.threads,
    };
    section(&about, r, profile.as_ref(), &info, ready_s)
}

/// What ran, as the report describes it.
struct Setup<'a> {
    cfg: &'a LlmConfig,
    arch: String,
    isa: String,
    threads: usize,
}

/// Tokens per second of a row, from its median step.
fn tok_s(cfg: &LlmConfig, m: &Measurement) -> f64 {
    let tokens = if m.unit == "prefill" {
        cfg.prompt_tokens as f64
    } else {
        1.0
    };
    tokens * m.calls_per_sec
}

/// The report's section of run `r` and its scratch `profile`: the comparison, efficiency and
/// scratch-profile tables, the targets and the JSON; the weights took `ready_s` seconds to
/// load or generate.
fn section(
    s: &Setup<'_>,
    r: LlmRun,
    profile: Option<&ScratchProfile>,
    info: &RunInfo,
    ready_s: f64,
) -> Section {
    let cfg = s.cfg;
    let comparison = comparison_table(
        &r.rows,
        &[Column {
            header: "tok/s",
            cell: &|m| format!("{:.1}", tok_s(cfg, m)),
        }],
        &[Column {
            header: "temp B/token",
            cell: &|m| format!("{:.0}", m.temp_bytes_per_call.unwrap_or(0.0)),
        }],
    );
    let headline = headline(&r.rows);
    let mut blocks = vec![
        format!(
            "{} measured rounds after 1 warm-up; {} rayon threads, kernels {}; weights ready in \
             {ready_s:.1} s\nmodel: {}\nround: prefill of {} tokens, then {} decode tokens, \
             interleaved across sources",
            cfg.rounds, s.threads, s.isa, s.arch, cfg.prompt_tokens, cfg.decode_tokens,
        ),
        format!(
            "Allocator comparison (median step; x static / x caching: median of step-by-step \
             ratios over the same interleaved steps; temp bytes, faults and system allocations \
             per token):\n\n{comparison}"
        ),
        headline.join("\n"),
        format!(
            "Efficiency (caching source, alternating turns with the baseline):\n\n{}",
            efficiency_table(&r, cfg.prompt_tokens)
        ),
    ];
    if let Some(p) = profile {
        blocks.push(format!(
            "Scratch profile (caching source; one prefill of {} tokens and {} decode tokens; \
             per token: over the prompt's tokens for prefill, per decode step):\n\n{}",
            cfg.prompt_tokens,
            cfg.decode_tokens,
            profile_table(p, cfg.prompt_tokens, cfg.decode_tokens)
        ));
    }
    blocks.extend(r.errors.iter().map(|e| format!("not measured: {e}")));
    let workloads = [
        (
            "llm-prefill",
            format!(
                "{}: prefill of {} tokens + sampling",
                cfg.model, cfg.prompt_tokens
            ),
        ),
        (
            "llm-decode",
            format!(
                "{}: one decode token (forward + greedy sampling), {} per round",
                cfg.model, cfg.decode_tokens
            ),
        ),
    ];
    let fields = json!({
        "sgemm_threads": crate::measure::sgemm_threads(),
        "kernels": s.isa,
        "config": cfg,
        "architecture": s.arch,
        "workloads": workloads.iter().map(|(n, d)| json!({"name": n, "step": d})).collect::<Vec<_>>(),
        "headline": headline,
        "efficiency": {
            "decode": r.decode_eff,
            "prefill": r.prefill_eff,
            "errors": r.errors,
        },
        "scratch_profile": profile.map(|p| p.to_json(cfg.prompt_tokens, cfg.decode_tokens)),
    });
    let mut out = Section {
        title: "llm: a whole model generating".into(),
        blocks,
        targets: targets(&r, s.threads),
        rows: r.rows,
        ..Section::default()
    }
    .with_json("llm", info, fields);
    if let Some((_, j)) = &mut out.json {
        for (k, m) in out.rows.iter().enumerate() {
            j["measurements"][k]["tokens_per_second"] = json!(tok_s(cfg, m));
        }
    }
    out
}

/// The efficiency table, as Markdown.
fn efficiency_table(r: &LlmRun, prompt_tokens: usize) -> Table {
    let mut t = markdown_table(&[
        "phase",
        "model",
        "baseline",
        "ratio (best)",
        "ratio (median)",
    ]);
    if let Some(d) = &r.decode_eff {
        let mib = d.weight_bytes as f64 / (1 << 20) as f64;
        let mut row = vec!["decode".into()];
        row.push(format!(
            "{:.2} GB/s of weights ({mib:.1} MiB/token)",
            d.decode_gbs
        ));
        row.push(format!("streaming read {:.2} GB/s", d.stream_gbs));
        row.extend(d.ratios.percent());
        t.add_row(row);
    }
    if let Some(p) = &r.prefill_eff {
        let (m, k, n) = p.sgemm_shape;
        let mut row = vec![format!("prefill {prompt_tokens}")];
        row.push(format!("{:.1} GFLOP/s", p.prefill_gflops));
        row.push(format!("sgemm {m}x{k}x{n} {:.1} GFLOP/s", p.sgemm_gflops));
        row.extend(p.ratios.percent());
        t.add_row(row);
    }
    t
}

/// The scratch profile as a table: per phase and kernel name, the calls, the largest scratch
/// one call took and the scratch per token (the phase's prompt or decode tokens).
pub fn profile_table(p: &ScratchProfile, prefill_tokens: usize, decode_tokens: usize) -> Table {
    let mut t = markdown_table(&["phase", "kernel", "calls", "max call B", "B/token"]);
    for e in p.entries() {
        let tokens = if e.phase == "decode" {
            decode_tokens
        } else {
            prefill_tokens
        };
        t.add_row(vec![
            e.phase.to_string(),
            e.kernel.to_string(),
            e.calls.to_string(),
            e.max_call_bytes.to_string(),
            format!("{:.0}", e.total_bytes as f64 / tokens.max(1) as f64),
        ]);
    }
    align_right(&mut t, 2..5);
    t
}

/// The headline: what `caching` buys against `system`, `fresh-pages` and `exact-cache`, per
/// phase (their time over `caching`'s, median over the same steps).
fn headline(rows: &[Measurement]) -> Vec<String> {
    let mut out = Vec::new();
    for phase in ["llm-decode", "llm-prefill"] {
        for rival in ["system", "fresh-pages", "exact-cache"] {
            let x = rows
                .iter()
                .find(|m| m.workload == phase && m.source == rival)
                .and_then(|r| r.x_caching);
            if let Some(x) = x {
                out.push(format!(
                    "{phase}: {rival} takes {x:.3}x caching's time (median of step-by-step \
                     ratios)"
                ));
            }
        }
    }
    out
}

/// The developers' targets, met or missed as measured on `threads` threads.
fn targets(r: &LlmRun, threads: usize) -> Vec<TargetCheck> {
    let mut out = within_static(&r.rows, goal::LLM_WITHIN_STATIC, &[CACHING], false);
    for phase in ["llm-decode", "llm-prefill"] {
        let Some(m) = r
            .rows
            .iter()
            .find(|m| m.workload == phase && m.source == CACHING)
        else {
            continue;
        };
        out.push(TargetCheck {
            target: format!("caching: 0 page faults and 0 system allocations per token on {phase}"),
            measured: format!(
                "{:.3} faults/token, {} system allocations/token",
                m.faults_per_call,
                m.sys_allocs_per_call
                    .map_or_else(|| "?".into(), |x| format!("{x:.3}"))
            ),
            met: Some(m.faults_per_call == 0.0 && m.sys_allocs_per_call == Some(0.0)),
        });
    }
    if let Some(d) = &r.decode_eff {
        let goal = goal::LLM_DECODE_STREAM;
        let target = format!("decode >= {} of the weight-streaming bound", pct(goal));
        let figures = [d.decode_gbs, d.stream_gbs].map(|x| format!("{x:.2} GB/s"));
        out.push(efficiency_check(
            format!("{target} ({threads} threads)"),
            figures,
            d.ratios,
            goal,
        ));
    }
    if let Some(p) = &r.prefill_eff {
        let goal = goal::LLM_PREFILL_SGEMM;
        let target = format!(
            "prefill >= {} of sgemm GFLOP/s ({threads} threads)",
            pct(goal)
        );
        let figures = [p.prefill_gflops, p.sgemm_gflops].map(|x| format!("{x:.1} GFLOP/s"));
        out.push(efficiency_check(target, figures, p.ratios, goal));
    }
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny model through the whole run: rows for every (phase, source), ratios against
    /// static, zero system allocations per token for the cache in steady state, the scratch
    /// profile, JSON units.
    #[test]
    fn smoke_run_on_a_tiny_model() {
        let cfg = LlmConfig::tiny();
        let w = weights(&cfg).unwrap();
        let kinds: Vec<&SourceKind> = ["caching", "static", "system"]
            .iter()
            .map(|n| find_source(n).unwrap())
            .collect();
        let (r, profile) = run(&cfg, &w, &kinds, &SourceConfig::default(), &|| {});
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert_eq!(r.rows.len(), 6);
        let get = |phase: &str, source: &str| {
            r.rows
                .iter()
                .find(|m| m.workload == phase && m.source == source)
                .unwrap()
        };
        let caching = get("llm-decode", "caching");
        assert_eq!(caching.sys_allocs_per_call, Some(0.0));
        assert!(caching.x_static.is_some() && caching.calls_per_sec > 0.0);
        assert!(caching.temp_bytes_per_call.is_some_and(|b| b > 0.0));
        let system = get("llm-decode", "system");
        assert!(
            system.sys_allocs_per_call.unwrap() > 0.0,
            "system mallocs every kernel's scratch"
        );
        assert!(get("llm-prefill", "static").ns_per_call.median > 0.0);
        assert!(r.decode_eff.is_some() && r.prefill_eff.is_some());
        let about = Setup {
            cfg: &cfg,
            arch: "tiny".into(),
            isa: "test".into(),
            threads: 2,
        };
        let s = section(
            &about,
            r,
            profile.as_ref(),
            &crate::report::tests::info(),
            0.0,
        );
        let (key, j) = s.json.clone().unwrap();
        assert_eq!(key, "llm");
        assert_eq!(
            j["measurements"][0]["time_per_call"]["median"]["unit"],
            "ns/prefill"
        );
        let tok_s = j["measurements"][0]["tokens_per_second"].as_f64().unwrap();
        assert!(tok_s > 0.0, "{tok_s}");
        assert!(s
            .targets
            .iter()
            .any(|c| c.target.contains("within 1.01x of static on llm-decode")));
        assert!(j["headline"][0].as_str().unwrap().contains("system takes"));
        // The scratch profile: one prefill and `decode_tokens` decode steps, every kernel's
        // largest call no more than its total, and a table row per (phase, kernel).
        let kernels = j["scratch_profile"]["kernels"].as_array().unwrap();
        assert!(!kernels.is_empty(), "{j}");
        for phase in ["prefill", "decode"] {
            assert!(kernels.iter().any(|k| k["phase"] == phase), "{phase}");
        }
        for k in kernels {
            let (max, total) = (k["max_call_bytes"].as_u64(), k["total_bytes"].as_u64());
            assert!(k["calls"].as_u64() > Some(0) && max <= total, "{k}");
        }
        let attention = |phase: &str| {
            let k = kernels
                .iter()
                .find(|k| k["phase"] == phase && k["kernel"] == "attention");
            k.and_then(|k| k["max_call_bytes"].as_u64())
        };
        // Prefill's attention scores cover the prompt; decode's one row.
        assert!(attention("prefill") > attention("decode"), "{j}");
        assert!(attention("decode") > Some(0), "{j}");
        let decode_calls = kernels
            .iter()
            .filter(|k| k["phase"] == "decode")
            .map(|k| k["calls"].as_u64().unwrap())
            .max()
            .unwrap();
        assert_eq!(decode_calls % cfg.decode_tokens as u64, 0, "{j}");
        let details = s.details().unwrap();
        assert!(details.contains("Scratch profile"), "{details}");
        let rows = details
            .lines()
            .filter(|l| l.starts_with("| decode"))
            .count();
        let decode_kernels = kernels.iter().filter(|k| k["phase"] == "decode").count();
        assert_eq!(rows, decode_kernels + 1, "{details}"); // + the efficiency table's row
    }
}
