// Deterministic block-wide sums and maxima: every thread's value goes to shared
// memory and a fixed tree (kernel_partition.h's reduces_at) combines them, so the
// order of additions depends on the block size alone, never on timing.
#pragma once

#include "dufu/trainer/device/kernel_partition.h"

namespace dufu::trainer::cuda {

// kThreads must be the block size, a power of two. Every thread of the block calls it
// and gets the result.
template <int kThreads, typename T>
__device__ T block_sum(T value, T* shared) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (reduces_at(static_cast<int>(threadIdx.x), stride)) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  const T result = shared[0];
  __syncthreads();
  return result;
}

template <int kThreads>
__device__ float block_max(float value, float* shared) {
  shared[threadIdx.x] = value;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (reduces_at(static_cast<int>(threadIdx.x), stride)) {
      shared[threadIdx.x] = fmaxf(shared[threadIdx.x], shared[threadIdx.x + stride]);
    }
    __syncthreads();
  }
  const float result = shared[0];
  __syncthreads();
  return result;
}

// Column sums of x [N, C] added to out[c] (+=) in double, chunk by chunk as
// kernel_partition.h cuts the rows; `scratch` holds row_chunk_count(N) * C doubles.
void accumulate_column_sums(float* out, const float* x, int N, int C, double* scratch);
// Grow-only device scratch shared by this backend's kernels (one stream, so one user
// at a time).
void* scratch(std::size_t bytes);

}  // namespace dufu::trainer::cuda
