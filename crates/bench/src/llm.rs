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
use serde_json::{json, Value};

use crate::harness::Measurement;
use crate::measure::{best, interleaved, median, sgemm, stream_read};
use crate::report::{
    comparison_table, efficiency_check, goal, markdown_table, pct, within_static, Column, RunInfo,
    TargetCheck, CACHING,
};
use crate::source::{ScratchSource, ScratchWorker, SourceConfig, SourceKind, LLM_ONLY, SOURCES};
use crate::steps::Steps;
use llm::safetensors::DType;
use llm::{Llama, ModelOptions, Module, Sampler, TempRef, Weights};

use crate::source::RUNNER_CAP;

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
    /// Best over best.
    pub ratio_best: f64,
    /// Median of same-turn ratios.
    pub ratio_median: f64,
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
    /// Best over best.
    pub ratio_best: f64,
    /// Median of same-turn ratios.
    pub ratio_median: f64,
}

/// A whole `allocbench llm` run.
#[derive(Clone, Debug)]
pub struct LlmReport {
    /// Where and how it ran (`threads`: rayon threads).
    pub info: RunInfo,
    /// What ran.
    pub config: LlmConfig,
    /// The model's architecture, as a one-line description.
    pub arch: String,
    /// matrixmultiply's threads, if known.
    pub sgemm_threads: Option<usize>,
    /// The kernels' SIMD path.
    pub isa: String,
    /// Prefill then decode, every source: time per prefill or per decode token; faults,
    /// system allocations and temp bytes per token; peaks over both phases (one temp
    /// allocator serves both).
    pub rows: Vec<Measurement>,
    /// Decode efficiency.
    pub decode_eff: Option<WeightReadEfficiency>,
    /// Prefill efficiency.
    pub prefill_eff: Option<ModelPrefillEfficiency>,
    /// What could not be measured, with why.
    pub errors: Vec<String>,
}

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

/// Runs the comparison on `kinds` and the efficiency figures; `tick` after every step.
pub fn run(
    cfg: &LlmConfig,
    weights: &Arc<Weights>,
    kinds: &[&SourceKind],
    source_config: &SourceConfig,
    tick: &dyn Fn(),
) -> (
    Vec<Measurement>,
    Option<WeightReadEfficiency>,
    Option<ModelPrefillEfficiency>,
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
    let counters = |i: usize| sources[i].counters().plus(workers[i].counters());
    let mut pre = Steps::new(kinds, &counters);
    let mut dec = Steps::new(kinds, &counters);
    let mut sampler = Sampler::greedy();
    // The next token of each source's model, and its temp bytes per phase (measured steps).
    let mut next_tok = vec![0u32; models.len()];
    let mut temp = vec![[0u64; 2]; models.len()];
    let prefill = |m: &mut Model<'_>, sampler: &mut Sampler| {
        m.clear();
        m.forward(&prompt).map_err(|e| e.to_string())?;
        m.sample(sampler).map_err(|e| e.to_string())
    };
    let decode = |m: &mut Model<'_>, tok: u32, sampler: &mut Sampler| {
        m.forward(&[tok]).map_err(|e| e.to_string())?;
        m.sample(sampler).map_err(|e| e.to_string())
    };
    // Warm-up: one round per source, in turn (every scratch size of the run seen once).
    for (i, m) in models.iter_mut().enumerate() {
        pre.warm_up(i, || {
            next_tok[i] = prefill(m, &mut sampler)?;
            Ok(())
        });
        dec.warm_up(i, || {
            for _ in 0..cfg.decode_tokens {
                next_tok[i] = decode(m, next_tok[i], &mut sampler)?;
            }
            Ok(())
        });
    }
    for _ in 0..cfg.rounds {
        for _ in 0..cfg.prefill_reps.max(1) {
            pre.step(|i| {
                let b0 = models[i].temp_usage().bytes;
                next_tok[i] = prefill(&mut models[i], &mut sampler)?;
                temp[i][0] += models[i].temp_usage().bytes - b0;
                Ok(prompt.len() as u64)
            });
            tick();
        }
        for _ in 0..cfg.decode_tokens {
            dec.step(|i| {
                let b0 = models[i].temp_usage().bytes;
                next_tok[i] = decode(&mut models[i], next_tok[i], &mut sampler)?;
                temp[i][1] += models[i].temp_usage().bytes - b0;
                Ok(1)
            });
            tick();
        }
    }
    let ns = |t: &[f64]| t.iter().map(|x| x * 1e9).collect();
    let mut rows = pre.measurements("llm-prefill", "prefill", ns);
    rows.extend(dec.measurements("llm-decode", "token", ns));
    let n = models.len();
    for (k, r) in rows.iter_mut().enumerate() {
        r.temp_bytes_per_call = Some(temp[k % n][k / n] as f64 / r.calls_total.max(1) as f64);
    }
    drop(pre);
    drop(dec);
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
    let decode_eff = (|| -> Result<WeightReadEfficiency, String> {
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
        Ok(WeightReadEfficiency {
            weight_bytes: wbytes,
            stream_gbs: gbs(best(&rounds, 0)),
            decode_gbs: gbs(best(&rounds, 1)),
            ratio_best: best(&rounds, 0) / best(&rounds, 1),
            ratio_median: median(&ratios),
        })
    })();
    tick();
    let prefill_eff = (|| -> Result<ModelPrefillEfficiency, String> {
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
        let a = crate::measure::fill(m * k, 3);
        let b = crate::measure::fill(k * nn, 4);
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
        Ok(ModelPrefillEfficiency {
            flops,
            sgemm_shape: (m, k, nn),
            sgemm_gflops: sg,
            prefill_gflops: pf,
            ratio_best: pf / sg,
            ratio_median: median(&ratios),
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

/// Progress units of a run: the measured steps, plus two efficiency figures.
pub fn progress_units(cfg: &LlmConfig) -> usize {
    cfg.rounds * (cfg.decode_tokens + cfg.prefill_reps.max(1)) + 2
}

/// Runs `allocbench llm` on `kinds` in this process: the report's rows, JSON section, targets
/// and the text of its detail tables; only an error when the weights could not be had.
pub fn run_part(cfg: &LlmConfig, quick: bool, kinds: &[&SourceKind]) -> crate::report::Section {
    let machine = crate::measure::Machine::detect();
    let started = std::time::Instant::now();
    let weights = match weights(cfg) {
        Ok(w) => w,
        Err(e) => return crate::report::Section::failed(format!("llm: {e}")),
    };
    let c = &weights.config;
    let arch = format!(
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
    );
    let ready_s = started.elapsed().as_secs_f64();
    let pb = crate::output::progress_bar(progress_units(cfg));
    pb.set_message("llm");
    // On a rayon worker, as `llm generate` runs: the kernels' parallel sections then start
    // inside the pool instead of waking the main thread through a latch after each of the
    // ~240 sections per token. Inline when the main thread is a member
    // ([`crate::parts::init_threads`]); this covers a single-thread pool, which keeps its own worker.
    let (rows, decode_eff, prefill_eff, errors) =
        rayon::scope(|_| run(cfg, &weights, kinds, &llm_source_config(), &|| pb.inc(1)));
    pb.finish_and_clear();
    let command: Vec<String> = std::env::args().collect();
    let report = LlmReport {
        info: RunInfo::new(
            machine,
            command.join(" "),
            quick,
            rayon::current_num_threads(),
            started,
        ),
        config: cfg.clone(),
        arch,
        sgemm_threads: crate::measure::sgemm_threads(),
        isa: format!("{:?}", ::llm::kernels::isa()),
        rows,
        decode_eff,
        prefill_eff,
        errors,
    };
    crate::report::Section {
        details: vec![report.details(ready_s)],
        json: Some(("llm".into(), report.to_json())),
        targets: report.targets(),
        rows: report.rows,
        errors: Vec::new(),
    }
}

impl LlmReport {
    /// The row of `source` in `phase`.
    pub fn get(&self, phase: &str, source: &str) -> Option<&Measurement> {
        self.rows
            .iter()
            .find(|m| m.workload == phase && m.source == source)
    }

    /// Tokens per second of a row, from its median step.
    pub fn tok_s(&self, m: &Measurement) -> f64 {
        let tokens = if m.unit == "prefill" {
            self.config.prompt_tokens as f64
        } else {
            1.0
        };
        tokens * m.calls_per_sec
    }

    /// What ran and every table but the targets, as printed under `--details`; the weights
    /// took `ready_s` seconds to load or generate.
    pub fn details(&self, ready_s: f64) -> String {
        let mut out = format!(
            "## llm: a whole model generating\n\n{} measured rounds after 1 warm-up; {} rayon \
             threads, kernels {}; weights ready in {ready_s:.1} s\nmodel: {}\nround: prefill \
             of {} tokens, then {} decode tokens, interleaved across sources\n\nAllocator \
             comparison (median step; x static / x caching: median of step-by-step ratios over \
             the same interleaved steps; temp bytes, faults and system allocations per \
             token):\n\n{}\n\n",
            self.config.rounds,
            self.info.threads,
            self.isa,
            self.arch,
            self.config.prompt_tokens,
            self.config.decode_tokens,
            self.table()
        );
        for h in self.headline() {
            out += &format!("{h}\n");
        }
        out += &format!(
            "\nEfficiency (caching source, alternating turns with the baseline):\n\n{}\n",
            self.efficiency_table()
        );
        for e in &self.errors {
            out += &format!("not measured: {e}\n");
        }
        out
    }

    /// The comparison table, as Markdown.
    pub fn table(&self) -> Table {
        comparison_table(
            &self.rows,
            &[Column {
                header: "tok/s",
                cell: &|m| format!("{:.1}", self.tok_s(m)),
            }],
            &[Column {
                header: "temp B/token",
                cell: &|m| format!("{:.0}", m.temp_bytes_per_call.unwrap_or(0.0)),
            }],
        )
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

    /// The headline: what `caching` buys against `system`, `fresh-pages` and `exact-cache`, per
    /// phase (their time over `caching`'s, median over the same steps).
    pub fn headline(&self) -> Vec<String> {
        let mut out = Vec::new();
        for phase in ["llm-decode", "llm-prefill"] {
            for rival in ["system", "fresh-pages", "exact-cache"] {
                if let Some(x) = self.get(phase, rival).and_then(|r| r.x_caching) {
                    out.push(format!(
                        "{phase}: {rival} takes {x:.3}x caching's time (median of step-by-step \
                         ratios)"
                    ));
                }
            }
        }
        out
    }

    /// The targets, met or missed as measured.
    pub fn targets(&self) -> Vec<TargetCheck> {
        let mut out = within_static(&self.rows, goal::LLM_WITHIN_STATIC, &[CACHING], false);
        for phase in ["llm-decode", "llm-prefill"] {
            let Some(m) = self.get(phase, CACHING) else {
                continue;
            };
            out.push(TargetCheck {
                target: format!(
                    "caching: 0 page faults and 0 system allocations per token on {phase}"
                ),
                measured: format!(
                    "{:.3} faults/token, {} system allocations/token",
                    m.faults_per_call,
                    m.sys_allocs_per_call
                        .map(|x| format!("{x:.3}"))
                        .unwrap_or_else(|| "?".into())
                ),
                met: Some(m.faults_per_call == 0.0 && m.sys_allocs_per_call == Some(0.0)),
            });
        }
        if let Some(d) = &self.decode_eff {
            out.push(efficiency_check(
                format!(
                    "decode >= {} of the weight-streaming bound ({} threads)",
                    pct(goal::LLM_DECODE_STREAM),
                    self.info.threads
                ),
                format!("{:.2} GB/s", d.decode_gbs),
                format!("{:.2} GB/s", d.stream_gbs),
                d.ratio_median,
                d.ratio_best,
                goal::LLM_DECODE_STREAM,
            ));
        }
        if let Some(p) = &self.prefill_eff {
            out.push(efficiency_check(
                format!(
                    "prefill >= {} of sgemm GFLOP/s ({} threads)",
                    pct(goal::LLM_PREFILL_SGEMM),
                    self.info.threads
                ),
                format!("{:.1} GFLOP/s", p.prefill_gflops),
                format!("{:.1} GFLOP/s", p.sgemm_gflops),
                p.ratio_median,
                p.ratio_best,
                goal::LLM_PREFILL_SGEMM,
            ));
        }
        out
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
        let mut j = self.info.json("llm", &self.rows, &self.targets());
        for (k, m) in self.rows.iter().enumerate() {
            j["measurements"][k]["tokens_per_second"] = json!(self.tok_s(m));
        }
        j["sgemm_threads"] = json!(self.sgemm_threads);
        j["kernels"] = json!(self.isa);
        j["config"] = json!(self.config);
        j["architecture"] = json!(self.arch);
        j["workloads"] = self
            .workloads()
            .iter()
            .map(|(n, d)| json!({"name": n, "step": d}))
            .collect();
        j["headline"] = json!(self.headline());
        j["efficiency"] = json!({
            "decode": self.decode_eff,
            "prefill": self.prefill_eff,
            "errors": self.errors,
        });
        j
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny model through the whole run: rows for every (phase, source), ratios against
    /// static, zero system allocations per token for the cache in steady state, JSON units.
    #[test]
    fn smoke_run_on_a_tiny_model() {
        let cfg = LlmConfig::tiny();
        let w = weights(&cfg).unwrap();
        let kinds: Vec<&SourceKind> = ["caching", "static", "system"]
            .iter()
            .map(|n| find_source(n).unwrap())
            .collect();
        let (rows, dec, pre, errors) = run(&cfg, &w, &kinds, &SourceConfig::default(), &|| {});
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(rows.len(), 6);
        let caching = rows
            .iter()
            .find(|r| r.workload == "llm-decode" && r.source == "caching")
            .unwrap();
        assert_eq!(caching.sys_allocs_per_call, Some(0.0));
        assert!(caching.x_static.is_some() && caching.calls_per_sec > 0.0);
        assert!(caching.temp_bytes_per_call.is_some_and(|b| b > 0.0));
        let system = rows
            .iter()
            .find(|r| r.workload == "llm-decode" && r.source == "system")
            .unwrap();
        assert!(
            system.sys_allocs_per_call.unwrap() > 0.0,
            "system mallocs every kernel's scratch"
        );
        let prefill = rows
            .iter()
            .find(|r| r.workload == "llm-prefill" && r.source == "static")
            .unwrap();
        assert!(prefill.ns_per_call.median > 0.0);
        assert!(dec.is_some() && pre.is_some());
        let report = LlmReport {
            info: crate::report::tests::info(),
            config: cfg,
            arch: "tiny".into(),
            sgemm_threads: None,
            isa: "test".into(),
            rows,
            decode_eff: dec,
            prefill_eff: pre,
            errors,
        };
        let j = report.to_json();
        assert_eq!(
            j["measurements"][0]["time_per_call"]["median"]["unit"],
            "ns/prefill"
        );
        let tok_s = j["measurements"][0]["tokens_per_second"].as_f64().unwrap();
        assert!(tok_s > 0.0, "{tok_s}");
        let t = report.targets();
        assert!(t
            .iter()
            .any(|c| c.target.contains("within 1.01x of static on llm-decode")));
        assert!(report.headline().iter().any(|h| h.contains("system takes")));
    }
}
