//! What a command runs, part by part, and running each part in a fresh process of its own.
//!
//! A command is a list of parts: each harness job (`scratch-small`, ..., `threads x2`), the
//! attention kernel (`sdpa`) and the model (`llm`). Every part runs in a child process (this
//! binary again, with the same arguments and [`PART_ENV`] naming the part), so it starts from
//! the same state whatever ran before it: glibc's heap, its mmap threshold (which frees of
//! large blocks raise), mimalloc's and jemalloc's arenas and the pages they keep mapped all
//! begin fresh. Run in one process, an earlier workload's pages made `exact-cache` on decode
//! look 20 times faster than when run alone. The child writes a [`Section`] as JSON to
//! the file named by [`PART_OUT_ENV`] (a [`Section`]); the parent reads it back and reports.

use std::path::Path;
use std::process::{Command, ExitCode, Stdio};

use crate::harness::RunConfig;
use crate::llm::LlmConfig;
use crate::report::Section;
use crate::sdpa::SdpaConfig;
use crate::source::{SourceConfig, SourceKind};
use crate::suite::{self, Bench, Options};

/// The environment variable that makes this binary run one part (its index) and exit.
pub const PART_ENV: &str = "ALLOCBENCH_PART";
/// The file a child writes its [`Section`] to.
pub const PART_OUT_ENV: &str = "ALLOCBENCH_PART_OUT";

/// The benchmark commands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum What {
    /// The three scratch mixes.
    Scratch,
    /// SDPA decode scratch.
    Decode,
    /// Medium scratch on 1 and N threads.
    Threads,
    /// The attention kernel over a model.
    Sdpa,
    /// A whole model generating.
    Llm,
    /// Everything above.
    All,
}

impl What {
    /// The command's name (also the stem of its default output files).
    pub fn name(self) -> &'static str {
        match self {
            What::Scratch => "scratch",
            What::Decode => "decode",
            What::Threads => "threads",
            What::Sdpa => "sdpa",
            What::Llm => "llm",
            What::All => "all",
        }
    }

    /// The harness benchmark whose jobs the command runs, if any.
    pub fn bench(self) -> Option<Bench> {
        match self {
            What::Scratch => Some(Bench::Scratch),
            What::Decode => Some(Bench::Decode),
            What::Threads => Some(Bench::Threads),
            What::All => Some(Bench::All),
            What::Sdpa | What::Llm => None,
        }
    }
}

/// Everything a command's parts need, the same in the parent and in every child (both build
/// it from the same command line).
#[derive(Clone, Debug)]
pub struct Settings {
    /// The command.
    pub what: What,
    /// Short rounds.
    pub quick: bool,
    /// The sources of the harness jobs and of `sdpa`.
    pub sources: Vec<&'static SourceKind>,
    /// The sources of `llm`.
    pub llm_sources: Vec<&'static SourceKind>,
    /// Source settings of the harness jobs and of `sdpa`.
    pub source_config: SourceConfig,
    /// The harness jobs' options.
    pub opts: Options,
    /// Rounds and durations of the harness jobs.
    pub run: RunConfig,
    /// What `sdpa` runs.
    pub sdpa: SdpaConfig,
    /// What `llm` runs.
    pub llm: LlmConfig,
    /// Only the parts of these labels (`--workloads`), or all.
    pub only: Option<Vec<String>>,
}

/// One part of a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// The harness job of this index in [`suite::plan`].
    Job(usize),
    /// The attention kernel.
    Sdpa,
    /// The model.
    Llm,
}

/// The parts of the command, labelled, in run order; an error names an unknown `--workloads`
/// label and lists the known ones.
pub fn plan(s: &Settings) -> Result<Vec<(String, Part)>, String> {
    let mut parts: Vec<(String, Part)> = match s.what.bench() {
        Some(b) => suite::plan(b, &s.opts)
            .into_iter()
            .enumerate()
            .map(|(i, j)| (j.label, Part::Job(i)))
            .collect(),
        None => Vec::new(),
    };
    if matches!(s.what, What::Sdpa | What::All) {
        parts.push(("sdpa".into(), Part::Sdpa));
    }
    if s.what == What::Llm || (s.what == What::All && !s.llm_sources.is_empty()) {
        parts.push(("llm".into(), Part::Llm));
    }
    if let Some(only) = &s.only {
        let known: Vec<&str> = parts.iter().map(|p| p.0.as_str()).collect();
        if let Some(bad) = only.iter().find(|w| !known.contains(&w.as_str())) {
            return Err(format!(
                "`{}` runs no workload `{bad}`; known: {}",
                s.what.name(),
                known.join(", ")
            ));
        }
        parts.retain(|p| only.contains(&p.0));
    }
    Ok(parts)
}

/// Runs `part` in this process.
pub fn run_here(s: &Settings, part: Part) -> Section {
    match part {
        Part::Job(i) => {
            let Some(bench) = s.what.bench() else {
                return Section::failed(format!("{} has no harness job {i}", s.what.name()));
            };
            let jobs = suite::plan(bench, &s.opts);
            let Some(job) = jobs.get(i) else {
                return Section::failed(format!("no harness job {i}"));
            };
            let job = std::slice::from_ref(job);
            let pb = crate::output::progress_bar(suite::ticks(job, &s.sources, &s.run));
            let rows = suite::run(job, &s.sources, &s.source_config, &s.run, &pb);
            pb.finish_and_clear();
            Section {
                rows,
                ..Section::default()
            }
        }
        Part::Sdpa => crate::sdpa::run_part(&s.sdpa, s.quick, &s.sources, &s.source_config),
        Part::Llm => crate::llm::run_part(&s.llm, s.quick, &s.llm_sources),
    }
}

/// Runs part `index` of the command in a child process (this binary, the same arguments)
/// and reads back what it measured.
pub fn run_in_child(index: usize, label: &str) -> Result<Section, String> {
    let exe = std::env::current_exe().map_err(|e| format!("finding this program: {e}"))?;
    let out = std::env::temp_dir().join(format!(
        "allocbench-{}-part-{index}.json",
        std::process::id()
    ));
    let status = Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env(PART_ENV, index.to_string())
        .env(PART_OUT_ENV, &out)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("starting the process of {label}: {e}"))?;
    let read = std::fs::read_to_string(&out);
    let _ = std::fs::remove_file(&out);
    if !status.success() {
        return Err(format!("the process of {label} failed ({status})"));
    }
    let text = read.map_err(|e| format!("reading what {label} measured: {e}"))?;
    serde_json::from_str(&text).map_err(|e| format!("reading what {label} measured: {e}"))
}

/// In a child ([`PART_ENV`] set): runs that part, writes its result and returns the exit
/// code; `None` in the parent.
pub fn serve_child(s: &Settings) -> Option<ExitCode> {
    let index = std::env::var(PART_ENV).ok()?;
    let out = std::env::var_os(PART_OUT_ENV)?;
    let part = index
        .parse::<usize>()
        .ok()
        .and_then(|i| plan(s).ok()?.into_iter().nth(i));
    let Some((_, part)) = part else {
        eprintln!("allocbench: {PART_ENV}={index} names no part of this command");
        return Some(ExitCode::from(2));
    };
    let result = run_here(s, part);
    let written = serde_json::to_string(&result)
        .map_err(|e| e.to_string())
        .and_then(|j| std::fs::write(Path::new(&out), j).map_err(|e| e.to_string()));
    Some(match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("allocbench: writing the result of part {index}: {e}");
            ExitCode::FAILURE
        }
    })
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
pub fn init_threads(cores: usize) {
    let rayon_threads = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(cores);
    crate::measure::set_sgemm_threads(rayon_threads);
    if rayon_threads >= 2 {
        // An error means a global pool exists already: then the calls stay outside it, which
        // costs time, not correctness.
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(rayon_threads)
            .use_current_thread()
            .build_global();
    }
}
