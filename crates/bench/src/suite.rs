//! What a benchmark command runs: a list of [`Suite`]s, each a workload (or the kernel
//! benchmark, or the model) that knows how to run and time itself and reports a [`Section`].
//!
//! The scratch suites ([`ScratchJob`]: a workload on a number of threads) run every selected
//! source through [`measure_all`], interleaved round by round; the kernel suites (`sdpa`,
//! `llm`) run steps through [`crate::steps`]. Each suite of a command runs in a fresh process
//! ([`crate::parts`]). A new workload is a [`ScratchJob`] in [`plan`]; a new kind of benchmark
//! implements [`Suite`].

use crate::harness::{measure_all, RunConfig};
use crate::llm::LlmConfig;
use crate::report::Section;
use crate::sdpa::SdpaConfig;
use crate::source::{SourceConfig, SourceKind, RUNNER_CAP};
use crate::workload::{Decode, Mix, Scratch, Workload};

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
}

/// Everything a command's suites need, the same in the parent and in every child (both build
/// it from the same command line).
#[derive(Clone, Debug)]
pub struct Settings {
    /// The command.
    pub what: What,
    /// Short rounds.
    pub quick: bool,
    /// The sources of the scratch workloads and of `sdpa`.
    pub sources: Vec<&'static SourceKind>,
    /// The sources of `llm`.
    pub llm_sources: Vec<&'static SourceKind>,
    /// Source settings of the scratch workloads and of `sdpa`.
    pub source_config: SourceConfig,
    /// Threads of the multi-thread run of `threads`.
    pub threads: usize,
    /// The `decode` workload (tokens, layers, the kernel's thread count in its formula).
    pub decode: Decode,
    /// Rounds and durations of the scratch workloads.
    pub run: RunConfig,
    /// What `sdpa` runs.
    pub sdpa: SdpaConfig,
    /// What `llm` runs.
    pub llm: LlmConfig,
    /// Only the suites of these labels (`--workloads`), or all.
    pub only: Option<Vec<String>>,
}

/// One benchmark of a command: what it runs, how it times it, what it reports.
pub trait Suite {
    /// Its label in the tables (and for `--workloads`).
    fn label(&self) -> &str;

    /// One line saying what it runs.
    fn describe(&self) -> String;

    /// Runs it in this process on the sources of `s`.
    fn run(&self, s: &Settings) -> Section;
}

/// A scratch workload on a number of threads: every selected source, rounds interleaved.
pub struct ScratchJob {
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

impl ScratchJob {
    /// The sources of `sources` this job runs on.
    fn sources(&self, sources: &[&'static SourceKind]) -> Vec<&'static SourceKind> {
        sources
            .iter()
            .copied()
            .filter(|k| self.only.is_none_or(|only| only.contains(&k.name)))
            .collect()
    }
}

impl Suite for ScratchJob {
    fn label(&self) -> &str {
        &self.label
    }

    fn describe(&self) -> String {
        self.workload.describe()
    }

    fn run(&self, s: &Settings) -> Section {
        let mine = self.sources(&s.sources);
        if mine.is_empty() {
            return Section::default();
        }
        let config = SourceConfig {
            caching_cap: self.caching_cap.unwrap_or(s.source_config.caching_cap),
            ..s.source_config.clone()
        };
        // A progress unit per source warm-up and per measured round.
        let units = mine.len() + s.run.rounds;
        let ms = crate::output::with_progress(units, &self.label, |tick| {
            let w = self.workload.as_ref();
            measure_all(w, &mine, &config, self.threads, &s.run, tick)
        });
        Section {
            rows: ms
                .into_iter()
                .map(|mut m| {
                    m.workload = self.label.clone();
                    m
                })
                .collect(),
            ..Section::default()
        }
    }
}

/// A kernel benchmark (`sdpa`, `llm`): it times its own steps and reports its own section.
struct KernelSuite {
    label: &'static str,
    about: &'static str,
    run: fn(&Settings) -> Section,
}

impl Suite for KernelSuite {
    fn label(&self) -> &str {
        self.label
    }

    fn describe(&self) -> String {
        self.about.into()
    }

    fn run(&self, s: &Settings) -> Section {
        (self.run)(s)
    }
}

/// The attention kernel over a model (`allocbench sdpa`).
const SDPA: KernelSuite = KernelSuite {
    label: "sdpa",
    about: "the attention kernel over a model, decode and prefill, every dtype",
    run: |s| crate::sdpa::run_part(&s.sdpa, s.quick, &s.sources, &s.source_config),
};

/// A whole model generating (`allocbench llm`).
const LLM: KernelSuite = KernelSuite {
    label: "llm",
    about: "a whole Llama-family model, prefill and decode",
    run: |s| crate::llm::run_part(&s.llm, s.quick, &s.llm_sources),
};

/// The sources of the capped decode job: the caches under the runner's cap, and the baselines.
const CAPPED_DECODE_SOURCES: &[&str] = &[
    "caching",
    "caching-scope",
    "exact-cache",
    "static",
    "system",
];

/// The scratch jobs of the command of `s` (none for `sdpa` and `llm`).
pub fn scratch_jobs(s: &Settings) -> Vec<ScratchJob> {
    let what = s.what;
    let job = |label: String, workload: Box<dyn Workload>, threads| ScratchJob {
        label,
        workload,
        threads,
        caching_cap: None,
        only: None,
    };
    let decode = || Box::new(s.decode.clone());
    let mut jobs = Vec::new();
    if matches!(what, What::Scratch | What::All) {
        for mix in Mix::ALL {
            let label = format!("scratch-{}", Mix::label(mix));
            jobs.push(job(label, Box::new(Scratch::new(mix)), 1));
        }
    }
    if matches!(what, What::Decode | What::All) {
        jobs.push(job("decode".into(), decode(), 1));
    }
    if what == What::All {
        // ExecuTorch's LLM runner gives its temp allocator a 10 MB cap: decode under it too.
        jobs.push(ScratchJob {
            caching_cap: Some(RUNNER_CAP),
            only: Some(CAPPED_DECODE_SOURCES),
            ..job("decode cap 10MiB".into(), decode(), 1)
        });
    }
    if matches!(what, What::Threads | What::All) {
        let mut counts = vec![1];
        if s.threads > 1 {
            counts.push(s.threads);
        }
        for n in counts {
            let medium = Box::new(Scratch::new(Mix::Medium));
            jobs.push(job(format!("threads x{n}"), medium, n));
        }
    }
    jobs
}

/// The suites of the command, in run order; an error names an unknown `--workloads` label
/// and lists the known ones.
pub fn plan(s: &Settings) -> Result<Vec<Box<dyn Suite>>, String> {
    let mut suites: Vec<Box<dyn Suite>> = scratch_jobs(s)
        .into_iter()
        .map(|j| Box::new(j) as Box<dyn Suite>)
        .collect();
    if matches!(s.what, What::Sdpa | What::All) {
        suites.push(Box::new(SDPA));
    }
    if s.what == What::Llm || (s.what == What::All && !s.llm_sources.is_empty()) {
        suites.push(Box::new(LLM));
    }
    if let Some(only) = &s.only {
        let known: Vec<&str> = suites.iter().map(|p| p.label()).collect();
        if let Some(bad) = only.iter().find(|w| !known.contains(&w.as_str())) {
            return Err(format!(
                "`{}` runs no workload `{bad}`; known: {}",
                s.what.name(),
                known.join(", ")
            ));
        }
        suites.retain(|p| only.iter().any(|w| w == p.label()));
    }
    Ok(suites)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(what: What, only: Option<&[&str]>) -> Settings {
        let quick = true;
        Settings {
            what,
            quick,
            sources: crate::source::SOURCES.iter().collect(),
            llm_sources: crate::llm::llm_sources(),
            source_config: SourceConfig::default(),
            threads: 2,
            decode: Decode::new(600, 2, 8),
            run: RunConfig::smoke(),
            sdpa: SdpaConfig::smoke(),
            llm: LlmConfig::tiny(),
            only: only.map(|o| o.iter().map(|w| w.to_string()).collect()),
        }
    }

    fn labels(s: &Settings) -> Vec<String> {
        plan(s)
            .unwrap()
            .iter()
            .map(|p| p.label().to_string())
            .collect()
    }

    #[test]
    fn all_runs_every_workload_in_order_and_workloads_picks_some() {
        assert_eq!(
            labels(&settings(What::All, None)),
            [
                "scratch-small",
                "scratch-medium",
                "scratch-large",
                "decode",
                "decode cap 10MiB",
                "threads x1",
                "threads x2",
                "sdpa",
                "llm"
            ]
        );
        let picked = settings(What::All, Some(&["llm", "scratch-large"]));
        assert_eq!(labels(&picked), ["scratch-large", "llm"]);
        assert_eq!(labels(&settings(What::Sdpa, None)), ["sdpa"]);
        let Err(bad) = plan(&settings(What::Decode, Some(&["sdpa"]))) else {
            panic!("decode ran a workload `sdpa`");
        };
        assert!(
            bad.contains("`sdpa`") && bad.contains("known: decode"),
            "{bad}"
        );
    }

    #[test]
    fn the_capped_decode_runs_on_its_sources_only() {
        let jobs = scratch_jobs(&settings(What::All, None));
        let capped = jobs.iter().find(|j| j.label == "decode cap 10MiB").unwrap();
        let mut names: Vec<&str> = capped
            .sources(&crate::source::SOURCES.iter().collect::<Vec<_>>())
            .iter()
            .map(|k| k.name)
            .collect();
        let mut want = CAPPED_DECODE_SOURCES.to_vec();
        names.sort();
        want.sort();
        assert_eq!(names, want);
        assert_eq!(capped.caching_cap, Some(RUNNER_CAP));
    }
}
