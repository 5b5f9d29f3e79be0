//! A benchmark command from start to end: its parts run one after the other, each in its own
//! process ([`crate::parts`]); then the summary, the details and goals on request, the JSON
//! and the plot (both opened before the run, [`crate::output`]).

use std::process::ExitCode;
use std::time::Instant;

use serde_json::Value;

use crate::harness::Measurement;
use crate::measure::Machine;
use crate::output::Output;
use crate::parts::{self, Part, Settings, What};
use crate::report::{targets_table, Report, RunInfo, Section, TargetCheck};

/// Runs the command of `s` and writes `json` and `plot`; `details` prints every table and the
/// developers' goals too. Failure when a part failed or a file could not be written.
pub fn run(s: &Settings, details: bool, json: Output, plot: Output) -> ExitCode {
    let plan = match parts::plan(s) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("allocbench: {e}");
            return ExitCode::from(2);
        }
    };
    let machine = Machine::detect();
    let command: Vec<String> = std::env::args().collect();
    let started = Instant::now();
    match command.get(1..).filter(|a| !a.is_empty()) {
        Some(args) => println!("# allocbench {}", args.join(" ")),
        None => println!("# allocbench: all --quick (the default)"),
    }
    println!("{machine}");
    println!(
        "{} run; each workload in a fresh process",
        if s.quick { "quick" } else { "full" }
    );
    let mut ok = true;
    let results: Vec<(Part, Section)> = plan
        .into_iter()
        .enumerate()
        .map(|(i, (label, part))| {
            (
                part,
                parts::run_in_child(i, &label).unwrap_or_else(Section::failed),
            )
        })
        .collect();

    // The harness jobs' figures make one report (its targets compare jobs).
    let harness_rows: Vec<Measurement> = results
        .iter()
        .filter(|r| matches!(r.0, Part::Job(_)))
        .flat_map(|r| r.1.rows.iter().cloned())
        .collect();
    let threads = s.opts.threads;
    let info = RunInfo::new(machine, command.join(" "), s.quick, threads, started);
    let harness = (!matches!(s.what, What::Sdpa | What::Llm)).then(|| Report {
        info: info.clone(),
        run: s.run.clone(),
        sources: s.source_config.clone(),
        workloads: s
            .what
            .bench()
            .map(|b| crate::suite::plan(b, &s.opts))
            .unwrap_or_default()
            .iter()
            .filter(|j| s.only.as_ref().is_none_or(|only| only.contains(&j.label)))
            .map(|j| (j.label.clone(), j.workload.describe()))
            .collect(),
        measurements: harness_rows,
    });
    let rows: Vec<Measurement> = results
        .iter()
        .flat_map(|r| r.1.rows.iter().cloned())
        .collect();
    let mut targets: Vec<TargetCheck> = harness.as_ref().map(Report::targets).unwrap_or_default();
    if details {
        if let Some(h) = &harness {
            println!("\n{}", h.details(&s.sources));
        }
        for r in &results {
            targets.extend(r.1.targets.iter().cloned());
            for d in &r.1.details {
                println!("\n{d}");
            }
        }
    }
    for e in results.iter().flat_map(|r| &r.1.errors) {
        eprintln!("allocbench: {e}");
        ok = false;
    }
    println!("\nWhat the cache buys, per workload (--help explains every column):\n");
    println!("{}", crate::summary::table(&rows));
    println!("\n{}", crate::summary::FOOTNOTES);
    if details {
        println!(
            "\n## Developers' goals\n\nTargets the project's developers set for the library and \
             kernels, checked against this run: a missed goal is work for them, not an error \
             in your set-up.\n"
        );
        println!("{}", targets_table(&targets));
    } else {
        println!(
            "--details: every source and figure, the kernels' efficiency, the developers' goals"
        );
    }
    let info = RunInfo::new(
        info.machine.clone(),
        info.command.clone(),
        s.quick,
        threads,
        started,
    );
    println!("\n{}", info.finished(s.what.name()));

    let section = |p: Part| {
        results
            .iter()
            .find(|r| r.0 == p)
            .and_then(|r| r.1.section.clone())
    };
    let value = match (&harness, s.what) {
        (Some(h), _) => {
            let mut j = Report {
                info: info.clone(),
                ..h.clone()
            }
            .to_json();
            for (key, p) in [("sdpa", Part::Sdpa), ("llm", Part::Llm)] {
                if let Some(v) = section(p) {
                    j[key] = v;
                }
            }
            j
        }
        (None, What::Sdpa) => section(Part::Sdpa).unwrap_or(Value::Null),
        (None, _) => section(Part::Llm).unwrap_or(Value::Null),
    };
    ok &= json.write_json(&value);
    ok &= plot.write_plot(&info, &rows);
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
