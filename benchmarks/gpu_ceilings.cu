// The two ceilings every GPU figure of dufu is read against (step 1 of the GPU runner,
// scripts/gpu_runner.sh): what the GPU, its driver and the CUDA runtime are, the bf16
// GEMM rate through cuBLASLt (the trainer's own measurement, in the CUDA device
// module, on a large square product) and the device-to-device copy rate (a
// cudaMemcpyAsync of a large buffer, counting the bytes read plus the bytes written).
// A program for humans and the runner; the last line is machine-readable:
//   gpu_ceilings gpu="NAME" sms=N memory_gb=X driver=A runtime=B bf16_gemm_tflops=Y copy_gbps=Z
// --probe only says whether there is a CUDA device (the reason on stderr when not).
// Exit status: 0 measured, 1 error, 77 no CUDA device here.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "dufu/common/error.h"
#include "dufu/trainer/device/device.h"
#include "dufu/trainer/model/flops.h"

namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) DUFU_FAIL(what, ": ", cudaGetErrorName(status), " (", cudaGetErrorString(status), ")");
}

// A pattern that is neither zero nor constant, so that no compression or zero
// detection in the memory system flatters the copy.
__global__ void fill_pattern(std::uint32_t* words, std::size_t count) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < count;
       i += std::size_t(gridDim.x) * blockDim.x) {
    words[i] = static_cast<std::uint32_t>(i * 2654435761u) ^ 0x9e3779b9u;
  }
}

// Median of `repeats` timed batches of `copies_per_batch` copies each; bytes read plus
// written per second.
double device_copy_bytes_per_second(std::size_t bytes, int copies_per_batch, int repeats) {
  void* source = nullptr;
  void* destination = nullptr;
  check(cudaMalloc(&source, bytes), "cudaMalloc (copy source)");
  check(cudaMalloc(&destination, bytes), "cudaMalloc (copy destination)");
  fill_pattern<<<1024, 256>>>(static_cast<std::uint32_t*>(source), bytes / 4);
  check(cudaGetLastError(), "fill_pattern launch");
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  check(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDeviceToDevice, nullptr), "warm-up copy");
  std::vector<double> rates;
  for (int r = 0; r < repeats; ++r) {
    check(cudaEventRecord(start, nullptr), "cudaEventRecord");
    for (int c = 0; c < copies_per_batch; ++c) {
      check(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDeviceToDevice, nullptr), "cudaMemcpyAsync");
    }
    check(cudaEventRecord(stop, nullptr), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float milliseconds = 0.0f;
    check(cudaEventElapsedTime(&milliseconds, start, stop), "cudaEventElapsedTime");
    rates.push_back(2.0 * static_cast<double>(bytes) * copies_per_batch / (1e-3 * milliseconds));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(source);
  cudaFree(destination);
  std::sort(rates.begin(), rates.end());
  return rates[rates.size() / 2];
}

int run() {
  int ordinal = 0;
  check(cudaGetDevice(&ordinal), "cudaGetDevice");
  cudaDeviceProp properties{};
  check(cudaGetDeviceProperties(&properties, ordinal), "cudaGetDeviceProperties");
  int driver = 0;
  int runtime = 0;
  check(cudaDriverGetVersion(&driver), "cudaDriverGetVersion");
  check(cudaRuntimeGetVersion(&runtime), "cudaRuntimeGetVersion");
  std::printf("GPU %d: %s, compute capability %d.%d, %d SMs, %.1f GB, L2 %.1f MB\n", ordinal, properties.name,
              properties.major, properties.minor, properties.multiProcessorCount,
              static_cast<double>(properties.totalGlobalMem) / 1e9, properties.l2CacheSize / 1e6);
  std::printf("CUDA driver API %d.%d, runtime %d.%d\n", driver / 1000, driver % 1000 / 10, runtime / 1000,
              runtime % 1000 / 10);

  const double copy = device_copy_bytes_per_second(std::size_t(1) << 30, 10, 7);
  std::printf("device-to-device copy: %.0f GB/s (bytes read + written, 1 GiB buffers, median of 7)\n", copy / 1e9);
  constexpr int kSide = 8192;
  const double gemm = dufu::trainer::measure_cuda_bf16_gemm_flops(kSide, kSide, kSide, 2.0);
  std::printf("bf16 GEMM (cuBLASLt, %d^3, fp32 accumulation): %.1f TFLOP/s\n", kSide, gemm / 1e12);
  std::printf("gpu_ceilings gpu=\"%s\" sms=%d memory_gb=%.1f driver=%d runtime=%d bf16_gemm_tflops=%.1f copy_gbps=%.0f\n",
              properties.name, properties.multiProcessorCount, static_cast<double>(properties.totalGlobalMem) / 1e9,
              driver, runtime, gemm / 1e12, copy / 1e9);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const auto availability = dufu::trainer::device_availability(dufu::trainer::DeviceKind::kCuda);
  if (!availability.available) {
    std::fprintf(stderr, "gpu_ceilings: skipped: no GPU: %s\n", availability.reason.c_str());
    return 77;
  }
  if (argc > 1 && std::string(argv[1]) == "--probe") return 0;
  try {
    return run();
  } catch (const dufu::Error& error) {
    std::fprintf(stderr, "gpu_ceilings: %s\n", error.what());
    return 1;
  } catch (const dufu::InternalError& bug) {  // a failed DUFU_CHECK: a bug in dufu
    std::fprintf(stderr, "gpu_ceilings: internal error: %s\n", bug.what());
    return 3;
  }
}
