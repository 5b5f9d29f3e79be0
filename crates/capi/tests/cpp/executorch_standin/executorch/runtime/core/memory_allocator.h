// A stand-in for ExecuTorch's <executorch/runtime/core/memory_allocator.h>, written from its
// public interface (pytorch/executorch, runtime/core/memory_allocator.h) so the adapter
// caching_allocator_executorch.hpp can be compiled and tested without ExecuTorch. Same class
// name and namespace, same constructor, same virtual functions with the same signatures and
// default argument, same helpers; the base allocate() is a plain bump allocator as upstream's
// is, without the logging and profiling macros.
#pragma once

#include <cstddef>
#include <cstdint>

namespace executorch {
namespace runtime {

class MemoryAllocator {
 public:
  static constexpr size_t kDefaultAlignment = alignof(void*);

  MemoryAllocator(uint32_t size, uint8_t* base_address)
      : begin_(base_address), end_(base_address + size), cur_(base_address), size_(size) {}

  // nullptr when out of space or when alignment is not a power of two.
  virtual void* allocate(size_t size, size_t alignment = kDefaultAlignment) {
    if (!isPowerOf2(alignment)) {
      return nullptr;
    }
    uint8_t* start = alignPointer(cur_, alignment);
    if (start > end_ || size > static_cast<size_t>(end_ - start)) {
      return nullptr;
    }
    cur_ = start + size;
    return start;
  }

  template <typename T>
  T* allocateInstance(size_t alignment = alignof(T)) {
    return static_cast<T*>(this->allocate(sizeof(T), alignment));
  }

  template <typename T>
  T* allocateList(size_t size, size_t alignment = alignof(T)) {
    return static_cast<T*>(this->allocate(size * sizeof(T), alignment));
  }

  virtual uint8_t* base_address() const { return begin_; }
  virtual uint32_t size() const { return size_; }
  virtual void reset() { cur_ = begin_; }

  virtual ~MemoryAllocator() {}

 protected:
  static bool isPowerOf2(size_t value) { return value > 0 && (value & (value - 1)) == 0; }

  static uint8_t* alignPointer(void* ptr, size_t alignment) {
    const uintptr_t address = reinterpret_cast<uintptr_t>(ptr);
    const uintptr_t aligned = (address + alignment - 1) & ~(uintptr_t{alignment} - 1);
    return reinterpret_cast<uint8_t*>(aligned);
  }

 private:
  uint8_t* const begin_;
  uint8_t* const end_;
  uint8_t* cur_;
  uint32_t const size_;
};

}  // namespace runtime
}  // namespace executorch
