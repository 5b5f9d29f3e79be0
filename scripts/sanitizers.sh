#!/usr/bin/env bash
# Runs the core crate's multi-thread tests under ThreadSanitizer and AddressSanitizer.
#
#   scripts/sanitizers.sh            # both
#   scripts/sanitizers.sh thread     # one of: thread, address
#
# Needs nightly with rust-src (installed here if missing): the sanitizers need the standard
# library rebuilt with them (-Zbuild-std). Builds go to their own target dir
# (target/sanitizers unless CARGO_TARGET_DIR is set) so they never invalidate the normal one.
# The tests keep their own (small) iteration counts; set CA_SANITIZER so a test may scale down.
#
# Measured on the 2-core development machine while other builds ran: ThreadSanitizer 567 s,
# AddressSanitizer 302 s from a cold target dir, nearly all of it building std and the crate's
# dev-dependencies with the sanitizer; the tests themselves take about 27 s and 8 s. With a warm
# target dir a run costs only the tests.
set -euo pipefail
cd "$(dirname "$0")/.."

sanitizers=("${@:-thread address}")
read -r -a sanitizers <<<"${sanitizers[*]}"
target=x86_64-unknown-linux-gnu
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target/sanitizers}"

# The list is read whole first (under pipefail an early `grep -q` exit can fail the pipe).
if ! grep -q '^nightly' <<<"$(rustup toolchain list)"; then
    rustup toolchain install nightly --profile minimal
fi
rustup component add --toolchain nightly rust-src >/dev/null

# The tests that run several threads on one allocator (`reset_races` holds the reset races,
# `arena` the arena's cross-thread releases and chunk hand-over), plus the model replay (every
# arena mode) and the error paths (AddressSanitizer checks every block access there too).
# The same reset race through the C ABI (`caching-allocator-capi`'s
# `reset_races_with_allocations_through_the_c_abi`) runs in `cargo test` only: under the
# sanitizers its dev-dependencies (cbindgen and its parser) doubled the cold build time, and
# the core code it drives is the one `reset_races` runs here.
tests=(--test stress --test contract_races --test fault_injection --test fuzz_ops --test bad_input --test regressions
    --test reset_races --test arena)

for san in "${sanitizers[@]}"; do
    start=$(date +%s)
    echo "== ${san} sanitizer =="
    case "$san" in
        thread) export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" ;;
        address) export ASAN_OPTIONS="detect_leaks=1:detect_stack_use_after_return=1" ;;
        *) echo "unknown sanitizer $san (thread or address)" >&2; exit 2 ;;
    esac
    RUSTFLAGS="-Zsanitizer=${san} -Cdebug-assertions=on" \
    RUSTDOCFLAGS="-Zsanitizer=${san}" \
    CA_SANITIZER="$san" \
        cargo +nightly test -Zbuild-std --target "$target" --release \
        -p caching-allocator "${tests[@]}" -- --test-threads=2
    echo "== ${san} sanitizer: passed in $(( $(date +%s) - start )) s =="
done
