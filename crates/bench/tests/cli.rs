//! The binary as a user meets it, without long measurements: `soak` runs briefly, passes and
//! writes its JSON; bad arguments and output paths fail before any measuring; the main
//! output is a short summary with the plot beside the JSON; `--help` explains the columns.

mod common;

use common::{allocbench, run_ok};

#[test]
fn short_soak_passes_and_reports() {
    let args = ["soak", "--seconds", "0.3", "--threads", "2"];
    let (stdout, j) = common::json_of("soak", &args);
    assert!(stdout.contains("violations: 0"), "{stdout}");
    assert!(stdout.contains("ops/s:"), "{stdout}");
    assert!(stdout.contains("peak live bytes:"), "{stdout}");
    // The JSON has the header every run has, and the soak's own figures.
    assert_eq!(j["subcommand"], "soak");
    assert_eq!(j["policy"], "peak-bound", "the default policy");
    assert_eq!(
        (j["threads"].as_u64(), j["violations"].as_u64()),
        (Some(2), Some(0))
    );
    assert!(j["cores"].as_u64().is_some_and(|c| c > 0), "{j}");
    assert!(j["ops"]["value"].as_u64().is_some_and(|n| n > 0), "{j}");
    assert_eq!(j["passed"], true);
}

/// Runs `allocbench args...`, asserts that it refused them (exit code 2) and returns its
/// standard output and standard error.
fn refused(args: &[&str]) -> (String, String) {
    let out = allocbench().args(args).output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(2), "{stdout}\n{stderr}");
    (stdout, stderr)
}

#[test]
fn soak_rejects_a_negative_duration() {
    let (_, stderr) = refused(&["soak", "--seconds=-1"]);
    assert!(stderr.contains("--seconds"), "{stderr}");
}

#[test]
fn soak_rejects_an_unknown_policy_naming_the_choices() {
    let (_, stderr) = refused(&["soak", "--policy", "lru"]);
    assert!(
        stderr.contains("peak-bound") && stderr.contains("cap"),
        "{stderr}"
    );
}

#[test]
fn a_bad_output_path_fails_before_the_run() {
    let started = std::time::Instant::now();
    let (stdout, stderr) = refused(&["all", "--json", "/nonexistent-dir/allocbench.json"]);
    assert!(
        stderr.contains("--json") && stderr.contains("nonexistent-dir"),
        "{stderr}"
    );
    // A full `all` takes minutes: this one measured nothing.
    assert!(started.elapsed().as_secs() < 20, "{:?}", started.elapsed());
    assert!(stdout.is_empty(), "{stdout}");
}

#[test]
fn an_unknown_workload_is_named_with_the_known_ones() {
    let (_, stderr) = refused(&["all", "--tiny", "--workloads", "decode,nope"]);
    assert!(
        stderr.contains("`nope`") && stderr.contains("scratch-large"),
        "{stderr}"
    );
}

#[test]
fn the_main_output_is_a_short_summary_and_the_plot_is_written() {
    let dir = std::env::temp_dir().join(format!("allocbench-cli-{}", std::process::id()));
    let stdout = run_ok(allocbench().args(["all", "--tiny", "--out"]).arg(&dir));
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines.len() <= 60, "{} lines:\n{stdout}", lines.len());
    let wide: Vec<&&str> = lines.iter().filter(|l| l.chars().count() > 100).collect();
    assert!(wide.is_empty(), "{wide:#?}");
    assert!(
        !stdout.contains("MISSED") && !stdout.contains("faster)"),
        "{stdout}"
    );
    for w in ["scratch-large", "decode", "sdpa-decode", "llm-decode"] {
        assert!(lines.iter().any(|l| l.starts_with(w)), "{w}:\n{stdout}");
    }
    // The plot is written by default, next to the JSON.
    assert!(std::fs::metadata(dir.join("all.svg")).unwrap().len() > 0);
    assert!(std::fs::metadata(dir.join("all.json")).unwrap().len() > 0);
    let _ = std::fs::remove_dir_all(&dir);
    // The details hold the goals, in their own section.
    let stdout = run_ok(
        allocbench()
            .args(["decode", "--tiny", "--details", "--out"])
            .arg(&dir),
    );
    assert!(stdout.contains("## Developers' goals"), "{stdout}");
    assert!(stdout.contains("faults/call"), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn help_explains_every_summary_column() {
    let out = allocbench().arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for column in [
        "caching",
        "over static",
        "best rival",
        "its time",
        "exact-cache",
        "faults/call",
        "sys allocs/call",
        "peak RSS +MiB",
        "peak held/live MiB",
        "x static",
        "x caching",
        "--details",
    ] {
        assert!(
            help.contains(column),
            "--help says nothing of `{column}`:\n{help}"
        );
    }
}
