// CUDA LayerNorm forward (plain and fused with the residual add) and backward: one
// block per row with deterministic block reductions, and dweight/dbias as column sums
// over the row chunks of kernel_partition.h, the same chunks the CPU kernel uses.
#include <cuda_runtime.h>

#include "block_reduce.cuh"
#include "cuda_check.h"
#include "cuda_kernels.h"
#include "cuda_scratch.h"
#include "dufu/trainer/device/kernel_math.h"
#include "dufu/trainer/device/kernel_partition.h"

namespace dufu::trainer::cuda {

namespace {

constexpr int kBlock = 256;

// Normalizes row n of x (or of residual + branch, stored to residual_out first).
__global__ void layernorm_kernel(float* residual_out, float* out, float* mean_out, float* rstd_out, const float* x,
                                 const float* branch, const float* weight, const float* bias, int C) {
  __shared__ float shared[kBlock];
  const std::size_t offset = static_cast<std::size_t>(blockIdx.x) * C;
  float sum = 0.0f;
  for (int c = threadIdx.x; c < C; c += kBlock) {
    float value = x[offset + c];
    if (branch != nullptr) {
      value += branch[offset + c];
      residual_out[offset + c] = value;
    }
    sum += value;
  }
  __syncthreads();  // residual_out may be x: every read of this row is done
  const float* row = branch != nullptr ? residual_out + offset : x + offset;
  const float mean = block_sum<kBlock>(sum, shared) / static_cast<float>(C);
  float sum_sq = 0.0f;
  for (int c = threadIdx.x; c < C; c += kBlock) {
    const float d = row[c] - mean;
    sum_sq += d * d;
  }
  const float rstd = rsqrtf(block_sum<kBlock>(sum_sq, shared) / static_cast<float>(C) + kLayerNormEps);
  for (int c = threadIdx.x; c < C; c += kBlock) out[offset + c] = (row[c] - mean) * rstd * weight[c] + bias[c];
  if (threadIdx.x == 0) {
    mean_out[blockIdx.x] = mean;
    rstd_out[blockIdx.x] = rstd;
  }
}

__global__ void layernorm_dx_kernel(float* dx, const float* dout, const float* x, const float* weight,
                                    const float* mean, const float* rstd, int C) {
  __shared__ float shared[kBlock];
  const std::size_t offset = static_cast<std::size_t>(blockIdx.x) * C;
  const float m = mean[blockIdx.x];
  const float s = rstd[blockIdx.x];
  float dnorm_sum = 0.0f;
  float dnorm_norm_sum = 0.0f;
  for (int c = threadIdx.x; c < C; c += kBlock) {
    const float norm = (x[offset + c] - m) * s;
    const float dnorm = weight[c] * dout[offset + c];
    dnorm_sum += dnorm;
    dnorm_norm_sum += dnorm * norm;
  }
  const float dnorm_mean = block_sum<kBlock>(dnorm_sum, shared) / static_cast<float>(C);
  const float dnorm_norm_mean = block_sum<kBlock>(dnorm_norm_sum, shared) / static_cast<float>(C);
  for (int c = threadIdx.x; c < C; c += kBlock) {
    const float norm = (x[offset + c] - m) * s;
    const float dnorm = weight[c] * dout[offset + c];
    dx[offset + c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
  }
}

// Per chunk of rows and column: the partial sums of norm * dout (dweight) and dout (dbias).
__global__ void layernorm_dparams_partials(double* partial, const float* dout, const float* x, const float* mean,
                                           const float* rstd, int N, int C, int chunks) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int chunk = blockIdx.y;
  if (c >= C) return;
  double dweight = 0.0;
  double dbias = 0.0;
  for (int n = row_chunk_begin(N, chunks, chunk); n < row_chunk_begin(N, chunks, chunk + 1); ++n) {
    const std::size_t i = static_cast<std::size_t>(n) * C + c;
    const float norm = (x[i] - mean[n]) * rstd[n];
    dweight += static_cast<double>(norm * dout[i]);
    dbias += static_cast<double>(dout[i]);
  }
  partial[(static_cast<std::size_t>(chunk) * 2) * C + c] = dweight;
  partial[(static_cast<std::size_t>(chunk) * 2 + 1) * C + c] = dbias;
}

__global__ void layernorm_dparams_finish(float* dweight, float* dbias, const double* partial, int C, int chunks) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  double sum_weight = 0.0;
  double sum_bias = 0.0;
  for (int chunk = 0; chunk < chunks; ++chunk) {
    sum_weight += partial[(static_cast<std::size_t>(chunk) * 2) * C + c];
    sum_bias += partial[(static_cast<std::size_t>(chunk) * 2 + 1) * C + c];
  }
  dweight[c] += static_cast<float>(sum_weight);
  dbias[c] += static_cast<float>(sum_bias);
}

}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* x, const float* weight, const float* bias,
                       int N, int C) {
  if (N == 0) return;
  layernorm_kernel<<<N, kBlock, 0, stream()>>>(nullptr, out, mean, rstd, x, nullptr, weight, bias, C);
  DUFU_CUDA_CHECK_LAUNCH();
}

void residual_layernorm_forward(float* residual_out, float* norm_out, float* mean, float* rstd, const float* residual,
                                const float* branch, const float* weight, const float* bias, int N, int C) {
  if (N == 0) return;
  layernorm_kernel<<<N, kBlock, 0, stream()>>>(residual_out, norm_out, mean, rstd, residual, branch, weight, bias, C);
  DUFU_CUDA_CHECK_LAUNCH();
}

void layernorm_backward(float* dx, float* dweight, float* dbias, const float* dout, const float* x, const float* weight,
                        const float* mean, const float* rstd, int N, int C) {
  if (N == 0) return;
  layernorm_dx_kernel<<<N, kBlock, 0, stream()>>>(dx, dout, x, weight, mean, rstd, C);
  DUFU_CUDA_CHECK_LAUNCH();
  const int chunks = row_chunk_count(N);
  auto* partial = static_cast<double*>(scratch(layernorm_scratch_bytes(N, C)));
  const dim3 grid(blocks_for(static_cast<std::size_t>(C), kBlock), static_cast<unsigned>(chunks));
  layernorm_dparams_partials<<<grid, kBlock, 0, stream()>>>(partial, dout, x, mean, rstd, N, C, chunks);
  DUFU_CUDA_CHECK_LAUNCH();
  layernorm_dparams_finish<<<blocks_for(static_cast<std::size_t>(C), kBlock), kBlock, 0, stream()>>>(
      dweight, dbias, partial, C, chunks);
  DUFU_CUDA_CHECK_LAUNCH();
}

}  // namespace dufu::trainer::cuda
