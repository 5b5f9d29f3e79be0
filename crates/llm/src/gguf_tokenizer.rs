//! The tokenizer a GGUF file carries in its metadata (`tokenizer.ggml.*`), chosen by
//! `tokenizer.ggml.model`:
//! - `gpt2`: built through the `tokenizers` crate: a byte-level BPE from the token list and
//!   the merges in rank order, the pre-tokenizer the `pre` name selects, control tokens as
//!   special added tokens (so they map to their ids when they occur in a prompt), and a BOS
//!   prepended when `add_bos_token` says so;
//! - `llama`: SentencePiece from the tokens, their scores and types
//!   ([`crate::tokenizer::spm`]), with llama.cpp's defaults for the keys a file leaves out
//!   (`add_bos_token` true, `add_eos_token` false, `add_space_prefix` true).

use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, PreTokenizerWrapper};

use crate::error::{LlmError, Result};
use crate::gguf::{GgufFile, Value};
use crate::tokenizer::spm::{Piece, SpmOptions, SpmTokenizer, TokenType};
use crate::tokenizer::Tokenizer;

/// `tokenizer.ggml.token_type` of a control token (BOS, EOS, `<|im_start|>`, ...).
const CONTROL: i64 = 3;
/// `tokenizer.ggml.token_type` of a user-defined token (matched whole, not special).
const USER_DEFINED: i64 = 4;

/// The pre-tokenizer names (`tokenizer.ggml.pre`) this loader knows.
pub const KNOWN_PRE: &[&str] = &["smollm", "gpt2"];

fn err(f: &GgufFile, message: String) -> LlmError {
    LlmError::Tokenizer {
        message: format!("{}: {message}", f.path().display()),
    }
}

/// Metadata `key` as `read` takes it (`Value::as_str`, ...), or the error `missing`.
fn required<'a, T>(
    f: &'a GgufFile,
    key: &str,
    read: impl FnOnce(&'a Value) -> Option<T>,
    missing: &str,
) -> Result<T> {
    f.get(key)
        .and_then(read)
        .ok_or_else(|| err(f, missing.into()))
}

fn strings<'a>(f: &'a GgufFile, key: &str) -> Result<Vec<&'a str>> {
    let a = f
        .get(key)
        .and_then(Value::as_array)
        .ok_or_else(|| err(f, format!("metadata `{key}` is missing or not an array")))?;
    a.iter()
        .map(|v| {
            v.as_str()
                .ok_or_else(|| err(f, format!("metadata `{key}` holds a non-string")))
        })
        .collect()
}

/// Builds the tokenizer of `f`: byte-level BPE (`tokenizer.ggml.model = gpt2`) with a
/// pre-tokenizer in [`KNOWN_PRE`], or SentencePiece (`llama`); anything else is a clear error.
pub fn from_gguf(f: &GgufFile) -> Result<Tokenizer> {
    let model = required(
        f,
        "tokenizer.ggml.model",
        Value::as_str,
        "no tokenizer.ggml.model: the file has no tokenizer",
    )?;
    match model {
        "gpt2" => bpe_from_gguf(f),
        "llama" => spm_from_gguf(f).map(Tokenizer::from_spm),
        other => Err(err(
            f,
            format!(
                "tokenizer model `{other}` is not supported (gpt2: byte-level BPE, llama: \
                 SentencePiece)"
            ),
        )),
    }
}

/// The numbers of metadata array `key` (scores, token types), `n` of them, or `None` when
/// the file leaves the key out.
fn numbers(f: &GgufFile, key: &str, n: usize) -> Result<Option<Vec<f64>>> {
    let Some(v) = f.get(key) else {
        return Ok(None);
    };
    let a = v
        .as_array()
        .ok_or_else(|| err(f, format!("metadata `{key}` is not an array")))?;
    if a.len() != n {
        return Err(err(
            f,
            format!("metadata `{key}` has {} entries for {n} tokens", a.len()),
        ));
    }
    a.iter()
        .map(|v| {
            v.as_f64()
                .ok_or_else(|| err(f, format!("metadata `{key}` holds a non-number")))
        })
        .collect::<Result<Vec<f64>>>()
        .map(Some)
}

/// A boolean key, `default` when absent.
fn flag(f: &GgufFile, key: &str, default: bool) -> Result<bool> {
    match f.get(key) {
        None => Ok(default),
        Some(v) => v
            .as_bool()
            .ok_or_else(|| err(f, format!("metadata `{key}` is not a boolean"))),
    }
}

/// The token id under `key` when `flag` (`add_bos_token`, `add_eos_token`) is set, which
/// makes it required; `None` when it is not set.
fn token_id(f: &GgufFile, key: &str, flag: (&str, bool)) -> Result<Option<u32>> {
    let (flag_key, set) = flag;
    if !set {
        return Ok(None);
    }
    let id = f.get(key).and_then(Value::as_u64).ok_or_else(|| {
        err(
            f,
            format!(
                "`{flag_key}` is true (or absent: llama.cpp's default) but `{key}` is missing or \
                 not an id; set `{key}`, or `{flag_key}` to false"
            ),
        )
    })?;
    u32::try_from(id)
        .map(Some)
        .map_err(|_| err(f, format!("`{key}` = {id} is not a token id")))
}

/// The SentencePiece vocabulary of `f` (`tokenizer.ggml.model = llama`).
pub fn spm_from_gguf(f: &GgufFile) -> Result<SpmTokenizer> {
    let tokens = strings(f, "tokenizer.ggml.tokens")?;
    let n = tokens.len();
    let scores = numbers(f, "tokenizer.ggml.scores", n)?;
    let types = numbers(f, "tokenizer.ggml.token_type", n)?;
    let pieces = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| Piece {
            text: t.to_string(),
            score: scores.as_ref().map_or(0.0, |s| s[i] as f32),
            kind: types
                .as_ref()
                .map_or(TokenType::Normal, |t| TokenType::from_number(t[i] as i64)),
        })
        .collect();
    let add_bos = flag(f, "tokenizer.ggml.add_bos_token", true)?;
    let add_eos = flag(f, "tokenizer.ggml.add_eos_token", false)?;
    let opts = SpmOptions {
        bos: token_id(
            f,
            "tokenizer.ggml.bos_token_id",
            ("tokenizer.ggml.add_bos_token", add_bos),
        )?,
        eos: token_id(
            f,
            "tokenizer.ggml.eos_token_id",
            ("tokenizer.ggml.add_eos_token", add_eos),
        )?,
        add_space_prefix: flag(f, "tokenizer.ggml.add_space_prefix", true)?,
    };
    SpmTokenizer::new(pieces, opts).map_err(|e| match e {
        LlmError::Tokenizer { message } => err(f, message),
        other => other,
    })
}

/// The byte-level BPE of `f` (`tokenizer.ggml.model = gpt2`).
fn bpe_from_gguf(f: &GgufFile) -> Result<Tokenizer> {
    let pre = f
        .get("tokenizer.ggml.pre")
        .and_then(Value::as_str)
        .unwrap_or("gpt2");
    let pre_tokenizer: PreTokenizerWrapper = match pre {
        // llama.cpp's smollm: every digit alone, then GPT-2's regex (as SmolLM2's
        // tokenizer.json: Digits(individual) + ByteLevel).
        "smollm" => Sequence::new(vec![
            Digits::new(true).into(),
            ByteLevel::new(false, true, true).into(),
        ])
        .into(),
        "gpt2" => ByteLevel::new(false, true, true).into(),
        other => {
            return Err(err(
                f,
                format!(
                    "pre-tokenizer `{other}` is not supported (known: {KNOWN_PRE:?}); its \
                     splitting rules would have to be added to gguf_tokenizer.rs"
                ),
            ))
        }
    };
    let tokens = strings(f, "tokenizer.ggml.tokens")?;
    let merges = strings(f, "tokenizer.ggml.merges")?;
    let types: Vec<i64> = match f.get("tokenizer.ggml.token_type").and_then(Value::as_array) {
        Some(a) => a
            .iter()
            .map(|v| v.as_f64().map_or(1, |x| x as i64))
            .collect(),
        None => vec![1; tokens.len()],
    };
    let vocab: tokenizers::models::bpe::Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.to_string(), i as u32))
        .collect();
    let mut pairs = Vec::with_capacity(merges.len());
    for m in &merges {
        let (a, b) = m
            .split_once(' ')
            .ok_or_else(|| err(f, format!("merge `{m}` is not two tokens")))?;
        pairs.push((a.to_string(), b.to_string()));
    }
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, pairs)
        .build()
        .map_err(|e| err(f, format!("building the BPE model: {e}")))?;
    let mut t = tokenizers::Tokenizer::new(bpe);
    t.with_pre_tokenizer(Some(pre_tokenizer));
    t.with_decoder(Some(ByteLevel::default()));
    let added: Vec<AddedToken> = tokens
        .iter()
        .zip(&types)
        .filter(|(_, &ty)| ty == CONTROL || ty == USER_DEFINED)
        .map(|(tok, &ty)| AddedToken::from(tok.to_string(), ty == CONTROL))
        .collect();
    t.add_special_tokens(&added);
    let add_bos = f
        .get("tokenizer.ggml.add_bos_token")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if add_bos {
        let bos = required(
            f,
            "tokenizer.ggml.bos_token_id",
            Value::as_u64,
            "add_bos_token is set but there is no bos_token_id",
        )?;
        let name = tokens
            .get(bos as usize)
            .ok_or_else(|| err(f, format!("bos_token_id {bos} is not a token")))?;
        let post = TemplateProcessing::builder()
            .try_single(format!("{name} $A"))
            .map_err(|e| err(f, format!("BOS template: {e}")))?
            .special_tokens(vec![(name.to_string(), bos as u32)])
            .build()
            .map_err(|e| err(f, format!("BOS template: {e}")))?;
        t.with_post_processor(Some(post));
    }
    Ok(Tokenizer::from_hf(t))
}

/// The chat template a GGUF file carries (`tokenizer.chat_template`), if any.
pub fn chat_template(f: &GgufFile) -> Option<&str> {
    f.get("tokenizer.chat_template").and_then(Value::as_str)
}

/// The text of token `id` of `f`'s vocabulary (for the template's `bos_token`/`eos_token`).
pub fn token_text<'a>(f: &'a GgufFile, key: &str) -> Option<&'a str> {
    let id = f.get(key)?.as_u64()?;
    f.get("tokenizer.ggml.tokens")?
        .as_array()?
        .get(id as usize)?
        .as_str()
}
