// A test device that catches host code reading or writing device memory: the CPU
// kernels over memory that is mapped PROT_NONE except while one of the device's own
// kernels or copy operations runs. Code that touches params(), grads(), the AdamW
// moments or the logits as host memory (instead of staging them through
// download/upload, as it must for a GPU) dies with SIGSEGV here, on a machine without
// a GPU. Results are bitwise the CPU device's: the same kernels run.
//
// Every KernelTable entry is wrapped generically from kernel_list.h's X-macro list,
// so an op added to the table is guarded without touching this file.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "../../trainer/src/device/kernel_list.h"
#include "dufu/common/error.h"
#include "dufu/trainer/device/device.h"

namespace dufu::testing {

class GuardedDevice;
GuardedDevice& guarded_device();

// Every live allocation of the guarded device, and whether they are open (readable
// and writable) right now.
class GuardedMemory {
 public:
  static GuardedMemory& instance() {
    static GuardedMemory memory;
    return memory;
  }
  void* map(std::size_t bytes) {
    const std::size_t page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    const std::size_t length = (bytes + page - 1) / page * page + page;  // never 0
    void* memory = ::mmap(nullptr, length, open_depth_ > 0 ? PROT_READ | PROT_WRITE : PROT_NONE,
                          MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) DUFU_FAIL("guarded device: mmap of ", length, " bytes failed");
    regions_[memory] = length;
    ++allocations_;
    return memory;
  }
  void unmap(void* memory) noexcept {
    const auto found = regions_.find(memory);
    if (found == regions_.end()) return;
    ::munmap(found->first, found->second);
    regions_.erase(found);
  }
  // Allocations made since the process started (a step must add none).
  std::size_t allocations() const { return allocations_; }

  // Opens every region for the scope of one kernel or copy (nested scopes allowed).
  class Open {
   public:
    Open() { GuardedMemory::instance().protect_all(+1); }
    ~Open() { GuardedMemory::instance().protect_all(-1); }
    Open(const Open&) = delete;
    Open& operator=(const Open&) = delete;
  };

 private:
  void protect_all(int delta) {
    const int before = open_depth_;
    open_depth_ += delta;
    if ((before == 0) == (open_depth_ == 0)) return;
    const int protection = open_depth_ > 0 ? PROT_READ | PROT_WRITE : PROT_NONE;
    for (const auto& [memory, length] : regions_) {
      if (::mprotect(memory, length, protection) != 0) {
        std::fprintf(stderr, "guarded device: mprotect failed\n");
        std::abort();
      }
    }
  }
  std::map<void*, std::size_t> regions_;
  std::size_t allocations_ = 0;
  int open_depth_ = 0;
};

// One table entry: opens the memory, calls the CPU kernel of the same entry, closes it.
template <auto Entry, typename Function>
struct GuardedKernel;
template <auto Entry, typename Result, typename... Args>
struct GuardedKernel<Entry, Result (*)(Args...)> {
  static Result call(Args... args) {
    const GuardedMemory::Open open;
    return (trainer::cpu_device().kernels().*Entry)(args...);
  }
};

#define DUFU_GUARDED_KERNEL_ENTRY(name) \
  .name = &GuardedKernel<&trainer::KernelTable::name, decltype(trainer::KernelTable::name)>::call,

class GuardedDevice final : public trainer::Device {
 public:
  trainer::DeviceKind kind() const override { return trainer::DeviceKind::kCpu; }
  std::string describe() const override { return "guarded cpu (device memory PROT_NONE outside kernels)"; }
  MemorySpace memory_space() const override { return MemorySpace::kHost; }
  const trainer::KernelTable& kernels() const override {
    static const trainer::KernelTable table{DUFU_KERNEL_OPS(DUFU_GUARDED_KERNEL_ENTRY)};
    return table;
  }
  void* allocate(std::size_t bytes) override { return GuardedMemory::instance().map(bytes); }
  void release(void* memory) noexcept override { GuardedMemory::instance().unmap(memory); }
  void upload(void* device_destination, const void* host_source, std::size_t bytes) override {
    const GuardedMemory::Open open;
    cpu().upload(device_destination, host_source, bytes);
  }
  void download(void* host_destination, const void* device_source, std::size_t bytes) override {
    const GuardedMemory::Open open;
    cpu().download(host_destination, device_source, bytes);
  }
  void copy(void* device_destination, const void* device_source, std::size_t bytes) override {
    const GuardedMemory::Open open;
    cpu().copy(device_destination, device_source, bytes);
  }
  void fill(float* device_destination, float value, std::size_t count) override {
    const GuardedMemory::Open open;
    cpu().fill(device_destination, value, count);
  }
  void zero(void* device_destination, std::size_t bytes) override {
    const GuardedMemory::Open open;
    cpu().zero(device_destination, bytes);
  }
  void synchronize() override {}
  double memory_capacity_bytes() const override { return cpu().memory_capacity_bytes(); }
  double scratch_bytes(const trainer::StepShapes& shapes) const override { return cpu().scratch_bytes(shapes); }

 private:
  static trainer::Device& cpu() { return trainer::cpu_device(); }
};

inline GuardedDevice& guarded_device() {
  static GuardedDevice device;
  return device;
}

}  // namespace dufu::testing
