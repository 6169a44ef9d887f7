// CUDA causal self-attention, written as the CPU kernel computes it: per query row the
// scores against keys 0..t, the softmax fused with the scale and the mask (exp_approx
// from kernel_math.h), then the weighted sum of values. The backward gathers every
// sum in a fixed order instead of scattering with atomics: dq by query row, dk and dv
// by key row over the queries that saw it. Direct loops over the head dimension:
// correct and deterministic, not yet tiled like flash attention (the issue's
// choice to make when a GPU can measure it).
#include <cuda_runtime.h>

#include <cmath>

#include "block_reduce.cuh"
#include "cuda_check.h"
#include "cuda_kernels.h"
#include "dufu/trainer/kernel_math.h"
#include "dufu/trainer/kernel_partition.h"

namespace dufu::trainer::cuda {

namespace {

constexpr int kBlock = 128;

// qkv [B, T, 3C]: q of head h at (b, t) starts at (b T + t) 3C + h hs; k at + C; v at + 2C.
__device__ inline std::size_t qkv_index(int b, int t, int T, int C, int part, int h, int hs) {
  return (static_cast<std::size_t>(b) * T + t) * 3 * C + static_cast<std::size_t>(part) * C +
         static_cast<std::size_t>(h) * hs;
}

// One block per (b, h, t) row: probabilities into att[b, h, t, 0..t].
__global__ void softmax_kernel(float* att, const float* qkv, int T, int C, int NH) {
  __shared__ float shared[kBlock];
  const int t = blockIdx.x % T;
  const int h = (blockIdx.x / T) % NH;
  const int b = blockIdx.x / (T * NH);
  const int hs = C / NH;
  const float scale = 1.0f / sqrtf(static_cast<float>(hs));
  float* row = att + static_cast<std::size_t>(blockIdx.x) * T;
  const float* q = qkv + qkv_index(b, t, T, C, 0, h, hs);
  float max_score = -INFINITY;
  for (int j = threadIdx.x; j <= t; j += kBlock) {
    const float* k = qkv + qkv_index(b, j, T, C, 1, h, hs);
    float dot = 0.0f;
    for (int d = 0; d < hs; ++d) dot += q[d] * k[d];
    row[j] = dot * scale;
    max_score = fmaxf(max_score, dot * scale);
  }
  max_score = block_max<kBlock>(max_score, shared);
  float sum = 0.0f;
  for (int j = threadIdx.x; j <= t; j += kBlock) {
    const float e = exp_approx(row[j] - max_score);
    row[j] = e;
    sum += e;
  }
  const float inverse = 1.0f / block_sum<kBlock>(sum, shared);
  for (int j = threadIdx.x; j <= t; j += kBlock) row[j] *= inverse;
}

// out[b, t, h hs + d] = sum_{j <= t} att[b, h, t, j] v[b, j, h, d]: one thread each.
__global__ void weighted_values_kernel(float* out, const float* att, const float* qkv, int B, int T, int C, int NH) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<std::size_t>(B) * T * C) return;
  const int channel = static_cast<int>(i % C);
  const int t = static_cast<int>((i / C) % T);
  const int b = static_cast<int>(i / (static_cast<std::size_t>(C) * T));
  const int hs = C / NH;
  const int h = channel / hs;
  const int d = channel % hs;
  const float* row = att + ((static_cast<std::size_t>(b) * NH + h) * T + t) * T;
  float sum = 0.0f;
  for (int j = 0; j <= t; ++j) sum += row[j] * qkv[qkv_index(b, j, T, C, 2, h, hs) + d];
  out[i] = sum;
}

// datt[b, h, t, j] = dout_t · v_j, then dpre = att (datt - sum_j att datt), into
// scratch[b, h, t, 0..t]: one block per row.
__global__ void softmax_backward_kernel(float* dpre, const float* att, const float* dout, const float* qkv, int T,
                                        int C, int NH) {
  __shared__ float shared[kBlock];
  const int t = blockIdx.x % T;
  const int h = (blockIdx.x / T) % NH;
  const int b = blockIdx.x / (T * NH);
  const int hs = C / NH;
  const float* row = att + static_cast<std::size_t>(blockIdx.x) * T;
  float* drow = dpre + static_cast<std::size_t>(blockIdx.x) * T;
  const float* g = dout + (static_cast<std::size_t>(b) * T + t) * C + static_cast<std::size_t>(h) * hs;
  float dot_sum = 0.0f;
  for (int j = threadIdx.x; j <= t; j += kBlock) {
    const float* v = qkv + qkv_index(b, j, T, C, 2, h, hs);
    float datt = 0.0f;
    for (int d = 0; d < hs; ++d) datt += g[d] * v[d];
    drow[j] = datt;
    dot_sum += row[j] * datt;
  }
  const float total = block_sum<kBlock>(dot_sum, shared);
  for (int j = threadIdx.x; j <= t; j += kBlock) drow[j] = row[j] * (drow[j] - total);
}

// dq, dk, dv into dqkv, one thread per (b, t, part, channel).
__global__ void attention_grads_kernel(float* dqkv, const float* dpre, const float* att, const float* dout,
                                       const float* qkv, int B, int T, int C, int NH) {
  const std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  if (i >= static_cast<std::size_t>(B) * T * 3 * C) return;
  const int column = static_cast<int>(i % (3 * C));
  const int t = static_cast<int>((i / (3 * C)) % T);
  const int b = static_cast<int>(i / (static_cast<std::size_t>(3) * C * T));
  const int part = column / C;
  const int channel = column % C;
  const int hs = C / NH;
  const int h = channel / hs;
  const int d = channel % hs;
  const float scale = 1.0f / sqrtf(static_cast<float>(hs));
  const std::size_t head_rows = (static_cast<std::size_t>(b) * NH + h) * T;
  float sum = 0.0f;
  if (part == 0) {  // dq_t = scale sum_{j <= t} dpre[t, j] k_j
    const float* drow = dpre + (head_rows + t) * T;
    for (int j = 0; j <= t; ++j) sum += drow[j] * qkv[qkv_index(b, j, T, C, 1, h, hs) + d];
    sum *= scale;
  } else if (part == 1) {  // dk_t = scale sum_{s >= t} dpre[s, t] q_s
    for (int s = t; s < T; ++s) sum += dpre[(head_rows + s) * T + t] * qkv[qkv_index(b, s, T, C, 0, h, hs) + d];
    sum *= scale;
  } else {  // dv_t = sum_{s >= t} att[s, t] dout_s
    for (int s = t; s < T; ++s) {
      sum += att[(head_rows + s) * T + t] * dout[(static_cast<std::size_t>(b) * T + s) * C + channel];
    }
  }
  dqkv[i] = sum;
}

}  // namespace

void attention_forward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  if (B * T == 0) return;
  softmax_kernel<<<B * NH * T, kBlock, 0, stream()>>>(att, qkv, T, C, NH);
  DUFU_CUDA_CHECK_LAUNCH();
  const std::size_t n = static_cast<std::size_t>(B) * T * C;
  weighted_values_kernel<<<blocks_for(n, kBlock), kBlock, 0, stream()>>>(out, att, qkv, B, T, C, NH);
  DUFU_CUDA_CHECK_LAUNCH();
}

void attention_backward(float* dqkv, float* datt_scratch, const float* dout, const float* qkv, const float* att, int B,
                        int T, int C, int NH) {
  if (B * T == 0) return;
  softmax_backward_kernel<<<B * NH * T, kBlock, 0, stream()>>>(datt_scratch, att, dout, qkv, T, C, NH);
  DUFU_CUDA_CHECK_LAUNCH();
  const std::size_t n = static_cast<std::size_t>(B) * T * 3 * C;
  attention_grads_kernel<<<blocks_for(n, kBlock), kBlock, 0, stream()>>>(dqkv, datt_scratch, att, dout, qkv, B, T, C,
                                                                          NH);
  DUFU_CUDA_CHECK_LAUNCH();
}

}  // namespace dufu::trainer::cuda
