#!/usr/bin/env bash
# Builds the C library (crates/capi) and installs it under a prefix, for C and C++ builds:
#
#   scripts/install-capi.sh --prefix /usr/local          # optimised, no debug info
#   scripts/install-capi.sh --prefix ~/ca --no-strip     # keep what the profile left
#   scripts/install-capi.sh --prefix ~/ca --profile release   # the workspace's release build
#
# Installs
#   <prefix>/include/caching_allocator.h, caching_allocator_executorch.hpp
#   <prefix>/lib/libcaching_allocator.so (SONAME libcaching_allocator.so) and .a
#   <prefix>/lib/cmake/caching_allocator/caching_allocatorConfig.cmake (+ ConfigVersion)
#       find_package(caching_allocator CONFIG REQUIRED) gives caching_allocator::shared,
#       caching_allocator::static and caching_allocator::caching_allocator (the shared one, or
#       the static one when CACHING_ALLOCATOR_STATIC is ON)
#   <prefix>/lib/pkgconfig/caching_allocator.pc (shared) and caching_allocator-static.pc
#
# The shared library is found at run time through an rpath: the CMake targets get one from
# CMake itself, the shared pkg-config file carries `-Wl,-rpath,${libdir}` in its Libs, so a
# program linked with `$(pkg-config --cflags --libs caching_allocator)` runs from any prefix
# with no LD_LIBRARY_PATH. The script ends by printing the lines to build and run a program.
#
# The package files are relocatable: the CMake one finds the prefix from its own path, the
# pkg-config ones from ${pcfiledir}. The static library holds the Rust standard library, which
# needs system libraries after it; the exact list is what rustc reports for this target
# (`--print native-static-libs`), written into both package files.
#
# Size: the default profile, capi-release (workspace Cargo.toml), is release without debug info
# and with fat LTO; the installed copies are then stripped (unless --no-strip): the static
# library of the debug info and of the LLVM bitcode the Rust standard library's objects embed
# (`.llvmbc`, only useful for cross-language LTO), the shared one of every symbol it does not
# export. On x86-64 Linux that took the static library from 23.9 MB (release, unstripped) to
# 1.5 MB and the shared one from 5.1 MB to 0.36 MB.
# Linux is what CI tests; on macOS the shared library is a .dylib (untested).
set -euo pipefail
cd "$(dirname "$0")/.."

prefix=""
strip_debug=1
profile=capi-release
while [[ $# -gt 0 ]]; do
    case "$1" in
        --prefix) prefix="${2:?--prefix needs a directory}"; shift 2 ;;
        --prefix=*) prefix="${1#--prefix=}"; shift ;;
        --no-strip) strip_debug=0; shift ;;
        --profile) profile="${2:?--profile needs a cargo profile}"; shift 2 ;;
        -h|--help) sed -n '2,35p' "$0"; exit 0 ;;
        *) echo "install-capi.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
    esac
done
if [[ -z "$prefix" ]]; then
    echo "install-capi.sh: give the install prefix, e.g. --prefix /usr/local" >&2
    exit 2
fi
mkdir -p "$prefix"
prefix="$(cd "$prefix" && pwd)"

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' crates/capi/Cargo.toml | head -n1)
case "$(uname -s)" in
    Darwin) shared_name=libcaching_allocator.dylib ;;
    *) shared_name=libcaching_allocator.so ;;
esac

# One build that also prints the system libraries the static library needs.
build_log=$(mktemp)
trap 'rm -f "$build_log"' EXIT
cargo rustc -p caching-allocator-capi --lib --profile "$profile" -- --print native-static-libs \
    2>"$build_log" || { cat "$build_log" >&2; exit 1; }
native_libs=$(sed -n 's/.*native-static-libs: //p' "$build_log" | tail -n1)
if [[ -z "$native_libs" ]]; then
    echo "install-capi.sh: rustc did not report the native libraries; build log:" >&2
    cat "$build_log" >&2
    exit 1
fi
target_dir=$(cargo metadata --format-version 1 --no-deps \
    | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
case "$profile" in
    dev) out="$target_dir/debug" ;;
    *) out="$target_dir/$profile" ;;
esac

install -d "$prefix/include" "$prefix/lib/pkgconfig" "$prefix/lib/cmake/caching_allocator"
install -m 644 crates/capi/include/caching_allocator.h \
    crates/capi/include/caching_allocator_executorch.hpp "$prefix/include/"
install -m 644 "$out/libcaching_allocator.a" "$prefix/lib/"
install -m 755 "$out/$shared_name" "$prefix/lib/"
if [[ $strip_debug == 1 ]]; then
    # The archive keeps its symbol tables (a linker needs them); the shared library its
    # dynamic symbol table (the exports), which --strip-unneeded never touches.
    strip --strip-debug --remove-section=.llvmbc --remove-section=.llvmcmd \
        "$prefix/lib/libcaching_allocator.a"
    strip --strip-unneeded "$prefix/lib/$shared_name"
fi

# CMake: the system libraries as a list ("-lpthread" items are passed to the linker as-is).
cmake_libs=$(printf '%s' "$native_libs" | tr -s ' ' ';')
cat >"$prefix/lib/cmake/caching_allocator/caching_allocatorConfig.cmake" <<EOF
# caching_allocator ${version}: written by scripts/install-capi.sh.
#   find_package(caching_allocator CONFIG REQUIRED)
#   target_link_libraries(app PRIVATE caching_allocator::caching_allocator)
# caching_allocator::caching_allocator is the shared library, or the static one when
# CACHING_ALLOCATOR_STATIC is ON; caching_allocator::shared and ::static name each directly.
# The C++ ExecuTorch adapter (caching_allocator_executorch.hpp) is in the include directory.
get_filename_component(_ca_prefix "\${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
include(CMakeFindDependencyMacro)
find_dependency(Threads)

foreach(_ca_file "include/caching_allocator.h" "lib/libcaching_allocator.a" "lib/${shared_name}")
  if(NOT EXISTS "\${_ca_prefix}/\${_ca_file}")
    set(caching_allocator_FOUND FALSE)
    set(caching_allocator_NOT_FOUND_MESSAGE
        "\${_ca_prefix}/\${_ca_file} is missing: reinstall with scripts/install-capi.sh --prefix \${_ca_prefix}")
    return()
  endif()
endforeach()

if(NOT TARGET caching_allocator::shared)
  add_library(caching_allocator::shared SHARED IMPORTED)
  set_target_properties(caching_allocator::shared PROPERTIES
    IMPORTED_LOCATION "\${_ca_prefix}/lib/${shared_name}"
    IMPORTED_SONAME "${shared_name}"
    INTERFACE_INCLUDE_DIRECTORIES "\${_ca_prefix}/include")

  # The static library holds the Rust standard library: these system libraries come after it.
  add_library(caching_allocator::static STATIC IMPORTED)
  set_target_properties(caching_allocator::static PROPERTIES
    IMPORTED_LOCATION "\${_ca_prefix}/lib/libcaching_allocator.a"
    IMPORTED_LINK_INTERFACE_LANGUAGES "C"
    INTERFACE_INCLUDE_DIRECTORIES "\${_ca_prefix}/include"
    INTERFACE_LINK_LIBRARIES "Threads::Threads;${cmake_libs}")

  add_library(caching_allocator::caching_allocator INTERFACE IMPORTED)
  if(CACHING_ALLOCATOR_STATIC)
    set_target_properties(caching_allocator::caching_allocator PROPERTIES
      INTERFACE_LINK_LIBRARIES caching_allocator::static)
  else()
    set_target_properties(caching_allocator::caching_allocator PROPERTIES
      INTERFACE_LINK_LIBRARIES caching_allocator::shared)
  endif()
endif()
unset(_ca_prefix)
unset(_ca_file)
EOF

# 0.x: a newer minor version may break the API, so only the same major.minor is compatible.
cat >"$prefix/lib/cmake/caching_allocator/caching_allocatorConfigVersion.cmake" <<EOF
set(PACKAGE_VERSION "${version}")
if(PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION)
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
elseif("${version}" MATCHES "^0\\\\.")
  if(PACKAGE_FIND_VERSION_MAJOR EQUAL 0 AND PACKAGE_FIND_VERSION_MINOR EQUAL "$(echo "$version" | cut -d. -f2)")
    set(PACKAGE_VERSION_COMPATIBLE TRUE)
  else()
    set(PACKAGE_VERSION_COMPATIBLE FALSE)
  endif()
elseif(PACKAGE_FIND_VERSION_MAJOR EQUAL "$(echo "$version" | cut -d. -f1)")
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
else()
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
endif()
if(PACKAGE_FIND_VERSION STREQUAL PACKAGE_VERSION)
  set(PACKAGE_VERSION_EXACT TRUE)
endif()
EOF

pc_common="prefix=\${pcfiledir}/../..
includedir=\${prefix}/include
libdir=\${prefix}/lib"
cat >"$prefix/lib/pkgconfig/caching_allocator.pc" <<EOF
$pc_common

Name: caching_allocator
Description: Caching CPU allocator for kernel scratch memory (shared library; C ABI and C++ ExecuTorch adapter)
Version: ${version}
Cflags: -I\${includedir}
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -lcaching_allocator
EOF
cat >"$prefix/lib/pkgconfig/caching_allocator-static.pc" <<EOF
$pc_common

Name: caching_allocator-static
Description: Caching CPU allocator for kernel scratch memory (static library, with the system libraries it needs)
Version: ${version}
Cflags: -I\${includedir}
Libs: \${libdir}/libcaching_allocator.a ${native_libs}
EOF

echo "installed caching_allocator ${version} into ${prefix}:"
ls -l "$prefix/lib/libcaching_allocator.a" "$prefix/lib/$shared_name" | awk '{print "  " $5 " bytes  " $NF}'
cat <<EOF
Build and run a program against it (the shared .pc file carries an rpath to ${prefix}/lib,
so the program runs with no LD_LIBRARY_PATH; a program linked by hand with
-L${prefix}/lib -lcaching_allocator needs -Wl,-rpath,${prefix}/lib or LD_LIBRARY_PATH=${prefix}/lib):
  export PKG_CONFIG_PATH=${prefix}/lib/pkgconfig
  cc app.c \$(pkg-config --cflags --libs caching_allocator) -o app && ./app          # shared
  cc app.c \$(pkg-config --cflags --libs caching_allocator-static) -o app && ./app   # static
  cmake -DCMAKE_PREFIX_PATH=${prefix} ...   # find_package(caching_allocator); CMake sets the rpath
EOF
