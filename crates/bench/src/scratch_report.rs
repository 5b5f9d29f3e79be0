//! The scratch workloads' section of a report (`scratch`, `decode`, `threads`, and the first
//! part of `all`): their table, the thread-scaling table, the developers' goals that compare
//! the workloads, and the command's own JSON.

use comfy_table::Table;
use serde_json::json;

use crate::harness::{Measurement, RunConfig};
use crate::report::{
    comparison_table, fig, find, fmt_ns, fmt_rate, goal, labels, table, within_static, Column,
    RunInfo, Section, TargetCheck, CACHING, CACHING_SCOPE, FLOOR, RIVALS,
};
use crate::source::{SourceConfig, SourceKind};

/// What the scratch workloads of a command measured (`scratch`, `decode`, `threads`, and the
/// first part of `all`), their jobs each in its own process.
#[derive(Clone, Debug)]
pub struct ScratchRun {
    /// Rounds and durations.
    pub run: RunConfig,
    /// Source settings.
    pub sources: SourceConfig,
    /// (workload, what one call does).
    pub workloads: Vec<(String, String)>,
    /// Every measurement, in run order.
    pub measurements: Vec<Measurement>,
}

impl ScratchRun {
    /// The measurement of `source` on `workload`, if it ran and succeeded.
    pub fn get(&self, workload: &str, source: &str) -> Option<&Measurement> {
        find(&self.measurements, workload, source)
    }

    /// Checks the developers' targets against the measurements (`cores`: the machine's), for
    /// `caching` and `caching-scope` each: within 1.05x of `static` with 0 faults per call on
    /// every workload; faster than every rival on the medium and large mixes and decode; on
    /// each decode job, peak RSS growth against `static`'s and system allocations against
    /// the size classes asked; scaling on N threads; and `exact-cache` missing on every decode
    /// token below 512.
    pub fn targets(&self, cores: usize) -> Vec<TargetCheck> {
        let variants = [CACHING, CACHING_SCOPE];
        // Each variant measured on each of `workloads`, with its measurement.
        let each = |workloads: Vec<String>| {
            let pairs = workloads
                .into_iter()
                .flat_map(move |w| variants.map(|v| (w.clone(), v)));
            pairs.filter_map(|(w, v)| Some((self.get(&w, v)?, w, v)))
        };
        let ms = &self.measurements;
        let mut out = within_static(ms, goal::HARNESS_WITHIN_STATIC, &variants, true);
        let raced = ["scratch-medium", "scratch-large", "decode"].map(String::from);
        out.extend(each(raced.to_vec()).map(|(m, w, v)| self.faster_than_rivals(m, &w, v)));
        let decodes = labels(ms).into_iter().filter(|l| l.starts_with("decode"));
        for (m, w, v) in each(decodes.collect()) {
            out.extend(self.rss_against_static(m, &w, v));
            out.push(self.allocs_against_classes(m, &w, v));
        }
        out.extend(self.exact_cache_misses());
        out.extend(variants.iter().filter_map(|v| self.scaling_check(v, cores)));
        out
    }

    /// "`v` faster than system, mimalloc, jemalloc, zeropool, orthotope on `w`", `m` its
    /// measurement there.
    fn faster_than_rivals(&self, m: &Measurement, w: &str, v: &str) -> TargetCheck {
        let (found, missing): (Vec<&str>, Vec<&str>) =
            RIVALS.iter().partition(|r| self.get(w, r).is_some());
        let best = found
            .iter()
            .filter_map(|r| self.get(w, r).map(|x| (*r, x.ns_per_call.median)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
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
        TargetCheck {
            target: format!(
                "{v} faster than system, mimalloc, jemalloc, zeropool, orthotope on {w}"
            ),
            measured,
            met: best.map(|(_, ns)| m.ns_per_call.median < ns),
        }
    }

    /// "`v` on `w`: peak RSS growth <= 1.25x static's" (`m` its measurement there), when
    /// `static` ran there.
    fn rss_against_static(&self, m: &Measurement, w: &str, v: &str) -> Option<TargetCheck> {
        let floor = self.get(w, FLOOR)?;
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        Some(TargetCheck {
            target: format!(
                "{v} on {w}: peak RSS growth <= {:.2}x static's",
                goal::DECODE_RSS_VS_STATIC
            ),
            measured: format!(
                "{:.1} MiB vs static {:.1} MiB{}",
                mib(m.peak_rss_growth),
                mib(floor.peak_rss_growth),
                if floor.peak_rss_growth == 0 {
                    " (no growth to compare: a source warmed up before it left the \
                     pages mapped)"
                } else {
                    ""
                }
            ),
            met: (floor.peak_rss_growth > 0).then_some(
                m.peak_rss_growth as f64
                    <= goal::DECODE_RSS_VS_STATIC * floor.peak_rss_growth as f64,
            ),
        })
    }

    /// "`v` on `w`: system allocations over the run <= distinct size classes asked", `m` its
    /// measurement there.
    fn allocs_against_classes(&self, m: &Measurement, w: &str, v: &str) -> TargetCheck {
        let classes = self
            .measurements
            .iter()
            .find_map(|x| x.observation.as_ref())
            .map(|o| o.distinct_size_classes);
        let allocs = m.whole_run.system_allocs;
        let known = |x: Option<String>| x.unwrap_or_else(|| "?".into());
        TargetCheck {
            target: format!(
                "{v} on {w}: system allocations over the run <= distinct size classes asked"
            ),
            measured: format!(
                "{} system allocations over {} calls; {} distinct size classes",
                known(allocs.map(|a| a.to_string())),
                m.calls_total,
                known(classes.map(|c| c.to_string())),
            ),
            met: allocs.zip(classes).map(|(a, c)| a <= c as u64),
        }
    }

    /// "exact-cache misses on every decode token below 512", when it ran on `decode`.
    fn exact_cache_misses(&self) -> Option<TargetCheck> {
        let m = self.get("decode", "exact-cache")?;
        let o = m.observation.clone().unwrap_or_default();
        Some(TargetCheck {
            target: "exact-cache misses on every decode token below 512 (the weakness shown)"
                .into(),
            measured: format!(
                "missed on {} of {} tokens below 512 in the first round; {} misses over {} calls",
                o.tokens_below_512_with_miss,
                o.tokens_below_512,
                m.whole_run.misses.unwrap_or(0),
                m.calls_total
            ),
            met: Some(o.tokens_below_512 > 0 && o.tokens_below_512_with_miss == o.tokens_below_512),
        })
    }

    /// "`v` threads: scaling >= 1.8x on N threads", when `v` ran on 1 and on N threads.
    fn scaling_check(&self, v: &str, cores: usize) -> Option<TargetCheck> {
        let (a, b) = (self.get("threads x1", v)?, self.many_threads(v)?);
        let s = self.scaling(v);
        Some(TargetCheck {
            target: format!(
                "{v} threads: scaling >= {:.1}x on {} threads ({} cores)",
                goal::SCALING,
                b.threads,
                cores
            ),
            measured: format!(
                "{} calls/s on 1 thread, {} on {}: {:.2}x",
                fmt_rate(a.calls_per_sec),
                fmt_rate(b.calls_per_sec),
                b.threads,
                s.unwrap_or(f64::NAN)
            ),
            met: s.map(|s| s >= goal::SCALING),
        })
    }

    /// Aggregate calls/s on N threads over calls/s on one, for `source`.
    pub fn scaling(&self, source: &str) -> Option<f64> {
        let one = self.get("threads x1", source)?;
        let many = self.many_threads(source)?;
        (one.calls_per_sec > 0.0).then(|| many.calls_per_sec / one.calls_per_sec)
    }

    /// The multi-thread `threads` measurement of `source`, if it ran and succeeded.
    fn many_threads(&self, source: &str) -> Option<&Measurement> {
        self.measurements.iter().find(|m| {
            m.workload.starts_with("threads x")
                && m.threads > 1
                && m.source == source
                && m.error.is_none()
        })
    }

    /// The report's section: settings, workloads, the comparison and scaling tables and the
    /// sources' legend (`legend`: the sources run), the targets and the command's own JSON.
    pub fn section(self, info: &RunInfo, legend: &[&SourceKind]) -> Section {
        let mut head = format!(
            "{} warm-up + {} measured rounds per figure; alignment 64; exact-cache cap {} B; \
             caching max_cached_bytes {} MiB; multi-thread runs on {} threads",
            self.run.warmup_rounds,
            self.run.rounds,
            self.sources.exact_cap,
            self.sources.caching_cap >> 20,
            info.threads
        );
        for (label, what) in &self.workloads {
            head += &format!("\nworkload {label}: {what}");
        }
        let rate = Column::new("calls/s", &|m| fmt_rate(m.calls_per_sec));
        let mut sources = "sources:".to_string();
        for k in legend {
            sources += &format!("\n  {:<14} {}", k.name, k.about);
        }
        let fields = json!({
            "run": self.run,
            "sources": {
                "exact_cache_cap": fig(f64::from(self.sources.exact_cap), "bytes"),
                "caching_max_cached_bytes": fig(self.sources.caching_cap as f64, "bytes"),
            },
            "workloads": self.workloads.iter().map(|(n, d)| json!({"name": n, "call": d})).collect::<Vec<_>>(),
        });
        Section {
            title: "Scratch workloads".into(),
            blocks: vec![
                head,
                comparison_table(&self.measurements, &[], &[rate]).to_string(),
                self.scaling_table()
                    .map(|t| t.to_string())
                    .unwrap_or_default(),
                sources,
            ],
            targets: self.targets(info.machine.cores),
            rows: self.measurements,
            ..Section::default()
        }
        .with_json("harness", info, fields)
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
        let dash = || "-".to_string();
        let rows = sources.into_iter().map(|s| {
            vec![
                s.to_string(),
                self.get("threads x1", s)
                    .map_or_else(dash, |m| fmt_rate(m.calls_per_sec)),
                self.many_threads(s).map_or_else(dash, |m| {
                    format!("{} ({} threads)", fmt_rate(m.calls_per_sec), m.threads)
                }),
                self.scaling(s).map_or_else(dash, |x| format!("{x:.2}x")),
            ]
        });
        let header = [
            "source",
            "calls/s, 1 thread",
            "calls/s, N threads",
            "scaling",
        ];
        Some(table(&header, rows, header.len()))
    }
}
