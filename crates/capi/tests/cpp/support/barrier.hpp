// A reusable thread barrier for the C++ example and tests (std::barrier is C++20; the
// adapter targets C++17).
#pragma once

#include <condition_variable>
#include <mutex>

class Barrier {
 public:
  explicit Barrier(int count) : count_(count) {}

  // Blocks until `count` threads have called wait() in this generation.
  void wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const unsigned long generation = generation_;
    if (++arrived_ == count_) {
      arrived_ = 0;
      generation_++;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation_ != generation; });
    }
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  int count_;
  int arrived_ = 0;
  unsigned long generation_ = 0;
};
