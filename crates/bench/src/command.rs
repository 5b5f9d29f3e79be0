//! A benchmark command from start to end: its suites run one after the other, each in its own
//! process ([`crate::parts`]), each reporting a [`Section`] (the scratch jobs' rows make one
//! section together); then the report: the summary, the sections' details and goals on
//! request, the JSON and the plot (both opened before the run, [`crate::output`]).

use std::process::ExitCode;
use std::time::Instant;

use serde_json::Value;

use crate::measure::Machine;
use crate::output::Output;
use crate::parts;
use crate::report::{targets_table, RunInfo, Section};
use crate::scratch_report::ScratchRun;
use crate::suite::{self, Settings, Suite, What};

/// Runs `suites`, the command of `s`, and writes `json` and `plot`; `details` prints every
/// section's details and the developers' goals too. Failure when a suite failed or a file
/// could not be written.
pub fn run(
    s: &Settings,
    suites: &[Box<dyn Suite>],
    details: bool,
    json: Output,
    plot: Output,
) -> ExitCode {
    let started = Instant::now();
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() {
        println!("# allocbench: all --quick (the default)");
    } else {
        println!("# allocbench {}", args.join(" "));
    }
    println!("{}", Machine::detect());
    println!(
        "{} run; each scratch workload, sdpa and llm in a fresh process",
        if s.quick { "quick" } else { "full" }
    );
    let mut took = Vec::new();
    let parts: Vec<Section> = suites
        .iter()
        .enumerate()
        .map(|(i, suite)| {
            let t0 = Instant::now();
            let part = parts::run_in_child(i, suite.label()).unwrap_or_else(Section::failed);
            took.push(format!(
                "{} {:.1} s",
                suite.label(),
                t0.elapsed().as_secs_f64()
            ));
            part
        })
        .collect();
    let info = RunInfo::now(s.quick, s.threads, started);
    // The scratch jobs' parts make the command's own section (its goals compare them).
    let jobs = suite::scratch_jobs(s);
    let is_job = |label: &str| jobs.iter().any(|j| j.label == label);
    let mut sections = Vec::new();
    let mut scratch = ScratchRun {
        run: s.run.clone(),
        sources: s.source_config.clone(),
        workloads: Vec::new(),
        measurements: Vec::new(),
    };
    let mut scratch_errors = Vec::new();
    for (suite, part) in suites.iter().zip(parts) {
        if is_job(suite.label()) {
            let what = (suite.label().to_string(), suite.describe());
            scratch.workloads.push(what);
            scratch.measurements.extend(part.rows);
            scratch_errors.extend(part.errors);
        } else {
            sections.push(part);
        }
    }
    if !matches!(s.what, What::Sdpa | What::Llm) {
        let mut own = scratch.section(&info, &s.sources);
        own.errors = scratch_errors;
        sections.insert(0, own);
    }
    let mut ok = print(&sections, details);
    println!(
        "\n{} finished in {:.1} s; load average {:.2} at the end",
        s.what.name(),
        info.elapsed_s,
        info.load_avg_end
    );
    // Wrapped at 100 columns, as the summary.
    let mut line = "wall time per part:".to_string();
    for t in took {
        if line.len() + t.len() + 2 > 100 {
            println!("{line}");
            line = " ".to_string();
        }
        line += &format!(" {t},");
    }
    println!("{}", line.trim_end_matches(','));
    let rows: Vec<_> = sections.iter().flat_map(|r| r.rows.clone()).collect();
    ok &= json.write_json(&json_of(&sections));
    ok &= plot.write_plot(&info, &rows);
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Prints the report of `sections`: their details (with `details`), their errors, the summary
/// and the developers' goals (with `details`). False when a section has errors.
pub fn print(sections: &[Section], details: bool) -> bool {
    if details {
        for d in sections.iter().filter_map(Section::details) {
            println!("\n{d}");
        }
    }
    let mut ok = true;
    for e in sections.iter().flat_map(|r| &r.errors) {
        eprintln!("allocbench: {e}");
        ok = false;
    }
    let rows: Vec<_> = sections.iter().flat_map(|r| r.rows.clone()).collect();
    println!("\nWhat the cache buys, per workload (--help explains every column):\n");
    println!("{}", crate::summary::table(&rows));
    println!("\n{}", crate::summary::FOOTNOTES);
    if details {
        let targets: Vec<_> = sections.iter().flat_map(|r| r.targets.clone()).collect();
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
    ok
}

/// The JSON of a report: the scratch workloads' section (`harness`) with every other section
/// under its subcommand; or the one section's JSON when there are no scratch workloads.
pub fn json_of(sections: &[Section]) -> Value {
    let mut own = sections.iter().filter_map(|s| s.json.clone());
    match own.next() {
        Some((key, mut top)) if key == "harness" => {
            for (key, v) in own {
                top[key] = v;
            }
            top
        }
        Some((_, v)) => v,
        None => Value::Null,
    }
}
