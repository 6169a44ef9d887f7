// The CPU device, counting the bytes its live allocations asked for: what a model
// allocates, measured against the memory plan's estimate.
#pragma once

#include <cstddef>
#include <map>
#include <string>

#include "support/forwarding_cpu_device.h"

namespace dufu::testing {

class CountingCpuDevice final : public ForwardingCpuDevice {
 public:
  std::string describe() const override { return "counting cpu"; }
  void* allocate(std::size_t bytes) override {
    void* memory = cpu().allocate(bytes);
    sizes_[memory] = bytes;
    live_ += bytes;
    peak_ = live_ > peak_ ? live_ : peak_;
    return memory;
  }
  void release(void* memory) noexcept override {
    const auto found = sizes_.find(memory);
    if (found != sizes_.end()) {
      live_ -= found->second;
      sizes_.erase(found);
    }
    cpu().release(memory);
  }
  std::size_t live_bytes() const { return live_; }
  std::size_t peak_bytes() const { return peak_; }
  // From now on the peak counts from what is live now (after a set-up to leave out).
  void reset_peak() { peak_ = live_; }

 private:
  std::map<void*, std::size_t> sizes_;
  std::size_t live_ = 0;
  std::size_t peak_ = 0;
};

}  // namespace dufu::testing
