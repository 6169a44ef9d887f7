// A test Device that hands every operation to the CPU device: a test derives from it
// and overrides what it changes (a kernel table with an entry missing, counted
// allocations), and everything else behaves, bit for bit, as the CPU device.
#pragma once

#include <cstddef>
#include <string>

#include "dufu/trainer/device/device.h"

namespace dufu::testing {

class ForwardingCpuDevice : public trainer::Device {
 public:
  trainer::DeviceKind kind() const override { return cpu().kind(); }
  std::string describe() const override { return cpu().describe(); }
  MemorySpace memory_space() const override { return cpu().memory_space(); }
  const trainer::KernelTable& kernels() const override { return cpu().kernels(); }
  void* allocate(std::size_t bytes) override { return cpu().allocate(bytes); }
  void release(void* memory) noexcept override { cpu().release(memory); }
  void upload(void* to, const void* from, std::size_t bytes) override { cpu().upload(to, from, bytes); }
  void download(void* to, const void* from, std::size_t bytes) override { cpu().download(to, from, bytes); }
  void copy(void* to, const void* from, std::size_t bytes) override { cpu().copy(to, from, bytes); }
  void fill(float* to, float value, std::size_t count) override { cpu().fill(to, value, count); }
  void zero(void* to, std::size_t bytes) override { cpu().zero(to, bytes); }
  void synchronize() override { cpu().synchronize(); }
  double memory_capacity_bytes() const override { return cpu().memory_capacity_bytes(); }
  double scratch_bytes(const trainer::StepShapes& shapes) const override { return cpu().scratch_bytes(shapes); }

 protected:
  static trainer::Device& cpu() { return trainer::cpu_device(); }
};

}  // namespace dufu::testing
