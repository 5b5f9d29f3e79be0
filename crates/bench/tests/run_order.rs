//! A workload's figures do not depend on what ran before it: `decode` alone and `decode`
//! after `scratch-large` inside `all` see the same page faults per call. (In one process,
//! with glibc's dynamic thresholds, `scratch-large`'s frees of big blocks raised the mmap
//! and trim thresholds, and `exact-cache`, which mallocs on every miss, went from 48 faults
//! per call alone to none after it; with these three sources, 85 alone.)

mod common;

/// Runs `allocbench args... --json FILE` and returns its JSON.
fn run(name: &str, args: &[&str]) -> serde_json::Value {
    common::json_of(&format!("order-{name}"), args).1
}

/// Faults per call of `source` on `workload` in a run's JSON.
fn faults(j: &serde_json::Value, workload: &str, source: &str) -> f64 {
    j["measurements"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["workload"] == workload && m["source"] == source)
        .unwrap_or_else(|| panic!("no {source} on {workload} in {j}"))["minor_page_faults_per_call"]
        ["value"]
        .as_f64()
        .unwrap()
}

#[test]
fn decode_alone_and_inside_all_see_the_same_page_faults() {
    // Decode up to 600 tokens: exact-cache's requests grow past glibc's 128 KiB mmap threshold.
    let common = [
        "--quick",
        "--decode-tokens",
        "600",
        "--decode-layers",
        "2",
        // Without `system`, whose frees keep glibc's heap warm for the others.
        "--allocators",
        "exact-cache,caching,static",
    ];
    let alone = run("alone", &[&["decode"], &common[..]].concat());
    let inside = run(
        "inside",
        &[&["all", "--workloads", "scratch-large,decode"], &common[..]].concat(),
    );
    for source in ["exact-cache", "caching"] {
        let (a, b) = (
            faults(&alone, "decode", source),
            faults(&inside, "decode", source),
        );
        assert!(
            (a - b).abs() <= 0.25 * a.max(b) + 0.5,
            "{source} on decode: {a} faults/call alone, {b} after scratch-large"
        );
    }
}
