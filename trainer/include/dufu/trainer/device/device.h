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
// export download or upload it (trainer/src/checkpoint/host_staging.h), as they must on a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dufu/common/communicator.h"
#include "dufu/common/error.h"
#include "dufu/trainer/device/kernel_table.h"

namespace dufu::trainer {

enum class DeviceKind { kCpu, kCuda };

const char* device_kind_name(DeviceKind kind);  // "cpu", "cuda"
// "cpu" or "cuda"; throws dufu::Error naming the choices for anything else.
DeviceKind parse_device_kind(std::string_view name);

// Every device allocation starts on a multiple of this, and BufferCarver starts every
// tensor it carves on one: the alignment cuBLASLt's fastest kernels want of their
// operands (and cudaMalloc's own). A tensor that is not so aligned still works; the
// CUDA matmuls tell cuBLASLt its real alignment (cuda/lt_algorithm_choice.h).
inline constexpr std::size_t kTensorAlignmentBytes = 256;

// One matrix product of a training step: out [rows, outputs] = x [rows, inputs] ·
// weight [outputs, inputs]^T, plus a bias when `bias` (so its backward sums columns).
struct MatmulShape {
  std::int64_t rows = 0;
  std::int64_t inputs = 0;
  std::int64_t outputs = 0;
  bool bias = false;
};

// What a training step's kernels work on, for Device::scratch_bytes: every distinct
// matmul, the rows and width of the LayerNorms, the parameters whose gradient norm is
// taken, whether the matmuls read bf16 operands (the bf16 recipe), and the rows times
// the rank's attention heads (0 on a stage without layers).
struct StepShapes {
  std::vector<MatmulShape> matmuls = {};
  std::int64_t rows = 0;
  std::int64_t width = 0;
  std::int64_t parameters = 0;
  bool bf16_operands = false;
  std::int64_t attention_row_heads = 0;
};

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

  // `bytes` of device memory, aligned to kTensorAlignmentBytes, contents undefined (0 bytes gives
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
  // memory plus swap, or a lower rlimit: memory_limit.h's memory_limit_bytes), on a
  // GPU its free memory. (Pure, so that the class keeps no key function: the CUDA
  // module, loaded with dlopen, needs its type information inline.)
  virtual double memory_capacity_bytes() const = 0;
  // The memory the device itself takes for a step of `shapes` beyond the tensors it is
  // given: the scratch its kernels keep (grow-only buffers, library workspaces), at
  // its largest over the step. The memory plan adds it, so a plan that fits leaves
  // room for it; memory_capacity_bytes() counts what of it is already held as free.
  virtual double scratch_bytes(const StepShapes& shapes) const = 0;
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
// The device of that kind (for GPUs the one choose_gpu picks for this process);
// throws dufu::Error with device_availability's or choose_gpu's reason when there is
// none.
Device& device_of_kind(DeviceKind kind);

// The CUDA device's bf16 GEMM throughput in FLOP/s: cuBLASLt with bf16 inputs and
// output and fp32 accumulation on [rows, inner] x [inner, cols], best of repeated runs
// over about `seconds`; what MFU on a GPU is measured against (flops.h). Throws
// dufu::Error with the reason when there is no CUDA device.
double measure_cuda_bf16_gemm_flops(int rows, int inner, int cols, double seconds);

// Which of the `visible_gpus` GPUs this process takes, one per rank: the launcher's
// local rank, or, when the launcher sets CUDA_VISIBLE_DEVICES (each rank then sees
// its own GPU or GPUs), local_rank % visible_gpus. `refusal` is set, and ordinal -1,
// when there is no GPU, or when more ranks run on the machine than it has GPUs and
// nothing partitioned them (two ranks of one NCCL communicator cannot share a GPU).
struct GpuChoice {
  int ordinal = -1;
  std::string refusal;
};
GpuChoice choose_gpu(int local_rank, int visible_gpus, bool visible_devices_set);
// choose_gpu for this process: its local rank, the GPUs the driver shows it, and
// whether CUDA_VISIBLE_DEVICES is set. Refused when no CUDA device is available.
GpuChoice gpu_for_this_process();

// Collective over `ranks`: every rank passes what it found on its own (a device or
// library it can use, or why not) and gets the same answer, available only if every
// rank is, else naming the lowest failing rank and its reason. Ranks that must skip or
// fail together (an NCCL communicator's members) ask this first, so that no rank is
// left waiting in a collective for one that gave up.
DeviceAvailability agree_on_availability(Communicator& ranks, const DeviceAvailability& own);

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
