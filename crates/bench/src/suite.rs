//! Which measurements a benchmark subcommand makes, and running them.
//!
//! A subcommand is a list of [`Job`]s (a workload on a number of threads); every job runs on
//! every selected source, one after the other, so all figures of a job come from the same
//! stretch of time. New subcommands add a [`Bench`] variant and its jobs in [`plan`].

use indicatif::ProgressBar;

use crate::harness::{measure_all, Measurement, RunConfig};
// ExecuTorch's LLM runner gives its temp allocator a 10 MB cap: `all` runs decode under it too.
use crate::source::{SourceConfig, SourceKind, RUNNER_CAP};
use crate::workload::{Decode, Mix, Scratch, Workload};

/// The benchmark subcommands that run through the harness.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bench {
    /// The three scratch mixes.
    Scratch,
    /// SDPA decode scratch.
    Decode,
    /// Medium scratch on 1 and N threads.
    Threads,
    /// All of the above.
    All,
}

/// What a run is asked to do.
#[derive(Clone, Debug)]
pub struct Options {
    /// Short rounds (`--quick`).
    pub quick: bool,
    /// Threads of the multi-thread run of `threads`.
    pub threads: usize,
    /// Decode: tokens per round.
    pub decode_tokens: usize,
    /// Decode: layers (attention calls) per token.
    pub decode_layers: usize,
    /// Decode: `T`, the kernel's thread count in the scratch formula.
    pub decode_kernel_threads: usize,
}

impl Options {
    /// Defaults for quick or full runs on a machine with `cores` cores.
    pub fn new(quick: bool, cores: usize) -> Self {
        Options {
            quick,
            threads: cores.max(1),
            decode_tokens: if quick { 600 } else { 1024 },
            decode_layers: if quick { 2 } else { 8 },
            decode_kernel_threads: 8,
        }
    }

    /// Rounds and durations for this run.
    pub fn run_config(&self) -> RunConfig {
        if self.quick {
            RunConfig::quick()
        } else {
            RunConfig::full()
        }
    }
}

/// One workload on a number of threads, with the label it has in the table.
pub struct Job {
    /// Table label (`scratch-medium`, `threads x2`).
    pub label: String,
    /// The workload.
    pub workload: Box<dyn Workload>,
    /// Threads running it at once.
    pub threads: usize,
    /// The caching sources' `max_cached_bytes` for this job, instead of the run's.
    pub caching_cap: Option<usize>,
    /// The sources this job runs on (of those selected), or all of them.
    pub only: Option<&'static [&'static str]>,
}

/// The sources of the capped decode job: the caches under the runner's cap, and the baselines.
const CAPPED_DECODE_SOURCES: &[&str] = &[
    "caching",
    "caching-scope",
    "exact-cache",
    "static",
    "system",
];

/// The jobs of `bench`.
pub fn plan(bench: Bench, opts: &Options) -> Vec<Job> {
    let mut jobs = Vec::new();
    let scratch = |mix| Job {
        label: format!("scratch-{}", Mix::label(mix)),
        workload: Box::new(Scratch::new(mix)),
        threads: 1,
        caching_cap: None,
        only: None,
    };
    if matches!(bench, Bench::Scratch | Bench::All) {
        jobs.extend(Mix::ALL.into_iter().map(scratch));
    }
    let decode = || {
        Box::new(Decode::new(
            opts.decode_tokens,
            opts.decode_layers,
            opts.decode_kernel_threads,
        ))
    };
    if matches!(bench, Bench::Decode | Bench::All) {
        jobs.push(Job {
            label: "decode".into(),
            workload: decode(),
            threads: 1,
            caching_cap: None,
            only: None,
        });
    }
    if bench == Bench::All {
        jobs.push(Job {
            label: "decode cap 10MiB".into(),
            workload: decode(),
            threads: 1,
            caching_cap: Some(RUNNER_CAP),
            only: Some(CAPPED_DECODE_SOURCES),
        });
    }
    if matches!(bench, Bench::Threads | Bench::All) {
        let mut counts = vec![1];
        if opts.threads > 1 {
            counts.push(opts.threads);
        }
        for n in counts {
            jobs.push(Job {
                label: format!("threads x{n}"),
                workload: Box::new(Scratch::new(Mix::Medium)),
                threads: n,
                caching_cap: None,
                only: None,
            });
        }
    }
    jobs
}

/// Runs every job on every source (interleaved within a job, see
/// [`measure_all`]), advancing `progress`.
pub fn run(
    jobs: &[Job],
    sources: &[&SourceKind],
    source_config: &SourceConfig,
    cfg: &RunConfig,
    progress: &ProgressBar,
) -> Vec<Measurement> {
    let mut out = Vec::with_capacity(jobs.len() * sources.len());
    for job in jobs {
        progress.set_message(job.label.clone());
        let tick = || progress.inc(1);
        let config = SourceConfig {
            caching_cap: job.caching_cap.unwrap_or(source_config.caching_cap),
            ..source_config.clone()
        };
        let mine: Vec<&SourceKind> = sources
            .iter()
            .copied()
            .filter(|k| job.only.is_none_or(|only| only.contains(&k.name)))
            .collect();
        if mine.is_empty() {
            continue;
        }
        let ms = measure_all(
            job.workload.as_ref(),
            &mine,
            &config,
            job.threads,
            cfg,
            &tick,
        );
        out.extend(ms.into_iter().map(|mut m| {
            m.workload = job.label.clone();
            m
        }));
    }
    out
}

/// Progress units of `jobs` on `sources`: per job, one per source warm-up and one per
/// measured round.
pub fn ticks(jobs: &[Job], sources: &[&SourceKind], cfg: &RunConfig) -> usize {
    jobs.iter()
        .map(|j| {
            let n = sources
                .iter()
                .filter(|k| j.only.is_none_or(|only| only.contains(&k.name)))
                .count();
            if n == 0 {
                0
            } else {
                n + cfg.rounds
            }
        })
        .sum()
}
