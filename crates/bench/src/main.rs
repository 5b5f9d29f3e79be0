//! `allocbench`: side-by-side scratch-memory benchmarks. `cargo run --release` runs
//! `allocbench all --quick`; see `allocbench --help`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::{Args, Parser, Subcommand};

use allocbench::os::Machine;
use allocbench::report::Report;
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
    /// scratch, decode and threads.
    All,
}

impl Command {
    fn bench(&self) -> Bench {
        match self {
            Command::Scratch => Bench::Scratch,
            Command::Decode => Bench::Decode,
            Command::Threads => Bench::Threads,
            Command::All => Bench::All,
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
    /// Threads for the multi-thread run of `threads` (default: all cores).
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    let c = &cli.common;
    if c.allocators.as_deref() == Some(&["list".to_string()]) {
        for k in SOURCES {
            println!("{:<14} {}", k.name, k.about);
        }
        return ExitCode::SUCCESS;
    }
    let (bench, quick) = match &cli.command {
        None => (Bench::All, true),
        Some(cmd) => (cmd.bench(), c.quick),
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
    let source_config = SourceConfig {
        exact_cap: c.exact_cap,
        caching_cap: c.caching_cap_mib << 20,
    };
    let run = opts.run_config();
    let jobs = suite::plan(bench, &opts);

    let command: Vec<String> = std::env::args().collect();
    println!("# allocbench: {}", command.join(" "));
    println!(
        "machine: {} cores, {}, Linux {}, load average {:.2} at start; {} run: {} warm-up + {} \
         measured rounds per figure",
        machine.cores,
        machine.cpu,
        machine.kernel,
        machine.load_avg_1m_at_start,
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
    let pb = suite::progress_bar(jobs.len() * suite::ticks_per_job(sources.len(), &run));
    let measurements = suite::run(&jobs, &sources, &source_config, &run, &pb);
    pb.finish_and_clear();

    let report = Report {
        machine,
        command: command.join(" "),
        mode: if quick { "quick" } else { "full" },
        run,
        sources: source_config,
        workloads: jobs
            .iter()
            .map(|j| (j.label.clone(), j.workload.describe()))
            .collect(),
        measurements,
        threads: opts.threads,
        elapsed_s: started.elapsed().as_secs_f64(),
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
    println!(
        "\nfinished in {:.1} s; load average {:.2} at the end",
        report.elapsed_s,
        allocbench::os::load_avg()
    );

    let mut ok = true;
    if let Some(path) = &c.json {
        match serde_json::to_string_pretty(&report.to_json())
            .map_err(|e| e.to_string())
            .and_then(|s| std::fs::write(path, s + "\n").map_err(|e| e.to_string()))
        {
            Ok(()) => eprintln!("wrote {}", path.display()),
            Err(e) => {
                eprintln!("allocbench: writing {}: {e}", path.display());
                ok = false;
            }
        }
    }
    if let Some(path) = &c.plot {
        match allocbench::plot::write_svg(&report, path) {
            Ok(()) => eprintln!("wrote {}", path.display()),
            Err(e) => {
                eprintln!("allocbench: writing {}: {e}", path.display());
                ok = false;
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
