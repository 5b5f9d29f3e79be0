//! SentencePiece (BPE kind) tokenization as llama.cpp does it for a GGUF vocabulary whose
//! `tokenizer.ggml.model` is `llama`: tokens with scores and types, no merge list.
//!
//! Encoding, as llama.cpp's `llm_tokenizer_spm` and `tokenizer_st_partition`:
//! 1. the text is split around the texts of the special tokens (control, user-defined and
//!    unknown types), longest token first; each occurrence becomes that token's id (llama.cpp
//!    with `parse_special`: a chat template's turn markers must become their ids; without it
//!    llama.cpp leaves control and unknown texts to the merges);
//! 2. each remaining piece (with a leading space when `add_space_prefix` is set and it is the
//!    first piece or follows a special token) has its spaces replaced by `▁` (U+2581) and is
//!    split into characters;
//! 3. while two adjacent symbols concatenate to a vocabulary token, the pair whose token has
//!    the highest score is merged (ties: the leftmost pair);
//! 4. each final symbol is its token, or (a single character outside the vocabulary) its
//!    UTF-8 bytes as the byte tokens `<0xNN>`.
//!
//! The Hugging Face `tokenizers` crate was not used here: its BPE merges by a ranked merge
//! list (a GGUF `llama` vocabulary has scores, not merges; a list derived from the scores
//! breaks ties between equal scores by rank, not by position as above) and its Unigram model
//! is a Viterbi search, a different algorithm. The merge loop is short; it is written here
//! against llama.cpp's definition, which the real-model tests check id for id.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use crate::error::{LlmError, Result};

/// A token's type, as `tokenizer.ggml.token_type` numbers them (llama.cpp's
/// `llama_token_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenType {
    /// 0: no type given (decodes to nothing).
    Undefined,
    /// 1: an ordinary piece; `▁` decodes to a space.
    Normal,
    /// 2: the unknown token (`<unk>`): matched whole in a prompt, skipped when decoding.
    Unknown,
    /// 3: a control token (BOS, EOS, `<start_of_turn>`, ...): matched whole in a prompt,
    /// skipped when decoding.
    Control,
    /// 4: a user-defined token (e.g. runs of spaces or newlines): matched whole in a
    /// prompt before the merges, decodes to its text.
    UserDefined,
    /// 5: an unused slot: decodes to nothing.
    Unused,
    /// 6: a byte token `<0xNN>`: the fallback for characters outside the vocabulary.
    Byte,
}

impl TokenType {
    /// The type numbered `n` in the file; numbers llama.cpp does not know are `Undefined`,
    /// as it treats them.
    pub fn from_number(n: i64) -> TokenType {
        match n {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }

    /// Whether the partition step matches this token whole in the text.
    fn is_special(self) -> bool {
        matches!(
            self,
            TokenType::Control | TokenType::UserDefined | TokenType::Unknown
        )
    }
}

/// One vocabulary entry.
#[derive(Clone, Debug)]
pub struct Piece {
    /// The token's text (`▁` for a space; `<0xNN>` for a byte token).
    pub text: String,
    /// Its score: the higher, the earlier a pair merges into it.
    pub score: f32,
    /// Its type.
    pub kind: TokenType,
}

/// The settings besides the vocabulary (from `tokenizer.ggml.*`).
#[derive(Clone, Copy, Debug)]
pub struct SpmOptions {
    /// The BOS id, prepended to every encoding when set.
    pub bos: Option<u32>,
    /// The EOS id, appended to every encoding when set.
    pub eos: Option<u32>,
    /// Prepend a space to the text (SentencePiece's `add_dummy_prefix`).
    pub add_space_prefix: bool,
}

/// A SentencePiece vocabulary ready to encode and decode.
pub struct SpmTokenizer {
    pieces: Vec<Piece>,
    ids: HashMap<String, u32>,
    /// The special tokens, longest text first (the order the partition tries them in).
    special: Vec<u32>,
    /// The token of each byte (`<0xNN>`, else the one-byte text), `None` if it has none.
    byte_ids: [Option<u32>; 256],
    opts: SpmOptions,
}

fn bad(message: String) -> LlmError {
    LlmError::Tokenizer { message }
}

/// The byte a byte token's text `<0xNN>` names.
fn byte_of(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

impl SpmTokenizer {
    /// A tokenizer over `pieces` (id = index). Errors name what is wrong with the vocabulary:
    /// a duplicate text, an empty text, a NaN score, a byte token that is not `<0xNN>`, or a
    /// BOS/EOS id outside it.
    pub fn new(pieces: Vec<Piece>, opts: SpmOptions) -> Result<SpmTokenizer> {
        let n = u32::try_from(pieces.len())
            .map_err(|_| bad(format!("{} tokens do not fit u32 ids", pieces.len())))?;
        for (name, id) in [("bos", opts.bos), ("eos", opts.eos)] {
            if let Some(id) = id.filter(|&id| id >= n) {
                return Err(bad(format!(
                    "{name} token id {id} is outside the vocabulary of {n} tokens"
                )));
            }
        }
        let mut ids = HashMap::with_capacity(pieces.len());
        let mut pieces = pieces;
        for (id, p) in (0..n).zip(pieces.iter_mut()) {
            if p.text.is_empty() {
                return Err(bad(format!("token {id} has an empty text")));
            }
            if p.score.is_nan() {
                return Err(bad(format!("token {id} ({:?}) has a NaN score", p.text)));
            }
            // -0.0 and 0.0 compare equal in llama.cpp's queue; the heap below orders with
            // total_cmp, which would not.
            p.score += 0.0;
            if p.kind == TokenType::Byte && byte_of(&p.text).is_none() {
                return Err(bad(format!(
                    "token {id} is a byte token but its text {:?} is not <0xNN>",
                    p.text
                )));
            }
            if let Some(first) = ids.insert(p.text.clone(), id) {
                return Err(bad(format!(
                    "duplicate token {:?}: ids {first} and {id}",
                    p.text
                )));
            }
        }
        let mut special: Vec<u32> = (0..n)
            .filter(|&id| pieces[id as usize].kind.is_special())
            .collect();
        // Longest first; among equal lengths by id (llama.cpp's std::sort leaves that order
        // unspecified; it matters only for two equally long special texts that overlap).
        special.sort_by_key(|&id| std::cmp::Reverse(pieces[id as usize].text.len()));
        let mut byte_ids = [None; 256];
        for (b, slot) in (0..=255u8).zip(byte_ids.iter_mut()) {
            let hex = format!("<0x{b:02X}>");
            *slot = ids.get(&hex).copied().or_else(|| {
                std::str::from_utf8(&[b])
                    .ok()
                    .and_then(|s| ids.get(s).copied())
            });
        }
        Ok(SpmTokenizer {
            pieces,
            ids,
            special,
            byte_ids,
            opts,
        })
    }

    /// The number of tokens.
    pub fn len(&self) -> usize {
        self.pieces.len()
    }

    /// Whether the vocabulary is empty.
    pub fn is_empty(&self) -> bool {
        self.pieces.is_empty()
    }

    /// The ids of `text`: BOS first when set, the special tokens' texts as their ids, the
    /// rest merged by score. Errors only when a character is outside the vocabulary and so is
    /// one of its bytes.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let mut out = Vec::new();
        out.extend(self.opts.bos);
        let mut prev_special = true;
        for fragment in self.partition(text) {
            match fragment {
                Fragment::Text(s) => {
                    let mut piece = String::with_capacity(s.len() + 3);
                    if self.opts.add_space_prefix && prev_special {
                        piece.push(' ');
                    }
                    piece.push_str(s);
                    self.merge(&piece.replace(' ', "\u{2581}"), &mut out)?;
                    prev_special = false;
                }
                Fragment::Token(id) => {
                    out.push(id);
                    prev_special = true;
                }
            }
        }
        out.extend(self.opts.eos);
        Ok(out)
    }

    /// `text` split around the special tokens' texts: for each special token, longest first,
    /// every occurrence in every text fragment left so far, left to right.
    fn partition<'t>(&self, text: &'t str) -> Vec<Fragment<'t>> {
        let mut fragments = vec![Fragment::Text(text)];
        if text.is_empty() {
            fragments.clear();
        }
        for &id in &self.special {
            let needle = self.pieces[id as usize].text.as_str();
            if !text.contains(needle) {
                continue;
            }
            let mut next = Vec::with_capacity(fragments.len() + 2);
            for f in fragments {
                let Fragment::Text(mut rest) = f else {
                    next.push(f);
                    continue;
                };
                while let Some(at) = rest.find(needle) {
                    if at > 0 {
                        next.push(Fragment::Text(&rest[..at]));
                    }
                    next.push(Fragment::Token(id));
                    rest = &rest[at + needle.len()..];
                }
                if !rest.is_empty() {
                    next.push(Fragment::Text(rest));
                }
            }
            fragments = next;
        }
        fragments
    }

    /// Appends the ids of `text` (spaces already `▁`): characters merged pairwise by the
    /// score of the token they form, highest first, leftmost on ties.
    fn merge(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        // Each symbol is a byte range of `text`; merged symbols are unlinked (len 0).
        let mut syms: Vec<Symbol> = text
            .char_indices()
            .map(|(start, c)| Symbol {
                start,
                len: c.len_utf8(),
                prev: None,
                next: None,
            })
            .collect();
        let count = syms.len();
        for (i, s) in syms.iter_mut().enumerate() {
            s.prev = i.checked_sub(1);
            s.next = Some(i + 1).filter(|&j| j < count);
        }
        let mut queue = BinaryHeap::new();
        for i in 1..count {
            self.push_pair(text, &syms, i - 1, i, &mut queue);
        }
        while let Some(b) = queue.pop() {
            let (l, r) = (syms[b.left], syms[b.right]);
            // A pair whose symbols have changed since it was queued is stale.
            if l.len == 0 || r.len == 0 || l.len + r.len != b.len {
                continue;
            }
            syms[b.left].len += r.len;
            syms[b.right].len = 0;
            syms[b.left].next = r.next;
            if let Some(n) = r.next {
                syms[n].prev = Some(b.left);
            }
            if let Some(p) = l.prev {
                self.push_pair(text, &syms, p, b.left, &mut queue);
            }
            if let Some(n) = r.next {
                self.push_pair(text, &syms, b.left, n, &mut queue);
            }
        }
        let mut at = Some(0).filter(|_| count > 0);
        while let Some(i) = at {
            let s = syms[i];
            let piece = &text[s.start..s.start + s.len];
            // A merged symbol is always a token (merges only form tokens); a symbol that is
            // not is one character outside the vocabulary: its bytes.
            match self.ids.get(piece) {
                Some(&id) => out.push(id),
                None => {
                    for &b in piece.as_bytes() {
                        out.push(self.byte_ids[b as usize].ok_or_else(|| {
                            bad(format!(
                                "{piece:?} is not in the vocabulary and neither is its byte \
                                 <0x{b:02X}>: this vocabulary has no byte fallback for it"
                            ))
                        })?);
                    }
                }
            }
            at = s.next;
        }
        Ok(())
    }

    /// Queues the merge of symbols `left` and `right` if their text is a token.
    fn push_pair(
        &self,
        text: &str,
        syms: &[Symbol],
        left: usize,
        right: usize,
        queue: &mut BinaryHeap<Pair>,
    ) {
        let start = syms[left].start;
        let len = syms[left].len + syms[right].len;
        if let Some(&id) = self.ids.get(&text[start..start + len]) {
            queue.push(Pair {
                score: self.pieces[id as usize].score,
                left,
                right,
                len,
            });
        }
    }

    /// The bytes token `id` stands for in decoded text, as llama.cpp's `token_to_piece`
    /// without `special`: a normal piece with `▁` as a space, a byte token's byte, the text of
    /// a user-defined token; nothing for control, unknown, unused and undefined tokens, or an
    /// id outside the vocabulary.
    fn piece_bytes(&self, id: u32, out: &mut Vec<u8>) {
        let Some(p) = self.pieces.get(id as usize) else {
            return;
        };
        match p.kind {
            TokenType::Normal => out.extend_from_slice(p.text.replace('\u{2581}', " ").as_bytes()),
            TokenType::Byte => out.extend(byte_of(&p.text)),
            TokenType::UserDefined => out.extend_from_slice(p.text.as_bytes()),
            TokenType::Control | TokenType::Unknown | TokenType::Unused | TokenType::Undefined => {}
        }
    }

    /// The text of `ids`: control and unknown tokens skipped, byte tokens joined into
    /// characters (an incomplete or invalid sequence becomes U+FFFD), and with
    /// `add_space_prefix` the space the encoding put in front of the text removed again (from
    /// the first piece that has text: llama.cpp removes it only when the ids do not start with
    /// BOS, so its decoding of an encoding keeps that space).
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::new();
        let mut first = true;
        for &id in ids {
            let before = bytes.len();
            self.piece_bytes(id, &mut bytes);
            if first && bytes.len() > before {
                first = false;
                if self.opts.add_space_prefix && bytes.get(before) == Some(&b' ') {
                    bytes.remove(before);
                }
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// A piece of the text between special tokens, or a special token.
enum Fragment<'t> {
    Text(&'t str),
    Token(u32),
}

/// A run of characters of the text being merged, linked to its neighbours.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge: symbols `left` and `right` (`len` bytes together) form a token of
/// `score`.
struct Pair {
    score: f32,
    left: usize,
    right: usize,
    len: usize,
}

impl Ord for Pair {
    /// The heap's greatest is the highest score, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Pair {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Pair {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Pair {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A vocabulary of `(text, score, type)`; ids are the positions.
    fn vocab(entries: &[(&str, f32, TokenType)], opts: SpmOptions) -> SpmTokenizer {
        let pieces = entries
            .iter()
            .map(|&(text, score, kind)| Piece {
                text: text.to_string(),
                score,
                kind,
            })
            .collect();
        SpmTokenizer::new(pieces, opts).unwrap()
    }

    const PLAIN: SpmOptions = SpmOptions {
        bos: None,
        eos: None,
        add_space_prefix: false,
    };

    use TokenType::{Byte, Control, Normal, UserDefined};

    /// The ids of `text` as token texts, for readable failures.
    fn pieces_of(t: &SpmTokenizer, text: &str) -> Vec<String> {
        t.encode(text)
            .unwrap()
            .iter()
            .map(|&id| t.pieces[id as usize].text.clone())
            .collect()
    }

    /// The pair whose token scores highest merges first, wherever it is: "abc" with "bc"
    /// above "ab" is [a, bc], with "ab" above "bc" it is [ab, c].
    #[test]
    fn merges_highest_score_first() {
        let with = |ab: f32, bc: f32| {
            vocab(
                &[
                    ("a", -1.0, Normal),
                    ("b", -1.0, Normal),
                    ("c", -1.0, Normal),
                    ("ab", ab, Normal),
                    ("bc", bc, Normal),
                ],
                PLAIN,
            )
        };
        assert_eq!(pieces_of(&with(-5.0, -2.0), "abc"), ["a", "bc"]);
        assert_eq!(pieces_of(&with(-2.0, -5.0), "abc"), ["ab", "c"]);
    }

    /// A merged symbol merges again (a+b, then ab+c, then ▁+abc), and a token that no
    /// adjacent pair forms ("bca" spans a merge boundary) is not produced.
    #[test]
    fn merges_chain_into_longer_tokens() {
        let t = vocab(
            &[
                ("\u{2581}", -1.0, Normal),
                ("a", -1.0, Normal),
                ("b", -1.0, Normal),
                ("c", -1.0, Normal),
                ("ab", -2.0, Normal),
                ("abc", -3.0, Normal),
                ("\u{2581}abc", -4.0, Normal),
                ("bca", 0.0, Normal),
            ],
            PLAIN,
        );
        assert_eq!(pieces_of(&t, " abc"), ["\u{2581}abc"]);
        assert_eq!(pieces_of(&t, "abcabc"), ["abc", "abc"]);
    }

    /// Between equal scores the leftmost pair merges first: "aaa" is [aa, a].
    #[test]
    fn equal_scores_merge_leftmost_first() {
        let t = vocab(&[("a", -1.0, Normal), ("aa", -2.0, Normal)], PLAIN);
        assert_eq!(pieces_of(&t, "aaa"), ["aa", "a"]);
        assert_eq!(pieces_of(&t, "aaaaa"), ["aa", "aa", "a"]);
    }

    /// -0.0 and 0.0 are the same score (llama.cpp compares with `<`): the tie goes to the
    /// leftmost pair, not to the +0.0 token.
    #[test]
    fn negative_zero_ties_with_zero() {
        let t = vocab(
            &[
                ("a", -1.0, Normal),
                ("b", -1.0, Normal),
                ("c", -1.0, Normal),
                ("ab", -0.0, Normal),
                ("bc", 0.0, Normal),
            ],
            PLAIN,
        );
        assert_eq!(pieces_of(&t, "abc"), ["ab", "c"]);
    }

    /// A character outside the vocabulary becomes its UTF-8 bytes as `<0xNN>` tokens; with
    /// no byte token for it, the error says so.
    #[test]
    fn unknown_characters_fall_back_to_bytes() {
        let mut entries = vec![("a", -1.0, Normal), ("\u{2581}", -1.0, Normal)];
        let bytes: Vec<String> = (0..=255u8).map(|b| format!("<0x{b:02X}>")).collect();
        entries.extend(bytes.iter().map(|b| (b.as_str(), 0.0, Byte)));
        let t = vocab(&entries, PLAIN);
        assert_eq!(pieces_of(&t, "a é"), ["a", "\u{2581}", "<0xC3>", "<0xA9>"]);
        assert_eq!(
            pieces_of(&t, "😀"),
            ["<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]
        );
        let none = vocab(&[("a", -1.0, Normal)], PLAIN);
        let e = none.encode("ab").unwrap_err().to_string();
        assert!(e.contains("\"b\"") && e.contains("<0x62>"), "{e}");
    }

    /// Special tokens are cut out of the text before merging, longest first, and each text
    /// fragment after one gets the space prefix when that is on; BOS and EOS wrap the ids.
    #[test]
    fn special_tokens_split_the_text_longest_first() {
        let t = vocab(
            &[
                ("<s>", 0.0, Control),
                ("</s>", 0.0, Control),
                ("\n", 0.0, UserDefined),
                ("\n\n", 0.0, UserDefined),
                ("\u{2581}", -1.0, Normal),
                ("a", -1.0, Normal),
                ("\u{2581}a", -2.0, Normal),
                ("<", -1.0, Normal),
                ("s", -1.0, Normal),
                (">", -1.0, Normal),
            ],
            SpmOptions {
                bos: Some(0),
                eos: Some(1),
                add_space_prefix: true,
            },
        );
        assert_eq!(t.encode("a\n\n\na").unwrap(), [0, 6, 3, 2, 6, 1]);
        assert_eq!(t.encode("a<s>a").unwrap(), [0, 6, 0, 6, 1]);
        assert_eq!(t.encode("").unwrap(), [0, 1]);
        // Without the prefix: no leading ▁.
        let t = vocab(
            &[
                ("\u{2581}", -1.0, Normal),
                ("a", -1.0, Normal),
                ("\u{2581}a", -2.0, Normal),
            ],
            PLAIN,
        );
        assert_eq!(pieces_of(&t, "a a"), ["a", "\u{2581}a"]);
    }

    /// Decoding turns ▁ into a space, byte tokens into bytes (joined into characters),
    /// keeps user-defined text, skips control tokens, and drops the space the prefix added:
    /// encode then decode gives the text back.
    #[test]
    fn decode_round_trips() {
        let mut entries = vec![
            ("<bos>", 0.0, Control),
            ("\u{2581}", -1.0, Normal),
            ("h", -1.0, Normal),
            ("i", -1.0, Normal),
            ("hi", -2.0, Normal),
            ("\u{2581}hi", -3.0, Normal),
            ("  ", 0.0, UserDefined),
            ("<unk>", 0.0, TokenType::Unknown),
            ("<unused0>", 0.0, TokenType::Unused),
        ];
        let bytes: Vec<String> = (0..=255u8).map(|b| format!("<0x{b:02X}>")).collect();
        entries.extend(bytes.iter().map(|b| (b.as_str(), 0.0, Byte)));
        // Only normal, byte and user-defined tokens have text: <bos>, <unk>, <unused0>, "  ",
        // "hi", <0x41>.
        let t = vocab(&entries, PLAIN);
        assert_eq!(t.decode(&[0, 7, 8, 6, 4, 9 + 0x41]), "  hiA");
        for prefix in [false, true] {
            let t = vocab(
                &entries,
                SpmOptions {
                    bos: Some(0),
                    eos: None,
                    add_space_prefix: prefix,
                },
            );
            for text in ["hi hi", " hi", "hi hi 😀 ñ", "h\ni\t", ""] {
                let ids = t.encode(text).unwrap();
                assert_eq!(t.decode(&ids), text, "prefix {prefix}, ids {ids:?}");
            }
            // The prefix also goes after each special token (llama.cpp's rule), so text
            // after a user-defined token gains a space on the way back.
            let ids = t.encode("hi  hi").unwrap();
            let back = if prefix { "hi   hi" } else { "hi  hi" };
            assert_eq!(t.decode(&ids), back, "prefix {prefix}, ids {ids:?}");
        }
        // An incomplete character (the first two of 😀's four bytes) is U+FFFD.
        let t = vocab(&entries, PLAIN);
        let ids = t.encode("😀").unwrap();
        assert_eq!(t.decode(&ids[..2]), "\u{FFFD}");
    }

    /// A vocabulary the merges cannot trust is refused, naming the token.
    #[test]
    fn bad_vocabularies_are_errors() {
        let err = |entries: &[(&str, f32, TokenType)], opts| {
            let pieces = entries
                .iter()
                .map(|&(text, score, kind)| Piece {
                    text: text.into(),
                    score,
                    kind,
                })
                .collect();
            SpmTokenizer::new(pieces, opts)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        let e = err(&[("a", 0.0, Normal), ("a", 0.0, Normal)], PLAIN);
        assert!(e.contains("duplicate token \"a\": ids 0 and 1"), "{e}");
        let e = err(&[("a", f32::NAN, Normal)], PLAIN);
        assert!(e.contains("NaN score"), "{e}");
        let e = err(&[("<0xZZ>", 0.0, Byte)], PLAIN);
        assert!(e.contains("not <0xNN>"), "{e}");
        let e = err(&[("", 0.0, Normal)], PLAIN);
        assert!(e.contains("token 0 has an empty text"), "{e}");
        let e = err(
            &[("a", 0.0, Normal)],
            SpmOptions {
                bos: Some(7),
                ..PLAIN
            },
        );
        assert!(e.contains("bos token id 7 is outside"), "{e}");
    }
}
