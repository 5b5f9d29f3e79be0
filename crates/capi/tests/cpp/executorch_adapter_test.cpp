// Tests of caching_allocator::ExecuTorchTempAllocator (include/caching_allocator_executorch.hpp)
// against the stand-in of ExecuTorch's MemoryAllocator in executorch_standin/: the scenarios of
// ExecuTorch's own CPUCachingAllocator tests, the semantics a drop-in user relies on (size 0,
// alignments above 2 MiB, bad alignments), and two multi-thread tests: kernels on four threads
// with resets between them (every block checked distinct and intact), and ExecuTorch's
// thread-safety shape, reset() on one thread while three others allocate.
//
// Built and run by tests/c_examples.rs with -std=c++17 -Wall -Wextra -Wpedantic -Werror against
// the shared library and, statically, under -fsanitize=address,undefined; prints
// "executorch_adapter_test: <n> checks, 0 failed" on success.
#include <caching_allocator_executorch.hpp>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "barrier.hpp"  // tests/cpp/support: std::barrier is C++20

using caching_allocator::ExecuTorchTempAllocator;
using executorch::runtime::MemoryAllocator;

namespace {

std::atomic<int> checks{0};
std::atomic<int> failures{0};

#define CHECK(cond)                                                        \
  do {                                                                     \
    checks++;                                                              \
    if (!(cond)) {                                                         \
      failures++;                                                          \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                      \
  } while (0)

bool aligned(const void* p, size_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

constexpr size_t kMiB = size_t{1} << 20;

void small_allocations_are_aligned_to_64() {
  ExecuTorchTempAllocator temp(1 << 20);
  for (size_t size : {16, 32, 64}) {
    void* p = temp.allocate(size);
    CHECK(p != nullptr);
    CHECK(aligned(p, 64));
  }
}

void reset_then_same_size_reuses_the_block() {
  ExecuTorchTempAllocator temp(1 << 20);
  void* first = temp.allocate(256);
  temp.reset();
  void* second = temp.allocate(256);
  CHECK(first != nullptr);
  CHECK(first == second);
  // Small blocks are bumped through the thread's arena: one chunk from the system serves both.
  CHECK(temp.stats().system_allocs == 1);
  CHECK(temp.stats().hits == 2 && temp.stats().misses == 0);
}

void different_sizes_are_distinct() {
  ExecuTorchTempAllocator temp(1 << 20);
  void* a = temp.allocate(128);
  void* b = temp.allocate(256);
  void* c = temp.allocate(512);
  CHECK(a && b && c && a != b && b != c && a != c);
  temp.reset();
  void* d = temp.allocate(256);
  void* e = temp.allocate(256);
  CHECK(d != nullptr && e != nullptr && d != e);
  CHECK(d == a);  // the arena rewound: the first bytes serve the first block again
  CHECK(temp.stats().system_allocs == 1);
}

void every_power_of_two_alignment_is_honoured() {
  ExecuTorchTempAllocator temp(64 * kMiB);
  for (size_t alignment = 1; alignment <= 16 * kMiB; alignment *= 2) {
    auto* p = static_cast<unsigned char*>(temp.allocate(1000, alignment));
    CHECK(p != nullptr);
    CHECK(aligned(p, std::max<size_t>(alignment, 64)));
    if (p != nullptr) {
      std::memset(p, 0xAB, 1000);  // writable, every byte (ASan checks the bounds)
      CHECK(p[999] == 0xAB);
    }
  }
  // Above 2 MiB the pointer is inside a padded block; reset still takes it back.
  temp.reset();
  CHECK(temp.stats().live_blocks == 0);
  void* a = temp.allocate(100, 256);
  void* b = temp.allocate(100, 512);
  CHECK(a != nullptr && b != nullptr && a != b);
  CHECK(aligned(a, 256) && aligned(b, 512));
}

void invalid_alignments_give_nullptr_and_a_reason() {
  ExecuTorchTempAllocator temp(1 << 20);
  for (size_t alignment : {0, 5, 6, 12, 34}) {
    CHECK(temp.allocate(64, alignment) == nullptr);
    CHECK(temp.last_error().code == CA_STATUS_INVALID_ALIGNMENT);
    // The adapter serves every power of two: its reason names no upper bound.
    const char* reason = temp.last_error().message;
    CHECK(std::strstr(reason, "is not a power of two") != nullptr);
    CHECK(std::strstr(reason, "CA_MAX_ALIGN") == nullptr && std::strstr(reason, "2097152") == nullptr &&
          std::strstr(reason, "2 MiB") == nullptr);
  }
  CHECK(temp.allocate(SIZE_MAX, 64) == nullptr);
  CHECK(temp.last_error().code == CA_STATUS_SIZE_OVERFLOW);
  CHECK(temp.allocate(SIZE_MAX - 10, 8 * kMiB) == nullptr);
  CHECK(temp.last_error().code == CA_STATUS_SIZE_OVERFLOW);
  char asked[64];
  std::snprintf(asked, sizeof asked, "size %zu ", SIZE_MAX - 10);
  CHECK(std::strstr(temp.last_error().message, asked) != nullptr);  // the size asked for
  CHECK(temp.stats().live_blocks == 0);
}

void size_zero_gives_distinct_blocks() {
  ExecuTorchTempAllocator temp(1 << 20);
  auto* a = static_cast<unsigned char*>(temp.allocate(0));
  auto* b = static_cast<unsigned char*>(temp.allocate(0, 256));
  auto* c = static_cast<unsigned char*>(temp.allocate(0));  // same request as a: still distinct
  CHECK(a != nullptr && b != nullptr && c != nullptr);
  CHECK(a != b && a != c && b != c);
  CHECK(aligned(b, 256));
  const bool real_blocks = temp.stats().live_blocks == 3;
  CHECK(real_blocks);
  if (real_blocks) {  // (the C function's size-0 pointer must not be written: guard the test)
    a[0] = 1;  // a real block: one byte is writable
    b[0] = 2;
    CHECK(a[0] == 1);
  }
}

void cap_never_refuses_live_memory() {
  ExecuTorchTempAllocator temp(1024);  // 1 KiB cap
  void* blocks[3];
  for (void*& p : blocks) {
    p = temp.allocate(512);
    CHECK(p != nullptr);
  }
  CHECK(blocks[0] != blocks[1] && blocks[1] != blocks[2] && blocks[0] != blocks[2]);
  temp.reset();
  const CaStats s = temp.stats();
  CHECK(s.live_blocks == 0);
  CHECK(s.cached_bytes <= 1024);  // over the cap: the least recently used went back
  CHECK(s.cached_blocks >= 1);    // under it: kept (CPUCachingAllocator would keep none)
}

void under_cap_reset_keeps_everything() {
  ExecuTorchTempAllocator temp(10 * kMiB);
  void* big = temp.allocate(kMiB);
  void* small = temp.allocate(1000);
  CHECK(big != nullptr && small != nullptr);
  temp.reset();
  // The 1 MiB block is idle in its class; the small one's bytes are in the arena's chunk.
  CHECK(temp.stats().cached_blocks == 1 && temp.stats().arena_chunks == 1);
  CHECK(temp.stats().live_bytes == 0);
  CHECK(temp.stats().system_allocs == 2);
  // From the second call on, the adaptive arena bumps both blocks through one chunk that holds
  // the whole call (taken once, at the second call's first request), and every later call
  // gets the same two blocks: nothing more from the system.
  big = temp.allocate(kMiB);
  small = temp.allocate(1000);
  CHECK(temp.stats().arena_live_blocks == 2);
  temp.reset();
  CHECK(temp.stats().system_allocs == 3);
  for (int call = 0; call < 3; call++) {
    CHECK(temp.allocate(kMiB) == big);
    CHECK(temp.allocate(1000) == small);
    temp.reset();
  }
  CHECK(temp.stats().system_allocs == 3);
  CHECK(temp.stats().live_bytes == 0);
}

void memory_is_writable_and_reads_back() {
  ExecuTorchTempAllocator temp(1 << 20);
  auto* p = static_cast<unsigned char*>(temp.allocate(1024));
  CHECK(p != nullptr);
  if (p == nullptr) return;
  for (int i = 0; i < 1024; i++) p[i] = static_cast<unsigned char>(i * 7);
  bool same = true;
  for (int i = 0; i < 1024; i++) same = same && p[i] == static_cast<unsigned char>(i * 7);
  CHECK(same);
}

void repeated_cycles_settle_into_the_cache() {
  ExecuTorchTempAllocator temp(10 * kMiB);
  for (int round = 0; round < 5; round++) {
    for (size_t size : {256, 512, 1024}) CHECK(temp.allocate(size) != nullptr);
    temp.reset();
  }
  const CaStats s = temp.stats();
  CHECK(s.system_allocs == 1);  // one arena chunk holds every round's blocks
  CHECK(s.hits == 15 && s.misses == 0);
  CHECK(s.last_interval_peak_bytes == 256 + 512 + 1024);  // one kernel call's high-water mark
}

struct Pair {
  double x;
  int64_t y;
};

void base_class_helpers_go_through_allocate() {
  ExecuTorchTempAllocator temp(1 << 20);
  MemoryAllocator& base = temp;  // what the runtime and kernels see
  Pair* one = base.allocateInstance<Pair>();
  Pair* list = base.allocateList<Pair>(100);
  CHECK(one != nullptr && list != nullptr && one != reinterpret_cast<Pair*>(list));
  CHECK(aligned(one, 64) && aligned(list, 64));
  CHECK(temp.stats().live_blocks == 2);
  base.reset();
  CHECK(temp.stats().live_blocks == 0);
}

void debug_checks_report_an_overrun_at_reset() {
  CaConfig config = ca_config_default();
  config.debug_checks = true;
  ExecuTorchTempAllocator temp(config);
  auto* p = static_cast<unsigned char*>(temp.allocate(100));
  CHECK(p != nullptr);
  if (p == nullptr) return;
  p[100] = 0;  // one byte past the request: still inside the block, onto the canary
  temp.reset();
  CHECK(temp.last_error().code == CA_STATUS_CORRUPTED);
  CHECK(temp.stats().corrupted_blocks == 1);
  CHECK(temp.stats().live_blocks == 0);
}

void runner_line_compiles_as_with_cpu_caching_allocator() {
  // extension/llm/runner/llm_runner_helper.cpp builds its temp allocator like this.
  std::unique_ptr<MemoryAllocator> temp =
      std::make_unique<ExecuTorchTempAllocator>(1024 * 1024 * 10);
  void* p = temp->allocate(4096, 64);
  CHECK(p != nullptr);
  temp->reset();
}

// Kernels on four threads; after each, one thread checks every block of every thread is
// distinct, aligned and intact, then resets while the others wait.
void kernels_on_four_threads_with_resets_between() {
  constexpr int kThreads = 4;
  constexpr int kIterations = 100;
  constexpr int kBlocks = 5;
  struct Block {
    unsigned char* ptr;
    size_t size;
    size_t alignment;
    unsigned char pattern;
  };
  CaConfig config = ca_config_default();
  config.max_cached_bytes = 8 * kMiB;
  config.debug_checks = true;  // an overrun would show as corrupted_blocks
  ExecuTorchTempAllocator temp(config);
  MemoryAllocator& allocator = temp;
  Barrier barrier(kThreads);
  std::vector<Block> blocks[kThreads];

  auto worker = [&](int t) {
    for (int iter = 0; iter < kIterations; iter++) {
      blocks[t].clear();
      for (int i = 0; i < kBlocks; i++) {
        // Sizes that grow a little every call, as attention decode's scratch does; one
        // alignment above 2 MiB now and then.
        const size_t size = 200 + static_cast<size_t>(i) * 3000 + iter * 16 + t * 8;
        const size_t alignment = (iter % 25 == 0 && i == 0) ? 4 * kMiB : size_t{16} << i;
        auto* p = static_cast<unsigned char*>(allocator.allocate(size, alignment));
        CHECK(p != nullptr);
        if (p == nullptr) continue;
        const auto pattern = static_cast<unsigned char>(t * 50 + i * 7 + iter);
        std::memset(p, pattern, size);
        blocks[t].push_back(Block{p, size, alignment, pattern});
      }
      barrier.wait();
      if (t == 0) {
        std::vector<Block> all;
        for (auto& b : blocks) all.insert(all.end(), b.begin(), b.end());
        std::sort(all.begin(), all.end(),
                  [](const Block& a, const Block& b) { return a.ptr < b.ptr; });
        CHECK(all.size() == size_t{kThreads} * kBlocks);
        for (size_t i = 0; i < all.size(); i++) {
          const Block& b = all[i];
          CHECK(aligned(b.ptr, b.alignment));
          if (i + 1 < all.size()) CHECK(b.ptr + b.size <= all[i + 1].ptr);
          CHECK(std::all_of(b.ptr, b.ptr + b.size, [&](unsigned char c) { return c == b.pattern; }));
        }
        allocator.reset();
      }
      barrier.wait();
    }
  };
  std::vector<std::thread> threads;
  for (int t = 1; t < kThreads; t++) threads.emplace_back(worker, t);
  worker(0);
  for (auto& th : threads) th.join();

  const CaStats s = temp.stats();
  CHECK(s.live_blocks == 0);
  CHECK(s.corrupted_blocks == 0);
  CHECK(s.hits + s.misses == uint64_t{kThreads} * kIterations * kBlocks);
  CHECK(s.hits > s.misses);  // size classes absorb the growth
}

// ExecuTorch's thread-safety shape: reset() on one thread while three others allocate. Blocks
// may be taken back under the allocating threads, so they are only checked (non-null, aligned),
// not written, as ExecuTorch's test does; afterwards the books must balance.
void reset_races_with_allocations() {
  constexpr int kAllocators = 3;
  constexpr int kPerThread = 2000;
  ExecuTorchTempAllocator temp(4 * kMiB);
  std::atomic<bool> done{false};
  std::atomic<int> resets{0};
  std::thread resetter([&] {
    while (!done.load()) {
      temp.reset();
      resets++;
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kAllocators; t++) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; i++) {
        const size_t size = 64 + static_cast<size_t>((i * 131 + t * 17) % 20000);
        const size_t alignment = size_t{64} << (i % 4);
        void* p = temp.allocate(size, alignment);
        CHECK(p != nullptr);
        CHECK(aligned(p, alignment));
      }
    });
  }
  for (auto& th : threads) th.join();
  done = true;
  resetter.join();
  temp.reset();
  const CaStats s = temp.stats();
  CHECK(resets.load() > 0);
  CHECK(s.live_blocks == 0);
  CHECK(s.live_bytes == 0);
  CHECK(s.hits + s.misses == uint64_t{kAllocators} * kPerThread);
  CHECK(s.reserved_bytes == s.cached_bytes);  // nothing lost: every block held is idle
  CHECK(s.cached_bytes <= 4 * kMiB);
}

// Memory pressure: trim_to(target) leaves at most target bytes held, never touching live
// blocks; with live blocks above the target it holds just those.
void trim_to_shrinks_to_the_target_and_keeps_live_blocks() {
  ExecuTorchTempAllocator temp(64 * kMiB);
  std::vector<void*> idle;
  for (size_t i = 1; i <= 8; i++) idle.push_back(temp.allocate(i * 256 * 1024));
  temp.reset();  // 9 MiB of idle blocks
  const size_t live_size = 3 * kMiB;
  auto* live = static_cast<unsigned char*>(temp.allocate(live_size));
  CHECK(live != nullptr);
  if (live == nullptr) return;
  std::memset(live, 0x5A, live_size);
  const CaStats before = temp.stats();
  CHECK(before.cached_bytes > 4 * kMiB);
  const size_t target = before.live_bytes + 2 * kMiB;
  const size_t held = temp.trim_to(target);
  const CaStats after = temp.stats();
  CHECK(held == after.reserved_bytes);
  CHECK(after.reserved_bytes <= target);
  CHECK(after.cached_bytes > 0);  // it trimmed to the target, not everything
  CHECK(after.live_blocks == before.live_blocks && after.live_bytes == before.live_bytes);
  CHECK(live[0] == 0x5A && live[live_size - 1] == 0x5A);
  // Below the live bytes: every idle block goes, the live one stays.
  CHECK(temp.trim_to(kMiB) == temp.stats().live_bytes);
  CHECK(temp.stats().cached_bytes == 0 && temp.stats().live_blocks == 1);
  CHECK(live[live_size / 2] == 0x5A);
  CHECK(temp.allocate(1000) != nullptr);  // a small block: the thread's arena
  temp.reset();
  CHECK(temp.trim_to(0) == 0);  // between kernels, everything goes back, arena chunks too
  CHECK(temp.stats().arena_chunks == 0);
}

// The temp plan through the adapter: every reset interval's peak, in order; off by default.
void temp_plan_reports_each_interval_and_the_max() {
  ExecuTorchTempAllocator temp(16 * kMiB);
  CHECK(temp.allocate(100000) != nullptr);
  temp.reset();
  CHECK(temp.read_temp_plan().intervals == 0);  // off by default
  CHECK(temp.start_temp_plan(8));
  size_t largest = 0;
  std::vector<size_t> seen;
  for (size_t call = 1; call <= 5; call++) {
    CHECK(temp.allocate(call * 300000) != nullptr);
    CHECK(temp.allocate(1000) != nullptr);
    temp.reset();
    seen.push_back(temp.stats().last_interval_peak_bytes);
    largest = std::max(largest, seen.back());
  }
  size_t peaks[8] = {};
  const CaPlanInfo info = temp.read_temp_plan(peaks, 8);
  CHECK(info.stored == 5 && info.intervals == 5 && info.dropped == 0 && info.recording);
  CHECK(info.max_bytes == largest);
  CHECK(largest >= 5 * 300000 + 1000);
  CHECK(std::equal(seen.begin(), seen.end(), peaks));
  temp.stop_temp_plan();
  temp.reset();
  CHECK(temp.read_temp_plan().intervals == 5 && !temp.read_temp_plan().recording);
}

}  // namespace

int main() {
  small_allocations_are_aligned_to_64();
  reset_then_same_size_reuses_the_block();
  different_sizes_are_distinct();
  every_power_of_two_alignment_is_honoured();
  invalid_alignments_give_nullptr_and_a_reason();
  size_zero_gives_distinct_blocks();
  cap_never_refuses_live_memory();
  under_cap_reset_keeps_everything();
  memory_is_writable_and_reads_back();
  repeated_cycles_settle_into_the_cache();
  base_class_helpers_go_through_allocate();
  debug_checks_report_an_overrun_at_reset();
  runner_line_compiles_as_with_cpu_caching_allocator();
  kernels_on_four_threads_with_resets_between();
  reset_races_with_allocations();
  trim_to_shrinks_to_the_target_and_keeps_live_blocks();
  temp_plan_reports_each_interval_and_the_max();
  std::printf("executorch_adapter_test: %d checks, %d failed\n", checks.load(), failures.load());
  return failures.load() == 0 ? 0 : 1;
}
