//! `tokenizer.json` through the `tokenizers` crate (pure-Rust build, `fancy-regex`).

use std::path::Path;

use crate::error::{LlmError, Result};

/// A Hugging Face tokenizer loaded from `tokenizer.json`.
pub struct Tokenizer(tokenizers::Tokenizer);

impl Tokenizer {
    /// Loads `path`.
    pub fn from_file(path: &Path) -> Result<Tokenizer> {
        tokenizers::Tokenizer::from_file(path)
            .map(Tokenizer)
            .map_err(|e| LlmError::Tokenizer {
                message: format!("{}: {e}", path.display()),
            })
    }

    /// Wraps a tokenizer built in code (e.g. from a GGUF file's vocabulary).
    pub fn from_hf(t: tokenizers::Tokenizer) -> Tokenizer {
        Tokenizer(t)
    }

    /// Token ids of `text`, with the tokenizer's special tokens (e.g. BOS) added.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.0
            .encode(text, true)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| LlmError::Tokenizer {
                message: format!("encode: {e}"),
            })
    }

    /// Text of `ids`, special tokens skipped.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.0.decode(ids, true).map_err(|e| LlmError::Tokenizer {
            message: format!("decode: {e}"),
        })
    }
}

/// Turns a growing list of generated ids into text pieces: decodes the whole list each time
/// and yields what was added, holding back an incomplete UTF-8 character (`\u{FFFD}` at the
/// end) until the next token completes it.
pub struct TextStream<'a> {
    tok: &'a Tokenizer,
    ids: Vec<u32>,
    printed: usize,
}

impl<'a> TextStream<'a> {
    /// A stream over `tok`.
    pub fn new(tok: &'a Tokenizer) -> Self {
        TextStream {
            tok,
            ids: Vec::new(),
            printed: 0,
        }
    }

    /// Adds `id`; returns the new text (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.ids.push(id);
        let text = self.tok.decode(&self.ids)?;
        if text.ends_with('\u{FFFD}') || text.len() < self.printed {
            return Ok(String::new());
        }
        let new = text.get(self.printed..).unwrap_or("").to_string();
        self.printed = text.len();
        Ok(new)
    }
}
