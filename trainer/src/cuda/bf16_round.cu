// The CUDA twin of cpu/bf16_round.cc: values rounded to bf16 in place, where the
// mixed-precision recipe stores bf16 (docs/architecture.md, "Mixed precision"), and
// the activations kept for the backward stored as bf16 bits. The conversions are
// bf16.h's DUFU_HOST_DEVICE functions, the ones the CPU device and its tests run, so
// both devices give the same bits for the same input.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda_check.h"
#include "cuda_kernels.h"
#include "device/bf16.h"
#include "device/kernel_partition.h"

namespace dufu::trainer::cuda {

namespace {

constexpr unsigned kBlock = 256;

__global__ void round_to_bf16_kernel(float* values, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) values[i] = ::dufu::trainer::round_to_bf16(values[i]);
}

// bf16.h's bits of each value; exact for values the recipe already rounded.
__global__ void to_bf16_bits_kernel(std::uint16_t* bits, const float* values, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) bits[i] = ::dufu::trainer::float_to_bf16_bits(values[i]);
}

__global__ void store_bf16_kernel(std::uint16_t* stored, float* values, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const std::uint16_t bits = ::dufu::trainer::float_to_bf16_bits(values[i]);
  stored[i] = bits;
  values[i] = ::dufu::trainer::bf16_bits_to_float(bits);
}

__global__ void load_bf16_kernel(float* values, const std::uint16_t* stored, std::size_t n) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i < n) values[i] = ::dufu::trainer::bf16_bits_to_float(stored[i]);
}

}  // namespace

void to_bf16_bits(std::uint16_t* bits, const float* values, std::size_t n) {
  if (n == 0) return;
  to_bf16_bits_kernel<<<blocks_for(n, kBlock), kBlock, 0, stream()>>>(bits, values, n);
  DUFU_CUDA_CHECK_LAUNCH();
}

void round_to_bf16(float* values, std::size_t n) {
  if (n == 0) return;
  round_to_bf16_kernel<<<blocks_for(n, kBlock), kBlock, 0, stream()>>>(values, n);
  DUFU_CUDA_CHECK_LAUNCH();
}

void to_bf16(std::uint16_t* bits, const float* values, std::size_t n) { to_bf16_bits(bits, values, n); }

void store_bf16(std::uint16_t* stored, float* values, std::size_t n) {
  if (n == 0) return;
  store_bf16_kernel<<<blocks_for(n, kBlock), kBlock, 0, stream()>>>(stored, values, n);
  DUFU_CUDA_CHECK_LAUNCH();
}

void load_bf16(float* values, const std::uint16_t* stored, std::size_t n) {
  if (n == 0) return;
  load_bf16_kernel<<<blocks_for(n, kBlock), kBlock, 0, stream()>>>(values, stored, n);
  DUFU_CUDA_CHECK_LAUNCH();
}

}  // namespace dufu::trainer::cuda
