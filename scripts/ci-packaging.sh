#!/usr/bin/env bash
# CI for what users consume outside this workspace, each step timed:
#   1. the C library installed into a fresh prefix (scripts/install-capi.sh), sizes printed;
#   2. a CMake consumer (crates/capi/examples/cmake) built with find_package against it, and
#      its tests run (C shared, C static, the C++ ExecuTorch adapter static);
#   3. the same programs built with pkg-config (caching_allocator.pc, caching_allocator-static.pc);
#   4. the C++ adapter inside the real ExecuTorch runtime: the `executorch` wheel from PyPI in a
#      venv (target/executorch-venv), crates/capi/examples/executorch built with its CMake
#      package (find_package(executorch) + find_package(caching_allocator)) and, the same
#      program, with plain g++ and the flags the README gives; both run;
#   5. ExecuTorch programs (.pte written with the wheel's flatc) run by ExecuTorch's Method with
#      each temp allocator, outputs equal, bad program files refused, and
#      ExecuTorchTempAllocator at 0 heap calls and 0 page faults per execute after warm-up
#      (scripts/executorch-programs.sh --quick: its table);
#   6. the static library cross-built for aarch64-apple-ios, aarch64-apple-ios-sim and
#      aarch64-linux-android, each checked to define the header's functions, sizes printed
#      (scripts/cross-capi.sh; a target rustup has no standard library for is built with
#      nightly -Zbuild-std);
#   7. `cargo package` of the publishable crates with no warning, then each packaged crate's
#      own tests run from its unpacked .crate (scripts/test-packaged-crates.sh).
#
#   scripts/ci-packaging.sh            # all
#   scripts/ci-packaging.sh install cmake pkg-config executorch executorch-programs cross package   # any, in order
#
# Needs cmake, pkg-config, gcc, g++ and python3 with venv (.ci/run installs them). Called by
# .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"

steps=("${@:-install cmake pkg-config executorch executorch-programs cross package}")
read -r -a steps <<<"${steps[*]}"
work=$(mktemp -d "${TMPDIR:-/tmp}/ca-packaging.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"

timed() {
    local name="$1"
    shift
    local t0
    t0=$(date +%s)
    echo "--- ${name}"
    "$@"
    echo "--- ${name}: $(( $(date +%s) - t0 )) s"
}

install_library() {
    scripts/install-capi.sh --prefix "$prefix"
}

cmake_consumer() {
    [[ -d "$prefix/lib/cmake/caching_allocator" ]] || install_library
    cmake -S crates/capi/examples/cmake -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" \
        -DCMAKE_BUILD_TYPE=Release >"$work/cmake-configure.log" \
        || { cat "$work/cmake-configure.log"; return 1; }
    cmake --build "$work/cmake-build" -j 2
    ctest --test-dir "$work/cmake-build" --output-on-failure
    # The default target must be the shared library, the ::static one self-contained. ldd's
    # output is read whole first: under pipefail, `ldd | grep -q` fails (or, negated, passes)
    # whenever grep exits at its match before ldd has written the rest (SIGPIPE), which
    # happened once in CI on a loaded machine.
    local shared static
    shared=$(ldd "$work/cmake-build/capi_test")
    static=$(ldd "$work/cmake-build/capi_test_static" 2>&1 || true) # a fully static one makes ldd fail
    grep -q "libcaching_allocator.so => $prefix/lib/" <<<"$shared" \
        || { echo "capi_test is not linked against $prefix/lib/libcaching_allocator.so"; return 1; }
    if grep -q libcaching_allocator <<<"$static"; then
        echo "capi_test_static needs libcaching_allocator.so: it should be static"
        return 1
    fi
}

pkg_config_consumer() {
    [[ -d "$prefix/lib/pkgconfig" ]] || install_library
    export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
    local out="$work/pkg-config"
    mkdir -p "$out"
    local warn=(-Wall -Wextra -Wpedantic -Werror)
    # The README's line exactly, nothing added: the .pc file's Libs carry the rpath, so the
    # program finds the shared library in this non-system prefix with no LD_LIBRARY_PATH.
    # shellcheck disable=SC2046 # pkg-config's output is meant to be split into words
    cc -std=c11 "${warn[@]}" crates/capi/examples/capi_test.c -o "$out/capi_test" \
        $(pkg-config --cflags --libs caching_allocator)
    # shellcheck disable=SC2046
    cc -std=c11 "${warn[@]}" crates/capi/examples/capi_test.c -o "$out/capi_test_static" \
        $(pkg-config --cflags --libs caching_allocator-static)
    # shellcheck disable=SC2046
    c++ -std=c++17 "${warn[@]}" -I crates/capi/tests/cpp/executorch_standin -I crates/capi/tests/cpp/support \
        crates/capi/tests/cpp/executorch_adapter_test.cpp -o "$out/executorch_adapter_test" \
        $(pkg-config --cflags --libs caching_allocator-static) -pthread
    env -u LD_LIBRARY_PATH "$out/capi_test" | tee "$out/1.log" | tail -n 1
    # And it is this prefix's copy that it loads (the rpath is ${pcfiledir}/../../lib, resolved).
    local deps loaded
    deps=$(env -u LD_LIBRARY_PATH ldd "$out/capi_test")
    loaded=$(sed -n 's/.*libcaching_allocator\.so => \([^ ]*\) .*/\1/p' <<<"$deps")
    [[ -n "$loaded" && "$(realpath "$loaded")" == "$prefix/lib/libcaching_allocator.so" ]] \
        || { echo "capi_test does not load $prefix/lib/libcaching_allocator.so:"; echo "$deps"; return 1; }
    "$out/capi_test_static" | tee "$out/2.log" | tail -n 1
    "$out/executorch_adapter_test" | tee "$out/3.log"
    grep -q " 0 failed" "$out/1.log" && grep -q " 0 failed" "$out/2.log" \
        && grep -q "checks, 0 failed" "$out/3.log"
}

# The wheel ships ExecuTorch's headers, lib/libexecutorch.so and its CMake package; its Python
# dependencies (torch among them) serve model export, which this does not do: --no-deps. Its
# imported target executorch::runtime needs CMake 3.28 (Debian 12 has 3.25): the cmake wheel.
executorch_version=1.5.1
executorch_cmake_version=3.31.10
executorch_consumer() {
    [[ -d "$prefix/lib/cmake/caching_allocator" ]] || install_library
    local venv="$repo/target/executorch-venv"
    if [[ ! -x "$venv/bin/pip" ]]; then
        python3 -m venv "$venv" || {
            rm -rf "$venv"
            apt-get update -qq && apt-get install -y -qq python3-venv && python3 -m venv "$venv"
        }
    fi
    "$venv/bin/pip" install -q --disable-pip-version-check --no-deps \
        "executorch==$executorch_version" "cmake==$executorch_cmake_version"
    local et build="$work/executorch-build"
    et=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/executorch
    "$venv/bin/cmake" -S crates/capi/examples/executorch -B "$build" \
        -DCMAKE_PREFIX_PATH="$prefix;$et" -DCMAKE_BUILD_TYPE=Release >"$work/executorch-configure.log" \
        || { cat "$work/executorch-configure.log"; return 1; }
    "$venv/bin/cmake" --build "$build" -j 2
    env -u LD_LIBRARY_PATH "$venv/bin/ctest" --test-dir "$build" --output-on-failure
    # Without CMake: the flags crates/capi/README.md gives, exactly.
    local out="$work/executorch-plain"
    # shellcheck disable=SC2046 # pkg-config's output is meant to be split into words
    c++ -std=c++17 -Wall -Wextra -Werror \
        crates/capi/examples/executorch/executorch_runtime_temp_allocator.cpp -o "$out" \
        -I"$et/include" -I"$et/include/executorch/runtime/core/portable_type/c10" \
        -DC10_USING_CUSTOM_GENERATED_MACROS -DET_EVENT_TRACER_ENABLED \
        $(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs caching_allocator) \
        -L"$et/lib" -Wl,-rpath,"$et/lib" -lexecutorch -pthread
    env -u LD_LIBRARY_PATH "$out" | tee "$work/executorch-plain.log" | tail -n 1
    grep -q "checks, 0 failed" "$work/executorch-plain.log"
}

# Quick mode and 3 rounds: the table is printed, the checks hold; the timing is only indicative.
executorch_programs() {
    scripts/executorch-programs.sh --quick --rounds 3
}

package_crates() {
    scripts/test-packaged-crates.sh
}

for step in "${steps[@]}"; do
    case "$step" in
        install) timed "install the C library into a fresh prefix" install_library ;;
        cmake) timed "CMake consumer: find_package(caching_allocator)" cmake_consumer ;;
        pkg-config) timed "pkg-config consumer" pkg_config_consumer ;;
        executorch) timed "the C++ adapter in the real ExecuTorch runtime (executorch $executorch_version wheel)" executorch_consumer ;;
        executorch-programs) timed "ExecuTorch programs with each temp allocator (scripts/executorch-programs.sh --quick)" executorch_programs ;;
        cross) timed "the static library for iOS and Android (scripts/cross-capi.sh)" scripts/cross-capi.sh ;;
        package) timed "cargo package + the packaged crates' tests" package_crates ;;
        *) echo "ci-packaging.sh: unknown step '$step' (install, cmake, pkg-config, executorch, executorch-programs, cross, package)" >&2
           exit 2 ;;
    esac
done
echo "ci-packaging.sh: all passed (${repo})"
