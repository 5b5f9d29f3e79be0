//! The binary's subcommands that need no long measurement: `soak` runs briefly, passes, writes
//! its JSON, and rejects bad arguments.

use std::process::Command;

fn allocbench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_allocbench"))
}

#[test]
fn short_soak_passes_and_reports() {
    let json = std::env::temp_dir().join(format!("allocbench-soak-{}.json", std::process::id()));
    let out = allocbench()
        .args(["soak", "--seconds", "0.3", "--threads", "2", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("violations: 0"), "{stdout}");
    assert!(stdout.contains("ops/s:"), "{stdout}");
    assert!(stdout.contains("peak live bytes:"), "{stdout}");
    // The JSON has the header every run has, and the soak's own figures.
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    assert_eq!(j["subcommand"], "soak");
    assert_eq!(
        (j["threads"].as_u64(), j["violations"].as_u64()),
        (Some(2), Some(0))
    );
    assert!(j["cores"].as_u64().is_some_and(|c| c > 0), "{j}");
    assert!(j["ops"]["value"].as_u64().is_some_and(|n| n > 0), "{j}");
    assert_eq!(j["passed"], true);
}

#[test]
fn soak_rejects_a_negative_duration() {
    let out = allocbench()
        .args(["soak", "--seconds=-1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}
