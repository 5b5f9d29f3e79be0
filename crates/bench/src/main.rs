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
    /// Soak test: random kernel-like traffic from `--threads` threads (default: all cores) on
    /// one shared caching allocator, every block's tag checked; exits non-zero on any violation.
    Soak {
        /// How long to run, in seconds.
        #[arg(long, default_value_t = 10.0, value_name = "S")]
        seconds: f64,
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
            Command::Soak { .. } => None,
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
    match serde_json::to_string_pretty(value)
        .map_err(|e| e.to_string())
        .and_then(|s| std::fs::write(path, s + "\n").map_err(|e| e.to_string()))
    {
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
    println!(
        "# allocbench soak: {seconds} s on {threads} threads; {} cores, {}, load average {:.2}",
        machine.cores, machine.cpu, machine.load_avg_1m_at_start
    );
    let r = allocbench::soak::run(seconds, threads);
    println!("{r}");
    println!(
        "ops/s: {:.0}; peak live bytes: {}; peak reserved bytes: {}; violations: {}",
        r.ops_per_sec, r.peak_live_bytes, r.peak_reserved_bytes, r.violations
    );
    let mut ok = r.passed();
    if let Some(path) = &c.json {
        let json = serde_json::json!({
            "tool": "allocbench",
            "command": std::env::args().collect::<Vec<_>>().join(" "),
            "mode": "soak",
            "machine": machine,
            "cores": machine.cores,
            "threads": r.threads,
            "elapsed": { "value": r.seconds, "unit": "s" },
            "ops": { "value": r.ops, "unit": "allocator calls" },
            "ops_per_second": { "value": r.ops_per_sec, "unit": "ops/s (all threads)" },
            "peak_live_bytes": { "value": r.peak_live_bytes, "unit": "bytes" },
            "peak_reserved_bytes": { "value": r.peak_reserved_bytes, "unit": "bytes" },
            "violations": r.violations,
            "first_violations": r.first_violations,
            "passed": r.passed(),
        });
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
        Some(Command::Soak { seconds }) => return soak(*seconds, c),
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
        ok &= write_json(path, &report.to_json());
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
