// caching_allocator::ExecuTorchTempAllocator inside the real ExecuTorch runtime (the
// `executorch` wheel's headers and libexecutorch.so): it is a MemoryManager's temp allocator,
// kernels take scratch through ExecuTorch's KernelRuntimeContext::allocate_temp and the
// MemoryAllocator API (allocate, allocateList, allocateInstance), and the runtime's side resets
// it through the MemoryManager after every kernel, as Method::execute does; then on four
// threads, and reset() racing three allocating threads as in ExecuTorch's own thread-safety
// test. Prints "N checks, 0 failed". Build: CMakeLists.txt beside this file.
#include <caching_allocator_executorch.hpp>
#include <executorch/runtime/core/error.h>
#include <executorch/runtime/core/hierarchical_allocator.h>
#include <executorch/runtime/core/memory_allocator.h>
#include <executorch/runtime/executor/memory_manager.h>
#include <executorch/runtime/kernel/kernel_runtime_context.h>
#include <executorch/runtime/platform/runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

using executorch::runtime::Error;
using executorch::runtime::KernelRuntimeContext;
using executorch::runtime::MemoryAllocator;
using executorch::runtime::MemoryManager;
using executorch::runtime::Result;

namespace {

std::atomic<int> checks{0};
std::atomic<int> failures{0};

#define CHECK(cond)                                                                      \
  do {                                                                                   \
    checks++;                                                                            \
    if (!(cond)) {                                                                       \
      failures++;                                                                        \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);      \
    }                                                                                    \
  } while (0)

bool aligned(const void* p, size_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

struct Pair {
  double a;
  int64_t b;
};

// One kernel as ExecuTorch's kernels take scratch: allocate_temp from the context, and the
// MemoryAllocator API on the same temp allocator. Writes every byte and reads it back.
void kernel(KernelRuntimeContext& context, MemoryAllocator& temp, size_t step, unsigned char tag) {
  const size_t bytes = 4096 + 64 * step;  // grows a little every call, as decode scratch does
  Result<void*> scratch = context.allocate_temp(bytes, 64);
  CHECK(scratch.ok());
  float* list = temp.allocateList<float>(1000 + step);
  Pair* one = temp.allocateInstance<Pair>();
  CHECK(list != nullptr && one != nullptr);
  if (!scratch.ok() || list == nullptr || one == nullptr) return;
  CHECK(aligned(scratch.get(), 64) && aligned(list, alignof(float)) && aligned(one, alignof(Pair)));
  std::memset(scratch.get(), tag, bytes);
  for (size_t i = 0; i < 1000 + step; i++) list[i] = static_cast<float>(i);
  one->a = 1.5;
  one->b = static_cast<int64_t>(step);
  const auto* bytes_back = static_cast<const unsigned char*>(scratch.get());
  CHECK(bytes_back[0] == tag && bytes_back[bytes - 1] == tag);
  CHECK(list[999] == 999.0f && one->b == static_cast<int64_t>(step));
}

// The runtime's side: a MemoryManager holds the adapter as its temp allocator; kernels see it
// only as a MemoryAllocator*, and it is reset through the manager after every kernel.
void kernels_through_the_memory_manager() {
  static uint8_t method_pool[4096];
  MemoryAllocator method_allocator(sizeof(method_pool), method_pool);
  caching_allocator::ExecuTorchTempAllocator temp(8 << 20);
  CHECK(temp.ok());
  MemoryManager memory_manager(&method_allocator, nullptr, &temp);
  MemoryAllocator* runtime_temp = memory_manager.temp_allocator();
  CHECK(runtime_temp == &temp);
  CHECK(memory_manager.method_allocator()->allocate(64) != nullptr);  // the plain bump one

  KernelRuntimeContext context(nullptr, runtime_temp);
  for (size_t step = 0; step < 200; step++) {
    kernel(context, *runtime_temp, step, static_cast<unsigned char>(step));
    CHECK(temp.stats().live_blocks == 3);
    runtime_temp->reset();  // what Method::execute does after each kernel
    CHECK(temp.stats().live_blocks == 0);
  }
  const CaStats s = temp.stats();
  std::printf("200 kernels, 3 blocks each: %llu hits, %llu misses, peak %zu bytes live\n",
              static_cast<unsigned long long>(s.hits), static_cast<unsigned long long>(s.misses),
              s.peak_live_bytes);
  CHECK(s.hits + s.misses == 600);
  CHECK(s.hits > 9 * s.misses);  // after warm-up, scratch comes from the cache

  // Alignments above the library's 2 MiB, through ExecuTorch's API.
  Result<void*> big = context.allocate_temp(1000, 8 << 20);
  CHECK(big.ok() && aligned(big.get(), 8 << 20));
  runtime_temp->reset();
}

// Failures reach the kernel as ExecuTorch's errors; the adapter says why.
void failures_are_executorch_errors() {
  static uint8_t method_pool[256];
  MemoryAllocator method_allocator(sizeof(method_pool), method_pool);
  caching_allocator::ExecuTorchTempAllocator temp(1 << 20);
  MemoryManager memory_manager(&method_allocator, nullptr, &temp);
  KernelRuntimeContext context(nullptr, memory_manager.temp_allocator());

  std::printf("ExecuTorch logs the refused allocation below (expected):\n");
  std::fflush(stdout);
  Result<void*> odd = context.allocate_temp(64, 3);
  CHECK(!odd.ok() && odd.error() == Error::MemoryAllocationFailed);
  const CaError e = temp.last_error();
  CHECK(e.code == CA_STATUS_INVALID_ALIGNMENT);
  CHECK(std::strstr(e.message, "not a power of two") != nullptr);
  std::printf("  last_error(): %s: %s\n", ca_status_name(e.code), e.message);
  // allocateList's own overflow check refuses before the adapter is called.
  CHECK(memory_manager.temp_allocator()->allocateList<uint64_t>(SIZE_MAX / 4) == nullptr);
  CHECK(temp.stats().live_blocks == 0);
}

// Four threads run kernels on one temp allocator; the runtime resets it between rounds.
void kernels_on_four_threads() {
  static uint8_t method_pool[256];
  MemoryAllocator method_allocator(sizeof(method_pool), method_pool);
  caching_allocator::ExecuTorchTempAllocator temp(16 << 20);
  MemoryManager memory_manager(&method_allocator, nullptr, &temp);
  MemoryAllocator* runtime_temp = memory_manager.temp_allocator();
  for (size_t round = 0; round < 50; round++) {
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < 4; t++) {
      threads.emplace_back([&, t] {
        KernelRuntimeContext context(nullptr, runtime_temp);
        for (size_t k = 0; k < 4; k++) {
          kernel(context, *runtime_temp, round + k, static_cast<unsigned char>(16 * t + k));
        }
      });
    }
    for (auto& th : threads) th.join();
    CHECK(temp.stats().live_blocks == 4 * 4 * 3);
    runtime_temp->reset();
    CHECK(temp.stats().live_blocks == 0);
  }
}

// ExecuTorch's own thread-safety test of its temp allocator: reset() while threads allocate.
// The blocks are not written: one allocated while the reset runs may be taken back by it.
void reset_races_three_allocating_threads() {
  caching_allocator::ExecuTorchTempAllocator temp(4 << 20);
  MemoryAllocator* runtime_temp = &temp;
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < 3; t++) {
    threads.emplace_back([&, t] {
      size_t i = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        void* p = runtime_temp->allocate(256 << (i++ % 5), size_t{64} << t);
        CHECK(p != nullptr && aligned(p, size_t{64} << t));
      }
    });
  }
  for (int r = 0; r < 2000; r++) runtime_temp->reset();
  stop = true;
  for (auto& th : threads) th.join();
  runtime_temp->reset();
  const CaStats s = temp.stats();
  CHECK(s.live_blocks == 0 && s.live_bytes == 0);
  CHECK(s.reserved_bytes == s.cached_bytes);
}

}  // namespace

int main() {
  executorch::runtime::runtime_init();  // ExecuTorch's platform layer: its logging and abort
  kernels_through_the_memory_manager();
  failures_are_executorch_errors();
  kernels_on_four_threads();
  reset_races_three_allocating_threads();
  std::printf("executorch_runtime_temp_allocator: %d checks, %d failed\n", checks.load(),
              failures.load());
  return failures.load() == 0 ? 0 : 1;
}
