#!/usr/bin/env bash
# Instructions per iteration of the allocator's hot paths (callgrind: the figure does not
# depend on the machine's load). Usage: scripts/hotpath-counts.sh [MODE ...]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --quiet --release -p caching-allocator --example hotpath
bin=target/release/examples/hotpath
n=100000
count() {
    valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" "$1" "$2" 2>&1 |
        awk '/refs:/ { gsub(",", "", $4); print $4 }'
}
modes=("$@")
[ ${#modes[@]} -gt 0 ] || modes=(reset16 reset16-default static16 release release-two scope reset2 reset2-classes reset2-default medium8 medium8-classes)
for mode in "${modes[@]}"; do
    base=$(count "$mode" 0)
    total=$(count "$mode" "$n")
    printf '%-9s %6d instructions per iteration\n' "$mode" $(((total - base) / n))
done
