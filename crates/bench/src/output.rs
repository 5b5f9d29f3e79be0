//! What a run shows and writes besides its tables: a progress bar, the JSON of every figure
//! and the SVG plot next to it. Both files are opened before the run, so a bad path fails in
//! a second, not after minutes of measuring.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};

use crate::harness::Measurement;
use crate::report::RunInfo;

/// Where a run writes when no `--out`, `--json` or `--plot` says otherwise: `allocbench/`
/// in the Cargo target directory the binary was built in (`target/allocbench/` for
/// `cargo run`), else `allocbench-results/` in the working directory.
pub fn default_dir() -> PathBuf {
    let target = std::env::current_exe().ok().and_then(|exe| {
        let dir = exe.parent()?.parent()?.to_path_buf();
        dir.join("CACHEDIR.TAG").is_file().then_some(dir)
    });
    match target {
        Some(t) => t.join("allocbench"),
        None => PathBuf::from("allocbench-results"),
    }
}

/// An output file, created (so checked) before the run.
#[derive(Debug)]
pub struct Output {
    /// Where it goes.
    pub path: PathBuf,
    file: File,
}

impl Output {
    /// Creates `path` for writing; `what` names the option in the error (`--json`).
    pub fn create(path: &Path, what: &str) -> Result<Output, String> {
        let file = File::create(path).map_err(|e| {
            format!(
                "cannot write {what} file {}: {e}; give a path in an existing, writable \
                 directory",
                path.display()
            )
        })?;
        Ok(Output {
            path: path.to_path_buf(),
            file,
        })
    }

    /// Writes `bytes` and reports on stderr how it went; true when written.
    pub fn write(mut self, bytes: &[u8]) -> bool {
        match self.file.write_all(bytes).and_then(|()| self.file.flush()) {
            Ok(()) => {
                eprintln!("wrote {}", self.path.display());
                true
            }
            Err(e) => {
                eprintln!("allocbench: writing {}: {e}", self.path.display());
                false
            }
        }
    }

    /// Writes `value` as pretty JSON.
    pub fn write_json(self, value: &serde_json::Value) -> bool {
        match serde_json::to_string_pretty(value) {
            Ok(s) => self.write((s + "\n").as_bytes()),
            Err(e) => {
                eprintln!("allocbench: {}: {e}", self.path.display());
                false
            }
        }
    }

    /// Draws the plot of `rows` and writes it.
    pub fn write_plot(self, info: &RunInfo, rows: &[Measurement]) -> bool {
        match crate::plot::render_svg(info, rows) {
            Ok(svg) => self.write(svg.as_bytes()),
            Err(e) => {
                eprintln!("allocbench: drawing {}: {e}", self.path.display());
                false
            }
        }
    }
}

/// The JSON and plot files of a run, both opened: `json` or `dir/{stem}.json` (`dir` is
/// [`default_dir`] when `None`, created if missing), and `plot` or the JSON's path with
/// `.svg`.
pub fn open(
    json: Option<&Path>,
    plot: Option<&Path>,
    dir: Option<&Path>,
    stem: &str,
) -> Result<(Output, Output), String> {
    let json = match json {
        Some(p) => p.to_path_buf(),
        None => {
            let dir = dir.map_or_else(default_dir, Path::to_path_buf);
            std::fs::create_dir_all(&dir).map_err(|e| {
                format!(
                    "cannot create the output directory {}: {e}; give another with --out DIR",
                    dir.display()
                )
            })?;
            dir.join(format!("{stem}.json"))
        }
    };
    let plot = plot.map_or_else(|| json.with_extension("svg"), Path::to_path_buf);
    Ok((
        Output::create(&json, "--json")?,
        Output::create(&plot, "--plot")?,
    ))
}

/// Runs `f` with a progress bar of `units` steps named `label` on stderr (hidden when stderr is
/// not a terminal): `f` gets the tick that advances it; the bar is cleared at the end.
pub fn with_progress<R>(units: usize, label: &str, f: impl FnOnce(&(dyn Fn() + Sync)) -> R) -> R {
    let pb = ProgressBar::new(units as u64);
    if let Ok(style) =
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
    {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_message(label.to_string());
    let r = f(&|| pb.inc(1));
    pb.finish_and_clear();
    r
}
