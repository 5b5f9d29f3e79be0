// Counts the process's heap calls: this program defines malloc, free, calloc, realloc and the
// aligned forms itself, forwarding to glibc's (__libc_*). A definition in the executable
// interposes on every shared library too (libexecutorch.so, the kernel library, libstdc++'s
// operator new), as an LD_PRELOAD shim would, and the static caching_allocator library's Rust
// code calls them as well. glibc only (the entry points are glibc's).
#ifndef CA_EXAMPLE_HEAP_COUNT_HPP
#define CA_EXAMPLE_HEAP_COUNT_HPP

#include <cstdint>

namespace heap_count {

// Calls to malloc, calloc, realloc, free (of a non-null pointer), memalign, posix_memalign and
// aligned_alloc since the program started, on every thread.
uint64_t calls();

}  // namespace heap_count

#endif
