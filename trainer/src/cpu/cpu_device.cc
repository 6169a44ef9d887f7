// The CPU device: host memory from the C++ allocator, copies as memcpy, and the table
// of this folder's kernels. Everything runs synchronously on the calling thread and
// OpenMP's threads, so synchronize() has nothing to wait for.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <string>

#include "cpu_kernels.h"
#include "dufu/common/error.h"
#include "dufu/trainer/device/device.h"
#include "dufu/trainer/device/memory_limit.h"

namespace dufu::trainer {
namespace cpu {

const KernelTable& kernel_table() {
  static const KernelTable table{DUFU_KERNEL_OPS(DUFU_KERNEL_TABLE_ENTRY)};

  return table;
}

namespace {

constexpr std::align_val_t kAlignment{kTensorAlignmentBytes};

class CpuDevice final : public Device {
 public:
  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string describe() const override { return str_cat("cpu (", omp_get_max_threads(), " OpenMP threads)"); }
  MemorySpace memory_space() const override { return MemorySpace::kHost; }
  const KernelTable& kernels() const override { return kernel_table(); }

  void* allocate(std::size_t bytes) override {
    void* memory = ::operator new(bytes == 0 ? 1 : bytes, kAlignment, std::nothrow);
    if (memory == nullptr) DUFU_FAIL("not enough memory on the cpu device for ", bytes, " bytes");
    return memory;
  }
  void release(void* memory) noexcept override {
    if (memory != nullptr) ::operator delete(memory, kAlignment);
  }

  void upload(void* device_destination, const void* host_source, std::size_t bytes) override {
    std::memcpy(device_destination, host_source, bytes);
  }
  void download(void* host_destination, const void* device_source, std::size_t bytes) override {
    std::memcpy(host_destination, device_source, bytes);
  }
  void copy(void* device_destination, const void* device_source, std::size_t bytes) override {
    std::memmove(device_destination, device_source, bytes);
  }
  void fill(float* device_destination, float value, std::size_t count) override {
    std::fill_n(device_destination, count, value);
  }
  void zero(void* device_destination, std::size_t bytes) override { std::memset(device_destination, 0, bytes); }
  void synchronize() override {}
  double memory_capacity_bytes() const override { return memory_limit_bytes(); }
  // The bf16 matmuls' widened operands, kept at the largest product's size.
  double scratch_bytes(const StepShapes& shapes) const override {
    if (!shapes.bf16_operands) return 0.0;
    std::size_t floats = 0;
    for (const MatmulShape& m : shapes.matmuls) {
      floats = std::max(floats, widened_operand_floats(static_cast<std::size_t>(m.rows),
                                                       static_cast<std::size_t>(m.inputs),
                                                       static_cast<std::size_t>(m.outputs)));
    }
    return static_cast<double>(floats) * sizeof(float);
  }
};

}  // namespace
}  // namespace cpu

Device& cpu_device() {
  static cpu::CpuDevice device;
  return device;
}

}  // namespace dufu::trainer
