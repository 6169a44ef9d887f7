// The bf16 GEMM rate of this GPU through cuBLASLt, for model FLOP utilization: bf16
// inputs and output with fp32 accumulation, the product mixed-precision training
// spends its FLOPs in (llm.c and Megatron-LM measure MFU against the same kind of
// number). Best of repeated runs, timed with CUDA events on the device's stream.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>

#include "cuda_check.h"
#include "cuda_kernels.h"

namespace dufu::trainer::cuda {

namespace {

template <typename Handle, cublasStatus_t (*Destroy)(Handle)>
struct LtObject {
  Handle handle = nullptr;
  ~LtObject() {
    if (handle != nullptr) Destroy(handle);
  }
};

struct DeviceMemory {
  void* pointer = nullptr;
  explicit DeviceMemory(std::size_t bytes) { DUFU_CUDA_CHECK(cudaMalloc(&pointer, bytes)); }
  ~DeviceMemory() { cudaFree(pointer); }
};

struct Event {
  cudaEvent_t event = nullptr;
  Event() { DUFU_CUDA_CHECK(cudaEventCreate(&event)); }
  ~Event() { cudaEventDestroy(event); }
};

}  // namespace

double bf16_gemm_flops(int rows, int inner, int cols, double seconds) {
  if (rows <= 0 || inner <= 0 || cols <= 0) {
    DUFU_FAIL("bf16 GEMM rate: the sizes must be positive, got ", rows, " x ", inner, " x ", cols);
  }
  const auto bf16_bytes = [](std::size_t elements) { return elements * sizeof(__nv_bfloat16); };
  DeviceMemory x(bf16_bytes(std::size_t(rows) * inner));
  DeviceMemory weight(bf16_bytes(std::size_t(inner) * cols));
  DeviceMemory out(bf16_bytes(std::size_t(rows) * cols));
  // Zeros: the rate of a GEMM does not depend on its values on these GPUs' tensor cores
  // closely enough to matter next to the run-to-run spread, and zeros cannot overflow.
  DUFU_CUDA_CHECK(cudaMemsetAsync(x.pointer, 0, bf16_bytes(std::size_t(rows) * inner), stream()));
  DUFU_CUDA_CHECK(cudaMemsetAsync(weight.pointer, 0, bf16_bytes(std::size_t(inner) * cols), stream()));

  auto lt = static_cast<cublasLtHandle_t>(cublaslt_handle());
  LtObject<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy> operation;
  DUFU_CUBLAS_CHECK(cublasLtMatmulDescCreate(&operation.handle, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transpose = CUBLAS_OP_T;
  DUFU_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(operation.handle, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof(transpose)));
  // The same product as matmul_forward, in column-major terms: W [inner, cols] used
  // transposed times x [inner, rows] gives out [cols, rows].
  LtObject<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy> a, b, d;
  DUFU_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a.handle, CUDA_R_16BF, inner, cols, inner));
  DUFU_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b.handle, CUDA_R_16BF, inner, rows, inner));
  DUFU_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.handle, CUDA_R_16BF, cols, rows, cols));
  LtObject<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy> preference;
  DUFU_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference.handle));
  const std::size_t workspace_bytes = matmul_workspace_bytes();
  DUFU_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference.handle, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                         &workspace_bytes, sizeof(workspace_bytes)));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  DUFU_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, operation.handle, a.handle, b.handle, d.handle, d.handle,
                                                   preference.handle, 1, &heuristic, &found));
  if (found == 0) DUFU_FAIL("cuBLASLt has no bf16 algorithm for ", rows, " x ", inner, " x ", cols);
  const float one = 1.0f;
  const float zero = 0.0f;
  auto run = [&] {
    DUFU_CUBLAS_CHECK(cublasLtMatmul(lt, operation.handle, &one, weight.pointer, a.handle, x.pointer, b.handle, &zero,
                                     out.pointer, d.handle, out.pointer, d.handle, &heuristic.algo, matmul_workspace(),
                                     workspace_bytes, stream()));
  };
  run();  // the first call loads the kernel
  DUFU_CUDA_CHECK(cudaStreamSynchronize(stream()));

  const double flops = 2.0 * rows * inner * cols;
  Event start, stop;
  double best = 0.0;
  int runs = 0;
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  do {
    DUFU_CUDA_CHECK(cudaEventRecord(start.event, stream()));
    run();
    DUFU_CUDA_CHECK(cudaEventRecord(stop.event, stream()));
    DUFU_CUDA_CHECK(cudaEventSynchronize(stop.event));
    float milliseconds = 0.0f;
    DUFU_CUDA_CHECK(cudaEventElapsedTime(&milliseconds, start.event, stop.event));
    if (milliseconds > 0.0f) best = std::max(best, flops / (1e-3 * milliseconds));
    ++runs;
  } while (Clock::now() < deadline || runs < 3);
  return best;
}

}  // namespace dufu::trainer::cuda
