#!/usr/bin/env bash
# Packages the publishable crates and runs each packaged crate's own tests, as a user of the
# .crate files (or crates.io) would get them:
#
#   scripts/test-packaged-crates.sh
#
# 1. `cargo package` of caching-allocator, kernel-simd, sdpa and caching-allocator-capi
#    (`--no-verify`: step 3 is the verification, with tests instead of a bare build); any
#    warning fails the step (missing metadata, files outside the package, ...). Set
#    CA_PACKAGE_ALLOW_DIRTY=1 to package uncommitted changes.
# 2. Each .crate is unpacked into a scratch directory outside the workspace. The crates are not
#    on crates.io, so a `.cargo/config.toml` there patches `caching-allocator` and
#    `kernel-simd` to the unpacked, packaged crates: sdpa and the C ABI are tested against
#    what would be published with them.
# 3. `cargo test` in each unpacked crate, with the workspace's target directory so the
#    dependencies the workspace's tests built are reused (only the crates themselves rebuild).
#
# The llm and allocbench crates are not published, so not packaged (`cargo package
# --workspace` would package them too).
set -euo pipefail
cd "$(dirname "$0")/.."

crates=(caching-allocator kernel-simd sdpa caching-allocator-capi)
target_dir=$(cargo metadata --format-version 1 --no-deps \
    | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
work=$(mktemp -d "${TMPDIR:-/tmp}/ca-packaged.XXXXXX")
trap 'rm -rf "$work"' EXIT

package_args=()
for c in "${crates[@]}"; do package_args+=(-p "$c"); done
if [[ "${CA_PACKAGE_ALLOW_DIRTY:-0}" == 1 ]]; then package_args+=(--allow-dirty); fi
cargo package --no-verify "${package_args[@]}" 2>&1 | tee "$work/package.log"
if grep -qi "warning" "$work/package.log"; then
    echo "test-packaged-crates.sh: cargo package warned (above): fix the metadata or the file list" >&2
    exit 1
fi

version_of() {
    cargo metadata --format-version 1 --no-deps \
        | grep -o "\"name\":\"$1\",\"version\":\"[^\"]*\"" | sed 's/.*"version":"\([^"]*\)"/\1/'
}
for c in "${crates[@]}"; do
    tar -xzf "$target_dir/package/$c-$(version_of "$c").crate" -C "$work"
done

mkdir -p "$work/.cargo"
cat >"$work/.cargo/config.toml" <<EOF
# The packaged crates depend on each other by version; test them against each other.
[patch.crates-io]
caching-allocator = { path = "$work/caching-allocator-$(version_of caching-allocator)" }
kernel-simd = { path = "$work/kernel-simd-$(version_of kernel-simd)" }
EOF

for c in "${crates[@]}"; do
    dir="$work/$c-$(version_of "$c")"
    echo "--- cargo test in the packaged $c ($dir)"
    t0=$(date +%s)
    rc=0
    (cd "$dir" && CARGO_TARGET_DIR="$target_dir" cargo test) >"$work/test-$c.log" 2>&1 || rc=$?
    grep -E "^test result|warning|skipped:" "$work/test-$c.log" || true
    if [[ $rc != 0 ]]; then
        echo "test-packaged-crates.sh: the packaged $c failed its tests (exit $rc):" >&2
        tail -n 60 "$work/test-$c.log" >&2
        exit 1
    fi
    echo "--- packaged $c: $(( $(date +%s) - t0 )) s"
done
echo "test-packaged-crates.sh: ${crates[*]} package cleanly and pass their tests"
