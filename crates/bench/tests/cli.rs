//! The binary's subcommands that need no long measurement: `soak` runs briefly, passes, and
//! rejects bad arguments.

use std::process::Command;

fn allocbench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_allocbench"))
}

#[test]
fn short_soak_passes_and_reports() {
    let out = allocbench()
        .args(["soak", "--seconds", "0.3", "--threads", "2"])
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
}

#[test]
fn soak_rejects_a_negative_duration() {
    let out = allocbench()
        .args(["soak", "--seconds=-1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}
