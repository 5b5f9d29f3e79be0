//! The `gemma3` architecture on tiny GGUF files written by the test: its metadata read as
//! the definition says, every position's logits against an f64 reference forward pass
//! written from the definition (local and global layers, a window shorter than the
//! sequence, q/k norms, post-norms, GELU gating, scaled embeddings, tied head), and KV-cache
//! decoding equal to recomputing the sequence.

mod common;

use std::sync::Arc;

use common::gemma3::{tiny_gemma3, GemmaSpec};
use common::{prompt, rel_err, TempDir};
use llm::arch::Architecture;
use llm::gguf::{GgufFile, Value};
use llm::quant::QType;
use llm::{caching_temp, Llama, ModelOptions, Module, Weights};

fn load(spec: &GemmaSpec, dir: &TempDir, tag: &str) -> Arc<Weights> {
    let (w, _) = tiny_gemma3(spec);
    let p = dir.path().join(format!("{tag}.gguf"));
    w.write(&p);
    Arc::new(Weights::load(&p).unwrap())
}

fn model(w: &Arc<Weights>) -> Llama<caching_allocator::CachingAllocator> {
    let opts = ModelOptions {
        context: Some(64),
        ..Default::default()
    };
    Llama::new(w.clone(), caching_temp(1 << 20), &opts).unwrap()
}

/// The metadata keys become the configuration; what the metadata does not hold comes from
/// the architecture's definition.
#[test]
fn gemma3_metadata_is_read() {
    let dir = TempDir::new("gemma3-meta");
    let spec = GemmaSpec::default();
    let w = load(&spec, &dir, "m");
    let c = &w.config;
    assert_eq!(c.num_layers, 7);
    assert_eq!(c.hidden_size, 32);
    assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim), (4, 1, 16));
    assert_eq!(c.intermediate_size, 64);
    assert_eq!(c.rope_theta, 1e6);
    assert!(c.tie_word_embeddings);
    let Architecture::Gemma3(g) = &c.arch else {
        panic!("architecture {:?}", c.arch)
    };
    assert_eq!(g.sliding_window, 4);
    assert_eq!(g.rope_local_theta, 10_000.0);
    assert_eq!(g.query_pre_attn_scalar, 16.0);
    let locals: Vec<bool> = (0..7).map(|i| g.is_local(i)).collect();
    assert_eq!(locals, [true, true, true, true, true, false, true]);
    assert!(w
        .layers
        .iter()
        .all(|l| l.q_norm.is_some() && l.mlp_out_norm.is_some()));
}

/// Every position's logits of a 12-token prompt (three times the window) against the f64
/// reference, matrices in F32, Q8_0 and Q4_0 (the embedding/head in Q8_0 when quantized).
#[test]
fn tiny_gemma3_matches_f64_reference() {
    let dir = TempDir::new("gemma3-ref");
    for (i, quant) in [None, Some(QType::Q8_0), Some(QType::Q4_0)]
        .into_iter()
        .enumerate()
    {
        let spec = GemmaSpec {
            quant,
            seed: 20 + i as u64,
            ..GemmaSpec::default()
        };
        let (w, reference) = tiny_gemma3(&spec);
        let p = dir.path().join(format!("r{i}.gguf"));
        w.write(&p);
        let weights = Arc::new(Weights::load(&p).unwrap());
        let tokens = prompt(spec.vocab, 12, 3 + i as u64);
        let want = reference.logits(&tokens);
        let mut m = model(&weights);
        let got = m.forward_all(&tokens).unwrap().to_vec();
        for (pos, w) in want.iter().enumerate() {
            let e = rel_err(&got[pos * spec.vocab..][..spec.vocab], w);
            assert!(e < 1e-4, "{quant:?} position {pos}: relative error {e:e}");
        }
    }
}

/// Decoding token by token through the KV cache (prefill of 3, then 9 steps past the
/// window) gives the logits of recomputing the whole sequence, and the reference's.
#[test]
fn gemma3_kv_decode_equals_recompute() {
    let dir = TempDir::new("gemma3-kv");
    let spec = GemmaSpec {
        quant: Some(QType::Q8_0),
        ..GemmaSpec::default()
    };
    let (w, reference) = tiny_gemma3(&spec);
    let p = dir.path().join("kv.gguf");
    w.write(&p);
    let weights = Arc::new(Weights::load(&p).unwrap());
    let tokens = prompt(spec.vocab, 12, 9);
    let want = reference.logits(&tokens);
    let v = spec.vocab;
    let mut whole = model(&weights);
    let recomputed = whole.forward_all(&tokens).unwrap().to_vec();
    let mut m = model(&weights);
    let mut step = m.forward(&tokens[..3]).unwrap().to_vec();
    for pos in 2..tokens.len() {
        if pos > 2 {
            step = m.forward(&tokens[pos..pos + 1]).unwrap().to_vec();
        }
        let again = &recomputed[pos * v..][..v];
        let diff = step
            .iter()
            .zip(again)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            diff < 1e-4,
            "position {pos}: decode vs recompute differ by {diff}"
        );
        let e = rel_err(&step, &want[pos]);
        assert!(e < 1e-4, "position {pos}: decode vs reference {e:e}");
    }
}

/// Bad gemma3 metadata is a named error that says what is wrong.
#[test]
fn gemma3_bad_metadata_is_refused() {
    let dir = TempDir::new("gemma3-bad");
    let cases: [(&str, Option<Value>, &str); 3] = [
        (
            "gemma3.attention.sliding_window",
            None,
            "sliding_window` is missing",
        ),
        (
            "gemma3.attention.value_length",
            Some(Value::U32(8)),
            "value_length 8 differs",
        ),
        (
            "gemma3.final_logit_softcapping",
            Some(Value::F32(30.0)),
            "not supported",
        ),
    ];
    for (i, (key, value, want)) in cases.into_iter().enumerate() {
        let (mut w, _) = tiny_gemma3(&GemmaSpec::default());
        match value {
            Some(v) => {
                w.set_meta(key, v);
            }
            None => w.meta.retain(|(k, _)| k != key),
        }
        let p = dir.path().join(format!("b{i}.gguf"));
        w.write(&p);
        let f = GgufFile::open(&p).unwrap();
        let e = match llm::gguf::weights_from(&f) {
            Ok(_) => panic!("{key}: the file was accepted"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(want), "{key}: {e}");
    }
}
