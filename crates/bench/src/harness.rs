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

/// What the coordinating thread asks the workers to do next.
const STOP: u64 = u64::MAX;

struct Shared<'a> {
    sources: Vec<&'a dyn ScratchSource>,
    workload: &'a dyn Workload,
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
        if lock(&sh.errors)[si].is_none() {
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

/// Runs one round of `calls` calls per thread on source `si`; returns its wall time.
fn round(sh: &Shared<'_>, si: usize, calls: u64, observe: bool) -> Duration {
    sh.next_source.store(si as u64, Ordering::Release);
    sh.next_calls.store(calls, Ordering::Release);
    sh.observe.store(u64::from(observe), Ordering::Release);
    sh.start.wait();
    sh.end.wait();
    let spans = lock(&sh.spans);
    let start = spans.iter().flatten().map(|s| s.0).min();
    let end = spans.iter().flatten().map(|s| s.1).max();
    match (start, end) {
        (Some(a), Some(b)) => b.saturating_duration_since(a),
        _ => Duration::ZERO,
    }
}

fn total_counters(sh: &Shared<'_>, si: usize) -> Counters {
    lock(&sh.counters)[si]
        .iter()
        .fold(sh.sources[si].counters(), |acc, c| acc.plus(*c))
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
    let mut ms: Vec<Measurement> = kinds
        .iter()
        .map(|k| Measurement {
            workload: workload.name(),
            source: k.name.to_string(),
            unit: "call".into(),
            threads,
            rounds: cfg.rounds,
            ..Measurement::default()
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
        let failed = |si: usize| lock(&sh.errors)[si].is_some();
        let observe_first = threads == 1;
        let mut calls_total = vec![0u64; n];
        let mut calls = vec![0u64; n];
        let mut before = vec![Counters::default(); n];
        // Build-up and warm-up, one source after the other.
        for si in 0..n {
            let rss_before = measure::rss_bytes();
            measure::reset_peak_rss();
            calls[si] = match workload.round_calls() {
                Some(c) => c,
                None => {
                    // Grow the calibration round until it lasts a quarter of the target, so
                    // slow first calls (cold caches, first faults) do not set the count.
                    let target = cfg.round_target.as_secs_f64();
                    let mut c = cfg.calibration_calls.max(1);
                    loop {
                        let t = round(&sh, si, c, false).as_secs_f64();
                        calls_total[si] += c * threads as u64;
                        if failed(si) || t >= target / 4.0 || c >= cfg.max_round_calls {
                            let k = (target * c as f64 / t.max(1e-9)).round() as u64;
                            break k.clamp(1, cfg.max_round_calls);
                        }
                        c = c.saturating_mul(4);
                    }
                }
            };
            for w in 0..cfg.warmup_rounds {
                if failed(si) {
                    break;
                }
                round(&sh, si, calls[si], w == 0 && observe_first);
                calls_total[si] += calls[si] * threads as u64;
            }
            ms[si].peak_rss_growth = measure::peak_rss_bytes().saturating_sub(rss_before);
            before[si] = total_counters(&sh, si);
            tick();
        }
        // Measured rounds, interleaved.
        let mut times: Vec<Vec<Duration>> = vec![Vec::with_capacity(cfg.rounds); n];
        let mut faults = vec![0u64; n];
        for r in 0..cfg.rounds {
            for k in 0..n {
                let si = (r + k) % n;
                if failed(si) {
                    continue;
                }
                let f0 = measure::minor_faults();
                times[si].push(round(&sh, si, calls[si], false));
                faults[si] += measure::minor_faults().saturating_sub(f0);
                calls_total[si] += calls[si] * threads as u64;
            }
            tick();
        }
        for (si, m) in ms.iter_mut().enumerate() {
            let after = total_counters(&sh, si);
            let c = calls[si];
            let measured_calls = (times[si].len() as u64 * c * threads as u64).max(1) as f64;
            let per_call: Vec<f64> = times[si]
                .iter()
                .map(|t| t.as_nanos() as f64 / c.max(1) as f64)
                .collect();
            m.calls_per_round = c;
            m.ns_per_call = Spread::of(&per_call);
            m.calls_per_sec = if m.ns_per_call.median > 0.0 {
                threads as f64 * 1e9 / m.ns_per_call.median
            } else {
                0.0
            };
            m.faults_per_call = faults[si] as f64 / measured_calls;
            m.sys_allocs_per_call = after
                .since(before[si])
                .system_allocs
                .map(|x| x as f64 / measured_calls);
            m.whole_run = after;
            m.calls_total = calls_total[si];
        }
        sh.next_calls.store(STOP, Ordering::Release);
        sh.start.wait();
    });
    let mut obs = std::mem::take(&mut *lock(&sh.observation));
    let mut errs = std::mem::take(&mut *lock(&sh.errors));
    for (si, m) in ms.iter_mut().enumerate() {
        m.observation = obs[si].take();
        m.error = errs[si].take();
    }
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
