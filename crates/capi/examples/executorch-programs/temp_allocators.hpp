// The temp allocators the runner compares, besides ExecuTorch's own (MallocMemoryAllocator,
// PlatformMemoryAllocator) and the project's ExecuTorchTempAllocator:
// - ExactSizeCache: ExecuTorch's CPUCachingAllocator design (extension/memory_allocator/
//   cpu_caching_malloc_allocator.h, not in the wheel), re-implemented from its description:
//   exact padded-size keys, one mutex, reset() frees everything once the bytes ever malloc'd
//   pass the cap, else keeps them all for reuse;
// - Counting: wraps any of them to count calls, failed calls and each reset interval's
//   requested bytes, identically for all.
#ifndef CA_EXAMPLE_TEMP_ALLOCATORS_HPP
#define CA_EXAMPLE_TEMP_ALLOCATORS_HPP

#include <caching_allocator_executorch.hpp>
#include <executorch/runtime/core/memory_allocator.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace ca_example {

class ExactSizeCache final : public executorch::runtime::MemoryAllocator {
 public:
  explicit ExactSizeCache(uint32_t max_size) : MemoryAllocator(0, nullptr), max_size_(max_size) {}
  ~ExactSizeCache() override { free_everything(); }
  ExactSizeCache(const ExactSizeCache&) = delete;
  ExactSizeCache& operator=(const ExactSizeCache&) = delete;

  void* allocate(size_t size, size_t alignment = kDefaultAlignment) override {
    if (alignment == 0 || (alignment & (alignment - 1)) != 0) return nullptr;
    alignment = std::max<size_t>(alignment, 64);
    if (size > SIZE_MAX - alignment) return nullptr;
    const size_t padded = size + alignment - 1;  // the cache key, matched exactly
    std::lock_guard<std::mutex> lock(mutex_);
    void* base = nullptr;
    auto idle = idle_.find(padded);
    if (idle != idle_.end() && !idle->second.empty()) {
      base = idle->second.back();
      idle->second.pop_back();
    } else {
      base = std::malloc(padded);
      if (base == nullptr) return nullptr;
      total_ += padded;
    }
    live_.emplace(base, padded);
    const uintptr_t p = reinterpret_cast<uintptr_t>(base);
    return reinterpret_cast<void*>((p + alignment - 1) & ~(uintptr_t{alignment} - 1));
  }

  void reset() override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (total_ > max_size_) {
      free_everything();
      return;
    }
    for (const auto& [base, padded] : live_) idle_[padded].push_back(base);
    live_.clear();
  }

 private:
  void free_everything() {
    for (const auto& [base, padded] : live_) std::free(base);
    for (auto& [padded, bases] : idle_) {
      for (void* base : bases) std::free(base);
    }
    live_.clear();
    idle_.clear();
    total_ = 0;
  }

  const uint32_t max_size_;
  std::mutex mutex_;
  std::unordered_map<size_t, std::vector<void*>> idle_;
  std::unordered_map<void*, size_t> live_;
  size_t total_ = 0;  // bytes malloc'd and not freed: live + idle
};

// Forwards to another temp allocator and counts: calls, failed calls, and the bytes asked for
// in each reset interval (the largest is the temp high-water mark the table prints).
class Counting final : public executorch::runtime::MemoryAllocator {
 public:
  explicit Counting(MemoryAllocator& inner) : MemoryAllocator(0, nullptr), inner_(inner) {}

  void* allocate(size_t size, size_t alignment = kDefaultAlignment) override {
    calls_++;
    void* p = inner_.allocate(size, alignment);
    if (p == nullptr) {
      failed_++;
    } else {
      interval_bytes_ += size;
      peak_interval_bytes_ = std::max(peak_interval_bytes_, interval_bytes_);
    }
    return p;
  }

  void reset() override {
    inner_.reset();
    interval_bytes_ = 0;
    if (watched_ != nullptr) {
      stats_max_interval_peak_ =
          std::max(stats_max_interval_peak_, watched_->stats().last_interval_peak_bytes);
    }
  }

  // After every reset, reads the caching allocator's last_interval_peak_bytes and keeps the
  // largest: what the temp plan's maximum must equal (the runner's --plan mode).
  void watch_interval_peaks(const caching_allocator::ExecuTorchTempAllocator* a) { watched_ = a; }
  size_t stats_max_interval_peak() const { return stats_max_interval_peak_; }

  uint64_t calls() const { return calls_; }
  uint64_t failed() const { return failed_; }
  size_t peak_interval_bytes() const { return peak_interval_bytes_; }

 private:
  MemoryAllocator& inner_;
  const caching_allocator::ExecuTorchTempAllocator* watched_ = nullptr;
  size_t stats_max_interval_peak_ = 0;
  uint64_t calls_ = 0;
  uint64_t failed_ = 0;
  size_t interval_bytes_ = 0;
  size_t peak_interval_bytes_ = 0;
};

}  // namespace ca_example

#endif
