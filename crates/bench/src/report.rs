//! Turning measurements into tables, target checks and JSON: one path for every benchmark.
//!
//! Every subcommand ends in [`Measurement`]s (the harness workloads through
//! [`crate::harness`], the kernel benchmarks through [`crate::steps`]) and a [`RunInfo`];
//! [`comparison_table`], [`measurement_json`], [`Section::with_json`], [`within_static`] and
//! [`efficiency_check`] turn them into what is printed and written, and [`goal`] holds every
//! target the benchmarks check. A report is made of [`Section`]s, one per suite of a command
//! (the scratch workloads' together: [`crate::scratch_report`]).

use comfy_table::{presets, CellAlignment, Table};
use serde_json::{json, Value};

use crate::harness::Measurement;
pub(crate) use crate::measure::pct;
use crate::measure::{Machine, Ratios};

pub use crate::source::{CACHING, CACHING_SCOPE, FLOOR, RIVALS};

/// Every target the benchmarks check (goals, reported met or missed, never asserted).
pub mod goal {
    /// Harness workloads: `caching` time per call over `static`'s (with 0 faults per call).
    pub const HARNESS_WITHIN_STATIC: f64 = 1.05;
    /// `threads`: aggregate calls/s on N threads over 1.
    pub const SCALING: f64 = 1.8;
    /// Decode jobs: peak RSS growth over `static`'s.
    pub const DECODE_RSS_VS_STATIC: f64 = 1.25;
    /// `sdpa`: `caching` time over `static`'s (median of step-by-step ratios), every row.
    pub const SDPA_WITHIN_STATIC: f64 = 1.02;
    /// `sdpa` decode, every dtype: fraction of the streaming read of the bytes it must read,
    /// at kv >= [`SDPA_DECODE_KV`].
    pub const SDPA_DECODE_STREAM: f64 = 0.85;
    /// The KV length from which [`SDPA_DECODE_STREAM`] applies.
    pub const SDPA_DECODE_KV: usize = 1024;
    /// `sdpa`: int8-KV decode at least this many times faster per call than f32 at kv
    /// [`SDPA_INT8_KV`].
    pub const SDPA_INT8_SPEEDUP: f64 = 3.0;
    /// The KV length of [`SDPA_INT8_SPEEDUP`].
    pub const SDPA_INT8_KV: usize = 4096;
    /// `sdpa` causal prefill, f32 and bf16: fraction of sgemm's GFLOP/s.
    pub const SDPA_PREFILL_SGEMM: f64 = 0.60;
    /// `llm`: `caching` (10 MiB cap) time over `static`'s (median of step-by-step ratios),
    /// per phase.
    pub const LLM_WITHIN_STATIC: f64 = 1.01;
    /// `llm` decode: fraction of the weight-streaming bound.
    pub const LLM_DECODE_STREAM: f64 = 0.80;
    /// `llm` prefill: fraction of sgemm's GFLOP/s.
    pub const LLM_PREFILL_SGEMM: f64 = 0.50;
    /// `soak`: peak reserved over the true peak live (the bytes the soak held; issue #20).
    pub const SOAK_RESERVED_OVER_LIVE: f64 = 1.3;
}

/// Where and how a run ran, shared by every report.
#[derive(Clone, Debug)]
pub struct RunInfo {
    /// Where it ran.
    pub machine: Machine,
    /// The command line.
    pub command: String,
    /// `quick` or `full`.
    pub mode: &'static str,
    /// Threads the workloads ran on (multi-thread runs; rayon threads for the kernels).
    pub threads: usize,
    /// Wall time, seconds.
    pub elapsed_s: f64,
    /// Load average (1 min) at the end.
    pub load_avg_end: f64,
}

impl RunInfo {
    /// The info of a run started at `started`: elapsed time and load average are taken now.
    pub fn new(
        machine: Machine,
        command: String,
        quick: bool,
        threads: usize,
        started: std::time::Instant,
    ) -> Self {
        RunInfo {
            machine,
            command,
            mode: if quick { "quick" } else { "full" },
            threads,
            elapsed_s: started.elapsed().as_secs_f64(),
            load_avg_end: crate::measure::load_avg(),
        }
    }

    /// The info of this process's run (its command line, this machine), started at `started`.
    pub fn now(quick: bool, threads: usize, started: std::time::Instant) -> Self {
        let command: Vec<String> = std::env::args().collect();
        Self::new(
            Machine::detect(),
            command.join(" "),
            quick,
            threads,
            started,
        )
    }
}

/// A figure with its unit, as every JSON figure is written.
pub(crate) fn fig(v: impl serde::Serialize, unit: &str) -> Value {
    json!({ "value": v, "unit": unit })
}

/// One measurement as JSON, with units.
pub fn measurement_json(m: &Measurement) -> Value {
    let per = &m.unit;
    let opt = |x: Option<f64>, unit: &str| x.map(|x| fig(x, unit));
    let bytes = |x: Option<u64>| x.map(|x| fig(x as f64, "bytes"));
    let c = &m.whole_run;
    json!({
        "workload": m.workload,
        "source": m.source,
        "unit": per,
        "threads": m.threads,
        "error": m.error,
        "rounds": m.rounds,
        "calls_per_round_per_thread": m.calls_per_round,
        "time_per_call": {
            "median": fig(m.ns_per_call.median, &format!("ns/{per}")),
            "min": fig(m.ns_per_call.min, &format!("ns/{per}")),
            "max": fig(m.ns_per_call.max, &format!("ns/{per}")),
        },
        "calls_per_second": fig(m.calls_per_sec, &format!("{per}s/s (all threads)")),
        "minor_page_faults_per_call": fig(m.faults_per_call, "faults/call"),
        "system_allocations_per_call": opt(m.sys_allocs_per_call, "allocations/call"),
        "system_allocations_whole_run": opt(c.system_allocs.map(|x| x as f64), "allocations"),
        "misses_whole_run": opt(c.misses.map(|x| x as f64), "misses"),
        "calls_whole_run": fig(m.calls_total as f64, "calls"),
        "peak_rss_growth_warmup": fig(m.peak_rss_growth as f64, "bytes"),
        "peak_reserved": bytes(c.peak_reserved),
        "peak_live": bytes(c.peak_live),
        "ratio_to_static": opt(m.x_static, "x (time)"),
        "ratio_to_caching": opt(m.x_caching, "x (time)"),
        "temp_bytes_per_call": opt(m.temp_bytes_per_call, "bytes/call"),
        "observation": m.observation,
    })
}

/// A column of a [`comparison_table`]: its header and its cell for a measurement.
pub struct Column<'a> {
    /// Its header.
    pub header: &'a str,
    /// Its cell for a measurement.
    pub cell: &'a dyn Fn(&Measurement) -> String,
}

impl<'a> Column<'a> {
    /// The column `header`, whose cell for a measurement `cell` makes.
    pub const fn new(header: &'a str, cell: &'a dyn Fn(&Measurement) -> String) -> Self {
        Column { header, cell }
    }
}

/// The columns every comparison table has (`--help` and the README explain each).
const STANDARD: [Column<'static>; 9] = [
    Column::new("median", &fmt_median),
    Column::new("min", &|m| fmt_ns(m.ns_per_call.min)),
    Column::new("max", &|m| fmt_ns(m.ns_per_call.max)),
    Column::new("x static", &|m| fmt_ratio(m.x_static)),
    Column::new("x caching", &|m| fmt_ratio(m.x_caching)),
    Column::new("faults/call", &|m| fmt_count(m.faults_per_call)),
    Column::new("sys allocs/call", &|m| {
        m.sys_allocs_per_call
            .map_or_else(|| "n/a".into(), fmt_count)
    }),
    Column::new("peak RSS +MiB", &|m| {
        format!("{:.1}", m.peak_rss_growth as f64 / (1 << 20) as f64)
    }),
    Column::new("peak held/live MiB", &held_cell),
];

/// A time ratio with three decimals, `-` when there is none.
fn fmt_ratio(x: Option<f64>) -> String {
    x.map_or_else(|| "-".into(), |v| format!("{v:.3}"))
}

/// The comparison table every benchmark prints, as Markdown: workload, source, the `lead`
/// columns, the standard ones (median per unit, min, max, x static, x caching, faults,
/// system allocations, peak RSS growth, peak held/live), the `trail` columns. A failed
/// measurement gets its error.
pub fn comparison_table(ms: &[Measurement], lead: &[Column<'_>], trail: &[Column<'_>]) -> Table {
    let columns: Vec<&Column<'_>> = lead.iter().chain(&STANDARD).chain(trail).collect();
    let mut header = vec!["workload", "source"];
    header.extend(columns.iter().map(|c| c.header));
    let rows = ms.iter().map(|m| {
        let mut row = vec![m.workload.clone(), m.source.clone()];
        match &m.error {
            Some(e) => row.push(format!("FAILED: {e}")),
            None => row.extend(columns.iter().map(|c| (c.cell)(m))),
        }
        row
    });
    table(&header, rows, 2)
}

/// The measurement of `source` on `workload` in `ms`, if it ran and succeeded.
pub fn find<'a>(ms: &'a [Measurement], workload: &str, source: &str) -> Option<&'a Measurement> {
    ms.iter()
        .find(|m| m.workload == workload && m.source == source && m.error.is_none())
}

/// The labels of `ms` in order, without repeats.
pub fn labels(ms: &[Measurement]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for m in ms {
        if !out.contains(&m.workload) {
            out.push(m.workload.clone());
        }
    }
    out
}

/// "`variant` within `limit`x of static on `workload`" for every workload of `ms` and each
/// of `variants` measured there (with "0 page faults/call" too when `zero_faults`). A
/// failed variant misses; a missing or failed `static` leaves the check unmeasured.
pub fn within_static(
    ms: &[Measurement],
    limit: f64,
    variants: &[&str],
    zero_faults: bool,
) -> Vec<TargetCheck> {
    let mut out = Vec::new();
    let get = |w: &str, s: &str| ms.iter().find(|m| m.workload == w && m.source == s);
    for w in labels(ms) {
        let floor = find(ms, &w, FLOOR);
        for &v in variants {
            let Some(m) = get(&w, v) else { continue };
            let faults_ok = !zero_faults || m.faults_per_call < 0.01;
            out.push(TargetCheck {
                target: format!(
                    "{v} within {limit:.2}x of static on {w}{}",
                    if zero_faults {
                        ", 0 page faults/call"
                    } else {
                        ""
                    }
                ),
                measured: match (&m.error, m.x_static, floor) {
                    (Some(e), _, _) => format!("{v} failed: {e}"),
                    (None, _, None) => "static not measured".into(),
                    (None, None, Some(_)) => "no ratio".into(),
                    (None, Some(x), Some(f)) => format!(
                        "{x:.3}x ({} vs {}){}",
                        fmt_ns(m.ns_per_call.median),
                        fmt_ns(f.ns_per_call.median),
                        if zero_faults {
                            format!(", {} faults/call", fmt_count(m.faults_per_call))
                        } else {
                            String::new()
                        }
                    ),
                },
                met: if m.error.is_some() {
                    Some(false)
                } else {
                    floor.and(m.x_static).map(|x| x <= limit && faults_ok)
                },
            });
        }
    }
    out
}

/// "`target`: measured `kernel` vs `baseline` (`figures`), median of same-round ratios >=
/// `goal`": the check of every efficiency figure (a kernel against its machine limit, timed
/// in turns).
pub fn efficiency_check(
    target: String,
    figures: [String; 2],
    ratios: Ratios,
    goal: f64,
) -> TargetCheck {
    let [kernel, baseline] = figures;
    let [best, median] = ratios.percent();
    TargetCheck {
        target,
        measured: format!(
            "{kernel} vs {baseline}: {median} (median of same-round ratios; best {best})"
        ),
        met: Some(ratios.ratio_median >= goal),
    }
}

/// A table of a kernel's efficiency figures, as Markdown: `header`, then "ratio (best)" and
/// "ratio (median)"; a row per (cells, ratios against the baseline); its columns from
/// `right` on right-aligned.
pub fn efficiency_table(
    header: &[&str],
    rows: impl IntoIterator<Item = (Vec<String>, Ratios)>,
    right: usize,
) -> Table {
    let header = [header, &["ratio (best)", "ratio (median)"]].concat();
    let rows = rows.into_iter().map(|(mut cells, ratios)| {
        cells.extend(ratios.percent());
        cells
    });
    table(&header, rows, right)
}

/// One section of a report: what one part of a command measured (a child process hands it to
/// the parent as JSON, see [`crate::parts`]). Every benchmark (the scratch workloads together,
/// `sdpa`, `llm`, `soak`) reports one; [`crate::command`] prints and writes them alike.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Section {
    /// The heading of its details (empty: no details of its own, as a scratch job's part).
    pub title: String,
    /// Its details, printed under `--details` a blank line apart: notes and tables.
    pub blocks: Vec<String>,
    /// Every (workload, source) it measured: the summary's and the plot's rows.
    pub rows: Vec<Measurement>,
    /// Its developers' goals, met or missed.
    pub targets: Vec<TargetCheck>,
    /// Its JSON and its subcommand (the key it goes under inside `all`), if it has one.
    pub json: Option<(String, Value)>,
    /// What could not run, printed whatever the flags (the command then fails).
    pub errors: Vec<String>,
}

impl Section {
    /// A part that could not run: its error is all it reports.
    pub fn failed(error: String) -> Self {
        Section {
            errors: vec![error],
            ..Section::default()
        }
    }

    /// Its details as printed: `## title`, then the blocks.
    pub fn details(&self) -> Option<String> {
        let blocks = self.blocks.iter().filter(|b| !b.is_empty());
        (!self.title.is_empty()).then(|| {
            let body: Vec<&str> = blocks.map(String::as_str).collect();
            format!("## {}\n\n{}", self.title, body.join("\n\n"))
        })
    }

    /// The section with its JSON: the run's header (tool, `subcommand`, command, machine,
    /// cores, threads, elapsed time and load, from `info`), its rows and targets, then the keys
    /// of `fields` (an object).
    pub fn with_json(mut self, subcommand: &str, info: &RunInfo, fields: Value) -> Self {
        let mut j = json!({
            "tool": "allocbench",
            "subcommand": subcommand,
            "command": info.command,
            "mode": info.mode,
            "machine": info.machine,
            "cores": info.machine.cores,
            "threads": info.threads,
            "elapsed": fig(info.elapsed_s, "s"),
            "load_average_end": info.load_avg_end,
            "measurements": self.rows.iter().map(measurement_json).collect::<Vec<_>>(),
            "targets": self.targets,
        });
        if let (Some(j), Value::Object(fields)) = (j.as_object_mut(), fields) {
            j.extend(fields);
        }
        self.json = Some((subcommand.into(), j));
        self
    }
}

/// One checked target.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
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

/// A measurement's median time, with its unit when that is not a call: `1.20 ms/token`.
pub fn fmt_median(m: &Measurement) -> String {
    match m.unit.as_str() {
        "call" => fmt_ns(m.ns_per_call.median),
        unit => format!("{}/{unit}", fmt_ns(m.ns_per_call.median)),
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

pub(crate) fn fmt_rate(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.2} M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1} k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

/// A Markdown table (readable in a terminal, pastes into a README) of `header` and `rows`,
/// its columns from `right` on right-aligned (the numeric ones; `header.len()` for none).
pub(crate) fn table(
    header: &[&str],
    rows: impl IntoIterator<Item = Vec<String>>,
    right: usize,
) -> Table {
    let mut t = Table::new();
    t.load_preset(presets::ASCII_MARKDOWN);
    t.set_header(header.to_vec());
    for row in rows {
        t.add_row(row);
    }
    for i in right..header.len() {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(CellAlignment::Right);
        }
    }
    t
}

/// The cell "peak held/live MiB": the most bytes the source held (live + cached) and the most
/// live at once, where it can tell ("-" for a figure it does not count, "n/a" for neither).
pub(crate) fn held_cell(m: &Measurement) -> String {
    let mib = |b: Option<u64>| {
        b.map_or("-".into(), |b| {
            format!("{:.1}", b as f64 / (1 << 20) as f64)
        })
    };
    match (m.whole_run.peak_reserved, m.whole_run.peak_live) {
        (None, None) => "n/a".into(),
        (r, l) => format!("{}/{}", mib(r), mib(l)),
    }
}

/// The targets table: target, measured, verdict.
pub fn targets_table(checks: &[TargetCheck]) -> Table {
    let rows = checks
        .iter()
        .map(|c| vec![c.target.clone(), c.measured.clone(), c.verdict().into()]);
    table(&["target", "measured", "verdict"], rows, 3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_cells_say_what_a_source_counts() {
        let mut x = Measurement::default();
        assert_eq!(held_cell(&x), "n/a");
        x.whole_run.peak_reserved = Some(3 << 20);
        assert_eq!(held_cell(&x), "3.0/-");
        x.whole_run.peak_live = Some(1 << 19);
        assert_eq!(held_cell(&x), "3.0/0.5");
    }

    #[test]
    fn formats() {
        assert_eq!(fmt_ns(12.0), "12 ns");
        assert_eq!(fmt_ns(12_345.0), "12.35 µs");
        assert_eq!(fmt_ns(2.5e6), "2.50 ms");
    }
}
