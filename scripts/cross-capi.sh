#!/usr/bin/env bash
# Builds the C library's static archive for the platforms ExecuTorch ships on first, and prints
# each size:
#
#   scripts/cross-capi.sh [TARGET...]    # default: aarch64-apple-ios aarch64-apple-ios-sim aarch64-linux-android
#
# `cargo rustc --release --target T -p caching-allocator-capi --crate-type staticlib` needs no
# linker (no cdylib), so no Xcode and no NDK: only the target's Rust standard library, which
# `rustup target add` installs here. Each archive is then checked to define every function
# crates/capi/include/caching_allocator.h declares (llvm-nm when present, else a byte search).
# Sizes: the release archive as built (it holds the Rust standard library with its debug info;
# an app's linker keeps only what is used), and without debug info when llvm-strip is present. Nothing is run: there is no iOS or Android device here.
#
# A target whose standard library rustup cannot install (its server has no such component:
# aarch64-apple-ios-sim here) is built with nightly's `-Zbuild-std` from the `rust-src`
# component instead (about a minute of CPU); if that cannot be done either, the target is
# reported as NOT BUILT and the script still succeeds, unless CA_CROSS_STRICT=1. A build that
# fails always fails.
set -euo pipefail
cd "$(dirname "$0")/.."

targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=(aarch64-apple-ios aarch64-apple-ios-sim aarch64-linux-android)
functions=$(sed -n 's/^[a-z].* \**\(ca_[a-z_]*\)(.*/\1/p' crates/capi/include/caching_allocator.h | sort -u)
[[ -n "$functions" ]] || { echo "cross-capi.sh: found no ca_* functions in the header" >&2; exit 1; }
target_dir=$(cargo metadata --format-version 1 --no-deps | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')

missing=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for t in "${targets[@]}"; do
    t0=$(date +%s)
    lib="$target_dir/$t/release/libcaching_allocator.a"
    how=""
    if rustup target list --installed | grep -qx "$t" || rustup target add "$t" >"$log" 2>&1; then
        cargo rustc -q --release --target "$t" -p caching-allocator-capi --crate-type staticlib
    elif rustup component add --toolchain nightly rust-src >/dev/null 2>&1; then
        # No prebuilt standard library for this target: build it from source (nightly only).
        build_std="$target_dir/build-std"
        cargo +nightly rustc -q --release -Zbuild-std=std,panic_abort --target "$t" \
            --target-dir "$build_std" -p caching-allocator-capi --crate-type staticlib
        lib="$build_std/$t/release/libcaching_allocator.a"
        how=" (standard library built from source with nightly -Zbuild-std: rustup has no prebuilt one here)"
    else
        echo "$t: NOT BUILT: rustup could not install the target: $(grep -m1 -i 'error' "$log" || tail -n 1 "$log")"
        missing=$((missing + 1))
        continue
    fi
    if command -v llvm-nm >/dev/null; then
        # llvm-nm exits non-zero over members it cannot read (none of ours): the list decides.
        defined=$({ llvm-nm -g --defined-only "$lib" 2>/dev/null || true; } | awk '$2 == "T" {print $3}' | sed 's/^_//' | sort -u)
        absent=$(comm -23 <(echo "$functions") <(echo "$defined"))
    else
        absent=$(for f in $functions; do grep -aq "$f" "$lib" || echo "$f"; done)
    fi
    if [[ -n "$absent" ]]; then
        echo "$t: $lib does not define: $absent" >&2
        exit 1
    fi
    stripped=""
    if command -v llvm-strip >/dev/null; then
        # What an app links from: without the debug info the Rust standard library carries.
        cp "$lib" "$lib.stripped" && llvm-strip --strip-debug "$lib.stripped" \
            && stripped=", $(stat -c %s "$lib.stripped") bytes without debug info (llvm-strip --strip-debug)"
        rm -f "$lib.stripped"
    fi
    printf '%s: %s bytes as built%s; %d C functions defined; %ss%s\n' "$t" "$(stat -c %s "$lib")" \
        "$stripped" "$(echo "$functions" | wc -l)" "$(( $(date +%s) - t0 ))" "$how"
done
if [[ $missing -gt 0 && "${CA_CROSS_STRICT:-0}" == 1 ]]; then
    echo "cross-capi.sh: $missing target(s) not built (CA_CROSS_STRICT=1)" >&2
    exit 1
fi
