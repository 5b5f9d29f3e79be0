#!/usr/bin/env python3
"""Reference token ids for crates/llm/tests/gguf_real.rs: SmolLM2's tokenizer rebuilt with the
Python `tokenizers` and `gguf` packages from the GGUF file's vocabulary and merges, with the
pre-tokenizer of SmolLM2's own tokenizer.json (digits split one by one, then GPT-2 byte-level).

    python3 -m venv /tmp/v && /tmp/v/bin/pip install gguf tokenizers
    /tmp/v/bin/python scripts/gguf-tokenizer-reference.py MODEL.gguf
"""
import sys

import gguf
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, AddedToken

r = gguf.GGUFReader(sys.argv[1])
f = r.fields
tokens = [str(bytes(f["tokenizer.ggml.tokens"].parts[i]), "utf-8") for i in f["tokenizer.ggml.tokens"].data]
merges = [str(bytes(f["tokenizer.ggml.merges"].parts[i]), "utf-8") for i in f["tokenizer.ggml.merges"].data]
types = [int(f["tokenizer.ggml.token_type"].parts[i][0]) for i in f["tokenizer.ggml.token_type"].data]
vocab = {t: i for i, t in enumerate(tokens)}
tok = Tokenizer(models.BPE(vocab, [tuple(m.split(" ", 1)) for m in merges]))
tok.pre_tokenizer = pre_tokenizers.Sequence(
    [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
)
tok.decoder = decoders.ByteLevel()
tok.add_special_tokens([AddedToken(t, special=True) for t, ty in zip(tokens, types) if ty == 3])
for s in [
    "The capital of France is",
    "Hello, world!",
    "  leading spaces and 12345 digits",
    "naïve café — ünïcödé 😀",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n",
    "don't I'll we've",
    "tabs\tand\nnewlines\n\n",
]:
    print(repr(s), tok.encode(s).ids)
