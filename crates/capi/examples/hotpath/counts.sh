#!/usr/bin/env bash
# Instructions per iteration of the C ABI's success paths under callgrind (see hotpath.c),
# against the release static library of the tree this script is in, or of LIB if set.
#   crates/capi/examples/hotpath/counts.sh [MODE ...]      (modes: release reset16)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../../.." && pwd)"
lib="${LIB:-}"
if [ -z "$lib" ]; then
    (cd "$root" && cargo build --quiet --release -p caching-allocator-capi)
    lib="${CARGO_TARGET_DIR:-$root/target}/release/libcaching_allocator.a"
fi
bin="$(mktemp -d)/hotpath"
trap 'rm -rf "$(dirname "$bin")"' EXIT
gcc -std=c11 -O2 -I "$root/crates/capi/include" "$here/hotpath.c" -o "$bin" "$lib" -pthread -ldl -lm
n=100000
count() {
    valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" "$1" "$2" 2>&1 |
        awk '/refs:/ { gsub(",", "", $4); print $4 }'
}
modes=("$@")
[ ${#modes[@]} -gt 0 ] || modes=(release reset16)
for mode in "${modes[@]}"; do
    base=$(count "$mode" 0)
    total=$(count "$mode" "$n")
    printf 'capi %-8s %6d instructions per iteration\n' "$mode" $(((total - base) / n))
done
