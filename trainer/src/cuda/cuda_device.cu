// The CUDA device: memory from cudaMalloc, copies on one stream, and the table of this
// folder's kernels. One GPU per process (device.cc's choose_gpu picks it).
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "cuda_check.h"
#include "cuda_kernels.h"
#include "cuda_scratch.h"
#include "device/cuda_module.h"
#include "dufu/common/error.h"
#include "dufu/trainer/device/device.h"
#include "nccl_entries.h"
#include "shared_memory_limit.h"
#include "stream_wait.h"
#include "upload_ring.h"

namespace dufu::trainer::cuda {

namespace {

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
    DUFU_CUDA_CHECK(cudaMalloc(&workspace, kMatmulWorkspaceBytes));
    // cuBLAS and cuBLASLt run on the one stream, one call after another, so they share
    // one workspace, which the memory plan counts (without this, cuBLAS would take its
    // own from the driver's pool the first time it runs).
    DUFU_CUBLAS_CHECK(cublasSetWorkspace(blas, workspace, kMatmulWorkspaceBytes));
  }
};


Context& context() {
  static Context instance;
  return instance;
}

void (*stream_watcher)() = nullptr;
// The bound on a watched wait, and what ends it (set_stream_wait_bound).
double stream_wait_timeout_seconds = 0;
void (*stream_wait_timed_out)(double waited_seconds) = nullptr;

void timed_out_or_nothing(double waited_seconds) {
  if (stream_wait_timed_out != nullptr) stream_wait_timed_out(waited_seconds);
}
void (*module_log)(LogLevel, const char*, const char*) = nullptr;

void wait_for_event(cudaEvent_t event) {
  if (stream_watcher == nullptr) {
    DUFU_CUDA_CHECK(cudaEventSynchronize(event));
    return;
  }
  wait_checking(
      [event] { return DUFU_CUDA_QUERY_DONE(cudaEventQuery(event)); },
      stream_watcher, stream_wait_timeout_seconds, timed_out_or_nothing);
}

}  // namespace

// UploadRing's backend: pinned host blocks, copies and events on the device's stream.
// (Outside the unnamed namespace: the ring lives until exit, so nothing here calls
// destroy_event, which the compiler would call unused there.)
struct PinnedUploads {
  using Event = cudaEvent_t;
  void* allocate_pinned(std::size_t bytes) {
    void* memory = nullptr;
    DUFU_CUDA_CHECK(cudaMallocHost(&memory, bytes));
    return memory;
  }
  void free_pinned(void* memory) { DUFU_CUDA_CHECK(cudaFreeHost(memory)); }
  Event make_event() {
    cudaEvent_t event = nullptr;
    DUFU_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    return event;
  }
  void destroy_event(Event event) { DUFU_CUDA_CHECK(cudaEventDestroy(event)); }
  void copy_async(void* device, const void* pinned, std::size_t bytes) {
    DUFU_CUDA_CHECK(cudaMemcpyAsync(device, pinned, bytes, cudaMemcpyHostToDevice, stream()));
  }
  void record(Event event) { DUFU_CUDA_CHECK(cudaEventRecord(event, stream())); }
  void wait(Event event) { wait_for_event(event); }
};

namespace {

// Lives as long as the process, like the context: nothing to free at exit, when the
// CUDA runtime may be gone.
UploadRing<PinnedUploads>& staged_uploads() {
  static PinnedUploads backend;
  static auto* ring = new UploadRing<PinnedUploads>(backend);
  return *ring;
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
  // A copy from or to pageable host memory waits for the stream inside the CUDA call,
  // where no watcher can see a dead peer: while communicators exist the stream is
  // waited for first. Small uploads (a micro-batch's tokens) go through pinned memory
  // and wait for nothing.
  void upload(void* device_destination, const void* host_source, std::size_t bytes) override {
    if (UploadRing<PinnedUploads>::takes(bytes)) {
      staged_uploads().upload(device_destination, host_source, bytes);
      return;
    }
    if (stream_watcher != nullptr) wait_for_stream();
    DUFU_CUDA_CHECK(cudaMemcpyAsync(device_destination, host_source, bytes, cudaMemcpyHostToDevice, stream()));
    // The host buffer may be reused as soon as this returns.
    wait_for_stream();
  }
  void download(void* host_destination, const void* device_source, std::size_t bytes) override {
    if (stream_watcher != nullptr) wait_for_stream();
    DUFU_CUDA_CHECK(cudaMemcpyAsync(host_destination, device_source, bytes, cudaMemcpyDeviceToHost, stream()));
    wait_for_stream();
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
  void synchronize() override { wait_for_stream(); }
  // Free memory now, plus the device's own scratch already held (the plan counts all
  // of it, scratch_bytes): the CUDA context and the handles are out of it.
  double memory_capacity_bytes() const override {
    context();
    std::size_t free_bytes = 0;
    std::size_t total_bytes = 0;
    DUFU_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    return static_cast<double>(free_bytes) + static_cast<double>(kMatmulWorkspaceBytes + scratch_capacity());
  }
  double scratch_bytes(const StepShapes& shapes) const override { return device_scratch_bytes(shapes); }
};

}  // namespace

cudaStream_t stream() { return context().stream; }
void* cublaslt_handle() { return context().lt; }
void* cublas_handle() { return context().blas; }
void* matmul_workspace() { return context().workspace; }

int shared_memory_per_block_limit() {
  static const int limit = [] {
    context();  // the GPU chosen
    int device = 0;
    int bytes = 0;
    DUFU_CUDA_CHECK(cudaGetDevice(&device));
    DUFU_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    return bytes;
  }();
  return limit;
}

void require_shared_memory(const char* kernel, int head_size, int bytes) {
  const std::string refusal = shared_memory_refusal(kernel, head_size, bytes, shared_memory_per_block_limit());
  if (!refusal.empty()) DUFU_FAIL(refusal);
}

void wait_for_stream() {
  if (stream_watcher == nullptr) {
    DUFU_CUDA_CHECK(cudaStreamSynchronize(stream()));
    return;
  }
  wait_checking(
      [] { return DUFU_CUDA_QUERY_DONE(cudaStreamQuery(stream())); },
      stream_watcher, stream_wait_timeout_seconds, timed_out_or_nothing);
}

void set_stream_watcher(void (*check)()) { stream_watcher = check; }

void set_stream_wait_bound(double seconds, void (*timed_out)(double waited_seconds)) {
  stream_wait_timeout_seconds = seconds;
  stream_wait_timed_out = timed_out;
}

void set_log(void (*log)(LogLevel level, const char* subsystem, const char* message)) { module_log = log; }

void log_line(LogLevel level, const std::string& message) {
  if (module_log != nullptr) module_log(level, "cuda", message.c_str());
}

void note_fallback(FusedFallback kind, const std::string& message) {
  static OncePerKind<FusedFallback> noted;
  if (noted.first(kind)) log_line(LogLevel::kWarn, str_cat(message, " (said once)"));
}

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
  static const dufu::trainer::CudaModule module{.availability = cuda::availability,
                                                .device = cuda::device,
                                                .device_count = cuda::device_count,
                                                .select_device = cuda::select_device,
                                                .nccl = cuda::nccl_entries(),
                                                .bf16_gemm_flops = cuda::bf16_gemm_flops,
                                                .is_device_memory = cuda::is_device_memory,
                                                .set_log = cuda::set_log};
  return &module;
}
