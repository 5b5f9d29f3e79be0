//! `allocbench`: side-by-side scratch-memory benchmarks. `cargo run --release` runs
//! `allocbench all --quick`; see `allocbench --help`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Args, Parser, Subcommand};

use allocbench::harness::Measurement;
use allocbench::os::Machine;
use allocbench::report::{Report, RunInfo};
use allocbench::source::{self, SourceConfig, SourceKind, SOURCES};
use allocbench::suite::{self, Bench, Options};

/// Side-by-side scratch-memory benchmarks: this project's caching allocator against system
/// malloc, mimalloc, jemalloc, fresh pages (iOS-like), ExecuTorch's exact-size cache,
/// bumpalo, zeropool, orthotope and preallocated buffers. Without a subcommand: `all --quick`.
#[derive(Parser, Debug)]
#[command(name = "allocbench", version)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    common: Common,
}

/// Subcommands. Benchmarks that run through the harness share [`Common`]; later
/// subcommands (`soak`, `sdpa`) add their own variant with their own arguments.
#[derive(Subcommand, Debug)]
enum Command {
    /// Scratch mixes: small (64 B - 4 KiB), medium (64 KiB - 1 MiB), large (4 - 64 MiB).
    Scratch,
    /// ExecuTorch SDPA decode scratch: two buffers per call, sizes growing every token.
    Decode,
    /// Medium scratch on 1 and on N threads at once: aggregate calls/s and scaling.
    Threads,
    /// scratch, decode, threads, sdpa (with sdpa's default model) and llm (smollm2-135m).
    All,
    /// Soak test: random kernel-like traffic from `--threads` threads (default: all cores) on
    /// one shared caching allocator, every block's tag checked; exits non-zero on any violation.
    Soak {
        /// How long to run, in seconds.
        #[arg(long, default_value_t = 10.0, value_name = "S")]
        seconds: f64,
    },
    /// The attention kernel (crate sdpa) over a 32-layer model, decode and prefill, with its
    /// scratch from every source; and its efficiency against a streaming read and sgemm.
    Sdpa {
        /// Decode: tokens 1..=N (the KV cache's capacity). Quick runs sample 16 of them.
        #[arg(long, default_value_t = 1024, value_name = "N")]
        tokens: usize,
        /// Layers of the model: attention calls per decode token and per prefill.
        #[arg(long, default_value_t = 32, value_name = "L")]
        layers: usize,
    },
    /// A whole Llama-family model (crate llm) generating, its kernels' scratch from system,
    /// fresh-pages, exact-cache (10 MB), caching (10 MiB), caching-unbounded and static; and
    /// its decode/prefill speed against a streaming read and sgemm.
    Llm {
        /// Named shape with random bf16 weights: smollm2-135m or llama-3.2-1b.
        #[arg(long, default_value = "smollm2-135m")]
        shape: String,
        /// Real weights instead of random ones: a .gguf file or a checkpoint directory.
        #[arg(long, value_name = "FILE.gguf|DIR")]
        model: Option<PathBuf>,
        /// Prompt tokens.
        #[arg(long, default_value_t = 128)]
        prompt_tokens: usize,
        /// Decode tokens per round.
        #[arg(long, default_value_t = 64)]
        decode_tokens: usize,
    },
}

impl Command {
    /// The harness benchmark this command runs, if it is one.
    fn bench(&self) -> Option<Bench> {
        match self {
            Command::Scratch => Some(Bench::Scratch),
            Command::Decode => Some(Bench::Decode),
            Command::Threads => Some(Bench::Threads),
            Command::All => Some(Bench::All),
            Command::Soak { .. } | Command::Sdpa { .. } | Command::Llm { .. } => None,
        }
    }
}

/// Options of the harness benchmarks (accepted before or after the subcommand).
#[derive(Args, Debug)]
struct Common {
    /// Short rounds and smaller decode (the default when no subcommand is given).
    #[arg(long, global = true)]
    quick: bool,
    /// Write every figure, with units and the core count, to this JSON file.
    #[arg(long, global = true, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write an SVG plot of time per call by source and workload to this file.
    #[arg(long, global = true, value_name = "FILE")]
    plot: Option<PathBuf>,
    /// Comma-separated sources to run (default: all). `--allocators list` lists them.
    #[arg(long, global = true, value_delimiter = ',', value_name = "LIST")]
    allocators: Option<Vec<String>>,
    /// Threads for the multi-thread run of `threads` and for `soak` (default: all cores).
    #[arg(long, global = true, value_name = "N")]
    threads: Option<usize>,
    /// Decode: tokens per round (default 600 quick, 1024 full).
    #[arg(long, global = true, value_name = "N")]
    decode_tokens: Option<usize>,
    /// Decode: attention calls per token (default 2 quick, 8 full).
    #[arg(long, global = true, value_name = "N")]
    decode_layers: Option<usize>,
    /// Decode: T, the kernel's thread count in ExecuTorch's scratch formula.
    #[arg(long, global = true, value_name = "T", default_value_t = 8)]
    decode_kernel_threads: usize,
    /// exact-cache cap in bytes (ExecuTorch's LLM runner uses 10 MB).
    #[arg(long, global = true, value_name = "BYTES", default_value_t = 10 * 1024 * 1024)]
    exact_cap: u32,
    /// caching: max_cached_bytes, in MiB.
    #[arg(long, global = true, value_name = "MIB", default_value_t = 256)]
    caching_cap_mib: usize,
}

fn select_sources(names: Option<&[String]>) -> Result<Vec<&'static SourceKind>, String> {
    let Some(names) = names else {
        return Ok(SOURCES.iter().collect());
    };
    names
        .iter()
        .map(|n| {
            source::find(n.trim()).ok_or_else(|| {
                format!(
                    "unknown source `{n}`; known: {}",
                    SOURCES
                        .iter()
                        .map(|k| k.name)
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            })
        })
        .collect()
}

/// Writes `value` as pretty JSON to `path`; reports the outcome on stderr.
fn write_json(path: &std::path::Path, value: &serde_json::Value) -> bool {
    report_write(
        path,
        serde_json::to_string_pretty(value)
            .map_err(|e| e.to_string())
            .and_then(|s| std::fs::write(path, s + "\n").map_err(|e| e.to_string())),
    )
}

/// Reports on stderr how writing `path` went; true when it was written.
fn report_write(path: &std::path::Path, outcome: Result<(), impl std::fmt::Display>) -> bool {
    match outcome {
        Ok(()) => {
            eprintln!("wrote {}", path.display());
            true
        }
        Err(e) => {
            eprintln!("allocbench: writing {}: {e}", path.display());
            false
        }
    }
}

/// `allocbench soak`: prints ops/s, peak bytes and the violations; fails on any violation.
fn soak(seconds: f64, c: &Common) -> ExitCode {
    if !(seconds.is_finite() && seconds >= 0.0) {
        eprintln!("allocbench: --seconds must be a non-negative number, got {seconds}");
        return ExitCode::from(2);
    }
    if c.plot.is_some() || c.allocators.is_some() {
        eprintln!("allocbench: soak runs the caching allocator only and draws no plot");
        return ExitCode::from(2);
    }
    let machine = Machine::detect();
    let threads = c.threads.unwrap_or(machine.cores).max(1);
    println!("# allocbench soak: {seconds} s on {threads} threads; {machine}");
    let r = allocbench::soak::run(seconds, threads);
    println!("{r}");
    println!(
        "ops/s: {:.0}; peak live bytes: {}; peak reserved bytes: {}; violations: {}",
        r.ops_per_sec, r.peak_live_bytes, r.peak_reserved_bytes, r.violations
    );
    let mut ok = r.passed();
    if let Some(path) = &c.json {
        let command = std::env::args().collect::<Vec<_>>().join(" ");
        let mut info = RunInfo::new(machine, command, false, r.threads, Instant::now());
        info.mode = "soak";
        info.elapsed_s = r.seconds;
        let mut json = info.json("soak", &[], &[]);
        json["ops"] = serde_json::json!({ "value": r.ops, "unit": "allocator calls" });
        json["ops_per_second"] =
            serde_json::json!({ "value": r.ops_per_sec, "unit": "ops/s (all threads)" });
        json["peak_live_bytes"] =
            serde_json::json!({ "value": r.peak_live_bytes, "unit": "bytes" });
        json["peak_reserved_bytes"] =
            serde_json::json!({ "value": r.peak_reserved_bytes, "unit": "bytes" });
        json["violations"] = serde_json::json!(r.violations);
        json["first_violations"] = serde_json::json!(r.first_violations);
        json["passed"] = serde_json::json!(r.passed());
        ok &= write_json(path, &json);
    }
    if !r.passed() {
        eprintln!("allocbench soak: {} violations", r.violations);
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Gives matrixmultiply as many threads as rayon's global pool will have (RAYON_NUM_THREADS or
/// one per core), and makes this (the main) thread one of the pool's. Call before any thread
/// exists: matrixmultiply reads the environment.
///
/// The kernels and model steps run from the main thread. Outside the pool, each parallel
/// section would hand its work to the pool and wait to be woken at the end (24 us for an empty
/// one on the project's VM; the `llm` runner's decode measured 51-54 tok/s that way against
/// 66-70 inside); as a member, the main thread runs its share and starts the section at once,
/// as when a runtime drives its model from inside the pool (`llm generate` uses
/// `rayon::scope`). With one thread the pool keeps its own worker: a pool made of the main
/// thread alone would leave work sent from other threads waiting for it.
fn init_threads(cores: usize) {
    let rayon_threads = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(cores);
    ::sdpa::baseline::set_sgemm_threads(rayon_threads);
    if rayon_threads >= 2 {
        // An error means a global pool exists already: then the calls stay outside it, which
        // costs time, not correctness.
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(rayon_threads)
            .use_current_thread()
            .build_global();
    }
}

/// Runs the sdpa benchmark on `sources`, printing what it runs first.
fn run_sdpa(
    cfg: allocbench::sdpa::SdpaConfig,
    quick: bool,
    sources: &[&'static SourceKind],
    source_config: &SourceConfig,
) -> allocbench::sdpa::SdpaReport {
    use allocbench::sdpa::{self, SdpaReport};
    let machine = Machine::detect();
    let threads = rayon::current_num_threads();
    let command: Vec<String> = std::env::args().collect();
    println!("# allocbench sdpa: {}", command.join(" "));
    println!(
        "machine: {machine}; {} run; kernel on {} rayon threads (SIMD: {}), sgemm on {} threads",
        if quick { "quick" } else { "full" },
        threads,
        ::sdpa::simd_level().name(),
        ::sdpa::baseline::sgemm_threads()
            .map(|t| t.to_string())
            .unwrap_or_else(|| "?".into())
    );
    println!(
        "model: {} layers, {} heads, {} kv heads, head_dim {}; one layer's KV cache ({} \
         positions, {} MiB for K and V) is shared by every layer",
        cfg.layers,
        cfg.heads,
        cfg.kv_heads,
        cfg.head_dim,
        cfg.kv_capacity,
        (2 * cfg.kv_capacity * cfg.kv_heads * cfg.head_dim * 4) >> 20
    );
    for (label, what) in cfg.workloads() {
        println!("workload {label}: {what}");
    }
    println!();
    let started = Instant::now();
    let pb = suite::progress_bar(cfg.progress_units());
    let (rows, decode_eff, prefill_eff, eff_errors) =
        sdpa::run(&cfg, sources, source_config, &|| pb.inc(1));
    pb.finish_and_clear();
    SdpaReport {
        info: RunInfo::new(machine, command.join(" "), quick, threads, started),
        config: cfg,
        sgemm_threads: ::sdpa::baseline::sgemm_threads(),
        simd: ::sdpa::simd_level().name().to_string(),
        rows,
        decode_eff,
        prefill_eff,
        eff_errors,
    }
}

/// Prints the sdpa tables and targets.
fn print_sdpa(report: &allocbench::sdpa::SdpaReport) {
    let threads = report.info.threads;
    println!(
        "Allocator comparison (median: per token over {} layers for decode, per prefill of {} \
         layer calls; x static / x caching: median of step-by-step ratios over the same interleaved steps; \
         faults and system allocations per attention call):",
        report.config.layers, report.config.layers
    );
    println!();
    println!("{}", report.table());
    println!();
    let (dt, pt) = report.efficiency_tables();
    println!(
        "Decode efficiency (q_len 1, layer caches cycled so K/V come from DRAM; GB/s of K and V \
         read) vs a streaming read on {threads} threads:"
    );
    println!();
    println!("{dt}");
    println!();
    println!(
        "Prefill efficiency (causal, start_pos 0; FLOPs = 4 * head_dim per visible pair) vs \
         matrixmultiply sgemm (best of the shapes {:?}):",
        report.config.eff_sgemm_shapes
    );
    println!();
    println!("{pt}");
    for e in &report.eff_errors {
        println!("efficiency not measured: {e}");
    }
    println!();
    println!("sdpa targets (goals for the kernel and the library, not assertions):");
    println!();
    println!("{}", report.targets_table());
    println!("\n{}", report.info.finished("sdpa"));
}

/// `allocbench sdpa`: the kernel over the model with every selected source, efficiency,
/// targets; JSON and plot on request. Exits 0 whether targets are met or not.
fn sdpa(tokens: usize, layers: usize, c: &Common) -> ExitCode {
    let sources = match select_sources(c.allocators.as_deref()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("allocbench: {e}");
            return ExitCode::from(2);
        }
    };
    let cfg = allocbench::sdpa::SdpaConfig::new(c.quick, tokens, layers);
    let report = run_sdpa(cfg, c.quick, &sources, &source_config(c));
    print_sdpa(&report);
    write_outputs(c, &report.info, || report.to_json(), &report.rows)
}

/// The llm sources selected by `--allocators` (all by default; unknown names are ignored
/// when `ignore_unknown`, as in `all`, whose list may name sources llm does not run).
fn select_llm_sources(
    names: Option<&[String]>,
    ignore_unknown: bool,
) -> Result<Vec<&'static SourceKind>, String> {
    use allocbench::llm::{find_source, llm_sources, LLM_SOURCE_NAMES};
    let Some(names) = names else {
        return Ok(llm_sources());
    };
    let mut out = Vec::new();
    for n in names {
        match find_source(n.trim()) {
            Some(k) => out.push(k),
            None if ignore_unknown => {}
            None => {
                return Err(format!(
                    "llm runs no source `{n}`; known: {}",
                    LLM_SOURCE_NAMES.join(", ")
                ))
            }
        }
    }
    Ok(out)
}

/// Runs `allocbench llm` and prints its tables; `None` when the weights could not be had.
fn run_llm(
    cfg: allocbench::llm::LlmConfig,
    quick: bool,
    sources: &[&'static SourceKind],
) -> Option<allocbench::llm::LlmReport> {
    use allocbench::llm::{self, LlmReport};
    let machine = Machine::detect();
    let command: Vec<String> = std::env::args().collect();
    println!("# allocbench llm: {}", command.join(" "));
    let started = Instant::now();
    let weights = match llm::weights(&cfg) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("allocbench llm: {e}");
            return None;
        }
    };
    let c = &weights.config;
    let arch = format!(
        "{}: hidden {}, {} layers, {} heads, {} kv heads, head_dim {}, FFN {}, vocab {}, {}, \
         rope_theta {}{}; {} weights, {:.1} MiB read per decode token",
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
    println!(
        "machine: {machine}; {} run ({} measured rounds after 1 warm-up); {} rayon threads, \
         kernels {:?}; weights ready in {:.1} s",
        if quick { "quick" } else { "full" },
        cfg.rounds,
        rayon::current_num_threads(),
        ::llm::kernels::isa(),
        started.elapsed().as_secs_f64()
    );
    println!("model: {arch}");
    println!(
        "round: prefill of {} tokens, then {} decode tokens, interleaved across sources",
        cfg.prompt_tokens, cfg.decode_tokens
    );
    println!();
    let pb = suite::progress_bar(llm::progress_units(&cfg));
    // On a rayon worker, as `llm generate` runs: the kernels' parallel sections then start
    // inside the pool instead of waking the main thread through a latch after each of the
    // ~240 sections per token. Inline when the main thread is a member (`init_threads`); this
    // covers a single-thread pool, which keeps its own worker.
    let (rows, decode_eff, prefill_eff, errors) = rayon::scope(|_| {
        llm::run(&cfg, &weights, sources, &llm::llm_source_config(), &|| {
            pb.inc(1)
        })
    });
    pb.finish_and_clear();
    let report = LlmReport {
        info: RunInfo::new(
            machine,
            command.join(" "),
            quick,
            rayon::current_num_threads(),
            started,
        ),
        config: cfg,
        arch,
        sgemm_threads: ::sdpa::baseline::sgemm_threads(),
        isa: format!("{:?}", ::llm::kernels::isa()),
        rows,
        decode_eff,
        prefill_eff,
        errors,
    };
    println!("Allocator comparison (median step; x static / x caching: median of step-by-step ratios over the same interleaved steps; temp bytes, faults and system allocations per token):");
    println!();
    println!("{}", report.table());
    println!();
    println!("Headline (what the cache buys):");
    for h in report.headline() {
        println!("  {h}");
    }
    println!();
    println!("Efficiency (caching source, alternating turns with the baseline):");
    println!();
    println!("{}", report.efficiency_table());
    for e in &report.errors {
        println!("not measured: {e}");
    }
    println!();
    println!("llm targets (goals, not assertions):");
    println!();
    println!("{}", report.targets_table());
    println!("\n{}", report.info.finished("llm"));
    Some(report)
}

/// `allocbench llm`.
fn llm_cmd(
    shape: String,
    model: Option<PathBuf>,
    prompt_tokens: usize,
    decode_tokens: usize,
    c: &Common,
) -> ExitCode {
    let sources = match select_llm_sources(c.allocators.as_deref(), false) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("allocbench: {e}");
            return ExitCode::from(2);
        }
    };
    let mut cfg = allocbench::llm::LlmConfig::new(c.quick, &shape);
    if let Some(dir) = model {
        cfg.model = dir.display().to_string();
        cfg.model_dir = Some(dir);
    }
    cfg.prompt_tokens = prompt_tokens.max(1);
    cfg.decode_tokens = decode_tokens;
    let Some(report) = run_llm(cfg, c.quick, &sources) else {
        return ExitCode::FAILURE;
    };
    write_outputs(c, &report.info, || report.to_json(), &report.rows)
}

fn source_config(c: &Common) -> SourceConfig {
    SourceConfig {
        exact_cap: c.exact_cap,
        caching_cap: c.caching_cap_mib << 20,
    }
}

/// Writes the `--json` and `--plot` files a command was asked for (each built only if asked);
/// failure if either could not be written.
fn write_outputs(
    c: &Common,
    info: &RunInfo,
    json: impl FnOnce() -> serde_json::Value,
    plotted: &[Measurement],
) -> ExitCode {
    let mut ok = true;
    if let Some(path) = &c.json {
        ok &= write_json(path, &json());
    }
    if let Some(path) = &c.plot {
        ok &= write_plot(info, plotted, path);
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Writes the SVG plot of `measurements` to `path`; reports the outcome on stderr.
fn write_plot(info: &RunInfo, measurements: &[Measurement], path: &std::path::Path) -> bool {
    report_write(path, allocbench::plot::write_svg(info, measurements, path))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let c = &cli.common;
    init_threads(Machine::detect().cores);
    if c.allocators.as_deref() == Some(&["list".to_string()]) {
        for k in SOURCES {
            println!("{:<14} {}", k.name, k.about);
        }
        return ExitCode::SUCCESS;
    }
    let (bench, quick) = match &cli.command {
        None => (Bench::All, true),
        Some(Command::Soak { seconds }) => return soak(*seconds, c),
        Some(Command::Sdpa { tokens, layers }) => return sdpa(*tokens, *layers, c),
        Some(Command::Llm {
            shape,
            model,
            prompt_tokens,
            decode_tokens,
        }) => {
            return llm_cmd(
                shape.clone(),
                model.clone(),
                *prompt_tokens,
                *decode_tokens,
                c,
            )
        }
        Some(cmd) => match cmd.bench() {
            Some(b) => (b, c.quick),
            None => unreachable!("every other command is a harness benchmark"),
        },
    };
    let sources = match select_sources(c.allocators.as_deref()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("allocbench: {e}");
            return ExitCode::from(2);
        }
    };
    let machine = Machine::detect();
    let mut opts = Options::new(quick, machine.cores);
    if let Some(n) = c.threads {
        opts.threads = n.max(1);
    }
    if let Some(n) = c.decode_tokens {
        opts.decode_tokens = n.max(1);
    }
    if let Some(n) = c.decode_layers {
        opts.decode_layers = n.max(1);
    }
    opts.decode_kernel_threads = c.decode_kernel_threads.max(1);
    let source_config = source_config(c);
    let run = opts.run_config();
    let jobs = suite::plan(bench, &opts);

    let command: Vec<String> = std::env::args().collect();
    println!("# allocbench: {}", command.join(" "));
    println!(
        "machine: {machine}; {} run: {} warm-up + {} measured rounds per figure",
        if quick { "quick" } else { "full" },
        run.warmup_rounds,
        run.rounds
    );
    println!(
        "settings: alignment 64; exact-cache cap {} B; caching max_cached_bytes {} MiB; \
         multi-thread runs on {} threads",
        source_config.exact_cap, c.caching_cap_mib, opts.threads
    );
    for j in &jobs {
        println!("workload {}: {}", j.label, j.workload.describe());
    }
    println!();

    let started = Instant::now();
    let pb = suite::progress_bar(suite::ticks(&jobs, &sources, &run));
    let measurements = suite::run(&jobs, &sources, &source_config, &run, &pb);
    pb.finish_and_clear();

    let report = Report {
        info: RunInfo::new(machine, command.join(" "), quick, opts.threads, started),
        run,
        sources: source_config.clone(),
        workloads: jobs
            .iter()
            .map(|j| (j.label.clone(), j.workload.describe()))
            .collect(),
        measurements,
    };

    println!("{}", report.table());
    println!();
    if let Some(t) = report.scaling_table() {
        println!("{t}");
        println!();
    }
    println!("Targets (goals for the library, not assertions):");
    println!();
    println!("{}", report.targets_table());
    println!();
    println!("sources:");
    for k in &sources {
        println!("  {:<14} {}", k.name, k.about);
    }
    println!("\n{}", report.info.finished("harness"));

    // `all` runs the attention kernel too, after the scratch workloads.
    let sdpa_report = (bench == Bench::All).then(|| {
        println!();
        let cfg = allocbench::sdpa::SdpaConfig::new(quick, 1024, 32);
        let r = run_sdpa(cfg, quick, &sources, &source_config);
        print_sdpa(&r);
        r
    });
    // ... and the whole model (smollm2-135m), last.
    let llm_report = if bench == Bench::All {
        println!();
        match select_llm_sources(c.allocators.as_deref(), true) {
            Ok(s) if !s.is_empty() => run_llm(
                allocbench::llm::LlmConfig::new(quick, "smollm2-135m"),
                quick,
                &s,
            ),
            _ => None,
        }
    } else {
        None
    };
    if sdpa_report.is_some() {
        println!("\nall finished in {:.1} s", started.elapsed().as_secs_f64());
    }

    let mut ok = true;
    if let Some(path) = &c.json {
        let mut json = report.to_json();
        if let Some(r) = &sdpa_report {
            json["sdpa"] = r.to_json();
        }
        if let Some(r) = &llm_report {
            json["llm"] = r.to_json();
        }
        ok &= write_json(path, &json);
    }
    if let Some(path) = &c.plot {
        let mut plotted = report.measurements.clone();
        plotted.extend(sdpa_report.iter().flat_map(|r| r.rows.iter().cloned()));
        plotted.extend(llm_report.iter().flat_map(|r| r.rows.iter().cloned()));
        ok &= write_plot(&report.info, &plotted, path);
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
