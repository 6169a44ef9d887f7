// CUDA RMSNorm forward (plain and fused with the residual add) and backward: one block
// per row with deterministic block reductions, and dweight as column sums over the row
// chunks of kernel_partition.h, the same chunks the CPU kernel uses.
#include <cuda_runtime.h>

#include "block_reduce.cuh"
#include "cuda_check.h"
#include "cuda_kernels.h"
#include "cuda_scratch.h"
#include "dufu/trainer/device/kernel_partition.h"
#include "dufu/trainer/device/llama_math.h"

namespace dufu::trainer::cuda {

namespace {

constexpr int kBlock = 256;

// Normalizes row n of x (or of residual + branch, stored to residual_out first).
__global__ void rmsnorm_kernel(float* residual_out, float* out, float* rstd_out, const float* x, const float* branch,
                               const float* weight, float eps, int C) {
  __shared__ float shared[kBlock];
  const std::size_t offset = static_cast<std::size_t>(blockIdx.x) * C;
  float sum_sq = 0.0f;
  for (int c = threadIdx.x; c < C; c += kBlock) {
    float value = x[offset + c];
    if (branch != nullptr) {
      value += branch[offset + c];
      residual_out[offset + c] = value;
    }
    sum_sq += value * value;
  }
  __syncthreads();  // residual_out may be x: every read of this row is done
  const float* row = branch != nullptr ? residual_out + offset : x + offset;
  const float rstd = rmsnorm_rstd(block_sum<kBlock>(sum_sq, shared), C, eps);
  for (int c = threadIdx.x; c < C; c += kBlock) out[offset + c] = row[c] * rstd * weight[c];
  if (threadIdx.x == 0) rstd_out[blockIdx.x] = rstd;
}

__global__ void rmsnorm_dx_kernel(float* dx, const float* dout, const float* x, const float* weight,
                                  const float* rstd, int C) {
  __shared__ float shared[kBlock];
  const std::size_t offset = static_cast<std::size_t>(blockIdx.x) * C;
  const float s = rstd[blockIdx.x];
  float dnorm_norm_sum = 0.0f;
  for (int c = threadIdx.x; c < C; c += kBlock) dnorm_norm_sum += weight[c] * dout[offset + c] * (x[offset + c] * s);
  const float dnorm_norm_mean = block_sum<kBlock>(dnorm_norm_sum, shared) / static_cast<float>(C);
  for (int c = threadIdx.x; c < C; c += kBlock) {
    dx[offset + c] += rmsnorm_dx(weight[c] * dout[offset + c], x[offset + c] * s, dnorm_norm_mean, s);
  }
}

// Per chunk of rows and column: the partial sum of norm * dout (dweight).
__global__ void rmsnorm_dweight_partials(double* partial, const float* dout, const float* x, const float* rstd, int N,
                                         int C, int chunks) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int chunk = blockIdx.y;
  if (c >= C) return;
  double dweight = 0.0;
  for (int n = row_chunk_begin(N, chunks, chunk); n < row_chunk_begin(N, chunks, chunk + 1); ++n) {
    const std::size_t i = static_cast<std::size_t>(n) * C + c;
    dweight += static_cast<double>(x[i] * rstd[n] * dout[i]);
  }
  partial[static_cast<std::size_t>(chunk) * C + c] = dweight;
}

__global__ void rmsnorm_dweight_finish(float* dweight, const double* partial, int C, int chunks) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  double sum = 0.0;
  for (int chunk = 0; chunk < chunks; ++chunk) sum += partial[static_cast<std::size_t>(chunk) * C + c];
  dweight[c] += static_cast<float>(sum);
}

}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* x, const float* weight, float eps, int N, int C) {
  if (N == 0) return;
  rmsnorm_kernel<<<N, kBlock, 0, stream()>>>(nullptr, out, rstd, x, nullptr, weight, eps, C);
  DUFU_CUDA_CHECK_LAUNCH();
}

void residual_rmsnorm_forward(float* residual_out, float* norm_out, float* rstd, const float* residual,
                              const float* branch, const float* weight, float eps, int N, int C) {
  if (N == 0) return;
  rmsnorm_kernel<<<N, kBlock, 0, stream()>>>(residual_out, norm_out, rstd, residual, branch, weight, eps, C);
  DUFU_CUDA_CHECK_LAUNCH();
}

void rmsnorm_backward(float* dx, float* dweight, const float* dout, const float* x, const float* weight,
                      const float* rstd, int N, int C) {
  if (N == 0) return;
  rmsnorm_dx_kernel<<<N, kBlock, 0, stream()>>>(dx, dout, x, weight, rstd, C);
  DUFU_CUDA_CHECK_LAUNCH();
  const int chunks = row_chunk_count(N);
  // One double per chunk and column: half of what LayerNorm's backward takes, so the
  // scratch sized for LayerNorm (cuda_scratch.h) covers it.
  auto* partial = static_cast<double*>(scratch(column_sum_scratch_bytes(N, C)));
  const dim3 grid(blocks_for(static_cast<std::size_t>(C), kBlock), static_cast<unsigned>(chunks));
  rmsnorm_dweight_partials<<<grid, kBlock, 0, stream()>>>(partial, dout, x, rstd, N, C, chunks);
  DUFU_CUDA_CHECK_LAUNCH();
  rmsnorm_dweight_finish<<<blocks_for(static_cast<std::size_t>(C), kBlock), kBlock, 0, stream()>>>(dweight, partial,
                                                                                                  C, chunks);
  DUFU_CUDA_CHECK_LAUNCH();
}

}  // namespace dufu::trainer::cuda
