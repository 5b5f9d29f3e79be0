// See heap_count.hpp. Every function forwards to glibc's own implementation; only a counter
// is added (relaxed: the total is read between executes, on the thread that runs them).
#include "heap_count.hpp"

#include <atomic>
#include <cerrno>
#include <cstddef>

extern "C" {
void* __libc_malloc(size_t size);
void __libc_free(void* ptr);
void* __libc_calloc(size_t n, size_t size);
void* __libc_realloc(void* ptr, size_t size);
void* __libc_memalign(size_t alignment, size_t size);
}

namespace {
std::atomic<uint64_t> g_calls{0};
inline void count() { g_calls.fetch_add(1, std::memory_order_relaxed); }
}  // namespace

namespace heap_count {
uint64_t calls() { return g_calls.load(std::memory_order_relaxed); }
}  // namespace heap_count

extern "C" {

void* malloc(size_t size) {
  count();
  return __libc_malloc(size);
}

void free(void* ptr) {
  if (ptr != nullptr) count();
  __libc_free(ptr);
}

void* calloc(size_t n, size_t size) {
  count();
  return __libc_calloc(n, size);
}

void* realloc(void* ptr, size_t size) {
  count();
  return __libc_realloc(ptr, size);
}

void* memalign(size_t alignment, size_t size) {
  count();
  return __libc_memalign(alignment, size);
}

void* aligned_alloc(size_t alignment, size_t size) {
  count();
  return __libc_memalign(alignment, size);
}

int posix_memalign(void** out, size_t alignment, size_t size) {
  count();
  // POSIX: a power of two and a multiple of sizeof(void*).
  if (alignment % sizeof(void*) != 0 || (alignment & (alignment - 1)) != 0) return EINVAL;
  void* p = __libc_memalign(alignment, size);
  if (p == nullptr) return ENOMEM;
  *out = p;
  return 0;
}

}  // extern "C"
