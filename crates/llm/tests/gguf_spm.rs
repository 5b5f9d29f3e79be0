//! A SentencePiece vocabulary (`tokenizer.ggml.model = llama`) in GGUF metadata written by the
//! test: `from_gguf` picks the SentencePiece tokenizer, reads the scores and token types, takes
//! llama.cpp's defaults for the keys a file leaves out, and names what is wrong with a bad one.

mod common;

use std::path::Path;

use common::gguf::Writer;
use llm::gguf::{GgufFile, Value};

/// `<bos>`, `<eos>`, `▁`, `a`, `b`, `▁a`, `ab`, `<0x62>` ("b" as a byte token is not needed:
/// `c` falls back to `<0x63>`), `<0x63>`; "ab" scores above "▁a".
fn writer() -> Writer {
    let tokens = [
        "<bos>",
        "<eos>",
        "\u{2581}",
        "a",
        "b",
        "\u{2581}a",
        "ab",
        "<0x63>",
    ];
    let scores = [0.0f32, 0.0, -1.0, -1.0, -1.0, -3.0, -2.0, 0.0];
    let types = [3, 3, 1, 1, 1, 1, 1, 6];
    let mut w = Writer::default();
    w.meta("tokenizer.ggml.model", Value::String("llama".into()))
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
            "tokenizer.ggml.scores",
            Value::Array(scores.iter().map(|&s| Value::F32(s)).collect()),
        )
        .meta(
            "tokenizer.ggml.token_type",
            Value::Array(types.iter().map(|&t| Value::I32(t)).collect()),
        )
        .meta("tokenizer.ggml.bos_token_id", Value::U32(0))
        .meta("tokenizer.ggml.eos_token_id", Value::U32(1));
    w
}

fn open(w: &Writer) -> GgufFile {
    GgufFile::from_bytes(Path::new("spm.gguf"), &w.bytes()).unwrap()
}

fn error(w: &Writer) -> String {
    llm::gguf_tokenizer::from_gguf(&open(w))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default()
}

/// The defaults (BOS added, a space prefix, no EOS) and the keys that change them.
#[test]
fn spm_vocabulary_from_metadata() {
    let t = llm::gguf_tokenizer::from_gguf(&open(&writer())).unwrap();
    // " ab": ▁ a b; "ab" (-2) merges before "▁a" (-3): [▁, ab].
    assert_eq!(t.encode("ab").unwrap(), [0, 2, 6]);
    assert_eq!(t.encode("c<eos>").unwrap(), [0, 2, 7, 1]);
    assert_eq!(t.decode(&[0, 2, 6, 7, 1]).unwrap(), "abc");

    let mut w = writer();
    w.meta("tokenizer.ggml.add_space_prefix", Value::Bool(false))
        .meta("tokenizer.ggml.add_bos_token", Value::Bool(false))
        .meta("tokenizer.ggml.add_eos_token", Value::Bool(true));
    let t = llm::gguf_tokenizer::from_gguf(&open(&w)).unwrap();
    assert_eq!(t.encode("ab a").unwrap(), [6, 5, 1]);
}

/// Bad SentencePiece metadata is an error naming the file and the key or token.
#[test]
fn bad_spm_metadata_is_named() {
    let mut w = writer();
    w.set_meta(
        "tokenizer.ggml.scores",
        Value::Array(vec![Value::F32(0.0); 3]),
    );
    let e = error(&w);
    assert!(
        e.contains("spm.gguf") && e.contains("`tokenizer.ggml.scores` has 3 entries for 8 tokens"),
        "{e}"
    );

    let mut w = writer();
    w.set_meta("tokenizer.ggml.add_eos_token", Value::Bool(true))
        .set_meta("tokenizer.ggml.eos_token_id", Value::String("x".into()));
    let e = error(&w);
    assert!(
        e.contains("`tokenizer.ggml.eos_token_id` is missing"),
        "{e}"
    );

    let mut w = writer();
    w.set_meta("tokenizer.ggml.bos_token_id", Value::U32(99));
    let e = error(&w);
    assert!(
        e.contains("spm.gguf") && e.contains("bos token id 99 is outside"),
        "{e}"
    );

    let mut w = writer();
    w.set_meta("tokenizer.ggml.model", Value::String("bert".into()));
    let e = error(&w);
    assert!(e.contains("tokenizer model `bert` is not supported"), "{e}");
}
