// Carves one device buffer into tensors: each want() reserves a slot, allocate() sizes
// the buffer once and points every slot into it. The model's activations are carved
// this way, so a slot of micro-batch activations is one allocation.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "dufu/trainer/device.h"

namespace dufu::trainer::detail {

template <typename T>
class BufferCarver {
 public:
  void want(T*& slot, std::size_t count) { slots_.emplace_back(&slot, count); }
  void allocate(Device& device, DeviceBuffer<T>& memory) {
    std::size_t total = 0;
    for (const auto& slot : slots_) total += slot.second;
    // Release the old buffer first so growing does not briefly need both.
    memory.reset();
    memory = DeviceBuffer<T>(device, total);
    T* next = memory.data();
    for (const auto& [slot, count] : slots_) {
      *slot = next;
      next += count;
    }
  }

 private:
  std::vector<std::pair<T**, std::size_t>> slots_;
};

}  // namespace dufu::trainer::detail
