//! GGUF files written by the tests themselves: every supported tensor type dequantized
//! bit-exactly as the formats define it, the quantized kernels against f64, a tiny model's
//! logits against the f64 reference, the tokenizer and chat template from metadata, and the
//! error of every kind of bad file.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::gguf::{self as g, Writer};
use common::{prompt, rel_err, Reference, Spec, TempDir};
use llm::gguf::{GgufFile, Value};
use llm::matrix::{Linear, Matrix};
use llm::output::Output;
use llm::quant::format::QType;
use llm::quant::QTensor;
use llm::runtime::Runtime;
use llm::{caching_temp, Activations, Llama, ModelOptions, Module, Weights};

fn one_tensor_file(
    dir: &Path,
    ty: u32,
    rows: usize,
    cols: usize,
    seed: u64,
) -> (std::path::PathBuf, Vec<u8>) {
    let data = g::random_tensor_bytes(ty, rows, cols, seed);
    let mut w = Writer::default();
    w.meta("general.alignment", Value::U32(64));
    // A first tensor of odd size, so the second's offset needs the alignment padding.
    w.tensor("pad", &[3], g::F16, vec![0; 6]);
    w.tensor("t", &[cols as u64, rows as u64], ty, data.clone());
    let p = dir.join(format!("t{ty}.gguf"));
    w.write(&p);
    (p, data)
}

/// Every supported type, read through the memory-mapped file, dequantizes to exactly the
/// values the format's definition gives (bit for bit).
#[test]
fn every_type_dequantizes_bit_exactly() {
    let dir = TempDir::new("gguf-types");
    let quantized = g::BLOCKS.map(|b| b.0);
    for ty in [g::F32, g::F16, g::BF16].into_iter().chain(quantized) {
        // Two K-quant super-blocks a row, three blocks of the others.
        let (rows, cols) = (5, if g::block_of_any(ty) == 256 { 512 } else { 96 });
        let (p, data) = one_tensor_file(dir.path(), ty, rows, cols, 40 + ty as u64);
        let f = GgufFile::open(&p).unwrap();
        assert_eq!(f.version(), 3);
        let m = f.matrix("t").unwrap().expect("tensor t");
        assert_eq!(m.shape(), vec![rows, cols], "type {ty}");
        let got = m.to_f32();
        let rb = g::row_bytes(ty, cols);
        let want: Vec<f32> = data
            .chunks(rb)
            .flat_map(|r| g::dequant_reference(ty, r))
            .collect();
        assert_eq!(got.len(), want.len());
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "type {ty} element {i}: {a} vs {b}"
            );
        }
        assert!(
            want.iter().any(|&v| v != 0.0),
            "type {ty}: test data all zero"
        );
    }
}

/// The quantized linear kernels (decode and prefill, with bias and accumulation) against an
/// f64 product of the dequantized weights.
#[test]
fn quantized_linear_matches_f64() {
    for qt in QType::ALL {
        let (n, k) = (37, 3 * qt.block_len());
        let bytes = g::random_tensor_bytes(g::qtype_id(qt), n, k, 7);
        let q = QTensor::from_bytes(qt, n, k, &bytes).unwrap();
        let wf: Vec<f64> = bytes
            .chunks(g::row_bytes(g::qtype_id(qt), k))
            .flat_map(|r| g::dequant_reference(g::qtype_id(qt), r))
            .map(f64::from)
            .collect();
        let mat = Matrix::Quant(q);
        let bias: Vec<f32> = (0..n).map(|i| i as f32 * 0.01).collect();
        for m in [1usize, 5] {
            let mut rng = llm::sample::Rng::new(m as u64);
            let x: Vec<f32> = (0..m * k).map(|_| rng.next_f32() * 2.0 - 1.0).collect();
            let init: Vec<f32> = (0..m * n).map(|i| (i % 7) as f32).collect();
            let mut out = init.clone();
            let mut rt = Runtime::new(caching_temp(1 << 20));
            rt.run("linear", |s| {
                Linear::new(&mat, Some(&bias)).forward(s, &x, m, &mut out, Output::AddTo)
            })
            .unwrap();
            for i in 0..m {
                let want: Vec<f64> = (0..n)
                    .map(|r| {
                        let d: f64 = (0..k).map(|j| wf[r * k + j] * x[i * k + j] as f64).sum();
                        init[i * n + r] as f64 + d + bias[r] as f64
                    })
                    .collect();
                let e = rel_err(&out[i * n..(i + 1) * n], &want);
                assert!(e < 1e-5, "{qt:?} m={m} row {i}: relative error {e:e}");
            }
        }
    }
}

fn tiny_spec(tied: bool, seed: u64) -> Spec {
    Spec {
        hidden: 64,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        ffn: 96,
        vocab: 80,
        tied,
        seed,
        ..Spec::default()
    }
}

/// A tiny llama model written as GGUF (matrices in each type, the K-quants' rows of whole
/// super-blocks, q/k permuted as llama.cpp's
/// converter does, tied and untied head): every prompt position's logits and 6 decode steps
/// against the f64 reference on the same (dequantized) weights, within 1e-4.
#[test]
fn tiny_gguf_model_matches_reference() {
    let dir = TempDir::new("gguf-model");
    let types = [None].into_iter().chain(QType::ALL.map(Some));
    for (i, qt) in types.enumerate() {
        for tied in [false, true] {
            let mut spec = tiny_spec(tied, 3 + i as u64);
            if qt.is_some_and(|q| q.block_len() == 256) {
                // Rows of whole super-blocks.
                (spec.hidden, spec.ffn) = (256, 512);
            }
            let (w, ts) = g::tiny_model(&spec, qt);
            // One file without the extension: recognised by its magic.
            let ext = if i == 1 && tied { "bin" } else { "gguf" };
            let p = dir.path().join(format!("m{i}{tied}.{ext}"));
            w.write(&p);
            let weights = Arc::new(Weights::load(&p).unwrap());
            assert_eq!(weights.config.tie_word_embeddings, tied);
            let reference = Reference::new(&spec, &ts);
            let mut m =
                Llama::new(weights, caching_temp(1 << 20), &ModelOptions::default()).unwrap();
            let mut tokens = prompt(spec.vocab, 12, 50 + i as u64);
            let got = m.forward_all(&tokens).unwrap().to_vec();
            let want = reference.logits(&tokens);
            let v = spec.vocab;
            for (pos, wv) in want.iter().enumerate() {
                let e = rel_err(&got[pos * v..][..v], wv);
                assert!(e < 1e-4, "{qt:?} tied={tied} position {pos}: {e:e}");
            }
            for (step, &t) in prompt(spec.vocab, 6, 90).iter().enumerate() {
                tokens.push(t);
                let got = m.forward(&[t]).unwrap().to_vec();
                let e = rel_err(&got, reference.logits(&tokens).last().unwrap());
                assert!(e < 1e-4, "{qt:?} tied={tied} decode step {step}: {e:e}");
            }
        }
    }
}

/// The opt-in int8 activations ([`Activations::Int8`]): prefill keeps f32 activations (the
/// reference's logits within 1e-4), decode over 4-bit rows moves away from the exact model by
/// the quantization of `x` (visibly more than f32 rounding, so the mode is in use) but stays
/// close to it.
#[test]
fn int8_activations_decode_near_the_exact_model() {
    let dir = TempDir::new("gguf-int8");
    for (i, qt) in [QType::Q4_0, QType::Q4_1].into_iter().enumerate() {
        let spec = tiny_spec(true, 21 + i as u64);
        let (w, ts) = g::tiny_model(&spec, Some(qt));
        let p = dir.path().join(format!("m{i}.gguf"));
        w.write(&p);
        let weights = Arc::new(Weights::load(&p).unwrap());
        let reference = Reference::new(&spec, &ts);
        let opts = ModelOptions {
            activations: Activations::Int8,
            ..Default::default()
        };
        let mut m = Llama::new(weights, caching_temp(1 << 20), &opts).unwrap();
        let mut tokens = prompt(spec.vocab, 12, 60 + i as u64);
        let v = spec.vocab;
        let got = m.forward_all(&tokens).unwrap().to_vec();
        let e = rel_err(&got[11 * v..], reference.logits(&tokens).last().unwrap());
        assert!(e < 1e-4, "{qt:?} prefill: {e:e}");
        let mut worst = 0f64;
        for (step, &t) in prompt(spec.vocab, 6, 91).iter().enumerate() {
            tokens.push(t);
            let got = m.forward(&[t]).unwrap().to_vec();
            let e = rel_err(&got, reference.logits(&tokens).last().unwrap());
            assert!(e < 3e-2, "{qt:?} decode step {step}: {e:e}");
            worst = worst.max(e);
        }
        println!("{qt:?}: int8 decode's largest relative error {worst:e}");
        assert!(
            worst > 1e-4,
            "{qt:?}: decode as exact as f32 ({worst:e}): int8 not in use?"
        );
    }
}

/// Loading without un-permuting q/k would be caught: the reference on the *permuted* rows
/// (what a loader that forgot would run) disagrees with the model.
#[test]
fn unpermuted_qk_would_be_detected() {
    let spec = tiny_spec(false, 11);
    let (w, ts) = g::tiny_model(&spec, None);
    let dir = TempDir::new("gguf-perm");
    let p = dir.path().join("m.gguf");
    w.write(&p);
    let mut m = common_model(&p);
    let tokens = prompt(spec.vocab, 8, 5);
    let got = m.forward_all(&tokens).unwrap().to_vec();
    // The weights as stored in the file, not restored.
    let f = GgufFile::open(&p).unwrap();
    let wrong: Vec<_> = ts
        .iter()
        .map(|(n, s, v)| {
            if n.ends_with("q_proj.weight") || n.ends_with("k_proj.weight") {
                let stored = f.matrix(&g::hf_to_gguf_name(n)).unwrap().unwrap().to_f32();
                (n.clone(), s.clone(), stored)
            } else {
                (n.clone(), s.clone(), v.clone())
            }
        })
        .collect();
    let bad = Reference::new(&spec, &wrong).logits(&tokens);
    let v = spec.vocab;
    let e = rel_err(&got[(tokens.len() - 1) * v..], bad.last().unwrap());
    assert!(
        e > 1e-3,
        "permuted and restored q/k gave the same logits ({e:e})"
    );
}

fn common_model(p: &Path) -> Llama<caching_allocator::CachingAllocator> {
    let w = Arc::new(Weights::load(p).unwrap());
    Llama::new(w, caching_temp(1 << 20), &ModelOptions::default()).unwrap()
}

/// The error of loading `bytes` as a model.
fn load_err(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    match Weights::load(&p) {
        Ok(_) => panic!("{name}: loaded"),
        Err(e) => e.to_string(),
    }
}

/// A file name, an edit of a good model, and the words the error of loading it must say.
type Edit<'a> = (&'a str, fn(&mut Writer), &'a [&'a str]);

#[test]
fn bad_files_are_errors_naming_file_and_tensor() {
    let dir = TempDir::new("gguf-bad");
    let d = dir.path();
    let spec = tiny_spec(false, 2);
    let (good, _) = g::tiny_model(&spec, Some(QType::Q4_1));
    let bytes = good.bytes();

    let e = load_err(d, "magic.gguf", b"GGML\x03\0\0\0");
    assert!(
        e.contains("magic.gguf") && e.contains("not a GGUF file"),
        "{e}"
    );

    let e = load_err(d, "empty.gguf", b"");
    assert!(e.contains("empty.gguf") && e.contains("truncated"), "{e}");

    let mut v1 = bytes.clone();
    v1[4] = 1;
    let e = load_err(d, "v1.gguf", &v1);
    assert!(e.contains("version 1 is not supported"), "{e}");

    // Cut inside the header, then inside the last tensor's data.
    let e = load_err(d, "cut-header.gguf", &bytes[..200]);
    assert!(
        e.contains("cut-header.gguf") && e.contains("truncated"),
        "{e}"
    );
    let e = load_err(d, "cut-data.gguf", &bytes[..bytes.len() - 10]);
    let last = &good.tensors.last().unwrap().name;
    assert!(
        e.contains("cut-data.gguf") && e.contains(last.as_str()) && e.contains("truncated"),
        "{e}"
    );

    // A type not run (Q3_K): refused naming the file, the tensor and its type.
    let mut w = g::tiny_model(&spec, Some(QType::Q4_1)).0;
    let t = w
        .tensors
        .iter_mut()
        .find(|t| t.name == "blk.1.ffn_up.weight")
        .unwrap();
    t.ggml_type = g::Q3_K;
    let e = load_err(d, "kquant.gguf", &w.bytes());
    assert!(
        e.contains("kquant.gguf")
            && e.contains("blk.1.ffn_up.weight")
            && e.contains("Q3_K")
            && e.contains("not supported"),
        "{e}"
    );

    // Edits of the f32 model, each refused with an error saying all its words.
    let first = g::tiny_model(&spec, None).0.tensors[0].name.clone();
    let edits: [Edit<'_>; 5] = [
        // An unknown type id.
        (
            "unknown.gguf",
            |w| w.tensors[0].ggml_type = 99,
            &[first.as_str(), "ggml id 99"],
        ),
        // A shape that contradicts the metadata.
        (
            "shape.gguf",
            |w| {
                w.set_meta("llama.feed_forward_length", Value::U32(64));
            },
            &[
                "shape.gguf",
                "blk.0.ffn_gate.weight",
                "contradicts the metadata",
            ],
        ),
        // A missing tensor.
        (
            "missing.gguf",
            |w| w.tensors.retain(|t| t.name != "blk.1.attn_v.weight"),
            &["missing.gguf", "blk.1.attn_v.weight"],
        ),
        // A layer beyond the block count.
        (
            "layers.gguf",
            |w| {
                w.set_meta("llama.block_count", Value::U32(1));
            },
            &["blk.1.", "llama.block_count is 1"],
        ),
        // Another architecture.
        (
            "arch.gguf",
            |w| w.meta[0].1 = Value::String("mamba".into()),
            &["architecture `mamba` is not supported"],
        ),
    ];
    for (name, edit, words) in edits {
        let mut w = g::tiny_model(&spec, None).0;
        edit(&mut w);
        let e = load_err(d, name, &w.bytes());
        assert!(words.iter().all(|&word| e.contains(word)), "{name}: {e}");
    }

    // A misaligned tensor offset, and a bad alignment value.
    let mut img = g::tiny_model(&spec, None).0;
    img.tensors.insert(
        0,
        g::TensorSpec {
            name: "odd".into(),
            dims: vec![3],
            ggml_type: g::F16,
            data: vec![0; 6],
        },
    );
    img.unpadded = true;
    let e = load_err(d, "offset.gguf", &img.bytes());
    let second = &img.tensors[1].name;
    assert!(
        e.contains(second.as_str()) && e.contains("offset 6 is not a multiple of the alignment 32"),
        "{e}"
    );
    let mut img = Writer::default();
    img.meta("general.alignment", Value::U32(48));
    let e = load_err(d, "align.gguf", &img.bytes());
    assert!(
        e.contains("general.alignment") && e.contains("power of two"),
        "{e}"
    );

    // An array claiming more elements than the file holds.
    let mut raw = b"GGUF".to_vec();
    raw.extend_from_slice(&3u32.to_le_bytes());
    raw.extend_from_slice(&0u64.to_le_bytes());
    raw.extend_from_slice(&1u64.to_le_bytes());
    raw.extend_from_slice(&3u64.to_le_bytes());
    raw.extend_from_slice(b"arr");
    raw.extend_from_slice(&9u32.to_le_bytes());
    raw.extend_from_slice(&8u32.to_le_bytes());
    raw.extend_from_slice(&(1u64 << 60).to_le_bytes());
    let e = load_err(d, "array.gguf", &raw);
    assert!(e.contains("`arr`") && e.contains("claims"), "{e}");
}

/// K-quant tensors whose rows do not fill whole super-blocks of 256, or whose last
/// super-block is cut short, are errors naming the file, the tensor and the format.
#[test]
fn bad_k_quant_tensors_are_named_errors() {
    let dir = TempDir::new("gguf-kbad");
    for ty in [g::Q4_K, g::Q5_K, g::Q6_K] {
        let name = g::BLOCKS.iter().position(|b| b.0 == ty).unwrap();
        let qname = [
            "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K",
        ][name];
        // 320 columns: one super-block and a quarter.
        let mut w = Writer::default();
        let data = g::random_tensor_bytes(ty, 2, 256, 5);
        w.tensor("w", &[320, 2], ty, data.clone());
        let p = dir.path().join(format!("ragged{ty}.gguf"));
        w.write(&p);
        let e = GgufFile::open(&p)
            .err()
            .expect("a ragged K-quant row")
            .to_string();
        assert!(
            e.contains(&format!("ragged{ty}.gguf"))
                && e.contains("`w`")
                && e.contains(&format!("{qname} rows of 320 elements"))
                && e.contains("whole blocks of 256"),
            "{e}"
        );
        // Two rows of two super-blocks, the last one cut short by 10 bytes.
        let data = g::random_tensor_bytes(ty, 2, 512, 6);
        let mut w = Writer::default();
        w.tensor("w", &[512, 2], ty, data[..data.len() - 10].to_vec());
        let p = dir.path().join(format!("cut{ty}.gguf"));
        w.write(&p);
        let e = GgufFile::open(&p)
            .err()
            .expect("a truncated super-block")
            .to_string();
        assert!(
            e.contains(&format!("cut{ty}.gguf")) && e.contains("`w`") && e.contains("truncated"),
            "{e}"
        );
    }
}

// Counts and sizes a hostile file gives: each a named error rather than an allocation
// abort, an overflow panic or a wrapped size that passes the bounds checks.

/// A tiny Q4_1 model to edit.
fn hostile_base() -> Writer {
    g::tiny_model(&tiny_spec(false, 3), Some(QType::Q4_1)).0
}

/// A block count no file holds (it sized a `Vec` of 2.8 TB: the process aborted).
#[test]
fn hostile_block_count_is_an_error() {
    let dir = TempDir::new("gguf-blocks");
    let mut w = hostile_base();
    w.set_meta("llama.block_count", Value::U32(u32::MAX));
    let e = load_err(dir.path(), "blocks.gguf", &w.bytes());
    assert!(
        e.contains("blocks.gguf")
            && e.contains("llama.block_count is 4294967295")
            && e.contains("room for at most 2 blocks"),
        "{e}"
    );
}

/// A key length of 2^60 (`heads * head_dim` overflowed: a capacity-overflow panic), and
/// one of 2^40 that does not overflow but that the file's matrices cannot back.
#[test]
fn hostile_key_length_is_an_error() {
    let dir = TempDir::new("gguf-keylen");
    let d = dir.path();
    let mut w = hostile_base();
    w.set_meta("llama.attention.key_length", Value::U64(1 << 60));
    w.meta.retain(|(k, _)| k != "llama.rope.dimension_count");
    let e = load_err(d, "keylen.gguf", &w.bytes());
    assert!(
        e.contains("keylen.gguf") && e.contains("query width") && e.contains("overflows"),
        "{e}"
    );
    // A key length the file's matrices cannot back, without overflow: the q matrix's shape
    // is refused before a row order of that size is built.
    let mut w = hostile_base();
    w.set_meta("llama.attention.key_length", Value::U64(1 << 40));
    w.meta.retain(|(k, _)| k != "llama.rope.dimension_count");
    let e = load_err(d, "keylen40.gguf", &w.bytes());
    assert!(
        e.contains("attn_q.weight") && e.contains("contradicts the metadata"),
        "{e}"
    );
}

/// A Q8_0 embedding whose row length (~1.7e19) makes `n / 32 * 34` wrap to 16 bytes (it
/// passed the bounds check, then a slice index panicked).
#[test]
fn hostile_row_length_is_an_error() {
    let dir = TempDir::new("gguf-wrap");
    let n: u64 = 542_551_296_285_575_048 * 32;
    assert_eq!((n / 32).wrapping_mul(34), 16);
    let mut w = hostile_base();
    let t = w
        .tensors
        .iter_mut()
        .find(|t| t.name == "token_embd.weight")
        .unwrap();
    t.ggml_type = g::Q8_0;
    t.dims[0] = n;
    let e = load_err(dir.path(), "wrap.gguf", &w.bytes());
    assert!(
        e.contains("token_embd.weight") && e.contains("overflows 2^64 bytes"),
        "{e}"
    );
}

/// A metadata array of more values than any model uses: refused by count, before the ~32
/// bytes a value takes are spent on each of its one-byte elements (32x the file's size).
#[test]
fn hostile_metadata_arrays_are_errors() {
    let dir = TempDir::new("gguf-arrays");
    let d = dir.path();
    let n = llm::gguf::MAX_METADATA_VALUES as usize + 1;
    let mut w = Writer::default();
    w.meta("big", Value::Array(vec![Value::U8(7); n]));
    let e = load_err(d, "bigarray.gguf", &w.bytes());
    assert!(
        e.contains("`big`") && e.contains("claims 4194305 elements"),
        "{e}"
    );
    // The same budget across many smaller arrays.
    let mut w = Writer::default();
    for i in 0..5 {
        w.meta(&format!("a{i}"), Value::Array(vec![Value::U8(1); 1 << 20]));
    }
    let e = load_err(d, "arrays.gguf", &w.bytes());
    // Each array is a value itself: the fourth is past the budget.
    assert!(
        e.contains("`a3`") && e.contains("at most 4194304 values"),
        "{e}"
    );
}

/// A byte-level vocabulary in GGUF metadata: BPE merges applied in rank order, control
/// tokens matched in the text, BOS added when asked, unknown pre-tokenizers refused.
#[test]
fn tokenizer_from_metadata() {
    // Byte-level symbols of "a", "b", " " (Ġ), and the merges "a b" -> "ab", "Ġ ab".
    let tokens = ["<s>", "</s>", "a", "b", "Ġ", "ab", "Ġab", "<|ctl|>"];
    let types = [3, 3, 1, 1, 1, 1, 1, 3];
    let merges = ["a b", "Ġ ab"];
    let mk = |pre: &str, add_bos: bool| {
        let mut w = Writer::default();
        w.meta("tokenizer.ggml.model", Value::String("gpt2".into()))
            .meta("tokenizer.ggml.pre", Value::String(pre.into()))
            .meta(
                "tokenizer.ggml.tokens",
                Value::Array(
                    tokens
                        .iter()
                        .map(|t| Value::String(t.to_string()))
                        .collect(),
                ),
            )
            .meta(
                "tokenizer.ggml.token_type",
                Value::Array(types.iter().map(|&t| Value::I32(t)).collect()),
            )
            .meta(
                "tokenizer.ggml.merges",
                Value::Array(
                    merges
                        .iter()
                        .map(|t| Value::String(t.to_string()))
                        .collect(),
                ),
            )
            .meta("tokenizer.ggml.bos_token_id", Value::U32(0))
            .meta("tokenizer.ggml.add_bos_token", Value::Bool(add_bos));
        GgufFile::from_bytes(Path::new("tok.gguf"), &w.bytes()).unwrap()
    };
    let t = llm::gguf_tokenizer::from_gguf(&mk("smollm", false)).unwrap();
    assert_eq!(t.encode("ab ab").unwrap(), vec![5, 6]);
    assert_eq!(t.encode("ba<|ctl|>ab").unwrap(), vec![3, 2, 7, 5]);
    assert_eq!(t.decode(&[5, 6]).unwrap(), "ab ab");
    let t = llm::gguf_tokenizer::from_gguf(&mk("gpt2", true)).unwrap();
    assert_eq!(t.encode("ab").unwrap(), vec![0, 5]);
    let e = llm::gguf_tokenizer::from_gguf(&mk("qwen2", false))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("tok.gguf") && e.contains("pre-tokenizer `qwen2` is not supported"),
        "{e}"
    );
}

/// A chat template renders one user message with the generation prompt.
#[test]
fn chat_template_renders_user_message() {
    let tpl = "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m.content }}{{ eos_token }}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}";
    let s = llm::chat::render_user_prompt(tpl, "Hi?", "<s>", "</s>").unwrap();
    assert_eq!(s, "<s><|user|>Hi?</s><|assistant|>");
    let e = llm::chat::render_user_prompt("{% if %}", "x", "", "")
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("chat template"), "{e}");
}

/// The scratch profile counts every kernel call per phase, with the largest call's bytes
/// (the quantized decode matvecs take the block sums of x, 4 bytes per 32 inputs) and the
/// calls' time.
#[test]
fn scratch_profile_counts_calls_and_high_water_marks() {
    let spec = tiny_spec(false, 4);
    let (w, _) = g::tiny_model(&spec, Some(QType::Q4_1));
    let dir = TempDir::new("gguf-profile");
    let p = dir.path().join("m.gguf");
    w.write(&p);
    let mut m = common_model(&p);
    m.enable_scratch_profile();
    m.forward(&prompt(spec.vocab, 6, 1)).unwrap();
    for t in [3, 4, 5] {
        m.forward(&[t]).unwrap();
    }
    let prof = m.scratch_profile().unwrap();
    let get = |phase: &str, kernel: &str| {
        *prof
            .entries()
            .iter()
            .find(|e| e.phase == phase && e.kernel == kernel)
            .unwrap_or_else(|| panic!("no {phase}/{kernel} in {:?}", prof.entries()))
    };
    let qkv = get("decode", "linear_qkv");
    assert_eq!(qkv.calls, 3 * spec.layers as u64);
    assert_eq!(qkv.max_call_bytes, (spec.hidden / 32 * 4) as u64);
    assert_eq!(qkv.total_bytes, qkv.calls * qkv.max_call_bytes);
    let lin = get("prefill", "linear");
    assert_eq!(lin.calls, 7 * spec.layers as u64);
    assert!(lin.max_call_bytes >= (16 * spec.ffn * 4) as u64, "{lin:?}");
    // Every kernel that ran was timed: a matvec takes more than a nanosecond.
    assert!(
        qkv.total_nanos > 0 && lin.total_nanos > 0,
        "{qkv:?} {lin:?}"
    );
    let j = prof.to_json(6, 3);
    assert_eq!(j["decode_tokens"], 3);
    assert!(j["kernels"].as_array().unwrap().len() >= 8);
    let qkv_json = j["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["phase"] == "decode" && e["kernel"] == "linear_qkv")
        .unwrap();
    let us = qkv_json["us_per_token"].as_f64().unwrap();
    assert_eq!(us, qkv.total_nanos as f64 / 1e3 / 3.0);
}
