//! `allocbench`: side-by-side scratch-memory benchmarks. `cargo run --release` runs
//! `allocbench all --quick`; see `allocbench --help`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};

use allocbench::harness::RunConfig;
use allocbench::llm::LlmConfig;
use allocbench::measure::Machine;
use allocbench::output::{self, Output};
use allocbench::parts;
use allocbench::sdpa::SdpaConfig;
use allocbench::source::{self, SourceConfig, SourceKind, SOURCES};
use allocbench::suite::{self, Settings, What};
use allocbench::workload::Decode;

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

/// What `--help` says about the output: the summary's columns as the run explains them
/// ([`allocbench::summary::FOOTNOTES`]), then the details and the files.
fn after_help() -> String {
    format!(
        "The summary, one line per workload (each scratch workload, sdpa and llm run in a fresh \
         process\nof their own, so what ran before cannot change their figures):\n{}\n\n{DETAILS}",
        allocbench::summary::FOOTNOTES
    )
}

/// What `--help` says of `--details` and of the files.
const DETAILS: &str = "\
--details adds, per source: median/min/max time, x static and x caching (time over static's
and caching's: medians, or for sdpa and llm the median of step-by-step ratios), faults/call
(minor page faults), sys allocs/call (calls into the layer below), peak RSS +MiB (during
warm-up), peak held/live MiB (bytes the source held from the system / handed out at most),
calls/s, tok/s and temp B/token (llm); the kernels' efficiency against a streaming read and
sgemm; and the developers' goals, MET or MISSED (goals for the project, not for your set-up).

Files: the JSON of every figure and the SVG plot, written to target/allocbench/COMMAND.json
and .svg by default (--out, --json, --plot), checked before the run.";

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
        /// The allocator's memory policy beside its 32 MiB cap: `peak-bound` (evict before
        /// reserved bytes pass their peak, best fit up to 1.25x: the policy for many blocks
        /// live at once) or `cap` (the allocator's defaults).
        #[arg(long, default_value = "peak-bound", value_name = "POLICY")]
        policy: allocbench::soak::Policy,
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
    /// The benchmark this command runs (`soak` is no benchmark).
    fn what(&self) -> Option<What> {
        Some(match self {
            Command::Scratch => What::Scratch,
            Command::Decode => What::Decode,
            Command::Threads => What::Threads,
            Command::All => What::All,
            Command::Sdpa { .. } => What::Sdpa,
            Command::Llm { .. } => What::Llm,
            Command::Soak { .. } => return None,
        })
    }
}

/// Options of the harness benchmarks (accepted before or after the subcommand).
#[derive(Args, Debug)]
struct Common {
    /// Short rounds and smaller decode (the default when no subcommand is given).
    #[arg(long, global = true)]
    quick: bool,
    /// Print every source's figures, the kernels' efficiency and the developers' goals.
    #[arg(long, global = true)]
    details: bool,
    /// Directory of the JSON and the plot (default: target/allocbench/ under cargo).
    #[arg(long, global = true, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Write every figure, with units and the core count, to this JSON file (default:
    /// DIR/COMMAND.json).
    #[arg(long, global = true, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write the SVG plot of time per call by source and workload here (default: next to
    /// the JSON, .svg).
    #[arg(long, global = true, value_name = "FILE")]
    plot: Option<PathBuf>,
    /// Comma-separated workloads of the command to run (default: all), e.g.
    /// `scratch-large,decode,sdpa,llm`.
    #[arg(long, global = true, value_delimiter = ',', value_name = "LIST")]
    workloads: Option<Vec<String>>,
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
    /// Tests: one tiny round of every workload, tiny attention shapes and a tiny model.
    #[arg(long, global = true, hide = true)]
    tiny: bool,
}

/// `allocbench soak`: the arguments checked, then [`allocbench::soak::command`].
fn soak(seconds: f64, policy: allocbench::soak::Policy, c: &Common) -> Result<ExitCode, String> {
    if !(seconds.is_finite() && seconds >= 0.0) {
        return Err(format!(
            "--seconds must be a non-negative number, got {seconds}"
        ));
    }
    if c.plot.is_some() || c.allocators.is_some() || c.workloads.is_some() {
        return Err("soak runs the caching allocator only and draws no plot".into());
    }
    let json = c.json.as_deref().map(|p| Output::create(p, "--json"));
    Ok(allocbench::soak::command(
        seconds,
        c.threads,
        policy,
        json.transpose()?,
    ))
}

/// What every part of a benchmark command runs, from the command line.
fn settings(what: What, cmd: Option<&Command>, c: &Common) -> Result<Settings, String> {
    let quick = c.quick || cmd.is_none();
    // `all` runs llm on the named sources llm has, and the rest on the others.
    let names = c.allocators.as_deref();
    let all: Vec<&'static SourceKind> = SOURCES.iter().collect();
    let sources = match what {
        What::Llm => Vec::new(),
        _ => source::select(names, &all, false)?,
    };
    let llm_sources = match what {
        What::Llm => source::select(names, &allocbench::llm::llm_sources(), false)?,
        What::All => source::select(names, &allocbench::llm::llm_sources(), true)?,
        _ => Vec::new(),
    };
    // Tests run a tiny decode whatever the flags say.
    let (tokens, layers) = match c.tiny {
        true => (12, 2),
        false => (
            c.decode_tokens.unwrap_or(if quick { 600 } else { 1024 }),
            c.decode_layers.unwrap_or(if quick { 2 } else { 8 }),
        ),
    };
    let run = match (c.tiny, quick) {
        (true, _) => RunConfig::smoke(),
        (false, true) => RunConfig::quick(),
        (false, false) => RunConfig::full(),
    };
    let sdpa = match (c.tiny, cmd) {
        (true, _) => SdpaConfig::smoke(),
        (false, Some(Command::Sdpa { tokens, layers })) => SdpaConfig::new(quick, *tokens, *layers),
        (false, _) => SdpaConfig::new(quick, 1024, 32),
    };
    let mut llm = if c.tiny {
        LlmConfig::tiny()
    } else {
        LlmConfig::new(quick, "smollm2-135m")
    };
    if let Some(Command::Llm {
        shape,
        model,
        prompt_tokens,
        decode_tokens,
    }) = cmd
    {
        if !c.tiny {
            if model.is_none() && ::llm::shapes::named(shape).is_none() {
                return Err(format!(
                    "unknown shape `{shape}`; known: {}",
                    ::llm::shapes::NAMES.join(", ")
                ));
            }
            llm = LlmConfig::new(quick, shape);
            llm.prompt_tokens = (*prompt_tokens).max(1);
            llm.decode_tokens = *decode_tokens;
        }
        if let Some(dir) = model {
            llm.model = dir.display().to_string();
            llm.model_dir = Some(dir.clone());
        }
    }
    Ok(Settings {
        what,
        quick,
        sources,
        llm_sources,
        source_config: SourceConfig {
            exact_cap: c.exact_cap,
            caching_cap: c.caching_cap_mib << 20,
        },
        threads: c.threads.unwrap_or(Machine::detect().cores).max(1),
        decode: Decode::new(tokens.max(1), layers.max(1), c.decode_kernel_threads.max(1)),
        run,
        sdpa,
        llm,
        only: c
            .workloads
            .as_ref()
            .map(|w| w.iter().map(|x| x.trim().to_string()).collect()),
    })
}

fn main() -> ExitCode {
    allocbench::measure::pin_malloc_thresholds();
    let help = Cli::command().after_help(after_help());
    let cli = Cli::from_arg_matches(&help.get_matches()).unwrap_or_else(|e| e.exit());
    allocbench::measure::init_threads(Machine::detect().cores);
    // Bad arguments and unwritable files exit 2, before anything is measured.
    dispatch(&cli).unwrap_or_else(|e| {
        eprintln!("allocbench: {e}");
        ExitCode::from(2)
    })
}

/// Runs the command of `cli`: the source list, `soak`, one part of a benchmark (in a child) or
/// a whole benchmark.
fn dispatch(cli: &Cli) -> Result<ExitCode, String> {
    let c = &cli.common;
    if c.allocators.as_deref() == Some(&["list".to_string()]) {
        for k in SOURCES {
            println!("{:<14} {}", k.name, k.about);
        }
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(Command::Soak { seconds, policy }) = &cli.command {
        return soak(*seconds, *policy, c);
    }
    let what = cli
        .command
        .as_ref()
        .and_then(Command::what)
        .unwrap_or(What::All);
    let s = settings(what, cli.command.as_ref(), c)?;
    if let Some(code) = parts::serve_child(&s) {
        return Ok(code);
    }
    let suites = suite::plan(&s)?;
    let (json, plot) = output::open(
        c.json.as_deref(),
        c.plot.as_deref(),
        c.out.as_deref(),
        what.name(),
    )?;
    Ok(allocbench::command::run(&s, &suites, c.details, json, plot))
}
