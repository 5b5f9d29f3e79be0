#!/usr/bin/env python3
"""The llama.cpp peer of `llm bench --model`: the same workload through llama-cpp-python.

    python3 scripts/llamacpp-peer.py MODEL.gguf [--threads 2] [--prompt-tokens 128]
        [--new-tokens 64] [--runs 3]

A seeded random prompt of `--prompt-tokens` ids is evaluated in one batch (prefill), then
`--new-tokens` greedy steps of one token each (decode, argmax of the logits, no sampler), as
`llm bench` does. Prints one line per run and the medians. Needs llama-cpp-python (PyPI ships
it as source: pip builds llama.cpp with CMake, 10-30 minutes on 2 cores). On a CPU that
advertises AMX without the OS permission (these VMs), the native build's first decode
segfaults; build without AMX:
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
    -DGGML_AVX512=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
    pip install llama-cpp-python==0.3.36 Compare it with `llm bench` in the same session, back to back:
the figures of a shared machine move between runs.
"""

import argparse
import random
import statistics
import time

import numpy as np
from llama_cpp import Llama


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    ctx = a.prompt_tokens + a.new_tokens + 8
    llm = Llama(
        model_path=a.model,
        n_threads=a.threads,
        n_threads_batch=a.threads,
        n_ctx=ctx,
        n_batch=max(a.prompt_tokens, 32),
        verbose=False,
    )
    n_vocab = llm.n_vocab()
    rng = random.Random(a.seed)
    # Ids above the control tokens, as `llm bench`'s random prompt.
    prompt = [rng.randrange(256, n_vocab) for _ in range(a.prompt_tokens)]

    def last_logits() -> np.ndarray:
        return np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))

    def run() -> tuple[float, float]:
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt)
        token = int(np.argmax(last_logits()))
        t1 = time.perf_counter()
        for _ in range(a.new_tokens):
            llm.eval([token])
            token = int(np.argmax(last_logits()))
        t2 = time.perf_counter()
        return a.prompt_tokens / (t1 - t0), a.new_tokens / (t2 - t1)

    run()  # warm-up: page in the weights, size the buffers
    prefill, decode = [], []
    for i in range(a.runs):
        p, d = run()
        prefill.append(p)
        decode.append(d)
        print(f"run {i}: prefill {p:.1f} tok/s, decode {d:.2f} tok/s")
    print(
        f"llama.cpp (llama-cpp-python), {a.threads} threads: prefill "
        f"{statistics.median(prefill):.1f} tok/s, decode {statistics.median(decode):.2f} tok/s "
        f"(medians of {a.runs})"
    )


if __name__ == "__main__":
    main()
