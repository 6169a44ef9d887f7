// CUDA LayerNorm forward (plain and fused with the residual add) and backward: one
// warp per row, 16-byte loads where the rows allow them, statistics by warp shuffles
// in a fixed order; dweight/dbias as column sums over the row chunks of
// kernel_partition.h, the same chunks the CPU kernel uses.
#include <cuda_runtime.h>

#include "block_reduce.cuh"
#include "cuda_check.h"
#include "cuda_kernels.h"
#include "cuda_scratch.h"
#include "dufu/trainer/device/kernel_math.h"
#include "dufu/trainer/device/kernel_partition.h"
#include "float_groups.cuh"

namespace dufu::trainer::cuda {

namespace {

constexpr int kBlock = 256;
constexpr int kRowsPerBlock = kBlock / kWarpSize;

// One warp per row, kWidth values per lane at a time (float_groups.cuh): the row's
// statistics are warp shuffles, no shared memory and no block barrier. Normalizes row
// n of x (or of residual + branch, stored to residual_kept first, rounded as it keeps
// it, and read back by the lane that stored it, so it may be x); out rounded as
// out_kept keeps it. Mean, then variance around it,
// as the CPU kernel takes them.
template <int kWidth>
__global__ void __launch_bounds__(kBlock)
    layernorm_kernel(TensorOut residual_kept, TensorOut out_kept, float* mean_out, float* rstd_out, const float* x,
                     const float* branch, const float* weight, const float* bias, int N, int C) {
  const int n = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (n >= N) return;
  const int lane = threadIdx.x % kWarpSize;
  const int groups = C / kWidth;
  const std::size_t offset = static_cast<std::size_t>(n) * C;
  float value[kWidth];
  float sum = 0.0f;
  for (int i = lane; i < groups; i += kWarpSize) {
    load_group(value, x + offset, i);
    if (branch != nullptr) {
      float added[kWidth];
      load_group(added, branch + offset, i);
#pragma unroll
      for (int k = 0; k < kWidth; ++k) value[k] += added[k];
      keep_group(value, residual_kept, offset, i);
      store_group(residual_kept.values + offset, i, value);
    }
#pragma unroll
    for (int k = 0; k < kWidth; ++k) sum += value[k];
  }
  const float* row = branch != nullptr ? residual_kept.values + offset : x + offset;
  const float mean = warp_sum(sum) / static_cast<float>(C);
  float sum_sq = 0.0f;
  for (int i = lane; i < groups; i += kWarpSize) {
    load_group(value, row, i);
#pragma unroll
    for (int k = 0; k < kWidth; ++k) sum_sq += (value[k] - mean) * (value[k] - mean);
  }
  const float rstd = rsqrtf(warp_sum(sum_sq) / static_cast<float>(C) + kLayerNormEps);
  for (int i = lane; i < groups; i += kWarpSize) {
    float w[kWidth], b[kWidth];
    load_group(value, row, i);
    load_group(w, weight, i);
    load_group(b, bias, i);
#pragma unroll
    for (int k = 0; k < kWidth; ++k) value[k] = (value[k] - mean) * rstd * w[k] + b[k];
    keep_group(value, out_kept, offset, i);
    store_group(out_kept.values + offset, i, value);
  }
  if (lane == 0) {
    mean_out[n] = mean;
    rstd_out[n] = rstd;
  }
}

// dx += ..., one warp per row as the forward; the two row means by warp shuffles.
template <int kWidth>
__global__ void __launch_bounds__(kBlock)
    layernorm_dx_kernel(TensorOut dx, const float* dout, const float* x, const float* weight, const float* mean,
                        const float* rstd, int N, int C) {
  const int n = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (n >= N) return;
  const int lane = threadIdx.x % kWarpSize;
  const int groups = C / kWidth;
  const std::size_t offset = static_cast<std::size_t>(n) * C;
  const float m = mean[n];
  const float s = rstd[n];
  float xs[kWidth], g[kWidth], w[kWidth];
  float dnorm_sum = 0.0f;
  float dnorm_norm_sum = 0.0f;
  for (int i = lane; i < groups; i += kWarpSize) {
    load_group(xs, x + offset, i);
    load_group(g, dout + offset, i);
    load_group(w, weight, i);
#pragma unroll
    for (int k = 0; k < kWidth; ++k) {
      const float dnorm = w[k] * g[k];
      dnorm_sum += dnorm;
      dnorm_norm_sum += dnorm * ((xs[k] - m) * s);
    }
  }
  const float dnorm_mean = warp_sum(dnorm_sum) / static_cast<float>(C);
  const float dnorm_norm_mean = warp_sum(dnorm_norm_sum) / static_cast<float>(C);
  for (int i = lane; i < groups; i += kWarpSize) {
    float d[kWidth];
    load_group(xs, x + offset, i);
    load_group(g, dout + offset, i);
    load_group(w, weight, i);
    load_group(d, dx.values + offset, i);
#pragma unroll
    for (int k = 0; k < kWidth; ++k) {
      const float norm = (xs[k] - m) * s;
      d[k] += (w[k] * g[k] - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
    keep_group(d, dx, offset, i);
    store_group(dx.values + offset, i, d);
  }
}

// Per chunk of rows and column: the partial sums of norm * dout (dweight) and dout
// (dbias), each thread its column of its chunk in row order. Blocks of kColumnSumTile
// columns, so that C = 768 over 32 chunks makes 384 blocks (kernel_partition.h).
__global__ void __launch_bounds__(kColumnSumTile)
    layernorm_dparams_partials(double* partial, const float* dout, const float* x, const float* mean, const float* rstd,
                               int N, int C, int chunks) {
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

unsigned row_blocks(int N) { return blocks_for(static_cast<std::size_t>(N), kRowsPerBlock); }

}  // namespace

void layernorm_forward(TensorOut out, float* mean, float* rstd, const float* x, const float* weight, const float* bias,
                       int N, int C) {
  residual_layernorm_forward(nullptr, out, mean, rstd, x, nullptr, weight, bias, N, C);
}

void residual_layernorm_forward(TensorOut residual_out, TensorOut norm_out, float* mean, float* rstd,
                                const float* residual, const float* branch, const float* weight, const float* bias, int N,
                                int C) {
  if (N == 0) return;
  if (rows_take_float4(C, residual_out.values, norm_out.values, residual, branch, weight, bias)) {
    layernorm_kernel<4><<<row_blocks(N), kBlock, 0, stream()>>>(residual_out, norm_out, mean, rstd, residual, branch,
                                                                weight, bias, N, C);
  } else {
    layernorm_kernel<1><<<row_blocks(N), kBlock, 0, stream()>>>(residual_out, norm_out, mean, rstd, residual, branch,
                                                                weight, bias, N, C);
  }
  DUFU_CUDA_CHECK_LAUNCH();
}

void layernorm_backward(TensorOut dx, float* dweight, float* dbias, const float* dout, const float* x,
                        const float* weight, const float* mean, const float* rstd, int N, int C) {
  if (N == 0) return;
  if (rows_take_float4(C, dx.values, dout, x, weight)) {
    layernorm_dx_kernel<4><<<row_blocks(N), kBlock, 0, stream()>>>(dx, dout, x, weight, mean, rstd, N, C);
  } else {
    layernorm_dx_kernel<1><<<row_blocks(N), kBlock, 0, stream()>>>(dx, dout, x, weight, mean, rstd, N, C);
  }
  DUFU_CUDA_CHECK_LAUNCH();
  const int chunks = row_chunk_count(N);
  auto* partial = static_cast<double*>(scratch(layernorm_scratch_bytes(N, C)));
  const dim3 grid(column_sum_tiles(C), static_cast<unsigned>(chunks));
  layernorm_dparams_partials<<<grid, kColumnSumTile, 0, stream()>>>(partial, dout, x, mean, rstd, N, C, chunks);
  DUFU_CUDA_CHECK_LAUNCH();
  layernorm_dparams_finish<<<blocks_for(static_cast<std::size_t>(C), kBlock), kBlock, 0, stream()>>>(
      dweight, dbias, partial, C, chunks);
  DUFU_CUDA_CHECK_LAUNCH();
}

}  // namespace dufu::trainer::cuda
