// CUDA RMSNorm forward (plain and fused with the residual add) and backward: one warp
// per row, 16-byte loads where the rows allow them, the row sums by warp shuffles in a
// fixed order; dweight as column sums over the row chunks of kernel_partition.h, the
// same chunks the CPU kernel uses.
#include <cuda_runtime.h>

#include "block_reduce.cuh"
#include "cuda_check.h"
#include "cuda_kernels.h"
#include "cuda_scratch.h"
#include "dufu/trainer/device/kernel_partition.h"
#include "dufu/trainer/device/llama_math.h"
#include "float_groups.cuh"

namespace dufu::trainer::cuda {

namespace {

constexpr int kBlock = 256;
constexpr int kRowsPerBlock = kBlock / kWarpSize;

// One warp per row, kWidth values per lane at a time (float_groups.cuh), the sum of
// squares by warp shuffles. Normalizes row n of x (or of residual + branch, stored to
// residual_kept first, rounded as it keeps it, and read back by the lane that stored
// it, so it may be x); out rounded as out_kept keeps it.
template <int kWidth>
__global__ void __launch_bounds__(kBlock)
    rmsnorm_kernel(TensorOut residual_kept, TensorOut out_kept, float* rstd_out, const float* x, const float* branch,
                   const float* weight, float eps, int N, int C) {
  const int n = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (n >= N) return;
  const int lane = threadIdx.x % kWarpSize;
  const int groups = C / kWidth;
  const std::size_t offset = static_cast<std::size_t>(n) * C;
  float value[kWidth];
  float sum_sq = 0.0f;
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
    for (int k = 0; k < kWidth; ++k) sum_sq += value[k] * value[k];
  }
  const float* row = branch != nullptr ? residual_kept.values + offset : x + offset;
  const float rstd = rmsnorm_rstd(warp_sum(sum_sq), C, eps);
  for (int i = lane; i < groups; i += kWarpSize) {
    float w[kWidth];
    load_group(value, row, i);
    load_group(w, weight, i);
#pragma unroll
    for (int k = 0; k < kWidth; ++k) value[k] = value[k] * rstd * w[k];
    keep_group(value, out_kept, offset, i);
    store_group(out_kept.values + offset, i, value);
  }
  if (lane == 0) rstd_out[n] = rstd;
}

// dx += ..., one warp per row as the forward.
template <int kWidth>
__global__ void __launch_bounds__(kBlock) rmsnorm_dx_kernel(TensorOut dx, const float* dout, const float* x,
                                                            const float* weight, const float* rstd, int N, int C) {
  const int n = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (n >= N) return;
  const int lane = threadIdx.x % kWarpSize;
  const int groups = C / kWidth;
  const std::size_t offset = static_cast<std::size_t>(n) * C;
  const float s = rstd[n];
  float xs[kWidth], g[kWidth], w[kWidth];
  float dnorm_norm_sum = 0.0f;
  for (int i = lane; i < groups; i += kWarpSize) {
    load_group(xs, x + offset, i);
    load_group(g, dout + offset, i);
    load_group(w, weight, i);
#pragma unroll
    for (int k = 0; k < kWidth; ++k) dnorm_norm_sum += w[k] * g[k] * (xs[k] * s);
  }
  const float dnorm_norm_mean = warp_sum(dnorm_norm_sum) / static_cast<float>(C);
  for (int i = lane; i < groups; i += kWarpSize) {
    float d[kWidth];
    load_group(xs, x + offset, i);
    load_group(g, dout + offset, i);
    load_group(w, weight, i);
    load_group(d, dx.values + offset, i);
#pragma unroll
    for (int k = 0; k < kWidth; ++k) d[k] += rmsnorm_dx(w[k] * g[k], xs[k] * s, dnorm_norm_mean, s);
    keep_group(d, dx, offset, i);
    store_group(dx.values + offset, i, d);
  }
}

// Per chunk of rows and column: the partial sum of norm * dout (dweight), each thread
// its column of its chunk in row order, in blocks of kColumnSumTile columns.
__global__ void __launch_bounds__(kColumnSumTile)
    rmsnorm_dweight_partials(double* partial, const float* dout, const float* x, const float* rstd, int N, int C,
                             int chunks) {
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

unsigned row_blocks(int N) { return blocks_for(static_cast<std::size_t>(N), kRowsPerBlock); }

}  // namespace

void rmsnorm_forward(TensorOut out, float* rstd, const float* x, const float* weight, float eps, int N, int C) {
  residual_rmsnorm_forward(nullptr, out, rstd, x, nullptr, weight, eps, N, C);
}

void residual_rmsnorm_forward(TensorOut residual_out, TensorOut norm_out, float* rstd, const float* residual,
                              const float* branch, const float* weight, float eps, int N, int C) {
  if (N == 0) return;
  if (rows_take_float4(C, residual_out.values, norm_out.values, residual, branch, weight)) {
    rmsnorm_kernel<4>
        <<<row_blocks(N), kBlock, 0, stream()>>>(residual_out, norm_out, rstd, residual, branch, weight, eps, N, C);
  } else {
    rmsnorm_kernel<1>
        <<<row_blocks(N), kBlock, 0, stream()>>>(residual_out, norm_out, rstd, residual, branch, weight, eps, N, C);
  }
  DUFU_CUDA_CHECK_LAUNCH();
}

void rmsnorm_backward(TensorOut dx, float* dweight, const float* dout, const float* x, const float* weight,
                      const float* rstd, int N, int C) {
  if (N == 0) return;
  if (rows_take_float4(C, dx.values, dout, x, weight)) {
    rmsnorm_dx_kernel<4><<<row_blocks(N), kBlock, 0, stream()>>>(dx, dout, x, weight, rstd, N, C);
  } else {
    rmsnorm_dx_kernel<1><<<row_blocks(N), kBlock, 0, stream()>>>(dx, dout, x, weight, rstd, N, C);
  }
  DUFU_CUDA_CHECK_LAUNCH();
  const int chunks = row_chunk_count(N);
  // One double per chunk and column: half of what LayerNorm's backward takes, so the
  // scratch sized for LayerNorm (cuda_scratch.h) covers it.
  auto* partial = static_cast<double*>(scratch(column_sum_scratch_bytes(N, C)));
  const dim3 grid(column_sum_tiles(C), static_cast<unsigned>(chunks));
  rmsnorm_dweight_partials<<<grid, kColumnSumTile, 0, stream()>>>(partial, dout, x, rstd, N, C, chunks);
  DUFU_CUDA_CHECK_LAUNCH();
  rmsnorm_dweight_finish<<<blocks_for(static_cast<std::size_t>(C), kBlock), kBlock, 0, stream()>>>(dweight, partial, C,
                                                                                                   chunks);
  DUFU_CUDA_CHECK_LAUNCH();
}

}  // namespace dufu::trainer::cuda
