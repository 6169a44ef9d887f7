// The bf16 GEMM rate of this GPU through cuBLASLt, for model FLOP utilization: bf16
// inputs and output with fp32 accumulation, the product mixed-precision training
// spends its FLOPs in (llm.c and Megatron-LM measure MFU against the same kind of
// number). Best of repeated timings of 20 launches each, timed with CUDA events on the
// device's stream around the launches alone.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>

#include "cuda_check.h"
#include "cuda_kernels.h"
#include "gemm_timing.h"

namespace dufu::trainer::cuda {

namespace {

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
  // Every element 0x3C3C (about 0.0115): not zero, so the products are real work, and
  // small enough that no sum overflows. Random values draw more power and can run a
  // few percent slower on a power-limited GPU: this is a peak, an upper bound.
  constexpr int kByte = 0x3C;
  DUFU_CUDA_CHECK(cudaMemsetAsync(x.pointer, kByte, bf16_bytes(std::size_t(rows) * inner), stream()));
  DUFU_CUDA_CHECK(cudaMemsetAsync(weight.pointer, kByte, bf16_bytes(std::size_t(inner) * cols), stream()));

  // The same product as matmul_forward: out [rows, cols] = x [rows, inner] · W^T. The
  // descriptors and the algorithm are made once, before any timing, so the events
  // bracket GPU work only.
  const LtCall gemm({.out = out.pointer,
                     .a = x.pointer,
                     .b = weight.pointer,
                     .rows = rows,
                     .inner = inner,
                     .cols = cols,
                     .b_transposed = true,
                     .input_type = CUDA_R_16BF,
                     .output_type = CUDA_R_16BF});
  if (!gemm.has_algorithm()) DUFU_FAIL("bf16 GEMM rate: ", gemm.no_algorithm_reason());
  gemm.launch();  // the first launch loads the kernel
  wait_for_stream();

  Event start, stop;
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration<double>(seconds);
  return best_flops_per_second(
      2.0 * rows * inner * cols, [&] { gemm.launch(); },
      [&] { DUFU_CUDA_CHECK(cudaEventRecord(start.event, stream())); },
      [&] {
        DUFU_CUDA_CHECK(cudaEventRecord(stop.event, stream()));
        DUFU_CUDA_CHECK(cudaEventSynchronize(stop.event));
        float milliseconds = 0.0f;
        DUFU_CUDA_CHECK(cudaEventElapsedTime(&milliseconds, start.event, stop.event));
        return 1e-3 * milliseconds;
      },
      [&] { return Clock::now() < deadline; });
}

}  // namespace dufu::trainer::cuda
