// The seam between the model and the hardware it runs on, the way ggml and llm.c keep
// backends apart: a Device owns memory, moves bytes between it and the host, and
// carries the table of kernels that run on that memory (kernel_table.h). GPT, the
// optimizer and the tests are written against a Device; the CPU backend
// (src/cpu/, namespace dufu::trainer::cpu) is one, and a CUDA backend fills in the
// same table in src/cuda/, so both link into one binary and one test runs every op on
// each.
//
// Device memory is reached only through the device: a pointer from allocate() or a
// DeviceBuffer goes to kernels, collectives of a communicator with the same
// memory_space(), and the copy operations below. On the CPU device it is host memory,
// but no code outside the kernels reads it directly: checkpoints, generation and
// export download or upload it (trainer/src/host_staging.h), as they must on a GPU.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dufu/common/communicator.h"
#include "dufu/common/error.h"
#include "dufu/trainer/kernel_table.h"

namespace dufu::trainer {

enum class DeviceKind { kCpu, kCuda };

const char* device_kind_name(DeviceKind kind);  // "cpu", "cuda"
// "cpu" or "cuda"; throws dufu::Error naming the choices for anything else.
DeviceKind parse_device_kind(std::string_view name);

class Device {
 public:
  virtual ~Device() = default;
  Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  virtual DeviceKind kind() const = 0;
  // For logs and messages, e.g. "cpu (2 OpenMP threads)".
  virtual std::string describe() const = 0;
  // Where its memory lives: communicators whose collectives move it have the same.
  virtual MemorySpace memory_space() const = 0;
  virtual const KernelTable& kernels() const = 0;

  // `bytes` of device memory, aligned to 64 bytes, contents undefined (0 bytes gives
  // a valid pointer too). Throws dufu::Error naming the device and the size when
  // there is not enough memory. release() takes what allocate() returned, or null.
  virtual void* allocate(std::size_t bytes) = 0;
  virtual void release(void* memory) noexcept = 0;

  // Copies in issue order with the kernels: upload and copy may still be running when
  // they return on an asynchronous device; download returns when the bytes are on
  // the host.
  virtual void upload(void* device_destination, const void* host_source, std::size_t bytes) = 0;
  virtual void download(void* host_destination, const void* device_source, std::size_t bytes) = 0;
  virtual void copy(void* device_destination, const void* device_source, std::size_t bytes) = 0;
  // count floats set to value; and bytes set to zero, for buffers of any type.
  virtual void fill(float* device_destination, float value, std::size_t count) = 0;
  virtual void zero(void* device_destination, std::size_t bytes) = 0;
  // Returns when every kernel and copy issued so far has finished.
  virtual void synchronize() = 0;

  // The bytes this process can still allocate on the device, for checking a memory
  // plan before anything is allocated: on the CPU device the host's limit (physical
  // memory plus swap, or a lower rlimit: training_memory.h's memory_limit_bytes), on a
  // GPU its free memory. (Pure, so that the class keeps no key function: the CUDA
  // module, loaded with dlopen, needs its type information inline.)
  virtual double memory_capacity_bytes() const = 0;
};

// The process's CPU device: OpenMP threads over host memory.
Device& cpu_device();

// Whether a kind of device can run here: built into this binary and present on this
// machine. `reason` says why not, for the one-line error or the skipped test.
struct DeviceAvailability {
  bool available = false;
  std::string reason;
};
DeviceAvailability device_availability(DeviceKind kind);
// The device of that kind (the first one, for GPUs); throws dufu::Error with
// device_availability's reason when there is none.
Device& device_of_kind(DeviceKind kind);

// `count` elements of T in one device's memory, zeroed at creation; owns it (move
// only) and releases it when destroyed.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Device& device, std::size_t count)
      : device_(&device), data_(static_cast<T*>(device.allocate(count * sizeof(T)))), count_(count) {
    device.zero(data_, count * sizeof(T));
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : device_(std::exchange(other.device_, nullptr)),
        data_(std::exchange(other.data_, nullptr)),
        count_(std::exchange(other.count_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      device_ = std::exchange(other.device_, nullptr);
      data_ = std::exchange(other.data_, nullptr);
      count_ = std::exchange(other.count_, 0);
    }
    return *this;
  }
  ~DeviceBuffer() { reset(); }

  // Releases the memory now; the buffer is then empty.
  void reset() noexcept {
    if (device_ != nullptr) device_->release(data_);
    device_ = nullptr;
    data_ = nullptr;
    count_ = 0;
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return count_; }
  bool empty() const { return count_ == 0; }
  // Views of device memory, for kernels and collectives (see the top of this file).
  std::span<T> span() { return {data_, count_}; }
  std::span<const T> span() const { return {data_, count_}; }

  // The first host.size() elements from the host; the rest are left as they are.
  void upload(std::span<const T> host) {
    DUFU_CHECK(host.size() <= count_, "upload of ", host.size(), " elements into a device buffer of ", count_);
    if (!host.empty()) device_->upload(data_, host.data(), host.size() * sizeof(T));
  }
  // The first host.size() elements to the host.
  void download(std::span<T> host) const {
    DUFU_CHECK(host.size() <= count_, "download of ", host.size(), " elements from a device buffer of ", count_);
    if (!host.empty()) device_->download(host.data(), data_, host.size() * sizeof(T));
  }
  std::vector<T> to_host() const {
    std::vector<T> host(count_);
    download(host);
    return host;
  }

 private:
  Device* device_ = nullptr;
  T* data_ = nullptr;
  std::size_t count_ = 0;
};

}  // namespace dufu::trainer
