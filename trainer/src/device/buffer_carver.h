// Carves one device buffer into tensors: each want() reserves a slot, allocate() sizes
// the buffer once and points every slot into it. The model's activations are carved
// this way, so a slot of micro-batch activations is one allocation.
//
// Every slot starts kTensorAlignmentBytes (256) past the buffer's start or a multiple
// of it, whatever the sizes before it (an odd prompt length gives N-float LayerNorm
// statistics of 4 N bytes): with the device's allocation aligned so, every tensor is
// what cuBLASLt's fastest kernels and vectorised loads want.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "dufu/trainer/device/device.h"

namespace dufu::trainer::detail {

// `count` elements of T rounded up to whole kTensorAlignmentBytes.
template <typename T>
constexpr std::size_t aligned_count(std::size_t count) {
  static_assert(kTensorAlignmentBytes % sizeof(T) == 0);
  constexpr std::size_t kStep = kTensorAlignmentBytes / sizeof(T);
  return (count + kStep - 1) / kStep * kStep;
}

template <typename T>
class BufferCarver {
 public:
  void want(T*& slot, std::size_t count) { slots_.emplace_back(&slot, count); }
  // Each slot's offset from the buffer's start, in elements, in want() order.
  std::vector<std::size_t> offsets() const {
    std::vector<std::size_t> result;
    std::size_t next = 0;
    for (const auto& slot : slots_) {
      result.push_back(next);
      next += aligned_count<T>(slot.second);
    }
    return result;
  }
  // Elements of the whole buffer.
  std::size_t total() const {
    std::size_t sum = 0;
    for (const auto& slot : slots_) sum += aligned_count<T>(slot.second);
    return sum;
  }
  void allocate(Device& device, DeviceBuffer<T>& memory) {
    // Release the old buffer first so growing does not briefly need both.
    memory.reset();
    memory = DeviceBuffer<T>(device, total());
    const std::vector<std::size_t> at = offsets();
    for (std::size_t i = 0; i < slots_.size(); ++i) *slots_[i].first = memory.data() + at[i];
  }

 private:
  std::vector<std::pair<T**, std::size_t>> slots_;
};

}  // namespace dufu::trainer::detail
