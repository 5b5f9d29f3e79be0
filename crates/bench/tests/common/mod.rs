//! What the tests of the binary share: running `allocbench` and reading what it wrote.

use std::process::Command;

/// The `allocbench` binary of this build.
pub fn allocbench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_allocbench"))
}

/// Runs `cmd` to the end, asserts that it succeeded (with its output in the message if not)
/// and returns its standard output.
pub fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{cmd:?}: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// Runs `allocbench args... --json FILE` in a directory of its own (named after `name`) and
/// returns its standard output and the JSON it wrote.
pub fn json_of(name: &str, args: &[&str]) -> (String, serde_json::Value) {
    let dir = std::env::temp_dir().join(format!("allocbench-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("out.json");
    let stdout = run_ok(
        allocbench()
            .args(args)
            .arg("--json")
            .arg(&json)
            .current_dir(&dir),
    );
    let v = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    (stdout, v)
}
