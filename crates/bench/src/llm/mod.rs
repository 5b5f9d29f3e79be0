//! `allocbench llm`: a whole Llama-family model (crate `llm`) generating tokens, its kernels'
//! scratch from every temp-memory source, and its speed against this machine's limits.
//!
//! **Allocator comparison.** One [`llm::Llama`] per source, all sharing one set of weights
//! (random, seeded, bf16, at a named real shape; or a checkpoint). Every source is warmed up
//! in turn (a prefill and the decode steps: every scratch size of the run seen once). A
//! measured *round* is `prefill_reps` prefills of the prompt (+ sampling the first token),
//! then `decode_tokens` decode steps (forward of one token + greedy sampling: the
//! `llm-decode` row), then as many more with sampling as a chat runner samples
//! ([`sampled`]: temperature, top-p and a fixed seed, so every source and every round draws
//! the same tokens; the `llm-decode-sampled` row, whose top-p sort over the vocabulary takes
//! megabytes of scratch), each step run on every source back to back in the order of
//! [`crate::steps::step_order`] (forward, backward, ...), so machine noise hits every source
//! alike. `x static` is the median of a source's step-by-step time over `static`'s; system
//! allocations, page faults and temp bytes are per token.
//!
//! **Efficiency**, with the `caching` source: decode tokens/s times the bytes of weights a
//! step reads, against a streaming read of as many bytes ([`crate::measure::stream_read`]);
//! prefill FLOP/s against matrixmultiply's sgemm on the model's largest matmul shape. Both
//! timed in alternating turns (module `probe`).
//!
//! **Scratch profile**: per phase and kernel name, what the kernels took from the runner's
//! default temp allocator over one prefill and `decode_tokens` decode steps, every token
//! sampled as the `llm-decode-sampled` row samples (so the sampler's scratch shows beside
//! the logits'). Module `section` turns it all into the report's section.

mod probe;
mod section;

use std::path::PathBuf;
use std::sync::Arc;

use crate::harness::Measurement;
use crate::report::{RunInfo, Section};
use crate::source::{
    ScratchSource, ScratchWorker, SourceConfig, SourceKind, LLM_ONLY, RUNNER_CAP, SOURCES,
};
use crate::steps::{KernelRun, Steps};
use llm::safetensors::DType;
use llm::scratch_profile::ScratchProfile;
use llm::{Llama, ModelOptions, Module, Sampler, TempRef, Weights};
use probe::Probe;
pub use probe::{ModelPrefillEfficiency, WeightReadEfficiency};
use section::{section, Setup};

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

/// The temperature of the sampled decode: ExecuTorch's LLM runner's default.
pub const SAMPLED_TEMPERATURE: f32 = 0.8;

/// The top-p of the sampled decode: ExecuTorch's LLM runner's (its `kTopp`).
pub const SAMPLED_TOP_P: f32 = 0.9;

/// The sampler of the `llm-decode-sampled` row and of the scratch profile: temperature
/// [`SAMPLED_TEMPERATURE`], top-p [`SAMPLED_TOP_P`], seeded with `seed` (reproducible: the
/// same logits draw the same tokens).
pub fn sampled(seed: u64) -> Sampler {
    // Both constants are in range, so `new` cannot refuse them; greedy would only hide the
    // sampler's scratch, which is why the row exists.
    Sampler::new(SAMPLED_TEMPERATURE, SAMPLED_TOP_P, seed).unwrap_or_else(|_| Sampler::greedy())
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
    /// Decode steps per round, and as many more sampled ones.
    pub decode_tokens: usize,
    /// Prefills per measured round (each on every source, interleaved).
    pub prefill_reps: usize,
    /// Measured rounds (after one warm-up round).
    pub rounds: usize,
    /// Alternating turns of each efficiency measurement.
    pub eff_reps: usize,
    /// Weight, prompt and sampling seed.
    pub seed: u64,
}

impl LlmConfig {
    /// The defaults: quick runs 1 measured round of 2 prefills and 16 decode tokens (after a
    /// warm-up round, so the main command stays within 4 minutes on a busy machine), full
    /// runs 3 of 3 prefills and 64 (`allocbench llm` takes its count from `--decode-tokens`).
    pub fn new(quick: bool, shape: &str) -> Self {
        LlmConfig {
            model: shape.into(),
            model_dir: None,
            prompt_tokens: 128,
            decode_tokens: if quick { 16 } else { 64 },
            prefill_reps: if quick { 2 } else { 3 },
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
        context: Some(prompt.len() + 2 * cfg.decode_tokens + cfg.eff_reps + 8),
        ..Default::default()
    };
    let mut out = LlmRun::default();
    let rows = compare(cfg, weights, &prompt, &opts, kinds, source_config, tick);
    let Some(rows) = out.keep("building the model", rows) else {
        return (out, None);
    };
    out.rows = rows;
    // ---- profile and efficiency, with the runner's default temp allocator ----
    let model = || {
        Llama::new(weights.clone(), llm::caching_temp(RUNNER_CAP), &opts).map_err(|e| e.to_string())
    };
    let profile = model().and_then(|mut m| {
        m.enable_scratch_profile();
        let mut sampler = sampled(cfg.seed);
        let mut tok = prefill(&mut m, &prompt, &mut sampler)?;
        for _ in 0..cfg.decode_tokens {
            tok = decode(&mut m, tok, &mut sampler)?;
        }
        Ok(m.scratch_profile().cloned().unwrap_or_default())
    });
    let Some(mut model) = out.keep("efficiency model", model()) else {
        return (out, None);
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
    let profile = out.keep("scratch profile", profile);
    out.decode_eff = out.keep("decode efficiency", decode_eff);
    out.prefill_eff = out.keep("prefill efficiency", prefill_eff);
    (out, profile)
}

/// A prefill of `prompt` from an empty cache, then the first token sampled by `sampler`.
fn prefill<A: caching_allocator::TempReset>(
    m: &mut Llama<A>,
    prompt: &[u32],
    sampler: &mut Sampler,
) -> Result<u32, String> {
    m.clear();
    m.forward(prompt).map_err(|e| e.to_string())?;
    m.sample(sampler).map_err(|e| e.to_string())
}

/// One decode step: the forward pass of `tok`, then the next token sampled by `sampler`.
fn decode<A: caching_allocator::TempReset>(
    m: &mut Llama<A>,
    tok: u32,
    sampler: &mut Sampler,
) -> Result<u32, String> {
    m.forward(&[tok]).map_err(|e| e.to_string())?;
    m.sample(sampler).map_err(|e| e.to_string())
}

/// A measured phase of a round: its workload name, its unit, and how it samples.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// `prefill_reps` prefills of the prompt, greedy first token.
    Prefill,
    /// `decode_tokens` decode steps, greedy.
    Decode,
    /// `decode_tokens` more decode steps, [`sampled`].
    DecodeSampled,
}

impl Phase {
    /// Every phase, in round order.
    const ALL: [Phase; 3] = [Phase::Prefill, Phase::Decode, Phase::DecodeSampled];

    /// The workload name of its rows.
    fn workload(self) -> &'static str {
        match self {
            Phase::Prefill => "llm-prefill",
            Phase::Decode => "llm-decode",
            Phase::DecodeSampled => "llm-decode-sampled",
        }
    }

    /// The unit of one step.
    fn unit(self) -> &'static str {
        match self {
            Phase::Prefill => "prefill",
            _ => "token",
        }
    }
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
    let mut steps = Phase::ALL.map(|_| Steps::new(kinds, &counters));
    // Each source's next token, its sampler (re-seeded as each phase starts, so every source
    // and round draws alike), and its temp bytes per phase (measured steps).
    let mut next_tok = vec![0u32; models.len()];
    let mut samplers = vec![sampled(cfg.seed); models.len()];
    let mut temp = vec![[0u64; Phase::ALL.len()]; models.len()];
    // The steps of `phase` in one round.
    let reps = |phase: Phase| match phase {
        Phase::Prefill => cfg.prefill_reps.max(1),
        _ => cfg.decode_tokens,
    };
    // Warm-up: one round per source, in turn (every scratch size of the run seen once).
    for (i, m) in models.iter_mut().enumerate() {
        for (p, phase) in Phase::ALL.into_iter().enumerate() {
            samplers[i] = sampled(cfg.seed);
            let (tok, sampler) = (&mut next_tok[i], &mut samplers[i]);
            steps[p].warm_up(i, || {
                (0..reps(phase))
                    .try_for_each(|_| phase_step(m, phase, prompt, tok, sampler).map(drop))
            });
        }
    }
    for _ in 0..cfg.rounds {
        for (p, phase) in Phase::ALL.into_iter().enumerate() {
            samplers.fill(sampled(cfg.seed));
            for _ in 0..reps(phase) {
                // One measured step on source `i`, its temp bytes counted.
                steps[p].step(|i| {
                    let m = &mut models[i];
                    let b0 = m.temp_usage().bytes;
                    let n = phase_step(m, phase, prompt, &mut next_tok[i], &mut samplers[i])?;
                    temp[i][p] += m.temp_usage().bytes - b0;
                    Ok(n)
                });
                tick();
            }
        }
    }
    let ns = |t: &[f64]| t.iter().map(|x| x * 1e9).collect();
    let mut rows = Vec::new();
    for (s, phase) in steps.iter().zip(Phase::ALL) {
        rows.extend(s.measurements(phase.workload(), phase.unit(), ns));
    }
    let n = kinds.len();
    for (k, r) in rows.iter_mut().enumerate() {
        r.temp_bytes_per_call = Some(temp[k % n][k / n] as f64 / r.calls_total.max(1) as f64);
    }
    Ok(rows)
}

/// One step of `phase` on model `m`: a prefill of `prompt` or a decode of `tok`, then `tok`
/// set to the next token (greedy but in [`Phase::DecodeSampled`], which takes `sampler`);
/// the tokens it ran.
fn phase_step<A: caching_allocator::TempReset>(
    m: &mut Llama<A>,
    phase: Phase,
    prompt: &[u32],
    tok: &mut u32,
    sampler: &mut Sampler,
) -> Result<u64, String> {
    *tok = match phase {
        Phase::Prefill => prefill(m, prompt, &mut Sampler::greedy())?,
        Phase::Decode => decode(m, *tok, &mut Sampler::greedy())?,
        Phase::DecodeSampled => decode(m, *tok, sampler)?,
    };
    Ok(if phase == Phase::Prefill {
        prompt.len() as u64
    } else {
        1
    })
}

/// Progress units of a run: the measured steps, plus two efficiency figures.
pub fn progress_units(cfg: &LlmConfig) -> usize {
    cfg.rounds * (2 * cfg.decode_tokens + cfg.prefill_reps.max(1)) + 2
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
    // On a rayon worker, as `llm generate` runs: the kernels' parallel sections then start
    // inside the pool instead of waking the main thread through a latch after each of the
    // ~240 sections per token. Inline when the main thread is a member
    // ([`crate::measure::init_threads`]); this covers a single-thread pool, which keeps its own worker.
    let (r, profile) = crate::output::with_progress(progress_units(cfg), "llm", |tick| {
        rayon::scope(|_| run(cfg, &weights, kinds, &llm_source_config(), tick))
    });
    let info = RunInfo::now(quick, rayon::current_num_threads(), started);
    let about = Setup {
        cfg,
        arch: describe(cfg, &weights),
        isa: format!("{:?}", ::llm::kernels::isa()),
        threads: info.threads,
    };
    section(&about, r, profile.as_ref(), &info, ready_s)
}

/// Every llm source, in table order.
pub fn llm_sources() -> Vec<&'static SourceKind> {
    let all = || SOURCES.iter().chain(LLM_ONLY);
    let named = |n: &&str| all().find(|k| k.name == *n);
    LLM_SOURCE_NAMES.iter().filter_map(named).collect()
}
