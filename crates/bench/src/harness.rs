//! The measurement harness: runs a workload on a source on one or more threads and measures
//! time per call, page faults, system allocations and peak RSS.
//!
//! Protocol for one workload on `threads` threads and a list of sources:
//! 1. build every source; each thread makes its own worker of each;
//! 2. for each source in turn: calibration (calibrated workloads only: rounds of growing
//!    length until one lasts a quarter of `round_target`, which sets the calls per round),
//!    then `warmup_rounds` untimed rounds (the first one observed, on single-thread runs);
//!    peak RSS growth = high-water mark during this phase minus RSS before it;
//! 3. `rounds` measured rounds per source, interleaved: round r runs every source once, so
//!    all sources share the same stretch of machine noise. All threads start a round together
//!    (barrier) and it lasts until the last one finishes. Time per call = round wall time /
//!    calls per thread.
//!
//! Page faults are the process's minor faults during a source's measured rounds (threads are
//! idle in between), divided by all calls of all threads.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Barrier, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::measure::{self, Spread};
use crate::source::{Block, Counters, ScratchSource, ScratchWorker, SourceConfig, SourceKind};
use crate::workload::{Observation, Round, Workload};

/// How long and how often to measure.
#[derive(Clone, Debug, serde::Serialize)]
pub struct RunConfig {
    /// Untimed rounds before measuring.
    pub warmup_rounds: usize,
    /// Measured rounds (the median is over these).
    pub rounds: usize,
    /// Target duration of one round of a calibrated workload.
    #[serde(serialize_with = "ser_ms")]
    pub round_target: Duration,
    /// Calls in the calibration round.
    pub calibration_calls: u64,
    /// Upper bound on calls per round.
    pub max_round_calls: u64,
}

fn ser_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{} ms", d.as_millis()))
}

impl RunConfig {
    /// `--quick`: short rounds, few of them.
    pub fn quick() -> Self {
        RunConfig {
            warmup_rounds: 1,
            rounds: 7,
            round_target: Duration::from_millis(40),
            calibration_calls: 2,
            max_round_calls: 1_000_000,
        }
    }

    /// The full run.
    pub fn full() -> Self {
        RunConfig {
            warmup_rounds: 2,
            rounds: 15,
            round_target: Duration::from_millis(100),
            calibration_calls: 3,
            max_round_calls: 10_000_000,
        }
    }

    /// Tests: one tiny round.
    pub fn smoke() -> Self {
        RunConfig {
            warmup_rounds: 1,
            rounds: 1,
            round_target: Duration::from_micros(50),
            calibration_calls: 1,
            max_round_calls: 3,
        }
    }
}

/// Everything measured for one (workload, source, threads). It crosses from a workload's
/// own process to the one that reports (see [`crate::parts`]) as JSON.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Measurement {
    /// Workload name.
    pub workload: String,
    /// Source name.
    pub source: String,
    /// What one "call" of the per-call figures is: `call` (a kernel call), `token`,
    /// `prefill`.
    pub unit: String,
    /// Threads running the workload at once.
    pub threads: usize,
    /// Measured rounds.
    pub rounds: usize,
    /// Calls per round per thread.
    pub calls_per_round: u64,
    /// Time per call (round wall time / calls per thread), nanoseconds.
    pub ns_per_call: Spread,
    /// Calls per second, all threads together, from the median round.
    pub calls_per_sec: f64,
    /// Minor page faults per call over the measured rounds.
    pub faults_per_call: f64,
    /// System allocations per call over the measured rounds, where countable.
    pub sys_allocs_per_call: Option<f64>,
    /// The source's counters at the end of the whole measurement (warm-up included), where
    /// it can tell: system allocations, cache misses, its peaks of bytes held from the layer
    /// below (live + cached) and of bytes live.
    pub whole_run: Counters,
    /// Calls over the whole measurement (warm-up included), all threads.
    pub calls_total: u64,
    /// Peak RSS during the measurement minus RSS before it, bytes.
    pub peak_rss_growth: u64,
    /// Time over `static`'s on the same workload (harness: median over median; kernel
    /// benchmarks: median of the step-by-step ratios over the same interleaved steps).
    pub x_static: Option<f64>,
    /// The same over `caching`'s.
    pub x_caching: Option<f64>,
    /// Bytes asked of the temp allocator per call, where counted (`llm`).
    pub temp_bytes_per_call: Option<f64>,
    /// What the observed warm-up round saw (decode).
    pub observation: Option<Observation>,
    /// Why the source could not run the workload, if it could not.
    pub error: Option<String>,
}

/// The message of a caught panic's payload (`?` when it is neither a `String` nor a `&str`).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> &str {
    payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied())
        .unwrap_or("?")
}

/// What one source did over its measured rounds (harness) or steps (the kernel benchmarks,
/// [`crate::steps`]): what its [`Measurement`]'s per-call figures are made of.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    /// Time of each measured round or step, seconds (NaN for a step after the source failed).
    pub times: Vec<f64>,
    /// Minor page faults over them.
    pub faults: u64,
    /// Calls (or tokens, prefills) over them, all threads: the divisor of the per-call figures.
    pub units: u64,
    /// System allocations over them, where the source counts them.
    pub sys_allocs: Option<u64>,
    /// Peak RSS growth during warm-up, bytes.
    pub peak_rss_growth: u64,
    /// The first error, after which the source is skipped.
    pub error: Option<String>,
}

impl Tally {
    /// The measurement of `source` on `workload` this tally makes: time per `unit` from `ns`
    /// (its samples, nanoseconds), calls per second with `parallel` calls running at once, faults
    /// and system allocations per unit, rounds = the times tallied. The caller fills in what
    /// only it knows (threads, counters, calls, ratios).
    pub fn measurement(
        &self,
        workload: &str,
        source: &str,
        unit: &str,
        ns: &[f64],
        parallel: usize,
    ) -> Measurement {
        let ns_per_call = Spread::of(ns);
        let units = self.units.max(1) as f64;
        Measurement {
            workload: workload.into(),
            source: source.into(),
            unit: unit.into(),
            rounds: self.times.len(),
            ns_per_call,
            calls_per_sec: if ns_per_call.median > 0.0 {
                parallel as f64 * 1e9 / ns_per_call.median
            } else {
                0.0
            },
            faults_per_call: self.faults as f64 / units,
            sys_allocs_per_call: self.sys_allocs.map(|x| x as f64 / units),
            peak_rss_growth: self.peak_rss_growth,
            error: self.error.clone(),
            ..Measurement::default()
        }
    }
}

/// What the coordinating thread asks the workers to do next.
const STOP: u64 = u64::MAX;

struct Shared<'a> {
    sources: Vec<&'a dyn ScratchSource>,
    workload: &'a dyn Workload,
    /// Worker threads running every round.
    threads: usize,
    start: Barrier,
    end: Barrier,
    /// Source of the next round.
    next_source: AtomicU64,
    /// Calls per thread for the next round, or STOP.
    next_calls: AtomicU64,
    /// Observe the next round (thread 0 only).
    observe: AtomicU64,
    /// counters[source][thread]: each worker's own counters after its last round.
    counters: Mutex<Vec<Vec<Counters>>>,
    observation: Mutex<Vec<Option<Observation>>>,
    errors: Mutex<Vec<Option<String>>>,
    /// (start, end) of each thread's last round, taken on the thread itself: the
    /// coordinating thread may be descheduled right after releasing a round.
    spans: Mutex<Vec<Option<(Instant, Instant)>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared<'_> {
    /// Whether source `si` has failed (it is skipped from then on).
    fn failed(&self, si: usize) -> bool {
        lock(&self.errors)[si].is_some()
    }

    /// Source `si`'s counters now: its shared state's and every worker's.
    fn counters(&self, si: usize) -> Counters {
        lock(&self.counters)[si]
            .iter()
            .fold(self.sources[si].counters(), |acc, c| acc.plus(*c))
    }

    /// Runs one round of `calls` calls per thread on source `si`; returns its wall time.
    fn round(&self, si: usize, calls: u64, observe: bool) -> Duration {
        self.next_source.store(si as u64, Ordering::Release);
        self.next_calls.store(calls, Ordering::Release);
        self.observe.store(u64::from(observe), Ordering::Release);
        self.start.wait();
        self.end.wait();
        let spans = lock(&self.spans);
        let start = spans.iter().flatten().map(|s| s.0).min();
        let end = spans.iter().flatten().map(|s| s.1).max();
        match (start, end) {
            (Some(a), Some(b)) => b.saturating_duration_since(a),
            _ => Duration::ZERO,
        }
    }
}

fn worker_loop(sh: &Shared<'_>, index: usize) {
    let mut workers: Vec<_> = sh.sources.iter().map(|s| s.worker()).collect();
    let mut blocks = vec![Block::EMPTY; sh.workload.max_blocks()];
    loop {
        sh.start.wait();
        let calls = sh.next_calls.load(Ordering::Acquire);
        if calls == STOP {
            break;
        }
        let si = sh.next_source.load(Ordering::Acquire) as usize;
        let worker = &mut workers[si];
        let t0 = Instant::now();
        if !sh.failed(si) {
            let observe = index == 0 && sh.observe.load(Ordering::Acquire) == 1;
            // A panicking source must not leave the other threads waiting at the barrier:
            // catch it and report it as the measurement's error.
            let res = std::panic::catch_unwind(AssertUnwindSafe(|| {
                let round = Round {
                    worker: worker.as_mut(),
                    calls,
                    blocks: &mut blocks,
                };
                if observe {
                    let read = |w: &dyn ScratchWorker| sh.sources[si].counters().plus(w.counters());
                    sh.workload
                        .observe_round(round, &read)
                        .map(|o| lock(&sh.observation)[si] = o)
                } else {
                    sh.workload.run_round(round)
                }
            }));
            let msg = match res {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e.to_string()),
                Err(p) => Some(format!("panicked: {}", panic_message(p.as_ref()))),
            };
            if let Some(msg) = msg {
                lock(&sh.errors)[si].get_or_insert(msg);
            }
        }
        let t1 = Instant::now();
        lock(&sh.spans)[index] = Some((t0, t1));
        lock(&sh.counters)[si][index] = worker.counters();
        sh.end.wait();
    }
}

/// One source of a [`measure_all`] run, from the coordinating thread's side.
#[derive(Default)]
struct SourceRun {
    /// Its index among the run's sources.
    index: usize,
    /// Calls per round per thread (fixed by the workload, or calibrated).
    calls: u64,
    /// Calls so far, warm-up included, all threads.
    calls_total: u64,
    /// Its counters after warm-up and at the end.
    before: Counters,
    after: Counters,
    tally: Tally,
}

impl SourceRun {
    /// A round of `calls` calls per thread on this source, counted in its total; its wall
    /// time in seconds.
    fn round(&mut self, sh: &Shared<'_>, calls: u64, observe: bool) -> f64 {
        self.calls_total += calls * sh.threads as u64;
        sh.round(self.index, calls, observe).as_secs_f64()
    }

    /// Builds the source up and warms it up: its calls per round (the workload's, or
    /// calibrated), then `cfg.warmup_rounds` untimed rounds, the first one observed on a
    /// single thread. Its peak RSS growth is measured over both.
    fn warm_up(&mut self, sh: &Shared<'_>, cfg: &RunConfig) {
        let rss_before = measure::rss_bytes();
        measure::reset_peak_rss();
        self.calls = match sh.workload.round_calls() {
            Some(c) => c,
            None => self.calibrate(sh, cfg),
        };
        for w in 0..cfg.warmup_rounds {
            if sh.failed(self.index) {
                break;
            }
            self.round(sh, self.calls, w == 0 && sh.threads == 1);
        }
        self.tally.peak_rss_growth = measure::peak_rss_bytes().saturating_sub(rss_before);
        self.before = sh.counters(self.index);
    }

    /// The calls per round of a calibrated workload: rounds of growing length until one lasts
    /// a quarter of `cfg.round_target` (so slow first calls, cold caches and first faults, do
    /// not set the count), then as many calls as fill the target.
    fn calibrate(&mut self, sh: &Shared<'_>, cfg: &RunConfig) -> u64 {
        let target = cfg.round_target.as_secs_f64();
        let mut c = cfg.calibration_calls.max(1);
        loop {
            let t = self.round(sh, c, false);
            if sh.failed(self.index) || t >= target / 4.0 || c >= cfg.max_round_calls {
                let k = (target * c as f64 / t.max(1e-9)).round() as u64;
                return k.clamp(1, cfg.max_round_calls);
            }
            c = c.saturating_mul(4);
        }
    }

    /// The source's measurement: time per call (round time / calls per thread), figures per
    /// call over the measured rounds.
    fn measurement(mut self, workload: &str, source: &str, threads: usize) -> Measurement {
        let (c, t) = (self.calls, &mut self.tally);
        t.units = t.times.len() as u64 * c * threads as u64;
        t.sys_allocs = self.after.since(self.before).system_allocs;
        let ns: Vec<f64> = t.times.iter().map(|s| s * 1e9 / c.max(1) as f64).collect();
        Measurement {
            threads,
            calls_per_round: c,
            whole_run: self.after,
            calls_total: self.calls_total,
            ..t.measurement(workload, source, "call", &ns, threads)
        }
    }
}

/// Measures `workload` on fresh sources of every `kinds` with `threads` threads, interleaved:
/// every source is built and warmed up in turn (its peak RSS growth is measured then), then
/// the measured rounds alternate between the sources (the first source of each round of
/// rounds rotates), so every source sees the same stretch of machine noise and the ratios
/// between them hold on a busy machine. `tick` is called after each warm-up and each round
/// of rounds.
pub fn measure_all(
    workload: &dyn Workload,
    kinds: &[&SourceKind],
    source_config: &SourceConfig,
    threads: usize,
    cfg: &RunConfig,
    tick: &(dyn Fn() + Sync),
) -> Vec<Measurement> {
    let threads = threads.max(1);
    let n = kinds.len();
    let built: Vec<Box<dyn ScratchSource>> =
        kinds.iter().map(|k| (k.build)(source_config)).collect();
    let sh = Shared {
        sources: built.iter().map(|b| b.as_ref()).collect(),
        workload,
        threads,
        start: Barrier::new(threads + 1),
        end: Barrier::new(threads + 1),
        next_source: AtomicU64::new(0),
        next_calls: AtomicU64::new(0),
        observe: AtomicU64::new(0),
        counters: Mutex::new(vec![vec![Counters::default(); threads]; n]),
        observation: Mutex::new(vec![None; n]),
        errors: Mutex::new(vec![None; n]),
        spans: Mutex::new(vec![None; threads]),
    };
    let mut runs: Vec<SourceRun> = (0..n)
        .map(|index| SourceRun {
            index,
            ..SourceRun::default()
        })
        .collect();
    std::thread::scope(|s| {
        for i in 0..threads {
            let sh = &sh;
            std::thread::Builder::new()
                .name(format!("allocbench-{i}"))
                .spawn_scoped(s, move || worker_loop(sh, i))
                .expect("spawning a benchmark thread");
        }
        // Build-up and warm-up, one source after the other.
        for r in &mut runs {
            r.warm_up(&sh, cfg);
            tick();
        }
        // Measured rounds, interleaved.
        for round in 0..cfg.rounds {
            for k in 0..n {
                let r = &mut runs[(round + k) % n];
                if !sh.failed(r.index) {
                    let f0 = measure::minor_faults();
                    let t = r.round(&sh, r.calls, false);
                    r.tally.faults += measure::minor_faults().saturating_sub(f0);
                    r.tally.times.push(t);
                }
            }
            tick();
        }
        for r in &mut runs {
            r.after = sh.counters(r.index);
        }
        sh.next_calls.store(STOP, Ordering::Release);
        sh.start.wait();
    });
    let mut obs = std::mem::take(&mut *lock(&sh.observation));
    let mut errs = std::mem::take(&mut *lock(&sh.errors));
    let mut ms: Vec<Measurement> = runs
        .into_iter()
        .zip(kinds)
        .map(|(mut r, k)| {
            let si = r.index;
            r.tally.error = errs[si].take();
            Measurement {
                observation: obs[si].take(),
                ..r.measurement(&workload.name(), k.name, threads)
            }
        })
        .collect();
    drop(sh);
    drop(built);
    median_ratios(&mut ms);
    ms
}

/// Sets `x_static` and `x_caching` of measurements of one workload: median time per call
/// over the base's, where both succeeded.
pub fn median_ratios(ms: &mut [Measurement]) {
    let median_of = |name: &str, ms: &[Measurement]| {
        ms.iter()
            .find(|m| m.source == name && m.error.is_none() && m.ns_per_call.median > 0.0)
            .map(|m| m.ns_per_call.median)
    };
    let floor = median_of(crate::source::FLOOR, ms);
    let caching = median_of(crate::source::CACHING, ms);
    for m in ms.iter_mut().filter(|m| m.error.is_none()) {
        m.x_static = floor.map(|b| m.ns_per_call.median / b);
        m.x_caching = caching.map(|b| m.ns_per_call.median / b);
    }
}
