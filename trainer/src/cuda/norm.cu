// CUDA LayerNorm and RMSNorm, forward (plain and fused with the residual add) and
// backward: one set of kernels, centred or not, as the CPU's norm.cc (ggml's
// norm_f32(..., sub_mean) is the model). Centred is LayerNorm: the row mean, then the
// variance around it, a bias; not centred is RMSNorm: the mean of squares, no bias.
// Each keeps its own arithmetic, as the CPU kernel takes it. One warp per row, 16-byte
// loads where the rows allow them, the row sums by warp shuffles in a fixed order;
// dweight (and LayerNorm's dbias) as column sums over the row chunks of
// kernel_partition.h, the same chunks the CPU kernel uses.
#include <cuda_runtime.h>

#include "block_reduce.cuh"
#include "cuda_check.h"
#include "cuda_kernels.h"
#include "cuda_scratch.h"
#include "device/kernel_math.h"
#include "device/kernel_partition.h"
#include "device/llama_math.h"
#include "float_groups.cuh"

namespace dufu::trainer::cuda {

namespace {

constexpr int kBlock = 256;
constexpr int kRowsPerBlock = kBlock / kWarpSize;

constexpr bool kLayerNorm = true;  // centred
constexpr bool kRMSNorm = false;

// One warp per row, kWidth values per lane at a time (float_groups.cuh): the row's
// statistics are warp shuffles, no shared memory and no block barrier. Normalizes row
// n of x (or of residual + branch, stored to residual_kept first, rounded as it keeps
// it, and read back by the lane that stored it, so it may be x); out rounded as
// out_kept keeps it. Centred: mean, then variance around it; else the sum of squares.
// mean_out and bias are read only when centred, eps only when not (LayerNorm's is
// kLayerNormEps).
template <bool kCentred, int kWidth>
__global__ void __launch_bounds__(kBlock)
    norm_kernel(TensorOut residual_kept, TensorOut out_kept, float* mean_out, float* rstd_out, const float* x,
                const float* branch, const float* weight, const float* bias, float eps, int N, int C) {
  const int n = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (n >= N) return;
  const int lane = threadIdx.x % kWarpSize;
  const int groups = C / kWidth;
  const std::size_t offset = static_cast<std::size_t>(n) * C;
  float value[kWidth];
  float sum = 0.0f;  // of the values when centred, of their squares when not
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
    for (int k = 0; k < kWidth; ++k) {
      if constexpr (kCentred) {
        sum += value[k];
      } else {
        sum += value[k] * value[k];
      }
    }
  }
  const float* row = branch != nullptr ? residual_kept.values + offset : x + offset;
  float mean = 0.0f;
  float rstd;
  if constexpr (kCentred) {
    mean = warp_sum(sum) / static_cast<float>(C);
    float sum_sq = 0.0f;
    for (int i = lane; i < groups; i += kWarpSize) {
      load_group(value, row, i);
#pragma unroll
      for (int k = 0; k < kWidth; ++k) sum_sq += (value[k] - mean) * (value[k] - mean);
    }
    rstd = rsqrtf(warp_sum(sum_sq) / static_cast<float>(C) + kLayerNormEps);
  } else {
    rstd = rmsnorm_rstd(warp_sum(sum), C, eps);
  }
  for (int i = lane; i < groups; i += kWarpSize) {
    float w[kWidth];
    load_group(value, row, i);
    load_group(w, weight, i);
    if constexpr (kCentred) {
      float b[kWidth];
      load_group(b, bias, i);
#pragma unroll
      for (int k = 0; k < kWidth; ++k) value[k] = (value[k] - mean) * rstd * w[k] + b[k];
    } else {
#pragma unroll
      for (int k = 0; k < kWidth; ++k) value[k] = value[k] * rstd * w[k];
    }
    keep_group(value, out_kept, offset, i);
    store_group(out_kept.values + offset, i, value);
  }
  if (lane == 0) {
    if constexpr (kCentred) mean_out[n] = mean;
    rstd_out[n] = rstd;
  }
}

// dx += ..., one warp per row as the forward; the row means (of dnorm when centred, and
// of dnorm * norm) by warp shuffles. mean is read only when centred.
template <bool kCentred, int kWidth>
__global__ void __launch_bounds__(kBlock)
    norm_dx_kernel(TensorOut dx, const float* dout, const float* x, const float* weight, const float* mean,
                   const float* rstd, int N, int C) {
  const int n = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarpSize;
  if (n >= N) return;
  const int lane = threadIdx.x % kWarpSize;
  const int groups = C / kWidth;
  const std::size_t offset = static_cast<std::size_t>(n) * C;
  const float m = kCentred ? mean[n] : 0.0f;
  const float s = rstd[n];
  float xs[kWidth], g[kWidth], w[kWidth];
  float dnorm_sum = 0.0f;  // centred only
  float dnorm_norm_sum = 0.0f;
  for (int i = lane; i < groups; i += kWarpSize) {
    load_group(xs, x + offset, i);
    load_group(g, dout + offset, i);
    load_group(w, weight, i);
#pragma unroll
    for (int k = 0; k < kWidth; ++k) {
      if constexpr (kCentred) {
        const float dnorm = w[k] * g[k];
        dnorm_sum += dnorm;
        dnorm_norm_sum += dnorm * ((xs[k] - m) * s);
      } else {
        dnorm_norm_sum += w[k] * g[k] * (xs[k] * s);
      }
    }
  }
  const float dnorm_mean = kCentred ? warp_sum(dnorm_sum) / static_cast<float>(C) : 0.0f;
  const float dnorm_norm_mean = warp_sum(dnorm_norm_sum) / static_cast<float>(C);
  for (int i = lane; i < groups; i += kWarpSize) {
    float d[kWidth];
    load_group(xs, x + offset, i);
    load_group(g, dout + offset, i);
    load_group(w, weight, i);
    load_group(d, dx.values + offset, i);
#pragma unroll
    for (int k = 0; k < kWidth; ++k) {
      if constexpr (kCentred) {
        const float norm = (xs[k] - m) * s;
        d[k] += (w[k] * g[k] - dnorm_mean - norm * dnorm_norm_mean) * s;
      } else {
        d[k] += rmsnorm_dx(w[k] * g[k], xs[k] * s, dnorm_norm_mean, s);
      }
    }
    keep_group(d, dx, offset, i);
    store_group(dx.values + offset, i, d);
  }
}

// Column sums a chunk keeps per column: dweight, and dbias when centred.
template <bool kCentred>
constexpr int kSums = kCentred ? 2 : 1;

// Per chunk of rows and column: the partial sums of norm * dout (dweight) and, when
// centred, of dout (dbias), each thread its column of its chunk in row order. Blocks
// of kColumnSumTile columns, so that C = 768 over 32 chunks makes 384 blocks
// (kernel_partition.h). partial holds kSums rows of C per chunk.
template <bool kCentred>
__global__ void __launch_bounds__(kColumnSumTile)
    norm_dparams_partials(double* partial, const float* dout, const float* x, const float* mean, const float* rstd,
                          int N, int C, int chunks) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int chunk = blockIdx.y;
  if (c >= C) return;
  double dweight = 0.0;
  double dbias = 0.0;  // centred only
  for (int n = row_chunk_begin(N, chunks, chunk); n < row_chunk_begin(N, chunks, chunk + 1); ++n) {
    const std::size_t i = static_cast<std::size_t>(n) * C + c;
    if constexpr (kCentred) {
      const float norm = (x[i] - mean[n]) * rstd[n];
      dweight += static_cast<double>(norm * dout[i]);
      dbias += static_cast<double>(dout[i]);
    } else {
      dweight += static_cast<double>(x[i] * rstd[n] * dout[i]);
    }
  }
  partial[(static_cast<std::size_t>(chunk) * kSums<kCentred>) * C + c] = dweight;
  if constexpr (kCentred) partial[(static_cast<std::size_t>(chunk) * 2 + 1) * C + c] = dbias;
}

template <bool kCentred>
__global__ void norm_dparams_finish(float* dweight, float* dbias, const double* partial, int C, int chunks) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  double sum_weight = 0.0;
  double sum_bias = 0.0;  // centred only
  for (int chunk = 0; chunk < chunks; ++chunk) {
    sum_weight += partial[(static_cast<std::size_t>(chunk) * kSums<kCentred>) * C + c];
    if constexpr (kCentred) sum_bias += partial[(static_cast<std::size_t>(chunk) * 2 + 1) * C + c];
  }
  dweight[c] += static_cast<float>(sum_weight);
  if constexpr (kCentred) dbias[c] += static_cast<float>(sum_bias);
}

unsigned row_blocks(int N) { return blocks_for(static_cast<std::size_t>(N), kRowsPerBlock); }

template <bool kCentred>
void norm_forward(TensorOut residual_out, TensorOut norm_out, float* mean, float* rstd, const float* residual,
                  const float* branch, const float* weight, const float* bias, float eps, int N, int C) {
  if (N == 0) return;
  if (rows_take_float4(C, residual_out.values, norm_out.values, residual, branch, weight, bias)) {
    norm_kernel<kCentred, 4><<<row_blocks(N), kBlock, 0, stream()>>>(residual_out, norm_out, mean, rstd, residual,
                                                                     branch, weight, bias, eps, N, C);
  } else {
    norm_kernel<kCentred, 1><<<row_blocks(N), kBlock, 0, stream()>>>(residual_out, norm_out, mean, rstd, residual,
                                                                     branch, weight, bias, eps, N, C);
  }
  DUFU_CUDA_CHECK_LAUNCH();
}

template <bool kCentred>
void norm_backward(TensorOut dx, float* dweight, float* dbias, const float* dout, const float* x, const float* weight,
                   const float* mean, const float* rstd, int N, int C) {
  if (N == 0) return;
  if (rows_take_float4(C, dx.values, dout, x, weight)) {
    norm_dx_kernel<kCentred, 4><<<row_blocks(N), kBlock, 0, stream()>>>(dx, dout, x, weight, mean, rstd, N, C);
  } else {
    norm_dx_kernel<kCentred, 1><<<row_blocks(N), kBlock, 0, stream()>>>(dx, dout, x, weight, mean, rstd, N, C);
  }
  DUFU_CUDA_CHECK_LAUNCH();
  const int chunks = row_chunk_count(N);
  // kSums doubles per chunk and column: RMSNorm's half of LayerNorm's, so the scratch
  // sized for LayerNorm (cuda_scratch.h) covers both.
  const std::size_t bytes = kCentred ? layernorm_scratch_bytes(N, C) : column_sum_scratch_bytes(N, C);
  auto* partial = static_cast<double*>(scratch(bytes));
  const dim3 grid(column_sum_tiles(C), static_cast<unsigned>(chunks));
  norm_dparams_partials<kCentred><<<grid, kColumnSumTile, 0, stream()>>>(partial, dout, x, mean, rstd, N, C, chunks);
  DUFU_CUDA_CHECK_LAUNCH();
  norm_dparams_finish<kCentred><<<blocks_for(static_cast<std::size_t>(C), kBlock), kBlock, 0, stream()>>>(
      dweight, dbias, partial, C, chunks);
  DUFU_CUDA_CHECK_LAUNCH();
}

}  // namespace

void layernorm_forward(TensorOut out, float* mean, float* rstd, const float* x, const float* weight, const float* bias,
                       int N, int C) {
  norm_forward<kLayerNorm>(nullptr, out, mean, rstd, x, nullptr, weight, bias, kLayerNormEps, N, C);
}

void residual_layernorm_forward(TensorOut residual_out, TensorOut norm_out, float* mean, float* rstd,
                                const float* residual, const float* branch, const float* weight, const float* bias, int N,
                                int C) {
  norm_forward<kLayerNorm>(residual_out, norm_out, mean, rstd, residual, branch, weight, bias, kLayerNormEps, N, C);
}

void layernorm_backward(TensorOut dx, float* dweight, float* dbias, const float* dout, const float* x,
                        const float* weight, const float* mean, const float* rstd, int N, int C) {
  norm_backward<kLayerNorm>(dx, dweight, dbias, dout, x, weight, mean, rstd, N, C);
}

void rmsnorm_forward(TensorOut out, float* rstd, const float* x, const float* weight, float eps, int N, int C) {
  norm_forward<kRMSNorm>(nullptr, out, nullptr, rstd, x, nullptr, weight, nullptr, eps, N, C);
}

void residual_rmsnorm_forward(TensorOut residual_out, TensorOut norm_out, float* rstd, const float* residual,
                              const float* branch, const float* weight, float eps, int N, int C) {
  norm_forward<kRMSNorm>(residual_out, norm_out, nullptr, rstd, residual, branch, weight, nullptr, eps, N, C);
}

void rmsnorm_backward(TensorOut dx, float* dweight, const float* dout, const float* x, const float* weight,
                      const float* rstd, int N, int C) {
  norm_backward<kRMSNorm>(dx, dweight, nullptr, dout, x, weight, nullptr, rstd, N, C);
}

}  // namespace dufu::trainer::cuda
