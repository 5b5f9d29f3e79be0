//! Correctness against the independent f64 reference, KV cache vs recompute, conventions
//! checked by hand, and every bad-checkpoint error.

mod common;

use std::sync::Arc;

use caching_allocator::CachingAllocator;
use common::{check_against_reference, model, prompt, Spec, TempDir};
use llm::runtime::Runtime;
use llm::safetensors::DType;
use llm::{Llama, LlmError, ModelOptions, Module, Sampler, Weights};

/// Each spec against the reference, within 1e-4 of the logits' scale (a failure names the
/// spec).
#[test]
fn specs_match_reference() {
    let specs = [
        // f32, GQA, a separate head.
        Spec::default(),
        Spec {
            tied: true,
            qwen2: true,
            llama3_scaling: true,
            heads: 4,
            kv_heads: 1,
            hidden: 64,
            rope_theta: 500.0,
            seed: 5,
            ..Spec::default()
        },
        // bf16 and f16 weights: the kernels widen exactly, so against the reference run on
        // the same rounded weights the f32 bound holds.
        Spec {
            dtype: DType::BF16,
            seed: 9,
            ..Spec::default()
        },
        Spec {
            dtype: DType::F16,
            seed: 9,
            ..Spec::default()
        },
        // Wide enough rows and prompts that the SIMD loops, their tails and the multi-task
        // matmul all run.
        Spec {
            hidden: 200,
            heads: 5,
            kv_heads: 5,
            ffn: 264,
            vocab: 300,
            layers: 1,
            dtype: DType::BF16,
            seed: 11,
            ..Spec::default()
        },
    ];
    for spec in &specs {
        check_against_reference(spec, 1e-4);
    }
}

#[test]
fn decode_with_kv_cache_equals_full_recompute() {
    let spec = Spec::seeded(3);
    let dir = spec.checkpoint("kv");
    let mut a = model(dir.path());
    let mut tokens = prompt(spec.vocab, 16, 1);
    a.forward(&tokens).unwrap();
    let mut sampler = Sampler::greedy();
    for _ in 0..8 {
        let t = a.sample(&mut sampler).unwrap();
        tokens.push(t);
        let step = a.forward(&[t]).unwrap().to_vec();
        let mut b = model(dir.path());
        let full = b.forward(&tokens).unwrap().to_vec();
        let err = step
            .iter()
            .zip(&full)
            .fold(0.0f32, |m, (x, y)| m.max((x - y).abs()));
        let scale = full.iter().fold(0.0f32, |m, y| m.max(y.abs()));
        assert!(
            err <= 1e-5 * scale,
            "cached decode differs from recompute: {err}"
        );
    }
}

#[test]
fn sharded_checkpoint_loads_like_single_file() {
    let spec = Spec::default();
    let single = TempDir::new("single");
    let ts = spec.write(single.path());
    let sharded = TempDir::new("sharded");
    let (a, b) = ts.split_at(ts.len() / 2);
    common::write_tensors(
        &sharded.path().join("model-00001-of-00002.safetensors"),
        a,
        DType::F32,
    );
    common::write_tensors(
        &sharded.path().join("model-00002-of-00002.safetensors"),
        b,
        DType::F32,
    );
    let mut map = serde_json::Map::new();
    for (n, _, _) in a {
        map.insert(n.clone(), "model-00001-of-00002.safetensors".into());
    }
    for (n, _, _) in b {
        map.insert(n.clone(), "model-00002-of-00002.safetensors".into());
    }
    std::fs::write(
        sharded.path().join("model.safetensors.index.json"),
        serde_json::json!({"metadata": {}, "weight_map": map}).to_string(),
    )
    .unwrap();
    spec.write_config(sharded.path());
    let toks = prompt(spec.vocab, 5, 2);
    let x = model(single.path()).forward(&toks).unwrap().to_vec();
    let y = model(sharded.path()).forward(&toks).unwrap().to_vec();
    assert_eq!(x, y);
}

/// HF rotate-half on a 4-dim head, by hand: inv_freq = [1, 10000^-0.5] = [1, 0.01], pos 1,
/// x = [1, 2, 3, 4]: pairs are (x0, x2) and (x1, x3), NOT adjacent elements.
#[test]
fn rope_is_rotate_half_hand_checked() {
    let mut rt = Runtime::new(CachingAllocator::new(1 << 20));
    let inv = llm::config::rope_inv_freq(4, 10000.0, None);
    assert!(
        (inv[0] - 1.0).abs() < 1e-15 && (inv[1] - 0.01).abs() < 1e-15,
        "{inv:?}"
    );
    let mut q = vec![1.0f32, 2.0, 3.0, 4.0];
    let mut k = vec![1.0f32, 2.0, 3.0, 4.0];
    rt.run("rope", |s| {
        let q = llm::kernels::Heads {
            data: &mut q,
            heads: 1,
        };
        let k = llm::kernels::Heads {
            data: &mut k,
            heads: 1,
        };
        llm::kernels::rope(s, &inv, 1..2, q, k)
    })
    .unwrap();
    let (c0, s0, c1, s1) = (1f64.cos(), 1f64.sin(), 0.01f64.cos(), 0.01f64.sin());
    let want = [
        1.0 * c0 - 3.0 * s0, // -1.98411
        2.0 * c1 - 4.0 * s1, //  1.95990
        3.0 * c0 + 1.0 * s0, //  2.46238
        4.0 * c1 + 2.0 * s1, //  4.01980
    ];
    for i in 0..4 {
        assert!(
            (q[i] as f64 - want[i]).abs() < 1e-6,
            "q[{i}] = {} want {}",
            q[i],
            want[i]
        );
        assert_eq!(q[i], k[i]);
    }
    assert!((q[0] + 1.984111).abs() < 1e-5 && (q[3] - 4.0198).abs() < 1e-5);
}

/// Llama 3 rope_scaling, head_dim 8, theta 10000: base frequencies 1, 0.1, 0.01, 0.001
/// (wavelengths 6.28, 62.8, 628, 6283). With factor 8, low 1, high 4, original context 64:
/// low wavelength 64, high 16. 6.28 < 16 keeps 1; 628 and 6283 > 64 divide by 8; 62.8 is in
/// between: smooth = (64 / 62.83 - 1) / 3 = 0.0061972, f = (1 - s) * 0.1 / 8 + s * 0.1.
#[test]
fn llama3_rope_scaling_hand_checked() {
    let sc = llm::config::Llama3Scaling {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 64.0,
    };
    let f = llm::config::rope_inv_freq(8, 10000.0, Some(&sc));
    let want = [1.0, 0.013_042_256, 0.001_25, 0.000_125];
    for i in 0..4 {
        assert!((f[i] - want[i]).abs() < 1e-8 * want[i].max(1e-3), "{f:?}");
    }
    // And the config parser wires it up.
    let c = llm::LlamaConfig::from_json(
        r#"{"hidden_size": 16, "intermediate_size": 8, "num_hidden_layers": 1,
            "num_attention_heads": 2, "vocab_size": 4, "rope_theta": 10000.0,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
            "eos_token_id": 7}"#,
    )
    .unwrap();
    assert_eq!(c.inv_freq(), f);
    assert_eq!(c.eos_token_ids, vec![7]);
}

/// GQA: with one key position, query head h's output is exactly v of KV head h / (heads /
/// kv_heads) (HF's repeat_kv: each KV head serves consecutive query heads).
#[test]
fn gqa_head_mapping_hand_checked() {
    let (heads, kv_heads, d) = (4, 2, 2);
    let q = vec![1.0f32; heads * d];
    let k = vec![0.5f32; kv_heads * d];
    let v = vec![10.0f32, 11.0, 20.0, 21.0]; // kv head 0: [10, 11]; kv head 1: [20, 21]
    let mut out = vec![0.0f32; heads * d];
    let shape = sdpa::Shape {
        batch: 1,
        q_len: 1,
        heads,
        kv_heads,
        head_dim: d,
        kv_capacity: 1,
        start_pos: 0,
    };
    let temp = CachingAllocator::new(1 << 20);
    sdpa::attention(
        &q,
        &k,
        &v,
        &mut out,
        &shape,
        &sdpa::Params::default(),
        &temp,
    )
    .unwrap();
    assert_eq!(out, vec![10.0, 11.0, 10.0, 11.0, 20.0, 21.0, 20.0, 21.0]);
}

#[test]
fn sampling_is_seeded_and_respects_top_p() {
    let mut rt = Runtime::new(CachingAllocator::new(1 << 20));
    let logits = vec![0.0f32, 5.0, 4.9, -3.0, 1.0];
    let draw = |rt: &mut Runtime<CachingAllocator>, t: f32, p: f32, seed: u64| -> Vec<u32> {
        let mut s = Sampler::new(t, p, seed).unwrap();
        (0..200)
            .map(|_| rt.run("sample", |sc| s.sample(sc, &logits)).unwrap())
            .collect()
    };
    assert!(draw(&mut rt, 0.0, 1.0, 1).iter().all(|&t| t == 1));
    let a = draw(&mut rt, 1.0, 1.0, 42);
    assert_eq!(a, draw(&mut rt, 1.0, 1.0, 42));
    assert!(
        a.contains(&1) && a.contains(&2),
        "temperature 1 samples both top tokens"
    );
    // top_p 0.5: token 1 alone has probability ~0.5 < 0.5? p1 = e^5 / (e^5 + e^4.9 + ...) ~ 0.51.
    let b = draw(&mut rt, 1.0, 0.5, 7);
    assert!(b.iter().all(|&t| t == 1), "{b:?}");
    let c = draw(&mut rt, 1.0, 0.9, 7);
    assert!(c.iter().all(|&t| t == 1 || t == 2) && c.contains(&2));
    assert!(Sampler::new(1.0, 0.0, 1).is_err());
}

// ---- bad checkpoints: each error names the file and the tensor ----

/// Loads the checkpoint in `dir`, which must fail with an error that contains every one of
/// `parts`.
fn assert_load_err(dir: &std::path::Path, parts: &[&str]) {
    let e = match Weights::load(dir) {
        Ok(_) => panic!("loading {} should fail", dir.display()),
        Err(e) => e.to_string(),
    };
    for part in parts {
        assert!(e.contains(part), "no {part:?} in: {e}");
    }
}

#[test]
fn missing_tensor_is_named() {
    let spec = Spec::default();
    let dir = TempDir::new("missing");
    let mut ts = spec.tensors();
    ts.retain(|(n, _, _)| n != "model.layers.1.mlp.up_proj.weight");
    spec.write_with(dir.path(), &ts);
    assert_load_err(
        dir.path(),
        &[
            "missing tensor `model.layers.1.mlp.up_proj.weight`",
            "model.safetensors",
        ],
    );
}

#[test]
fn wrong_shape_is_named() {
    let spec = Spec::default();
    let dir = TempDir::new("shape");
    let mut ts = spec.tensors();
    for t in &mut ts {
        if t.0 == "model.layers.0.self_attn.k_proj.weight" {
            t.1 = vec![8, 32];
            t.2.truncate(8 * 32);
        }
    }
    spec.write_with(dir.path(), &ts);
    assert_load_err(
        dir.path(),
        &[
            "`model.layers.0.self_attn.k_proj.weight` has shape [8, 32]",
            "[16, 32]",
            "model.safetensors",
        ],
    );
}

/// A default checkpoint in a new directory tagged `tag`, the path of its weights file and that
/// file's bytes, for a test to write back damaged.
fn weights_to_damage(tag: &str) -> (TempDir, std::path::PathBuf, Vec<u8>) {
    let dir = Spec::default().checkpoint(tag);
    let path = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    (dir, path, bytes)
}

#[test]
fn unsupported_dtype_is_named() {
    let (dir, path, bytes) = weights_to_damage("dtype");
    // Rewrite one tensor's dtype as I32 (same 4-byte size, so the file stays consistent).
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    header["model.norm.weight"]["dtype"] = "I32".into();
    let mut h = header.to_string().into_bytes();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(&bytes[8 + n..]);
    std::fs::write(&path, out).unwrap();
    assert_load_err(
        dir.path(),
        &["`model.norm.weight` has dtype I32", "model.safetensors"],
    );
}

#[test]
fn truncated_file_is_named() {
    let (dir, path, bytes) = weights_to_damage("trunc");
    std::fs::write(&path, &bytes[..bytes.len() - 10]).unwrap();
    assert_load_err(dir.path(), &["truncated", "model.safetensors", "tensor `"]);
    // A file too short for its header.
    std::fs::write(&path, &bytes[..20]).unwrap();
    assert_load_err(dir.path(), &["truncated", "header"]);
}

#[test]
fn config_contradicting_weights_is_reported() {
    let spec = Spec::default();
    let dir = spec.checkpoint("contra");
    // Fewer layers in the config than in the weights.
    let mut c = spec.config_json();
    c["num_hidden_layers"] = 1.into();
    std::fs::write(dir.path().join("config.json"), c.to_string()).unwrap();
    assert_load_err(
        dir.path(),
        &["contradicts", "model.layers.1.", "model.safetensors"],
    );
    // A vocabulary size that is not the embedding's.
    let mut c = spec.config_json();
    c["vocab_size"] = 100.into();
    std::fs::write(dir.path().join("config.json"), c.to_string()).unwrap();
    assert_load_err(dir.path(), &["contradicts", "model.embed_tokens.weight"]);
    // Bias promised by a qwen2 config but absent.
    let mut c = spec.config_json();
    c["model_type"] = "qwen2".into();
    std::fs::write(dir.path().join("config.json"), c.to_string()).unwrap();
    assert_load_err(
        dir.path(),
        &["missing tensor `model.layers.0.self_attn.q_proj.bias`"],
    );
}

/// Sizes in config.json that the weights cannot back, or whose arithmetic overflows, are
/// errors naming them, not an allocation abort or an overflow panic.
#[test]
fn hostile_config_sizes_are_errors() {
    let spec = Spec::default();
    let dir = spec.checkpoint("hostile-cfg");
    // A layer count the checkpoint's tensors cannot fill (`Vec::with_capacity` of it aborted).
    let mut c = spec.config_json();
    c["num_hidden_layers"] = 0xFFFF_FFFFu64.into();
    std::fs::write(dir.path().join("config.json"), c.to_string()).unwrap();
    assert_load_err(
        dir.path(),
        &[
            "num_hidden_layers is 4294967295",
            "room for at most",
            "model.safetensors",
        ],
    );
    // A head dimension whose products overflow.
    let mut c = spec.config_json();
    c["head_dim"] = (1u64 << 60).into();
    std::fs::write(dir.path().join("config.json"), c.to_string()).unwrap();
    assert_load_err(dir.path(), &["config.json", "query width", "overflows"]);
}

#[test]
fn bad_config_and_no_weights() {
    let dir = TempDir::new("cfg");
    std::fs::write(dir.path().join("config.json"), "{\"hidden_size\": 4}").unwrap();
    assert_load_err(dir.path(), &["config.json", "missing field"]);
    Spec::default().write(dir.path());
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    assert_load_err(dir.path(), &["no model.safetensors"]);
}

#[test]
fn prompt_longer_than_context_is_an_error() {
    let spec = Spec::default();
    let dir = spec.checkpoint("ctx");
    let w = Arc::new(Weights::load(dir.path()).unwrap());
    let mut m = Llama::new(
        w,
        llm::caching_temp(1 << 20),
        &ModelOptions {
            context: Some(8),
            ..Default::default()
        },
    )
    .unwrap();
    let e = m.forward(&prompt(spec.vocab, 9, 1)).unwrap_err();
    assert!(
        matches!(e, LlmError::ContextOverflow { capacity: 8, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("exceed its capacity of 8"), "{e}");
    let e = m.forward(&[spec.vocab as u32]).unwrap_err();
    assert!(matches!(e, LlmError::BadToken { .. }), "{e}");
    // Generation stops at a full context instead of failing.
    let mut s = Sampler::greedy();
    let st = llm::generate(
        &mut m,
        &prompt(spec.vocab, 6, 1),
        &mut s,
        &llm::GenerateOptions {
            max_new_tokens: 100,
            stop_tokens: vec![],
        },
        |_| Ok(()),
    )
    .unwrap();
    assert_eq!(st.stop, llm::StopReason::ContextFull);
    assert_eq!(st.generated, 3);
}

#[test]
fn tokenizer_round_trip_and_stop_tokens() {
    let dir = TempDir::new("tok");
    common::write_tokenizer(dir.path());
    let tok = llm::tokenizer::Tokenizer::from_file(&dir.path().join("tokenizer.json")).unwrap();
    let ids = tok.encode("hi é").unwrap();
    assert_eq!(ids[0], 1, "BOS prepended: {ids:?}");
    assert_eq!(ids[1], 260, "the merge applies: {ids:?}");
    assert_eq!(tok.decode(&ids).unwrap(), "hi é");
    // Streaming holds back half a UTF-8 character.
    let mut st = llm::tokenizer::TextStream::new(&tok);
    let pieces: Vec<String> = ids[1..].iter().map(|&i| st.push(i).unwrap()).collect();
    assert_eq!(pieces.concat(), "hi é");
    // eos_token_id as a list becomes the stop tokens.
    let c = llm::LlamaConfig::from_json(&Spec::default().config_json().to_string()).unwrap();
    assert_eq!(c.eos_token_ids, vec![2, 3]);
}
