//! Turning measurements into the table, the target checks and the JSON file.

use comfy_table::{presets, CellAlignment, Table};
use serde_json::{json, Value};

use crate::harness::{Measurement, RunConfig};
use crate::os::Machine;
use crate::source::SourceConfig;

/// Source names the ratios and targets refer to.
pub const FLOOR: &str = "static";
/// This project's allocator, `allocate`/`reset` path.
pub const CACHING: &str = "caching";
/// This project's allocator, `Scope` path.
pub const CACHING_SCOPE: &str = "caching-scope";
/// The general-purpose allocators and pools `caching` should beat.
pub const RIVALS: [&str; 5] = ["system", "mimalloc", "jemalloc", "zeropool", "orthotope"];

/// One checked target.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TargetCheck {
    /// The goal, as the issue states it.
    pub target: String,
    /// What was measured.
    pub measured: String,
    /// `Some(true)` met, `Some(false)` missed, `None` not measured (a source was left out).
    pub met: Option<bool>,
}

impl TargetCheck {
    /// `MET`, `MISSED` or `n/a`.
    pub fn verdict(&self) -> &'static str {
        match self.met {
            Some(true) => "MET",
            Some(false) => "MISSED",
            None => "n/a",
        }
    }
}

/// A whole run.
#[derive(Clone, Debug)]
pub struct Report {
    /// Where it ran.
    pub machine: Machine,
    /// The command that ran.
    pub command: String,
    /// `quick` or `full`.
    pub mode: &'static str,
    /// Rounds and durations.
    pub run: RunConfig,
    /// Source settings.
    pub sources: SourceConfig,
    /// (workload, what one call does).
    pub workloads: Vec<(String, String)>,
    /// Every measurement, in run order.
    pub measurements: Vec<Measurement>,
    /// Threads of the multi-thread runs.
    pub threads: usize,
    /// Wall time of the whole run, seconds.
    pub elapsed_s: f64,
}

/// Formats nanoseconds with a readable unit.
pub fn fmt_ns(ns: f64) -> String {
    if !ns.is_finite() {
        "-".into()
    } else if ns < 1e3 {
        format!("{ns:.0} ns")
    } else if ns < 1e6 {
        format!("{:.2} µs", ns / 1e3)
    } else if ns < 1e9 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.2} s", ns / 1e9)
    }
}

/// Formats a per-call count (faults, system allocations) with as many decimals as it needs.
pub(crate) fn fmt_count(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else if x < 0.01 {
        format!("{x:.4}")
    } else if x < 100.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.0}")
    }
}

fn fmt_rate(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.2} M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1} k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

/// An empty Markdown table (readable in a terminal, pastes into a README) with `header`.
pub(crate) fn markdown_table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(presets::ASCII_MARKDOWN);
    t.set_header(header.to_vec());
    t
}

/// Right-aligns the columns `cols` of `t` (the numeric ones).
pub(crate) fn align_right(t: &mut Table, cols: core::ops::Range<usize>) {
    for i in cols {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(CellAlignment::Right);
        }
    }
}

/// The cells "faults/call", "sys allocs/call" and "peak RSS +MiB" of a measurement.
pub(crate) fn memory_cells(m: &Measurement) -> [String; 3] {
    [
        fmt_count(m.faults_per_call),
        m.sys_allocs_per_call
            .map(fmt_count)
            .unwrap_or_else(|| "n/a".into()),
        format!("{:.1}", m.peak_rss_growth as f64 / (1 << 20) as f64),
    ]
}

/// The cell "peak held/live MiB": the most bytes the source held (live + cached) and the most
/// live at once, where it can tell ("n/a" otherwise).
pub(crate) fn held_cell(m: &Measurement) -> String {
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    match (m.peak_reserved, m.peak_live) {
        (Some(r), Some(l)) => format!("{:.1}/{:.1}", mib(r), mib(l)),
        _ => "n/a".into(),
    }
}

/// The targets table: target, measured, verdict.
pub fn targets_table(checks: &[TargetCheck]) -> Table {
    let mut t = markdown_table(&["target", "measured", "verdict"]);
    for c in checks {
        t.add_row(vec![
            c.target.clone(),
            c.measured.clone(),
            c.verdict().to_string(),
        ]);
    }
    t
}

impl Report {
    /// The measurement of `source` on `workload`, if it ran and succeeded.
    pub fn get(&self, workload: &str, source: &str) -> Option<&Measurement> {
        self.measurements
            .iter()
            .find(|m| m.workload == workload && m.source == source && m.error.is_none())
    }

    /// Median time per call of `m` over that of `source` on the same workload.
    pub fn ratio_to(&self, m: &Measurement, source: &str) -> Option<f64> {
        let base = self.get(&m.workload, source)?;
        (m.error.is_none() && base.ns_per_call.median > 0.0)
            .then(|| m.ns_per_call.median / base.ns_per_call.median)
    }

    /// Workload labels in run order, without repeats.
    pub fn workload_labels(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for m in &self.measurements {
            if !out.contains(&m.workload) {
                out.push(m.workload.clone());
            }
        }
        out
    }

    /// The main table, as Markdown (readable in a terminal, pastes into a README).
    pub fn table(&self) -> Table {
        let mut t = markdown_table(&[
            "workload",
            "source",
            "median/call",
            "min",
            "max",
            "x static",
            "x caching",
            "faults/call",
            "sys allocs/call",
            "peak RSS +MiB",
            "peak held/live MiB",
            "calls/s",
        ]);
        for m in &self.measurements {
            let ratio = |s: &str| {
                self.ratio_to(m, s)
                    .map(|r| format!("{r:.2}"))
                    .unwrap_or_else(|| "-".into())
            };
            let row = if let Some(e) = &m.error {
                vec![
                    m.workload.clone(),
                    m.source.clone(),
                    format!("FAILED: {e}"),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                ]
            } else {
                let [faults, sys_allocs, rss] = memory_cells(m);
                vec![
                    m.workload.clone(),
                    m.source.clone(),
                    fmt_ns(m.ns_per_call.median),
                    fmt_ns(m.ns_per_call.min),
                    fmt_ns(m.ns_per_call.max),
                    ratio(FLOOR),
                    ratio(CACHING),
                    faults,
                    sys_allocs,
                    rss,
                    held_cell(m),
                    fmt_rate(m.calls_per_sec),
                ]
            };
            t.add_row(row);
        }
        align_right(&mut t, 2..12);
        t
    }

    /// Checks the targets against the measurements.
    pub fn targets(&self) -> Vec<TargetCheck> {
        let mut out = Vec::new();
        let labels = self.workload_labels();
        let variants = [CACHING, CACHING_SCOPE];
        // 1. within 1.05x of static, 0 faults per call.
        for w in &labels {
            for v in variants {
                let Some(m) = self.get(w, v) else { continue };
                let r = self.ratio_to(m, FLOOR);
                out.push(TargetCheck {
                    target: format!("{v} within 1.05x of static on {w}, 0 page faults/call"),
                    measured: format!(
                        "{}, {} faults/call",
                        r.map(|r| format!("{r:.2}x"))
                            .unwrap_or_else(|| "no static".into()),
                        fmt_count(m.faults_per_call)
                    ),
                    met: r.map(|r| r <= 1.05 && m.faults_per_call < 0.01),
                });
            }
        }
        // 2. faster than the general-purpose allocators and pools.
        for w in ["scratch-medium", "scratch-large", "decode"] {
            for v in variants {
                let Some(m) = self.get(w, v) else { continue };
                let rivals: Vec<(&str, f64)> = RIVALS
                    .iter()
                    .filter_map(|r| self.get(w, r).map(|x| (*r, x.ns_per_call.median)))
                    .collect();
                let best = rivals.iter().copied().min_by(|a, b| a.1.total_cmp(&b.1));
                let missing: Vec<&str> = RIVALS
                    .iter()
                    .copied()
                    .filter(|r| !rivals.iter().any(|x| x.0 == *r))
                    .collect();
                let measured = match best {
                    Some((name, ns)) => format!(
                        "fastest rival {name} {}; {v} {} ({:.2}x faster){}",
                        fmt_ns(ns),
                        fmt_ns(m.ns_per_call.median),
                        ns / m.ns_per_call.median,
                        if missing.is_empty() {
                            String::new()
                        } else {
                            format!("; not measured: {}", missing.join(", "))
                        }
                    ),
                    None => "no rival measured".into(),
                };
                out.push(TargetCheck {
                    target: format!(
                        "{v} faster than system, mimalloc, jemalloc, zeropool, orthotope on {w}"
                    ),
                    measured,
                    met: best.map(|(_, ns)| m.ns_per_call.median < ns),
                });
            }
        }
        // 3. decode (and decode under the runner's cap): system allocations vs distinct size
        // classes, peak RSS growth vs static's; exact-cache misses.
        let decodes: Vec<&String> = labels.iter().filter(|l| l.starts_with("decode")).collect();
        for (w, v) in decodes.iter().flat_map(|w| variants.map(|v| (*w, v))) {
            let Some(m) = self.get(w, v) else {
                continue;
            };
            if let Some(floor) = self.get(w, FLOOR) {
                let mib = |b: u64| b as f64 / (1 << 20) as f64;
                out.push(TargetCheck {
                    target: format!("{v} on {w}: peak RSS growth <= 1.25x static's"),
                    measured: format!(
                        "{:.1} MiB vs static {:.1} MiB{}",
                        mib(m.peak_rss_growth),
                        mib(floor.peak_rss_growth),
                        if floor.peak_rss_growth == 0 {
                            " (no growth to compare: an earlier job left the pages mapped; run \
                             this workload alone)"
                        } else {
                            ""
                        }
                    ),
                    met: (floor.peak_rss_growth > 0)
                        .then_some(m.peak_rss_growth as f64 <= 1.25 * floor.peak_rss_growth as f64),
                });
            }
            let classes = self
                .measurements
                .iter()
                .find_map(|x| x.observation.as_ref())
                .map(|o| o.distinct_size_classes);
            let allocs = m.sys_allocs_total;
            out.push(TargetCheck {
                target: format!(
                    "{v} on {w}: system allocations over the run <= distinct size classes asked"
                ),
                measured: format!(
                    "{} system allocations over {} calls; {} distinct size classes",
                    allocs.map(|a| a.to_string()).unwrap_or_else(|| "?".into()),
                    m.calls_total,
                    classes.map(|c| c.to_string()).unwrap_or_else(|| "?".into()),
                ),
                met: allocs.zip(classes).map(|(a, c)| a <= c as u64),
            });
        }
        if let Some(m) = self.get("decode", "exact-cache") {
            let o = m.observation.clone().unwrap_or_default();
            out.push(TargetCheck {
                target: "exact-cache misses on every decode token below 512 (the weakness shown)"
                    .into(),
                measured: format!(
                    "missed on {} of {} tokens below 512 in the first round; {} misses over {} calls",
                    o.tokens_below_512_with_miss,
                    o.tokens_below_512,
                    m.misses_total.unwrap_or(0),
                    m.calls_total
                ),
                met: Some(
                    o.tokens_below_512 > 0 && o.tokens_below_512_with_miss == o.tokens_below_512,
                ),
            });
        }
        // 4. threads scaling.
        let one = "threads x1".to_string();
        let many = labels
            .iter()
            .find(|l| l.starts_with("threads x") && **l != one)
            .cloned();
        for v in variants {
            let (Some(a), Some(b)) = (
                self.get(&one, v),
                many.as_deref().and_then(|w| self.get(w, v)),
            ) else {
                continue;
            };
            let s = self.scaling(v);
            out.push(TargetCheck {
                target: format!(
                    "{v} threads: scaling >= 1.8x on {} threads ({} cores)",
                    b.threads, self.machine.cores
                ),
                measured: format!(
                    "{} calls/s on 1 thread, {} on {}: {:.2}x",
                    fmt_rate(a.calls_per_sec),
                    fmt_rate(b.calls_per_sec),
                    b.threads,
                    s.unwrap_or(f64::NAN)
                ),
                met: s.map(|s| s >= 1.8),
            });
        }
        out
    }

    /// Aggregate calls/s on N threads over calls/s on one, for `source`.
    pub fn scaling(&self, source: &str) -> Option<f64> {
        let one = self.get("threads x1", source)?;
        let many = self.measurements.iter().find(|m| {
            m.workload.starts_with("threads x")
                && m.threads > 1
                && m.source == source
                && m.error.is_none()
        })?;
        (one.calls_per_sec > 0.0).then(|| many.calls_per_sec / one.calls_per_sec)
    }

    /// The targets table.
    pub fn targets_table(&self) -> Table {
        targets_table(&self.targets())
    }

    /// Thread-scaling table: calls/s on 1 and N threads per source.
    pub fn scaling_table(&self) -> Option<Table> {
        let sources: Vec<&str> = self
            .measurements
            .iter()
            .filter(|m| m.workload == "threads x1")
            .map(|m| m.source.as_str())
            .collect();
        if sources.is_empty() {
            return None;
        }
        let mut t = markdown_table(&[
            "source",
            "calls/s, 1 thread",
            "calls/s, N threads",
            "scaling",
        ]);
        for s in sources {
            let one = self.get("threads x1", s);
            let many = self
                .measurements
                .iter()
                .find(|m| m.workload.starts_with("threads x") && m.threads > 1 && m.source == s);
            t.add_row(vec![
                s.to_string(),
                one.map(|m| fmt_rate(m.calls_per_sec))
                    .unwrap_or_else(|| "-".into()),
                many.filter(|m| m.error.is_none())
                    .map(|m| format!("{} ({} threads)", fmt_rate(m.calls_per_sec), m.threads))
                    .unwrap_or_else(|| "-".into()),
                self.scaling(s)
                    .map(|x| format!("{x:.2}x"))
                    .unwrap_or_else(|| "-".into()),
            ]);
        }
        Some(t)
    }

    /// Every figure, with units, as JSON.
    pub fn to_json(&self) -> Value {
        let fig = |v: f64, unit: &str| json!({ "value": v, "unit": unit });
        let measurements: Vec<Value> = self
            .measurements
            .iter()
            .map(|m| {
                json!({
                    "workload": m.workload,
                    "source": m.source,
                    "threads": m.threads,
                    "error": m.error,
                    "rounds": m.rounds,
                    "calls_per_round_per_thread": m.calls_per_round,
                    "time_per_call": {
                        "median": fig(m.ns_per_call.median, "ns"),
                        "min": fig(m.ns_per_call.min, "ns"),
                        "max": fig(m.ns_per_call.max, "ns"),
                    },
                    "calls_per_second": fig(m.calls_per_sec, "calls/s (all threads)"),
                    "minor_page_faults_per_call": fig(m.faults_per_call, "faults/call"),
                    "system_allocations_per_call":
                        m.sys_allocs_per_call.map(|x| fig(x, "allocations/call")),
                    "system_allocations_whole_run":
                        m.sys_allocs_total.map(|x| fig(x as f64, "allocations")),
                    "misses_whole_run": m.misses_total.map(|x| fig(x as f64, "misses")),
                    "calls_whole_run": fig(m.calls_total as f64, "calls"),
                    "peak_rss_growth": fig(m.peak_rss_growth as f64, "bytes"),
                    "peak_reserved": m.peak_reserved.map(|x| fig(x as f64, "bytes")),
                    "peak_live": m.peak_live.map(|x| fig(x as f64, "bytes")),
                    "ratio_to_static": self.ratio_to(m, FLOOR).map(|r| fig(r, "x (time/call)")),
                    "ratio_to_caching":
                        self.ratio_to(m, CACHING).map(|r| fig(r, "x (time/call)")),
                    "observation": m.observation,
                })
            })
            .collect();
        json!({
            "tool": "allocbench",
            "command": self.command,
            "mode": self.mode,
            "machine": self.machine,
            "cores": self.machine.cores,
            "threads": self.threads,
            "run": self.run,
            "sources": {
                "exact_cache_cap": fig(f64::from(self.sources.exact_cap), "bytes"),
                "caching_max_cached_bytes": fig(self.sources.caching_cap as f64, "bytes"),
            },
            "workloads": self.workloads.iter().map(|(n, d)| json!({"name": n, "call": d})).collect::<Vec<_>>(),
            "elapsed": fig(self.elapsed_s, "s"),
            "measurements": measurements,
            "targets": self.targets(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::Spread;

    fn m(workload: &str, source: &str, ns: f64, faults: f64) -> Measurement {
        Measurement {
            workload: workload.into(),
            source: source.into(),
            threads: 1,
            ns_per_call: Spread {
                median: ns,
                min: ns,
                max: ns,
            },
            calls_per_sec: 1e9 / ns,
            faults_per_call: faults,
            ..Measurement::default()
        }
    }

    fn report(ms: Vec<Measurement>) -> Report {
        Report {
            machine: Machine {
                cores: 2,
                cpu: "test".into(),
                kernel: String::new(),
                load_avg_1m_at_start: 0.0,
            },
            command: "test".into(),
            mode: "quick",
            run: RunConfig::smoke(),
            sources: SourceConfig::default(),
            workloads: vec![],
            measurements: ms,
            threads: 2,
            elapsed_s: 0.0,
        }
    }

    #[test]
    fn targets_are_met_and_missed_as_measured() {
        let r = report(vec![
            m("scratch-medium", "static", 100.0, 0.0),
            m("scratch-medium", "caching", 104.0, 0.0),
            m("scratch-medium", "system", 150.0, 0.0),
            m("scratch-large", "static", 100.0, 0.0),
            m("scratch-large", "caching", 120.0, 0.0),
            m("scratch-large", "mimalloc", 110.0, 5.0),
        ]);
        let t = r.targets();
        let find = |s: &str| t.iter().find(|c| c.target.contains(s)).unwrap().met;
        assert_eq!(
            find("caching within 1.05x of static on scratch-medium"),
            Some(true)
        );
        assert_eq!(
            find("caching within 1.05x of static on scratch-large"),
            Some(false)
        );
        assert_eq!(find("zeropool, orthotope on scratch-medium"), Some(true));
        assert_eq!(find("zeropool, orthotope on scratch-large"), Some(false));
        assert_eq!(r.ratio_to(&r.measurements[1], FLOOR), Some(1.04));
    }

    #[test]
    fn faults_miss_the_floor_target() {
        let r = report(vec![
            m("scratch-small", "static", 100.0, 0.0),
            m("scratch-small", "caching", 100.0, 0.5),
        ]);
        assert_eq!(r.targets()[0].met, Some(false));
    }

    #[test]
    fn scaling_is_rate_over_rate() {
        let mut two = m("threads x2", "caching", 100.0, 0.0);
        two.threads = 2;
        two.calls_per_sec = 1.9e7;
        let r = report(vec![m("threads x1", "caching", 100.0, 0.0), two]);
        let s = r.scaling("caching").unwrap();
        assert!((s - 1.9).abs() < 1e-9);
        let t = r.targets();
        assert_eq!(t.last().unwrap().met, Some(true));
    }

    #[test]
    fn json_has_units_and_cores() {
        let r = report(vec![m("scratch-small", "static", 100.0, 0.0)]);
        let j = r.to_json();
        assert_eq!(j["cores"], 2);
        assert_eq!(
            j["measurements"][0]["time_per_call"]["median"]["unit"],
            "ns"
        );
        assert_eq!(j["measurements"][0]["ratio_to_static"]["value"], 1.0);
    }

    #[test]
    fn formats() {
        assert_eq!(fmt_ns(12.0), "12 ns");
        assert_eq!(fmt_ns(12_345.0), "12.35 µs");
        assert_eq!(fmt_ns(2.5e6), "2.50 ms");
    }
}
