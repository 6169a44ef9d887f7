// CUDA fused classifier, serial and vocab-parallel. Serial: one block per row reads
// the row once for its maximum and sum of exponentials together (the online softmax
// of classifier_math.h), then overwrites it with the gradient: two sweeps, no
// probabilities stored. Vocab-parallel: the three phases of kernel_table.h, one block
// per row each, the sum in double. Reductions keep one order (block_reduce.cuh).
// Targets are checked by the caller.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "block_reduce.cuh"
#include "cuda_check.h"
#include "cuda_kernels.h"
#include "device/classifier_math.h"
#include "device/kernel_math.h"
#include "device/kernel_partition.h"
#include "float_groups.cuh"

namespace dufu::trainer::cuda {

namespace {

constexpr int kBlock = 256;

// How many of a rank's Vl columns, from vocabulary id vocab_begin, are real vocabulary.
__host__ __device__ inline int real_columns(int V, int vocab_begin, int Vl) {
  const int real = V - vocab_begin;
  return real < 0 ? 0 : (real > Vl ? Vl : real);
}

constexpr int kWarps = kBlock / kWarpSize;

// One block per row, two sweeps over it: the first reads each logit once and keeps,
// per thread, the online maximum and sum of exponentials of its groups
// (classifier_math.h); the threads' states merge by warps, then the 8 warp states in
// warp order. The second sweep writes the gradient in place, recomputing each weight.
// kWidth 4 reads 16 bytes at a time (float_groups.cuh); a group straddling V holds
// padding, which is loaded but neither counted nor kept.
template <int kWidth>
__global__ void __launch_bounds__(kBlock)
    classifier_kernel(TensorOut logits, float* losses, const std::int32_t* targets, float dloss_scale, int V, int Vp) {
  __shared__ OnlineSoftmax warp_states[kWarps];
  const std::size_t offset = static_cast<std::size_t>(blockIdx.x) * Vp;
  float* row = logits.values + offset;
  const int target = targets[blockIdx.x];
  const int groups = Vp / kWidth;
  float group[kWidth];
  if (target < 0) {
#pragma unroll
    for (int k = 0; k < kWidth; ++k) group[k] = 0.0f;
    for (int i = threadIdx.x; i < groups; i += kBlock) {
      // Kept too: the LM head's backward reads the bits of every row.
      keep_group(group, logits, offset, i);
      store_group(row, i, group);
    }
    if (threadIdx.x == 0) losses[blockIdx.x] = 0.0f;
    return;
  }
  const int real_groups = (V + kWidth - 1) / kWidth;
  OnlineSoftmax state = online_softmax_start();
  for (int i = threadIdx.x; i < real_groups; i += kBlock) {
    load_group(group, row, i);
    const int real = V - i * kWidth;
    if (real >= kWidth) {
      online_softmax_add_tile(state, group, kWidth);
    } else {
      // The group straddling V, as single logits: constant indices keep the group in
      // registers, where a runtime count would index it in local memory.
#pragma unroll
      for (int k = 0; k < kWidth; ++k) {
        if (k < real) online_softmax_add_tile(state, &group[k], 1);
      }
    }
  }
  state = warp_merge(state);
  if (threadIdx.x % kWarpSize == 0) warp_states[threadIdx.x / kWarpSize] = state;
  const float target_logit = row[target];
  __syncthreads();  // the warp states are written, and the target's logit read before the sweep overwrites it
  OnlineSoftmax total = warp_states[0];
  for (int w = 1; w < kWarps; ++w) total = online_softmax_merge(total, warp_states[w]);
  if (threadIdx.x == 0) losses[blockIdx.x] = classifier_loss(total, target_logit);
  const float grad_scale = dloss_scale / total.sum;
  for (int i = threadIdx.x; i < groups; i += kBlock) {
    load_group(group, row, i);
#pragma unroll
    for (int k = 0; k < kWidth; ++k) {
      const int column = i * kWidth + k;
      group[k] = column < V ? classifier_grad(total, group[k], grad_scale, column == target, dloss_scale) : 0.0f;
    }
    keep_group(group, logits, offset, i);
    store_group(row, i, group);
  }
}

__global__ void vp_max_kernel(float* row_max, const float* logits, const std::int32_t* targets, int real, int Vl) {
  __shared__ float shared[kBlock];
  const float* row = logits + static_cast<std::size_t>(blockIdx.x) * Vl;
  float max_logit = -INFINITY;
  if (targets[blockIdx.x] >= 0) {
    for (int i = threadIdx.x; i < real; i += kBlock) max_logit = fmaxf(max_logit, row[i]);
  }
  max_logit = block_max<kBlock>(max_logit, shared);
  if (threadIdx.x == 0) row_max[blockIdx.x] = max_logit;
}

__global__ void vp_exp_sum_kernel(double* stats, float* logits, const float* row_max, const std::int32_t* targets,
                                  int N, int vocab_begin, int real, int Vl) {
  __shared__ double shared[kBlock];
  float* row = logits + static_cast<std::size_t>(blockIdx.x) * Vl;
  const int target = targets[blockIdx.x];
  if (target < 0) {
    if (threadIdx.x == 0) {
      stats[blockIdx.x] = 0.0;
      stats[N + blockIdx.x] = 0.0;
    }
    return;
  }
  const int local_target = target - vocab_begin;
  const bool holds_target = local_target >= 0 && local_target < real;
  const float target_logit = holds_target ? row[local_target] : 0.0f;
  __syncthreads();
  double sum = 0.0;
  for (int i = threadIdx.x; i < real; i += kBlock) {
    const float e = exp_approx(row[i] - row_max[blockIdx.x]);
    row[i] = e;
    sum += e;
  }
  sum = block_sum<kBlock>(sum, shared);
  if (threadIdx.x == 0) {
    stats[blockIdx.x] = sum;
    stats[N + blockIdx.x] = holds_target ? static_cast<double>(target_logit) : 0.0;
  }
}

__global__ void vp_finish_kernel(TensorOut logits, float* losses, const double* stats, const float* row_max,
                                 const std::int32_t* targets, float dloss_scale, int N, int vocab_begin, int real,
                                 int Vl) {
  const std::size_t offset = static_cast<std::size_t>(blockIdx.x) * Vl;
  const float* row = logits.values + offset;
  const int target = targets[blockIdx.x];
  if (target < 0) {
    for (int i = threadIdx.x; i < Vl; i += kBlock) keep_store(logits, offset + i, 0.0f);
    if (threadIdx.x == 0) losses[blockIdx.x] = 0.0f;
    return;
  }
  const double sum = stats[blockIdx.x];
  if (threadIdx.x == 0) {
    losses[blockIdx.x] =
        static_cast<float>(log(sum) - (stats[N + blockIdx.x] - static_cast<double>(row_max[blockIdx.x])));
  }
  const float grad_scale = static_cast<float>(dloss_scale / sum);
  const int local_target = target - vocab_begin;
  for (int i = threadIdx.x; i < Vl; i += kBlock) {
    keep_store(logits, offset + i, i < real ? row[i] * grad_scale - (i == local_target ? dloss_scale : 0.0f) : 0.0f);
  }
}

}  // namespace

void classifier_forward_backward(TensorOut logits, float* losses, const std::int32_t* targets, float dloss_scale,
                                 int N, int V, int Vp) {
  DUFU_CHECK(V >= 1 && V <= Vp, "vocabulary ", V, " must be in [1, padded vocabulary ", Vp, "]");
  if (N == 0) return;
  if (rows_take_float4(Vp, logits.values)) {
    classifier_kernel<4><<<N, kBlock, 0, stream()>>>(logits, losses, targets, dloss_scale, V, Vp);
  } else {
    classifier_kernel<1><<<N, kBlock, 0, stream()>>>(logits, losses, targets, dloss_scale, V, Vp);
  }
  DUFU_CUDA_CHECK_LAUNCH();
}

void vocab_parallel_classifier_max(float* row_max, const float* logits, const std::int32_t* targets, int N, int V,
                                   int vocab_begin, int Vl) {
  DUFU_CHECK(V >= 1 && vocab_begin >= 0 && Vl >= 1, "vocabulary ", V, ", columns [", vocab_begin, ", +", Vl, ")");
  if (N == 0) return;
  vp_max_kernel<<<N, kBlock, 0, stream()>>>(row_max, logits, targets, real_columns(V, vocab_begin, Vl), Vl);
  DUFU_CUDA_CHECK_LAUNCH();
}

void vocab_parallel_classifier_exp_sum(double* stats, float* logits, const float* row_max, const std::int32_t* targets,
                                       int N, int V, int vocab_begin, int Vl) {
  if (N == 0) return;
  vp_exp_sum_kernel<<<N, kBlock, 0, stream()>>>(stats, logits, row_max, targets, N, vocab_begin,
                                                real_columns(V, vocab_begin, Vl), Vl);
  DUFU_CUDA_CHECK_LAUNCH();
}

void vocab_parallel_classifier_finish(TensorOut logits, float* losses, const double* stats, const float* row_max,
                                      const std::int32_t* targets, float dloss_scale, int N, int V, int vocab_begin,
                                      int Vl) {
  if (N == 0) return;
  vp_finish_kernel<<<N, kBlock, 0, stream()>>>(logits, losses, stats, row_max, targets, dloss_scale, N, vocab_begin,
                                               real_columns(V, vocab_begin, Vl), Vl);
  DUFU_CUDA_CHECK_LAUNCH();
}

}  // namespace dufu::trainer::cuda
