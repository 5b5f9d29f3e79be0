//! The `llm` binary: `generate` prints exactly the greedy continuation the library computes,
//! text with a tokenizer, ids without one; timings go to stderr only.

mod common;

use std::process::Command;
use std::sync::Arc;

use common::{Spec, TempDir};
use llm::tokenizer::Tokenizer;
use llm::{Llama, ModelOptions, Module, Sampler, Weights};

fn greedy_ids(dir: &std::path::Path, prompt: &[u32], n: usize) -> Vec<u32> {
    let w = Arc::new(Weights::load(dir).unwrap());
    let stop = w.config.eos_token_ids.clone();
    let mut m = Llama::new(w, llm::caching_temp(1 << 20), &ModelOptions::default()).unwrap();
    let mut out = Vec::new();
    llm::generate(
        &mut m,
        prompt,
        &mut Sampler::greedy(),
        &llm::GenerateOptions {
            max_new_tokens: n,
            stop_tokens: stop,
        },
        |t| {
            out.push(t);
            Ok(())
        },
    )
    .unwrap();
    out
}

/// `llm generate --model MODEL ARGS...`, run to completion.
fn generate(model: &std::path::Path, args: &[&std::ffi::OsStr]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_llm"))
        .args(["generate", "--model"])
        .arg(model)
        .args(args)
        .output()
        .unwrap()
}

/// [`generate`], which must succeed (its stderr is the failure message).
fn generate_ok(model: &std::path::Path, args: &[&str]) -> std::process::Output {
    let args: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    let out = generate(model, &args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn generate_streams_only_the_generated_text() {
    let spec = Spec {
        vocab: 261,
        seed: 21,
        ..Spec::default()
    };
    let dir = spec.checkpoint("cli");
    common::write_tokenizer(dir.path());
    let tok = Tokenizer::from_file(&dir.path().join("tokenizer.json")).unwrap();
    let prompt = "hi there";
    let ids = greedy_ids(dir.path(), &tok.encode(prompt).unwrap(), 12);
    assert!(!ids.is_empty());
    let want = tok.decode(&ids).unwrap();
    let out = generate_ok(
        dir.path(),
        &[
            "--prompt",
            prompt,
            "--max-new-tokens",
            "12",
            "--temperature",
            "0",
        ],
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.trim_end_matches('\n'), want);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("tok/s") && stderr.contains("time to first token"),
        "{stderr}"
    );
}

#[test]
fn generate_on_ids_without_tokenizer() {
    let spec = Spec::seeded(22);
    let dir = spec.checkpoint("cli-ids");
    let ids = greedy_ids(dir.path(), &[5, 6, 7], 6);
    let out = generate_ok(
        dir.path(),
        &[
            "--prompt-ids",
            "5,6,7",
            "--max-new-tokens",
            "6",
            "--temperature",
            "0",
        ],
    );
    // In the input's format: comma-separated, no spaces, so it can be passed back.
    let want: Vec<String> = ids.iter().map(u32::to_string).collect();
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        want.join(",") + "\n"
    );
    // Text without a tokenizer is a clear error.
    let out = generate(dir.path(), &["--prompt".as_ref(), "hello".as_ref()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no tokenizer.json"));
    assert!(out.stdout.is_empty());
}

/// `--model FILE.gguf` (no vocabulary in the file: ids in, ids out) prints the library's
/// greedy continuation and writes the scratch profile.
#[test]
fn generate_runs_a_gguf_file_and_writes_the_scratch_profile() {
    let spec = Spec {
        hidden: 64,
        heads: 4,
        kv_heads: 2,
        ffn: 96,
        seed: 8,
        ..Spec::default()
    };
    let dir = TempDir::new("cli-gguf");
    let (w, _) = common::gguf::tiny_model(&spec, Some(llm::quant::format::QType::Q4_0));
    let model = dir.path().join("tiny.gguf");
    w.write(&model);
    let ids = greedy_ids(&model, &[5, 6, 7], 6);
    let prof = dir.path().join("prof.json");
    let prof_arg = prof.to_str().expect("a UTF-8 temp path");
    let out = generate_ok(
        &model,
        &[
            "--prompt-ids",
            "5,6,7",
            "--max-new-tokens",
            "6",
            "--scratch-profile",
            prof_arg,
        ],
    );
    // Ids out in the input's format: comma-separated.
    let got: Vec<u32> = String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .split(',')
        .map(|t| t.parse().unwrap())
        .collect();
    assert_eq!(got, ids);
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&prof).unwrap()).unwrap();
    assert_eq!(j["prefill_tokens"], 3);
    assert!(j["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .any(|k| k["phase"] == "decode" && k["kernel"] == "linear_qkv" && k["calls"] == 5 * 2));
}
