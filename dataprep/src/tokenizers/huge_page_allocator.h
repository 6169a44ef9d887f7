// An allocator for large tables read at random (the tokenizers' merge and piece
// tables, megabytes each): whole 2 MB pages, which Linux backs with transparent huge
// pages when asked (madvise). With 4 kB pages nearly every look-up into a cold table
// also misses the TLB, and waits for a page walk before its cache miss. Blocks
// smaller than a huge page are allocated as usual.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <new>

namespace dufu::dataprep {

template <typename T>
struct HugePageAllocator {
  using value_type = T;
  static constexpr std::size_t kHugePage = std::size_t{2} << 20;

  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) {}

  T* allocate(std::size_t count) {
    const std::size_t bytes = count * sizeof(T);
    if (bytes < kHugePage) return static_cast<T*>(::operator new(bytes));
    const std::size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    void* memory = std::aligned_alloc(kHugePage, rounded);
    if (memory == nullptr) throw std::bad_alloc();
    // Advice only: where the kernel has no huge pages, 4 kB pages serve as before.
    madvise(memory, rounded, MADV_HUGEPAGE);
    return static_cast<T*>(memory);
  }
  void deallocate(T* memory, std::size_t count) {
    if (count * sizeof(T) < kHugePage) {
      ::operator delete(memory);
    } else {
      std::free(memory);
    }
  }
  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const {
    return true;
  }
};

}  // namespace dufu::dataprep
