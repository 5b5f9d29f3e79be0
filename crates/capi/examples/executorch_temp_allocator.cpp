// ExecuTorch's temp allocator from caching-allocator: a kernel-like loop on two threads.
//
// ExecuTorch hands kernels a `MemoryAllocator` for scratch ("temp") memory and calls `reset()`
// on it after each kernel. `caching_allocator::ExecuTorchTempAllocator`
// (include/caching_allocator_executorch.hpp) is such an allocator; with ExecuTorch it derives
// from the real `executorch::runtime::MemoryAllocator`, here from the stand-in in
// tests/cpp/executorch_standin/ (same interface). `main` runs a kernel-like loop on two threads
// sharing one allocator: both allocate concurrently inside a "kernel", then one thread resets
// while the other waits at a barrier (so no block of the finished kernel is used after), and
// every block is checked to be distinct, aligned and writable.
//
// Built and run by `cargo test -p caching-allocator-capi` (tests/c_examples.rs) with -std=c++17
// -Wall -Wextra -Werror, against the shared library and under -fsanitize=address,undefined.
#include <caching_allocator_executorch.hpp>

#include <algorithm>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "barrier.hpp"  // tests/cpp/support: std::barrier is C++20

using caching_allocator::ExecuTorchTempAllocator;
using executorch::runtime::MemoryAllocator;

struct Block {
    unsigned char* ptr;
    size_t size;
    size_t alignment;
    unsigned char pattern;
};

constexpr int kThreads = 2;
constexpr int kIterations = 200;
constexpr int kBlocksPerKernel = 6;

int main() {
    CaConfig config = ca_config_default();
    config.max_cached_bytes = 8 << 20;
    config.debug_checks = true;  // any overrun would come back as CA_STATUS_CORRUPTED
    ExecuTorchTempAllocator temp(config);
    MemoryAllocator& allocator = temp;  // kernels only see the ExecuTorch interface

    Barrier barrier(kThreads);
    std::vector<Block> blocks[kThreads];
    int failures[kThreads] = {0, 0};

    auto worker = [&](int t) {
        for (int iter = 0; iter < kIterations; iter++) {
            // The "kernel": scratch whose sizes change a little from call to call, as attention
            // decode's grow with the sequence.
            blocks[t].clear();
            for (int i = 0; i < kBlocksPerKernel; i++) {
                const size_t size = 256 + static_cast<size_t>(i) * 1500 + iter * 8 + t * 64;
                const size_t alignment = size_t{16} << (i % 6);  // 16 .. 512
                auto* p = static_cast<unsigned char*>(allocator.allocate(size, alignment));
                if (p == nullptr) {
                    failures[t]++;
                    continue;
                }
                const auto pattern = static_cast<unsigned char>(t * 100 + i * 10 + iter % 7);
                std::memset(p, pattern, size);  // writable, every byte
                blocks[t].push_back(Block{p, size, alignment, pattern});
            }
            barrier.wait();  // both kernels done: blocks of both threads are live together
            if (t == 0) {
                std::vector<Block> all(blocks[0]);
                all.insert(all.end(), blocks[1].begin(), blocks[1].end());
                std::sort(all.begin(), all.end(),
                          [](const Block& a, const Block& b) { return a.ptr < b.ptr; });
                for (size_t i = 0; i < all.size(); i++) {
                    const Block& b = all[i];
                    if (reinterpret_cast<uintptr_t>(b.ptr) % b.alignment != 0) {
                        std::fprintf(stderr, "block %p not aligned to %zu\n",
                                     static_cast<void*>(b.ptr), b.alignment);
                        failures[0]++;
                    }
                    if (i + 1 < all.size() && b.ptr + b.size > all[i + 1].ptr) {
                        std::fprintf(stderr, "blocks %p and %p overlap\n",
                                     static_cast<void*>(b.ptr), static_cast<void*>(all[i + 1].ptr));
                        failures[0]++;
                    }
                    for (size_t j = 0; j < b.size; j++) {
                        if (b.ptr[j] != b.pattern) {  // another block wrote into this one
                            std::fprintf(stderr, "block %p byte %zu overwritten\n",
                                         static_cast<void*>(b.ptr), j);
                            failures[0]++;
                            break;
                        }
                    }
                }
                if (all.size() != kThreads * kBlocksPerKernel) {
                    failures[0]++;
                }
                allocator.reset();  // between kernels: the other thread waits at the barrier
            }
            barrier.wait();
        }
    };

    std::thread other(worker, 1);
    worker(0);
    other.join();

    const CaStats s = temp.stats();
    const uint64_t requests = uint64_t{kThreads} * kIterations * kBlocksPerKernel;
    std::printf("executorch_temp_allocator: %llu requests, %llu hits, %llu system allocations, "
                "%zu bytes cached\n",
                static_cast<unsigned long long>(s.hits + s.misses),
                static_cast<unsigned long long>(s.hits),
                static_cast<unsigned long long>(s.system_allocs), s.cached_bytes);
    int failed = failures[0] + failures[1];
    if (s.hits + s.misses != requests) failed++;
    if (s.live_blocks != 0) failed++;
    if (s.corrupted_blocks != 0) failed++;
    // Size classes absorb the growth: most requests reuse cached blocks.
    if (s.hits < requests * 9 / 10) {
        std::fprintf(stderr, "hit rate too low: %llu of %llu\n",
                     static_cast<unsigned long long>(s.hits),
                     static_cast<unsigned long long>(requests));
        failed++;
    }
    std::printf("executorch_temp_allocator: %s\n", failed == 0 ? "ok" : "FAILED");
    return failed == 0 ? 0 : 1;
}
