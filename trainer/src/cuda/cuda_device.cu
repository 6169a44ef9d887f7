// The CUDA device: memory from cudaMalloc, copies on one stream, and the table of this
// folder's kernels. One GPU per process (the launcher's local rank picks it).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "cuda_check.h"
#include "cuda_kernels.h"
#include "dufu/common/error.h"
#include "cuda_module.h"
#include "nccl_entries.h"
#include "dufu/trainer/device.h"

namespace dufu::trainer::cuda {

void fail_cuda(const char* call, cudaError_t status, const char* file, int line) {
  DUFU_FAIL("CUDA call ", call, " failed at ", file, ":", line, ": ", cudaGetErrorName(status), " (",
            cudaGetErrorString(status), ")");
}

void fail_cublas(const char* call, cublasStatus_t status, const char* file, int line) {
  DUFU_FAIL("cuBLAS call ", call, " failed at ", file, ":", line, ": status ", static_cast<int>(status));
}

namespace {

constexpr std::size_t kWorkspaceBytes = std::size_t{32} << 20;  // cuBLASLt's recommended size for Hopper

// The GPU this process chose (select_device), or -1 before the choice; the first use
// of the device fixes it to the current one if nothing was chosen.
int chosen_ordinal = -1;

void select_device(int ordinal) {
  if (chosen_ordinal == ordinal) return;
  if (chosen_ordinal >= 0) {
    DUFU_FAIL("cannot make GPU ", ordinal, " this process's CUDA device: GPU ", chosen_ordinal,
              " already is (one GPU per process, chosen before its first use)");
  }
  DUFU_CUDA_CHECK(cudaSetDevice(ordinal));
  chosen_ordinal = ordinal;
}

int device_count() {
  int count = 0;
  DUFU_CUDA_CHECK(cudaGetDeviceCount(&count));
  return count;
}

bool is_device_memory(const void* pointer) {
  cudaPointerAttributes attributes{};
  DUFU_CUDA_CHECK(cudaPointerGetAttributes(&attributes, pointer));
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
}

struct Context {
  cudaStream_t stream = nullptr;
  cublasLtHandle_t lt = nullptr;
  cublasHandle_t blas = nullptr;
  void* workspace = nullptr;
  Context() {
    if (chosen_ordinal < 0) DUFU_CUDA_CHECK(cudaGetDevice(&chosen_ordinal));
    DUFU_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    DUFU_CUBLAS_CHECK(cublasLtCreate(&lt));
    DUFU_CUBLAS_CHECK(cublasCreate(&blas));
    DUFU_CUBLAS_CHECK(cublasSetStream(blas, stream));
    // Deterministic cuBLAS: no atomics in its reductions.
    DUFU_CUBLAS_CHECK(cublasSetAtomicsMode(blas, CUBLAS_ATOMICS_NOT_ALLOWED));
    DUFU_CUDA_CHECK(cudaMalloc(&workspace, kWorkspaceBytes));
  }
};

Context& context() {
  static Context instance;
  return instance;
}

class CudaDevice final : public Device {
 public:
  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string describe() const override {
    int device = 0;
    DUFU_CUDA_CHECK(cudaGetDevice(&device));
    cudaDeviceProp properties{};
    DUFU_CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
    return str_cat("cuda:", device, " (", properties.name, ", ", properties.totalGlobalMem >> 20, " MiB)");
  }
  MemorySpace memory_space() const override { return MemorySpace::kCudaDevice; }
  const KernelTable& kernels() const override { return kernel_table(); }

  void* allocate(std::size_t bytes) override {
    void* memory = nullptr;
    const cudaError_t status = cudaMalloc(&memory, bytes == 0 ? 1 : bytes);
    if (status == cudaErrorMemoryAllocation) {
      DUFU_FAIL("not enough memory on ", describe(), " for ", bytes, " bytes");
    }
    DUFU_CUDA_CHECK(status);
    return memory;
  }
  void release(void* memory) noexcept override {
    if (memory != nullptr) cudaFree(memory);
  }
  void upload(void* device_destination, const void* host_source, std::size_t bytes) override {
    DUFU_CUDA_CHECK(cudaMemcpyAsync(device_destination, host_source, bytes, cudaMemcpyHostToDevice, stream()));
    // The host buffer may be reused as soon as this returns.
    DUFU_CUDA_CHECK(cudaStreamSynchronize(stream()));
  }
  void download(void* host_destination, const void* device_source, std::size_t bytes) override {
    DUFU_CUDA_CHECK(cudaMemcpyAsync(host_destination, device_source, bytes, cudaMemcpyDeviceToHost, stream()));
    DUFU_CUDA_CHECK(cudaStreamSynchronize(stream()));
  }
  void copy(void* device_destination, const void* device_source, std::size_t bytes) override {
    DUFU_CUDA_CHECK(cudaMemcpyAsync(device_destination, device_source, bytes, cudaMemcpyDeviceToDevice, stream()));
  }
  void fill(float* device_destination, float value, std::size_t count) override {
    cuda::fill(device_destination, value, count);
  }
  void zero(void* device_destination, std::size_t bytes) override {
    DUFU_CUDA_CHECK(cudaMemsetAsync(device_destination, 0, bytes, stream()));
  }
  void synchronize() override { DUFU_CUDA_CHECK(cudaStreamSynchronize(stream())); }
  // Free memory now: what the memory plan may still take (the CUDA context and
  // cuBLASLt's workspace are already out of it).
  double memory_capacity_bytes() const override {
    context();
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
    DUFU_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    return static_cast<double>(free_bytes);
  }
};

}  // namespace

cudaStream_t stream() { return context().stream; }
void* cublaslt_handle() { return context().lt; }
void* cublas_handle() { return context().blas; }
void* matmul_workspace() { return context().workspace; }
std::size_t matmul_workspace_bytes() { return kWorkspaceBytes; }

DeviceAvailability availability() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear it
    if (status == cudaErrorInsufficientDriver || status == cudaErrorNoDevice) {
      return {false, str_cat("no CUDA driver or GPU on this machine (cudaGetDeviceCount: ", cudaGetErrorString(status),
                             ")")};
    }
    return {false, str_cat("no usable CUDA device: ", cudaGetErrorString(status))};
  }
  if (count == 0) return {false, "no CUDA device on this machine"};
  return {true, ""};
}

Device& device() {
  static CudaDevice instance;
  return instance;
}

const KernelTable& kernel_table() {
  static const KernelTable table{DUFU_KERNEL_OPS(DUFU_KERNEL_TABLE_ENTRY)};

  return table;
}

}  // namespace dufu::trainer::cuda

extern "C" __attribute__((visibility("default"))) const dufu::trainer::CudaModule* dufu_cuda_module() {
  namespace cuda = dufu::trainer::cuda;
  static const dufu::trainer::CudaModule module{cuda::availability,    cuda::device,         cuda::device_count,
                                                cuda::select_device,   cuda::nccl_entries(), cuda::bf16_gemm_flops,
                                                cuda::is_device_memory};
  return &module;
}
