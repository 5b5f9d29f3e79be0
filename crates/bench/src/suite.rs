//! Which measurements a benchmark subcommand makes, and running them.
//!
//! A subcommand is a list of [`Job`]s (a workload on a number of threads); every job runs on
//! every selected source, one after the other, so all figures of a job come from the same
//! stretch of time. New subcommands add a [`Bench`] variant and its jobs in [`plan`].

use indicatif::{ProgressBar, ProgressStyle};

use crate::harness::{measure_all, Measurement, RunConfig};
use crate::source::{SourceConfig, SourceKind};
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
}

/// The jobs of `bench`.
pub fn plan(bench: Bench, opts: &Options) -> Vec<Job> {
    let mut jobs = Vec::new();
    let scratch = |mix| Job {
        label: format!("scratch-{}", Mix::label(mix)),
        workload: Box::new(Scratch::new(mix)),
        threads: 1,
    };
    if matches!(bench, Bench::Scratch | Bench::All) {
        jobs.extend(Mix::ALL.into_iter().map(scratch));
    }
    if matches!(bench, Bench::Decode | Bench::All) {
        jobs.push(Job {
            label: "decode".into(),
            workload: Box::new(Decode::new(
                opts.decode_tokens,
                opts.decode_layers,
                opts.decode_kernel_threads,
            )),
            threads: 1,
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
        let ms = measure_all(
            job.workload.as_ref(),
            sources,
            source_config,
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

/// Progress units of one job: one per source warm-up, one per round of measured rounds.
pub fn ticks_per_job(sources: usize, cfg: &RunConfig) -> usize {
    sources + cfg.rounds
}

/// A progress bar on stderr for `n` measurements (hidden when stderr is not a terminal).
pub fn progress_bar(n: usize) -> ProgressBar {
    let pb = ProgressBar::new(n as u64);
    if let Ok(style) =
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
    {
        pb.set_style(style.progress_chars("=> "));
    }
    pb
}
