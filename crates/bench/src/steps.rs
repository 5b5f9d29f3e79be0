//! The run loop of the kernel benchmarks (`sdpa`, `llm`): *steps* (one token, one prefill,
//! one layer call) run on every source back to back, in an order that changes every step,
//! so every source sees the same stretch of machine noise; then one [`Measurement`] per
//! source, with its time over `static`'s and `caching`'s: the median of their ratios step by
//! step.
//!
//! The harness workloads (`scratch`, `decode`, `threads`) run their rounds on threads with
//! barriers ([`crate::harness`]); both tally a source's times, faults and allocations in a
//! [`Tally`] that makes its [`Measurement`], so the per-call figures, tables, JSON, targets
//! and plots are one code path ([`crate::report`]).

use std::fmt::Display;
use std::sync::OnceLock;
use std::time::Instant;

use crate::harness::{Measurement, Tally};
use crate::measure::{self, Spread};
use crate::source::{Counters, SourceKind, CACHING, FLOOR};

/// What a kernel benchmark (`sdpa`, `llm`) measured: the allocator comparison's rows, the
/// kernels' decode and prefill efficiency (`D`, `P`) and what could not be measured.
#[derive(Clone, Debug, Default)]
pub struct KernelRun<D, P> {
    /// Every (workload, source) of the comparison, in run order.
    pub rows: Vec<Measurement>,
    /// Decode efficiency.
    pub decode_eff: D,
    /// Prefill efficiency.
    pub prefill_eff: P,
    /// What could not be measured, with why.
    pub errors: Vec<String>,
}

impl<D, P> KernelRun<D, P> {
    /// The value of `r`, or `None` with its error noted as "`what`: error" (what could not be
    /// measured, which the report lists).
    pub fn keep<T>(&mut self, what: impl Display, r: Result<T, impl Display>) -> Option<T> {
        r.map_err(|e| self.errors.push(format!("{what}: {e}"))).ok()
    }
}

impl<D: serde::Serialize, P: serde::Serialize> KernelRun<D, P> {
    /// The efficiency figures and what could not be measured, as the JSON has them.
    pub fn efficiency_json(&self) -> serde_json::Value {
        let (decode, prefill) = (&self.decode_eff, &self.prefill_eff);
        serde_json::json!({ "decode": decode, "prefill": prefill, "errors": self.errors })
    }
}

/// The order in which `n` sources run in step `step`: steps come in pairs, the second of a
/// pair the reverse of the first (forward, backward: a linear drift in machine speed over a
/// pair costs every source the same), and each pair starts one source later than the last.
pub fn step_order(step: usize, n: usize) -> Vec<usize> {
    let mut o: Vec<usize> = (0..n).map(|j| (step / 2 + j) % n.max(1)).collect();
    if step % 2 == 1 {
        o.reverse();
    }
    o
}

/// Interleaved steps over a set of sources.
pub struct Steps<'a> {
    kinds: &'a [&'a SourceKind],
    /// Each source's counters now (shared state plus its worker's).
    counters: &'a dyn Fn(usize) -> Counters,
    tallies: Vec<Tally>,
    /// Steps run so far (sets the order of the next one).
    taken: usize,
    /// Seconds on a monotonic clock ([`wall_seconds`] but in tests).
    clock: &'a dyn Fn() -> f64,
    /// When measuring should stop ([`Steps::with_budget`]), on `clock`.
    deadline: Option<f64>,
}

/// Steps taken before a budget may stop a run: one forward and one backward step.
pub const MIN_STEPS: usize = 2;

/// Seconds since the first call, on the monotonic clock.
fn wall_seconds() -> f64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_secs_f64()
}

impl<'a> Steps<'a> {
    /// No step run yet on `kinds`, whose counters `counters(i)` reads.
    pub fn new(kinds: &'a [&'a SourceKind], counters: &'a dyn Fn(usize) -> Counters) -> Self {
        Self::with_clock(kinds, counters, &wall_seconds)
    }

    /// [`new`](Self::new) timing steps with `clock` (seconds): a test's own clock makes the
    /// times, and so the ratios, exact.
    fn with_clock(
        kinds: &'a [&'a SourceKind],
        counters: &'a dyn Fn(usize) -> Counters,
        clock: &'a dyn Fn() -> f64,
    ) -> Self {
        Steps {
            kinds,
            counters,
            tallies: vec![Tally::default(); kinds.len()],
            taken: 0,
            clock,
            deadline: None,
        }
    }

    /// The same steps with a wall-time budget of `seconds` from now (none: no budget), which
    /// [`out_of_time`](Self::out_of_time) checks.
    pub fn with_budget(mut self, seconds: Option<f64>) -> Self {
        self.deadline = seconds.map(|s| (self.clock)() + s);
        self
    }

    /// Whether the budget is spent, with at least [`MIN_STEPS`] steps taken: the caller stops
    /// measuring, and every figure is the median of the steps taken (each row's `rounds`
    /// says how many). Never without a budget.
    pub fn out_of_time(&self) -> bool {
        self.taken >= MIN_STEPS && self.deadline.is_some_and(|d| (self.clock)() >= d)
    }

    /// Whether source `i` has failed (it is skipped from then on).
    pub fn failed(&self, i: usize) -> bool {
        self.tallies[i].error.is_some()
    }

    /// Warms source `i` up with `run` (untimed), keeping the largest peak RSS growth over its
    /// warm-ups and its first error.
    pub fn warm_up(&mut self, i: usize, run: impl FnOnce() -> Result<(), String>) {
        if self.failed(i) {
            return;
        }
        let rss = measure::rss_bytes();
        measure::reset_peak_rss();
        let r = run();
        let a = &mut self.tallies[i];
        a.peak_rss_growth = a
            .peak_rss_growth
            .max(measure::peak_rss_bytes().saturating_sub(rss));
        if let Err(e) = r {
            a.error = Some(e);
        }
    }

    /// One measured step on every source, in [`step_order`]: `run(i)` does source `i`'s
    /// part and returns how many units (calls, tokens) it was. A failed source records NaN.
    pub fn step(&mut self, mut run: impl FnMut(usize) -> Result<u64, String>) {
        for i in step_order(self.taken, self.tallies.len()) {
            if self.failed(i) {
                self.tallies[i].times.push(f64::NAN);
                continue;
            }
            let c0 = (self.counters)(i);
            let f0 = measure::minor_faults();
            let t0 = (self.clock)();
            let r = run(i);
            let dt = (self.clock)() - t0;
            let faults = measure::minor_faults().saturating_sub(f0);
            let allocs = (self.counters)(i).since(c0).system_allocs;
            let a = &mut self.tallies[i];
            match r {
                Ok(units) => {
                    a.times.push(dt);
                    a.faults += faults;
                    a.units += units;
                    if let Some(n) = allocs {
                        *a.sys_allocs.get_or_insert(0) += n;
                    }
                }
                Err(e) => {
                    a.times.push(f64::NAN);
                    a.error = Some(e);
                }
            }
        }
        self.taken += 1;
    }

    /// One [`Measurement`] per source, labelled `label`, time in ns per `unit` (`per_unit`
    /// maps a source's step times in seconds to those samples); `x_static` and `x_caching`
    /// are the median, over the steps both sources completed, of the two sources' time ratio
    /// in that step: the steps pair the sources up in time, and the median keeps one step
    /// that another process disturbed from moving the ratio.
    pub fn measurements(
        &self,
        label: &str,
        unit: &'static str,
        per_unit: impl Fn(&[f64]) -> Vec<f64>,
    ) -> Vec<Measurement> {
        let find = |name: &str| self.kinds.iter().position(|k| k.name == name);
        let ratio = |i: usize, base: Option<usize>| -> Option<f64> {
            let b = base?;
            if self.failed(i) || self.failed(b) {
                return None;
            }
            let ratios: Vec<f64> = self.tallies[i]
                .times
                .iter()
                .zip(&self.tallies[b].times)
                .filter(|(x, y)| x.is_finite() && y.is_finite() && **y > 0.0)
                .map(|(x, y)| x / y)
                .collect();
            (!ratios.is_empty()).then(|| Spread::of(&ratios).median)
        };
        let (floor, caching) = (find(FLOOR), find(CACHING));
        let threads = rayon::current_num_threads();
        let each = self.tallies.iter().enumerate().map(|(i, a)| Measurement {
            threads,
            whole_run: (self.counters)(i),
            calls_total: a.units,
            x_static: ratio(i, floor),
            x_caching: ratio(i, caching),
            ..a.measurement(label, self.kinds[i].name, unit, &per_unit(&a.times), 1)
        });
        each.collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::find;

    #[test]
    fn step_orders_pair_forward_and_backward() {
        assert_eq!(step_order(0, 3), vec![0, 1, 2]);
        assert_eq!(step_order(1, 3), vec![2, 1, 0]);
        assert_eq!(step_order(2, 3), vec![1, 2, 0]);
        assert_eq!(step_order(3, 3), vec![0, 2, 1]);
        for s in 0..10 {
            let mut o = step_order(s, 5);
            o.sort_unstable();
            assert_eq!(o, vec![0, 1, 2, 3, 4]);
        }
    }

    #[test]
    fn ratios_are_medians_of_the_steps_both_completed() {
        let kinds: Vec<&SourceKind> = ["static", "caching", "system"]
            .iter()
            .map(|n| find(n).unwrap())
            .collect();
        let allocs = std::cell::Cell::new(0u64);
        let counters = |i: usize| {
            if i == 2 {
                Counters::allocs(allocs.get())
            } else {
                Counters::default()
            }
        };
        // A clock the steps advance: exact times, whatever the machine's load.
        let now = std::cell::Cell::new(0.0f64);
        let clock = || now.get();
        // A budget of 1 ms: spent after the first step, but no stop before the second.
        let mut s = Steps::with_clock(&kinds, &counters, &clock).with_budget(Some(1e-3));
        assert!(!s.out_of_time());
        s.warm_up(1, || Ok(()));
        for step in 0..4 {
            assert_eq!(s.out_of_time(), step >= MIN_STEPS, "step {step}");
            s.step(|i| {
                // caching takes twice static's time, and 20 times in one disturbed step.
                let disturbed = if step == 0 && i == 1 { 10.0 } else { 1.0 };
                now.set(now.get() + 200e-6 * (i as f64 + 1.0) * disturbed);
                if i == 2 {
                    allocs.set(allocs.get() + 3);
                    if step == 3 {
                        return Err("out of memory".into());
                    }
                }
                Ok(2)
            });
        }
        let ms = s.measurements("w", "call", |t| t.iter().map(|x| x * 1e9).collect());
        assert_eq!(ms.len(), 3);
        assert_eq!((ms[0].x_static, ms[1].x_caching), (Some(1.0), Some(1.0)));
        // The median ratio is 2: the disturbed step (a total ratio of 6.5) does not move it.
        let x = ms[1].x_static.unwrap();
        assert!((x - 2.0).abs() < 1e-9, "{x}");
        // static's steps took 200 us each (`per_unit` above keeps whole steps).
        assert!(
            (ms[0].ns_per_call.median - 200e3).abs() < 1e-3,
            "{:?}",
            ms[0].ns_per_call
        );
        assert_eq!(ms[1].calls_total, 8);
        assert_eq!(ms[1].sys_allocs_per_call, None);
        // system failed on the last step: no ratio, its error kept, 3 allocations per 2 units
        // over the steps it completed.
        assert_eq!(ms[2].error.as_deref(), Some("out of memory"));
        assert_eq!(ms[2].x_static, None);
        assert_eq!(ms[2].sys_allocs_per_call, Some(1.5));
        assert!(s.failed(2));
    }
}
