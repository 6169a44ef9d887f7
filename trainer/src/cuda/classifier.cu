// CUDA fused classifier, serial and vocab-parallel: one block per row computes the
// row's maximum, its sum of exponentials in double and the loss, then overwrites the
// logits with the gradient, without storing probabilities. Block reductions keep one
// order (block_reduce.cuh). Targets are checked by the caller.
#include <cuda_runtime.h>

#include <cmath>

#include "block_reduce.cuh"
#include "cuda_check.h"
#include "cuda_kernels.h"
#include "dufu/trainer/device/kernel_math.h"
#include "dufu/trainer/device/kernel_partition.h"

namespace dufu::trainer::cuda {

namespace {

constexpr int kBlock = 256;

// How many of a rank's Vl columns, from vocabulary id vocab_begin, are real vocabulary.
__host__ __device__ inline int real_columns(int V, int vocab_begin, int Vl) {
  const int real = V - vocab_begin;
  return real < 0 ? 0 : (real > Vl ? Vl : real);
}

__global__ void classifier_kernel(float* logits, float* losses, const std::int32_t* targets, float dloss_scale, int V,
                                  int Vp) {
  __shared__ float shared[kBlock];
  __shared__ double shared_sum[kBlock];
  float* row = logits + static_cast<std::size_t>(blockIdx.x) * Vp;
  const int target = targets[blockIdx.x];
  for (int i = V + threadIdx.x; i < Vp; i += kBlock) row[i] = 0.0f;
  if (target < 0) {
    for (int i = threadIdx.x; i < V; i += kBlock) row[i] = 0.0f;
    if (threadIdx.x == 0) losses[blockIdx.x] = 0.0f;
    return;
  }
  float max_logit = -INFINITY;
  for (int i = threadIdx.x; i < V; i += kBlock) max_logit = fmaxf(max_logit, row[i]);
  max_logit = block_max<kBlock>(max_logit, shared);
  const float target_logit = row[target];
  __syncthreads();  // every thread has read the target's logit before it is overwritten
  double sum = 0.0;
  for (int i = threadIdx.x; i < V; i += kBlock) {
    const float e = exp_approx(row[i] - max_logit);
    row[i] = e;
    sum += e;
  }
  sum = block_sum<kBlock>(sum, shared_sum);
  if (threadIdx.x == 0) {
    losses[blockIdx.x] = static_cast<float>(log(sum) - (static_cast<double>(target_logit) - max_logit));
  }
  const float grad_scale = static_cast<float>(dloss_scale / sum);
  for (int i = threadIdx.x; i < V; i += kBlock) row[i] = row[i] * grad_scale - (i == target ? dloss_scale : 0.0f);
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

__global__ void vp_finish_kernel(float* logits, float* losses, const double* stats, const float* row_max,
                                 const std::int32_t* targets, float dloss_scale, int N, int vocab_begin, int real,
                                 int Vl) {
  float* row = logits + static_cast<std::size_t>(blockIdx.x) * Vl;
  const int target = targets[blockIdx.x];
  if (target < 0) {
    for (int i = threadIdx.x; i < Vl; i += kBlock) row[i] = 0.0f;
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
    row[i] = i < real ? row[i] * grad_scale - (i == local_target ? dloss_scale : 0.0f) : 0.0f;
  }
}

}  // namespace

void classifier_forward_backward(float* logits, float* losses, const std::int32_t* targets, float dloss_scale, int N,
                                 int V, int Vp) {
  DUFU_CHECK(V >= 1 && V <= Vp, "vocabulary ", V, " must be in [1, padded vocabulary ", Vp, "]");
  if (N == 0) return;
  classifier_kernel<<<N, kBlock, 0, stream()>>>(logits, losses, targets, dloss_scale, V, Vp);
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

void vocab_parallel_classifier_finish(float* logits, float* losses, const double* stats, const float* row_max,
                                      const std::int32_t* targets, float dloss_scale, int N, int V, int vocab_begin,
                                      int Vl) {
  if (N == 0) return;
  vp_finish_kernel<<<N, kBlock, 0, stream()>>>(logits, losses, stats, row_max, targets, dloss_scale, N, vocab_begin,
                                               real_columns(V, vocab_begin, Vl), Vl);
  DUFU_CUDA_CHECK_LAUNCH();
}

}  // namespace dufu::trainer::cuda
