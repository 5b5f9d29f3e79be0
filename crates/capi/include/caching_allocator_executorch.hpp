/* caching_allocator_executorch.hpp: caching-allocator as ExecuTorch's temp allocator.
 *
 * Header-only, C++17. Link with the C library (libcaching_allocator, see caching_allocator.h).
 * Needs ExecuTorch's <executorch/runtime/core/memory_allocator.h> on the include path: with
 * ExecuTorch's CMake package (the executorch wheel has one), link executorch::runtime, which
 * brings its include directories, compile definitions and libexecutorch.so; the steps, and
 * the flags without CMake, are in crates/capi/README.md. CI builds it against ExecuTorch 1.5.1
 * (crates/capi/examples/executorch).
 *
 * Replaces ExecuTorch's CPUCachingAllocator line for line, e.g. in the LLM runner:
 *
 *     #include <caching_allocator_executorch.hpp>
 *     ...
 *     std::make_unique<caching_allocator::ExecuTorchTempAllocator>(1024 * 1024 * 10)
 *
 * Contract (ExecuTorch's MemoryAllocator, as CPUCachingAllocator serves it):
 * - allocate(size, alignment) returns nullptr on failure, never throws; alignment must be a
 *   power of two (0 and non-powers give nullptr). Every power of two is served: up to 2 MiB
 *   directly, larger ones by padding the request and aligning inside the block. Every block is
 *   at least 64-byte aligned. Memory is not zeroed.
 * - allocate(0, alignment) returns a distinct, valid, aligned block (of the smallest size
 *   class), as CPUCachingAllocator does; the C function ca_allocate(a, 0, align) instead
 *   returns a pointer that may be the same for every call.
 * - reset() takes back every block handed out since the last reset, on every thread. It is
 *   thread-safe: other threads may allocate while it runs; a block whose allocate() returned
 *   before reset() began is taken back, one whose allocate() began after reset() returned is
 *   not, and one allocated meanwhile may be either (as with CPUCachingAllocator's mutex, where
 *   it depends on who takes the lock first): order such allocations after the reset.
 * - The destructor frees everything; nothing may use the allocator or its blocks meanwhile.
 *
 * Differences from CPUCachingAllocator, all in the caller's favour:
 * - max_cached_bytes caps the *idle* bytes kept across resets, least recently used evicted
 *   first (CPUCachingAllocator frees everything at reset once its total passes the cap);
 * - sizes are rounded to size classes (under 12.5% waste from 1 KiB), so scratch that grows a
 *   little every call (attention decode) hits the cache instead of missing on every token;
 * - stats() gives hits, misses, live/cached/peak bytes; last_error() says why a call failed;
 * - a temp plan (start_temp_plan, read_temp_plan) reports the scratch of every kernel call,
 *   to size a fixed temp buffer from; trim_to(bytes) shrinks it on an OS memory warning.
 */
#ifndef CACHING_ALLOCATOR_EXECUTORCH_HPP
#define CACHING_ALLOCATOR_EXECUTORCH_HPP

#include <executorch/runtime/core/memory_allocator.h>

#include <cstddef>
#include <cstdint>

#include "caching_allocator.h"

namespace caching_allocator {

/* An executorch::runtime::MemoryAllocator whose blocks come from a caching allocator: use it as
 * a Module's or MemoryManager's temp allocator, which the runtime resets after every kernel. */
class ExecuTorchTempAllocator : public executorch::runtime::MemoryAllocator {
 public:
  /* Keeps up to max_cached_bytes of idle blocks between resets (the argument of
   * CPUCachingAllocator's constructor), and only its working set under that (working_set_slack
   * 1.25: a decode whose scratch grows every token holds its two blocks plus a quarter, not a
   * block per size class); no limit on live memory. */
  explicit ExecuTorchTempAllocator(size_t max_cached_bytes)
      : ExecuTorchTempAllocator(config_with_cap(max_cached_bytes)) {}

  /* Full configuration: cap, hard limit, debug checks, working set (see CaConfig). If the
   * allocator cannot be created, ok() is false, every allocate() returns nullptr and
   * ca_last_error(nullptr) says why. */
  explicit ExecuTorchTempAllocator(const CaConfig& config)
      // No arena of its own: the base class's bump allocator is never used.
      : MemoryAllocator(0, nullptr), a_(ca_create(&config)) {}

  ~ExecuTorchTempAllocator() override { ca_destroy(a_); }

  ExecuTorchTempAllocator(const ExecuTorchTempAllocator&) = delete;
  ExecuTorchTempAllocator& operator=(const ExecuTorchTempAllocator&) = delete;
  ExecuTorchTempAllocator(ExecuTorchTempAllocator&&) = delete;
  ExecuTorchTempAllocator& operator=(ExecuTorchTempAllocator&&) = delete;

  /* A block of at least size bytes aligned to alignment (a power of two), or nullptr; then
   * last_error() on the same thread says why. Thread-safe. */
  void* allocate(size_t size, size_t alignment = kDefaultAlignment) override {
    if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
      // Let the library refuse it, so last_error() explains.
      return ca_allocate(a_, size, alignment);
    }
    // Distinct blocks for size 0, as ExecuTorch's allocators give.
    const size_t request = size == 0 ? 1 : size;
    if (alignment <= kMaxAlign) {
      return ca_allocate(a_, request, alignment);
    }
    // Above the library's largest alignment: a CA_MAX_ALIGN-aligned block with room to align
    // up inside it. The block starts on a CA_MAX_ALIGN boundary, so reaching the next multiple
    // of alignment skips at most alignment - CA_MAX_ALIGN bytes. The pointer handed out is
    // inside the block; reset() takes the whole block back (there is no per-block free).
    const size_t pad = alignment - kMaxAlign;
    if (request > SIZE_MAX - pad) {
      // Then request > PTRDIFF_MAX (pad < SIZE_MAX / 2): the library reports the overflow,
      // naming the size that was asked for.
      return ca_allocate(a_, request, kMaxAlign);
    }
    void* block = ca_allocate(a_, request + pad, kMaxAlign);
    if (block == nullptr) {
      return nullptr;
    }
    const uintptr_t address = reinterpret_cast<uintptr_t>(block);
    const uintptr_t aligned = (address + (alignment - 1)) & ~(uintptr_t{alignment} - 1);
    return static_cast<unsigned char*>(block) + (aligned - address);
  }

  /* Every block handed out since the last reset goes back to the cache. Thread-safe (see the
   * file comment). If debug checks found a block written past its end, it goes back to the
   * system instead and last_error() on this thread names it (CA_STATUS_CORRUPTED). */
  void reset() override { ca_reset(a_); }

  /* A snapshot of the counters (zeros if the allocator could not be created). Thread-safe. */
  CaStats stats() const {
    CaStats s{};
    ca_stats(a_, &s);
    return s;
  }

  /* The calling thread's last failure on this allocator (code CA_STATUS_OK if none): read it
   * right after allocate() returned nullptr. */
  CaError last_error() const { return ca_last_error(a_); }

  /* Gives every idle cached block back to the system (e.g. when the app goes to background). */
  void free_cached() { ca_free_cached(a_); }

  /* Keeps at most keep_bytes of idle blocks, giving back the least recently used. */
  void trim(size_t keep_bytes) { ca_trim(a_, keep_bytes); }

  /* On memory pressure (iOS didReceiveMemoryWarning, Android onTrimMemory): gives idle cached
   * blocks back to the system, least recently used first, until the bytes held (live + idle,
   * CaStats::reserved_bytes) are at most target_bytes. Live blocks, those handed out since the
   * last reset, are never touched: if they alone exceed target_bytes, every idle block goes
   * and the allocator holds just the live ones. Returns the bytes held afterwards (<=
   * target_bytes unless the live ones exceed it). Thread-safe; blocks other threads allocate
   * meanwhile may leave it above the target. trim_to(0) is free_cached() between kernels. */
  size_t trim_to(size_t target_bytes) {
    const size_t live = stats().live_bytes;
    ca_trim(a_, target_bytes > live ? target_bytes - live : 0);
    return stats().reserved_bytes;
  }

  /* Temp plan: from the next reset on, records the scratch high-water mark of every reset
   * interval, which under ExecuTorch's Method (it resets the temp allocator after every
   * instruction, and once before execute) is every kernel call, in the order run; the first
   * `capacity` entries are kept, the maximum covers all. Clears an earlier plan. The buffer is
   * allocated here: recording allocates nothing, and allocate() is the same with or without a
   * plan. Returns false if the buffer could not be allocated (last_error() says why). */
  bool start_temp_plan(size_t capacity) { return ca_plan_start(a_, capacity) == CA_STATUS_OK; }

  /* Stops recording; the plan stays readable. */
  void stop_temp_plan() { ca_plan_stop(a_); }

  /* The plan's summary (entries stored, intervals, dropped, the maximum: the temp bytes the
   * program needs, in the allocator's block bytes), with its first peaks_len entries copied
   * into peaks (which may be nullptr when peaks_len is 0). */
  CaPlanInfo read_temp_plan(size_t* peaks = nullptr, size_t peaks_len = 0) const {
    CaPlanInfo info{};
    ca_plan_read(a_, peaks, peaks_len, &info);
    return info;
  }

  /* Whether the allocator was created; false only after a failed ca_create. */
  bool ok() const { return a_ != nullptr; }

  /* The C handle, for the other ca_* functions. Not to be destroyed by the caller. */
  CaAllocator* handle() const { return a_; }

 private:
  static constexpr size_t kMaxAlign = CA_MAX_ALIGN;

  static CaConfig config_with_cap(size_t max_cached_bytes) {
    CaConfig config = ca_config_default();
    config.max_cached_bytes = max_cached_bytes;
    // A temp allocator reset after every kernel: keep the working set, not one block per
    // size class the runner ever asked for (see CaConfig::working_set_slack).
    config.working_set_slack = 1.25;
    // The adaptive arena stays on (the default): a kernel's one or two large buffers are
    // bumped through the thread's chunk with its small ones.
    return config;
  }

  CaAllocator* const a_;
};

}  // namespace caching_allocator

#endif  // CACHING_ALLOCATOR_EXECUTORCH_HPP
