//! A benchmark command from start to end: its suites run one after the other, each in its own
//! process ([`crate::parts`]); then the summary, the details and goals on request, the JSON
//! and the plot (both opened before the run, [`crate::output`]).

use std::process::ExitCode;
use std::time::Instant;

use serde_json::Value;

use crate::harness::Measurement;
use crate::measure::Machine;
use crate::output::Output;
use crate::parts;
use crate::report::{targets_table, RunInfo, Section};
use crate::scratch_report::ScratchReport;
use crate::suite::{self, Settings};

/// Runs the command of `s` and writes `json` and `plot`; `details` prints every table and the
/// developers' goals too. Failure when a suite failed or a file could not be written.
pub fn run(s: &Settings, details: bool, json: Output, plot: Output) -> ExitCode {
    let suites = match suite::plan(s) {
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
        "{} run; each scratch workload, sdpa and llm in a fresh process",
        if s.quick { "quick" } else { "full" }
    );
    let sections: Vec<Section> = suites
        .iter()
        .enumerate()
        .map(|(i, suite)| parts::run_in_child(i, suite.label()).unwrap_or_else(Section::failed))
        .collect();
    let rows: Vec<Measurement> = sections.iter().flat_map(|r| r.rows.clone()).collect();

    // The scratch workloads' figures make the command's own report (its goals compare them).
    let info = |started| {
        RunInfo::new(
            machine.clone(),
            command.join(" "),
            s.quick,
            s.opts.threads,
            started,
        )
    };
    let jobs = suite::scratch_jobs(s.what, &s.opts);
    let is_job = |label: &str| jobs.iter().any(|j| j.label == label);
    let scratch = s.what.has_scratch().then(|| ScratchReport {
        info: info(started),
        run: s.run.clone(),
        sources: s.source_config.clone(),
        workloads: suites
            .iter()
            .filter(|j| is_job(j.label()))
            .map(|j| (j.label().to_string(), j.describe()))
            .collect(),
        measurements: suites
            .iter()
            .zip(&sections)
            .filter(|(j, _)| is_job(j.label()))
            .flat_map(|(_, r)| r.rows.clone())
            .collect(),
    });
    let mut ok = true;
    if details {
        if let Some(h) = &scratch {
            println!("\n{}", h.details(&s.sources));
        }
        for d in sections.iter().flat_map(|r| &r.details) {
            println!("\n{d}");
        }
    }
    for e in sections.iter().flat_map(|r| &r.errors) {
        eprintln!("allocbench: {e}");
        ok = false;
    }
    println!("\nWhat the cache buys, per workload (--help explains every column):\n");
    println!("{}", crate::summary::table(&rows));
    println!("\n{}", crate::summary::FOOTNOTES);
    if details {
        let mut targets = scratch
            .as_ref()
            .map(ScratchReport::targets)
            .unwrap_or_default();
        targets.extend(sections.iter().flat_map(|r| r.targets.clone()));
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
    let info = info(started);
    println!("\n{}", info.finished(s.what.name()));

    let own = sections.iter().filter_map(|r| r.json.clone());
    let value = match scratch {
        Some(h) => {
            let mut j = ScratchReport {
                info: info.clone(),
                ..h
            }
            .to_json();
            for (key, v) in own {
                j[key] = v;
            }
            j
        }
        None => own.map(|(_, v)| v).next().unwrap_or(Value::Null),
    };
    ok &= json.write_json(&value);
    ok &= plot.write_plot(&info, &rows);
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
