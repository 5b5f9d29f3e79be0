//! Text to token ids and back: a Hugging Face tokenizer (`tokenizer.json`, or a GGUF file's
//! byte-level BPE, through the `tokenizers` crate, pure-Rust build with `fancy-regex`) or a
//! SentencePiece vocabulary from a GGUF file ([`spm`]).

pub mod spm;

use std::path::Path;

use crate::error::{LlmError, Result};
use spm::SpmTokenizer;

/// A tokenizer of either kind.
pub struct Tokenizer(Kind);

/// Both boxed: they differ in size by kilobytes and a tokenizer is built once.
enum Kind {
    Hf(Box<tokenizers::Tokenizer>),
    Spm(Box<SpmTokenizer>),
}

impl Tokenizer {
    /// Loads `path`.
    pub fn from_file(path: &Path) -> Result<Tokenizer> {
        tokenizers::Tokenizer::from_file(path)
            .map(Tokenizer::from_hf)
            .map_err(|e| LlmError::Tokenizer {
                message: format!("{}: {e}", path.display()),
            })
    }

    /// Wraps a tokenizer built in code (e.g. from a GGUF file's vocabulary).
    pub fn from_hf(t: tokenizers::Tokenizer) -> Tokenizer {
        Tokenizer(Kind::Hf(Box::new(t)))
    }

    /// Wraps a SentencePiece vocabulary.
    pub fn from_spm(t: SpmTokenizer) -> Tokenizer {
        Tokenizer(Kind::Spm(Box::new(t)))
    }

    /// Token ids of `text`, with the tokenizer's special tokens (e.g. BOS) added; the texts
    /// of control tokens in `text` (e.g. a chat template's turn markers) become their ids.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        match &self.0 {
            Kind::Hf(t) => t
                .encode(text, true)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| LlmError::Tokenizer {
                    message: format!("encode: {e}"),
                }),
            Kind::Spm(t) => t.encode(text),
        }
    }

    /// Text of `ids`, special tokens skipped.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        match &self.0 {
            Kind::Hf(t) => t.decode(ids, true).map_err(|e| LlmError::Tokenizer {
                message: format!("decode: {e}"),
            }),
            Kind::Spm(t) => Ok(t.decode(ids)),
        }
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

#[cfg(test)]
mod tests {
    use super::spm::{Piece, SpmOptions, SpmTokenizer, TokenType};
    use super::*;

    /// A SentencePiece vocabulary of `▁`, `a` and the 256 byte tokens.
    fn bytes_vocab() -> Tokenizer {
        let mut pieces = vec![
            Piece {
                text: "\u{2581}".into(),
                score: -1.0,
                kind: TokenType::Normal,
            },
            Piece {
                text: "a".into(),
                score: -1.0,
                kind: TokenType::Normal,
            },
        ];
        pieces.extend((0..=255u8).map(|b| Piece {
            text: format!("<0x{b:02X}>"),
            score: 0.0,
            kind: TokenType::Byte,
        }));
        let opts = SpmOptions {
            bos: None,
            eos: None,
            add_space_prefix: false,
        };
        Tokenizer::from_spm(SpmTokenizer::new(pieces, opts).unwrap())
    }

    /// A character spread over byte tokens is printed once, when its last byte arrives.
    #[test]
    fn stream_holds_back_incomplete_characters() {
        let t = bytes_vocab();
        let ids = t.encode("a 😀é").unwrap();
        assert_eq!(ids.len(), 2 + 4 + 2, "{ids:?}");
        let mut s = TextStream::new(&t);
        let pieces: Vec<String> = ids.iter().map(|&id| s.push(id).unwrap()).collect();
        assert_eq!(pieces, ["a", " ", "", "", "", "😀", "", "é"]);
    }
}
