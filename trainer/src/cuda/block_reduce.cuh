// Deterministic block-wide sums and maxima: every thread's value goes to shared
// memory and a fixed tree (kernel_partition.h's reduces_at) combines them, so the
// order of additions depends on the block size alone, never on timing. The warp-wide
// ones combine by a butterfly of shuffles, also in a fixed order.
#pragma once

#include "device/classifier_math.h"
#include "device/kernel_partition.h"

namespace dufu::trainer::cuda {

constexpr int kWarpSize = 32;
constexpr unsigned kFullWarp = 0xffffffffu;

// The sum over the 32 lanes of a warp, in every lane: at each step a lane adds its
// partner's value to its own, and since float addition commutes both partners hold
// the same bits, so every lane ends with the same sum. All 32 lanes must call it.
__device__ inline float warp_sum(float value) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) value += __shfl_xor_sync(kFullWarp, value, offset);
  return value;
}

// The online-softmax state of the parts of a row the 32 lanes hold, in every lane
// (online_softmax_merge is symmetric in its operands, as addition is above).
__device__ inline OnlineSoftmax warp_merge(OnlineSoftmax state) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const OnlineSoftmax other{__shfl_xor_sync(kFullWarp, state.max, offset),
                              __shfl_xor_sync(kFullWarp, state.sum, offset)};
    state = online_softmax_merge(state, other);
  }
  return state;
}

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
