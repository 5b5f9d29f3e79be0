#!/usr/bin/env python3
"""Reference token ids for crates/llm/tests/gguf_real_gemma.rs: llama.cpp's own tokenizer (through
llama-cpp-python, vocabulary only) on the Gemma 3 270M GGUF file. Prints each string and its ids
as Rust test cases to paste; with --random OUT, also writes the ids of 400 random strings
(seeded: the same strings every run) to OUT as JSON lines, the test's data file.

    python3 -m venv /tmp/venv-llama
    CMAKE_BUILD_PARALLEL_LEVEL=1 /tmp/venv-llama/bin/pip install llama-cpp-python==0.3.36   # builds llama.cpp (25 min on 2 busy cores)
    /tmp/venv-llama/bin/python scripts/gemma-tokenizer-reference.py "$(scripts/fetch-model.sh gemma3)" \
        --random crates/llm/tests/data/gemma3-tokenizer-random.jsonl

The plain strings are tokenized with special=False (as a user's text is) and checked to give the
same ids with special=True (so `llm`'s encoder, which maps control-token texts to their ids as
a chat template needs, must agree on them) and to decode back to themselves with llama.cpp's
detokenize; the chat-marker string and the random strings are tokenized with special=True.
"""
import json
import random
import sys
import unicodedata

import llama_cpp

PLAIN = [
    "The capital of France is",
    "Hello, world!",
    "  leading spaces and 12345 digits",
    "naïve café — ünïcödé 😀",
    "tabs\tand\nnewlines\n\n",
    "multiple   spaces    here  ",
    " leading space",
    "日本語のテキストと中文文本，한국어",
    "x = 3.14159; y = 2**10  # 1024",
    "don't I'll we've",
    "𓀀 \ue000 \U0010fffd",
    # Runs of one letter: equal-score pairs side by side, where the leftmost merges first.
    "aaaaaaa",
    "ooooooooo",
    "",
]
SPECIAL = [
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
]


def rust_str(s):
    """`s` as a Rust string literal: escapes for quotes, control and unassigned/private chars."""
    out = []
    for c in s:
        if c in '"\\':
            out.append("\\" + c)
        elif c == "\n":
            out.append("\\n")
        elif c == "\t":
            out.append("\\t")
        elif unicodedata.category(c) in ("Cc", "Co", "Cn", "Cs", "Zl", "Zp"):
            out.append("\\u{%x}" % ord(c))
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


llm = llama_cpp.Llama(model_path=sys.argv[1], vocab_only=True, verbose=False)
print(f"// llama-cpp-python {llama_cpp.__version__}")
for s in PLAIN + SPECIAL:
    special = s in SPECIAL
    ids = llm.tokenize(s.encode(), add_bos=True, special=special)
    if not special:
        assert ids == llm.tokenize(s.encode(), add_bos=True, special=True), s
        # llama.cpp's decoding gives the text back (the test checks `llm`'s does too).
        assert llm.detokenize(ids[1:]) == s.encode(), (s, llm.detokenize(ids[1:]))
    print(f"({rust_str(s)}, &{ids}),")


# Random strings: pieces drawn from words, digits, whitespace runs, accents (precomposed and
# combining), emoji (with modifiers and flags), CJK, private-use and rare characters, the texts
# of control and user-defined tokens, and byte-token look-alikes; or runs of random code points.
PIECES = [
    "the", " the", "The", "capital", "France", "naïve", "café", "über", "日本", "語", "中文",
    "한국어", "😀", "👍🏽", "🇫🇷", "123", "4", "3.14", " ", "  ", "   ", "\n", "\n\n", "\t",
    "\r\n", "<start_of_turn>", "<end_of_turn>", "<unk>", "<mask>", "<bos>", "<eos>",
    "[multimodal]", "<start_of_image>", "aaaa", "ooo", "zz", "—", "“", "”", "'s", "don't",
    "e\u0301", "\u00a0", "\u200b", "\ue000", "𓀀", "ß", "ﬁ", "Ω", "ℕ", "x", "<", ">",
    "<0x41>", "▁", "__", "http://a.b/c?d=e", "def f(x):", "    return x", "{}", "[]", "ÿ", "İ",
    "ǅ", "\U0001F9EC",
]
if len(sys.argv) > 3 and sys.argv[2] == "--random":
    rng = random.Random(7)
    with open(sys.argv[3], "w") as out:
        for _ in range(400):
            if rng.random() < 0.2:
                ranges = [(32, 126), (0xA0, 0x2FFF), (0x3000, 0x9FFF), (0x1F300, 0x1FAFF)]
                s = "".join(
                    chr(rng.randint(*rng.choice(ranges))) for _ in range(rng.randint(1, 20))
                )
            else:
                s = "".join(
                    rng.choice(PIECES) + (" " if rng.random() < 0.4 else "")
                    for _ in range(rng.randint(0, 12))
                )
            ids = llm.tokenize(s.encode(), add_bos=True, special=True)
            out.write(json.dumps({"text": s, "ids": ids}) + "\n")
