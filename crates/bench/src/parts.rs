//! Running each part of a command (each [`suite::Suite`]) in a fresh process of its own.
//!
//! A command is a list of suites: each scratch job (`scratch-small`, ..., `threads x2`), the
//! attention kernel (`sdpa`) and the model (`llm`). Every one runs in a child process (this
//! binary again, with the same arguments and [`PART_ENV`] naming the part), so it starts from
//! the same state whatever ran before it: glibc's heap, its mmap threshold (which frees of
//! large blocks raise), mimalloc's and jemalloc's arenas and the pages they keep mapped all
//! begin fresh. Run in one process, an earlier workload's pages made `exact-cache` on decode
//! look 20 times faster than when run alone. The child writes a [`Section`] as JSON to
//! the file named by [`PART_OUT_ENV`] (a [`Section`]); the parent reads it back and reports.

use std::path::Path;
use std::process::{Command, ExitCode, Stdio};

use crate::report::Section;
use crate::suite::{self, Settings};

/// The environment variable that makes this binary run one part (its index) and exit.
pub const PART_ENV: &str = "ALLOCBENCH_PART";
/// The file a child writes its [`Section`] to.
pub const PART_OUT_ENV: &str = "ALLOCBENCH_PART_OUT";

/// Runs part `index` of the command in a child process (this binary, the same arguments)
/// and reads back what it measured.
pub fn run_in_child(index: usize, label: &str) -> Result<Section, String> {
    let exe = std::env::current_exe().map_err(|e| format!("finding this program: {e}"))?;
    let out = std::env::temp_dir().join(format!(
        "allocbench-{}-part-{index}.json",
        std::process::id()
    ));
    let status = Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env(PART_ENV, index.to_string())
        .env(PART_OUT_ENV, &out)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("starting the process of {label}: {e}"))?;
    let read = std::fs::read_to_string(&out);
    let _ = std::fs::remove_file(&out);
    if !status.success() {
        return Err(format!("the process of {label} failed ({status})"));
    }
    let text = read.map_err(|e| format!("reading what {label} measured: {e}"))?;
    serde_json::from_str(&text).map_err(|e| format!("reading what {label} measured: {e}"))
}

/// In a child ([`PART_ENV`] set): runs that part, writes its result and returns the exit
/// code; `None` in the parent.
pub fn serve_child(s: &Settings) -> Option<ExitCode> {
    let index = std::env::var(PART_ENV).ok()?;
    let Some(out) = std::env::var_os(PART_OUT_ENV) else {
        eprintln!("allocbench: {PART_ENV} is set without {PART_OUT_ENV}: unset {PART_ENV}");
        return Some(ExitCode::from(2));
    };
    let suite = index
        .parse::<usize>()
        .ok()
        .and_then(|i| suite::plan(s).ok()?.into_iter().nth(i));
    let Some(suite) = suite else {
        eprintln!("allocbench: {PART_ENV}={index} names no part of this command");
        return Some(ExitCode::from(2));
    };
    let result = suite.run(s);
    let written = serde_json::to_string(&result)
        .map_err(|e| e.to_string())
        .and_then(|j| std::fs::write(Path::new(&out), j).map_err(|e| e.to_string()));
    Some(match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("allocbench: writing the result of part {index}: {e}");
            ExitCode::FAILURE
        }
    })
}
