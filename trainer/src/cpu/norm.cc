// CPU LayerNorm and RMSNorm, forward (plain and fused with the residual add) and
// backward: one row norm, centred or not (ggml's norm_f32(..., sub_mean) is the
// model). Centred is LayerNorm: the row mean subtracted, the variance taken around it
// (two passes over a row that is in cache: a centred variance is accurate where
// E[x^2] - E[x]^2 is not), a bias added. Not centred is RMSNorm: the mean of squares,
// no bias. Each keeps its own arithmetic, element for element.
//
// The backward's dweight (and LayerNorm's dbias) are sums over rows: rows are cut into
// a fixed number of chunks (kernel_partition.h, independent of the thread count; the
// CUDA kernels cut the same), each chunk sums privately, and the chunks are added in
// order, so the result does not depend on scheduling.
//
// The OpenMP loops stay in the entry points: DUFU_CPU_CLONES clones a function with its
// parallel regions, and the row helpers below are inlined into every clone.
#include <cmath>
#include <cstddef>
#include <vector>

#include "cpu_kernels.h"
#include "device/kernel_math.h"
#include "device/kernel_partition.h"
#include "device/llama_math.h"

namespace dufu::trainer::cpu {

namespace {

constexpr bool kLayerNorm = true;  // centred
constexpr bool kRMSNorm = false;

// Column sums a chunk keeps per column: dweight, and dbias when centred.
template <bool kCentred>
constexpr int kSums = kCentred ? 2 : 1;

// The normalized value of x in a row of `mean` (centred only) and `rstd`.
template <bool kCentred>
inline float normalized(float x, float mean, float rstd) {
  if constexpr (kCentred) {
    return (x - mean) * rstd;
  } else {
    return x * rstd;
  }
}

// Row n of residual (+ branch, stored to residual_out first and rounded as it keeps
// it), normalized into norm_out; mean (centred only) and rstd of the row recorded.
template <bool kCentred>
inline void forward_row(TensorOut residual_out, TensorOut norm_out, float* mean, float* rstd, const float* residual,
                        const float* branch, const float* weight, const float* bias, float eps, int n, int C) {
  const std::size_t offset = static_cast<std::size_t>(n) * C;
  const float* x = residual + offset;
  if (branch != nullptr) {
    float* r = residual_out.values + offset;
    const float* b = branch + offset;
    for (int c = 0; c < C; ++c) r[c] = x[c] + b[c];
    keep_row(residual_out, offset, C);
    x = r;
  }
  float* out = norm_out.values + offset;
  float row_mean = 0.0f;
  float sum_sq = 0.0f;
  if constexpr (kCentred) {
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int c = 0; c < C; ++c) sum += x[c];
    row_mean = sum / static_cast<float>(C);
#pragma omp simd reduction(+ : sum_sq)
    for (int c = 0; c < C; ++c) {
      const float d = x[c] - row_mean;
      sum_sq += d * d;
    }
  } else {
#pragma omp simd reduction(+ : sum_sq)
    for (int c = 0; c < C; ++c) sum_sq += x[c] * x[c];
  }
  const float row_rstd = rmsnorm_rstd(sum_sq, C, eps);  // 1 / sqrt(sum_sq / C + eps), for both
  for (int c = 0; c < C; ++c) {
    if constexpr (kCentred) {
      out[c] = normalized<kCentred>(x[c], row_mean, row_rstd) * weight[c] + bias[c];
    } else {
      out[c] = normalized<kCentred>(x[c], row_mean, row_rstd) * weight[c];
    }
  }
  if constexpr (kCentred) mean[n] = row_mean;
  rstd[n] = row_rstd;
  keep_row(norm_out, offset, C);
}

// dx += the rows of one chunk; the chunk's column sums into `partial` (kSums x C:
// dweight, then dbias when centred).
template <bool kCentred>
inline void backward_chunk(TensorOut kept_dx, double* partial, const float* dout, const float* x,
                           const float* weight, const float* mean, const float* rstd, int N, int C, int chunks,
                           int chunk) {
  double* dweight_partial = partial + static_cast<std::size_t>(chunk) * kSums<kCentred> * C;
  const int n0 = row_chunk_begin(N, chunks, chunk);
  const int n1 = row_chunk_begin(N, chunks, chunk + 1);
  for (int n = n0; n < n1; ++n) {
    const std::size_t offset = static_cast<std::size_t>(n) * C;
    const float* g = dout + offset;
    const float* xn = x + offset;
    float* dxn = kept_dx.values + offset;
    const float m = kCentred ? mean[n] : 0.0f;
    const float s = rstd[n];
    // dL/dnorm = weight * dout; the row means are the projections that normalization
    // removes: onto norm itself, and for LayerNorm onto the constant too.
    if constexpr (kCentred) {
      float dnorm_mean = 0.0f;
      float dnorm_norm_mean = 0.0f;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
      for (int c = 0; c < C; ++c) {
        const float norm = normalized<kCentred>(xn[c], m, s);
        const float dnorm = weight[c] * g[c];
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * norm;
      }
      dnorm_mean /= static_cast<float>(C);
      dnorm_norm_mean /= static_cast<float>(C);
      double* dbias_partial = dweight_partial + C;
      for (int c = 0; c < C; ++c) {
        const float norm = normalized<kCentred>(xn[c], m, s);
        const float dnorm = weight[c] * g[c];
        dxn[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
        dweight_partial[c] += static_cast<double>(norm * g[c]);
        dbias_partial[c] += static_cast<double>(g[c]);
      }
    } else {
      float dnorm_norm_sum = 0.0f;
#pragma omp simd reduction(+ : dnorm_norm_sum)
      for (int c = 0; c < C; ++c) dnorm_norm_sum += weight[c] * g[c] * normalized<kCentred>(xn[c], m, s);
      const float dnorm_norm_mean = dnorm_norm_sum / static_cast<float>(C);
      for (int c = 0; c < C; ++c) {
        const float norm = normalized<kCentred>(xn[c], m, s);
        dxn[c] += rmsnorm_dx(weight[c] * g[c], norm, dnorm_norm_mean, s);
        dweight_partial[c] += static_cast<double>(norm * g[c]);
      }
    }
    keep_row(kept_dx, offset, C);
  }
}

// dweight[c] (and dbias[c] when centred) += column c's chunk sums, added in order.
template <bool kCentred>
inline void add_column_sums(float* dweight, float* dbias, const double* partial, int C, int chunks, int c) {
  double sum_weight = 0.0;
  double sum_bias = 0.0;
  for (int chunk = 0; chunk < chunks; ++chunk) {
    const double* chunk_sums = partial + static_cast<std::size_t>(chunk) * kSums<kCentred> * C;
    sum_weight += chunk_sums[c];
    if constexpr (kCentred) sum_bias += chunk_sums[C + c];
  }
  dweight[c] += static_cast<float>(sum_weight);
  if constexpr (kCentred) dbias[c] += static_cast<float>(sum_bias);
}

// The backward's column sums: kSums doubles per chunk and column.
template <bool kCentred>
std::vector<double> chunk_sums(int chunks, int C) {
  return std::vector<double>(static_cast<std::size_t>(chunks) * kSums<kCentred> * C, 0.0);
}

}  // namespace

DUFU_CPU_CLONES void layernorm_forward(TensorOut out, float* mean, float* rstd, const float* x, const float* weight,
                                       const float* bias, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    forward_row<kLayerNorm>(TensorOut{}, out, mean, rstd, x, nullptr, weight, bias, kLayerNormEps, n, C);
  }
}

DUFU_CPU_CLONES void residual_layernorm_forward(TensorOut residual_out, TensorOut norm_out, float* mean, float* rstd,
                                                const float* residual, const float* branch, const float* weight,
                                                const float* bias, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    forward_row<kLayerNorm>(residual_out, norm_out, mean, rstd, residual, branch, weight, bias, kLayerNormEps, n, C);
  }
}

DUFU_CPU_CLONES void rmsnorm_forward(TensorOut out, float* rstd, const float* x, const float* weight, float eps, int N,
                                     int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    forward_row<kRMSNorm>(TensorOut{}, out, nullptr, rstd, x, nullptr, weight, nullptr, eps, n, C);
  }
}

DUFU_CPU_CLONES void residual_rmsnorm_forward(TensorOut residual_out, TensorOut norm_out, float* rstd,
                                              const float* residual, const float* branch, const float* weight,
                                              float eps, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    forward_row<kRMSNorm>(residual_out, norm_out, nullptr, rstd, residual, branch, weight, nullptr, eps, n, C);
  }
}

DUFU_CPU_CLONES void layernorm_backward(TensorOut kept_dx, float* dweight, float* dbias, const float* dout,
                                        const float* x, const float* weight, const float* mean, const float* rstd,
                                        int N, int C) {
  const int chunks = row_chunk_count(N);
  std::vector<double> partial = chunk_sums<kLayerNorm>(chunks, C);
#pragma omp parallel for schedule(static)
  for (int chunk = 0; chunk < chunks; ++chunk) {
    backward_chunk<kLayerNorm>(kept_dx, partial.data(), dout, x, weight, mean, rstd, N, C, chunks, chunk);
  }
#pragma omp parallel for schedule(static)
  for (int c = 0; c < C; ++c) add_column_sums<kLayerNorm>(dweight, dbias, partial.data(), C, chunks, c);
}

DUFU_CPU_CLONES void rmsnorm_backward(TensorOut kept_dx, float* dweight, const float* dout, const float* x,
                                      const float* weight, const float* rstd, int N, int C) {
  const int chunks = row_chunk_count(N);
  std::vector<double> partial = chunk_sums<kRMSNorm>(chunks, C);
#pragma omp parallel for schedule(static)
  for (int chunk = 0; chunk < chunks; ++chunk) {
    backward_chunk<kRMSNorm>(kept_dx, partial.data(), dout, x, weight, nullptr, rstd, N, C, chunks, chunk);
  }
#pragma omp parallel for schedule(static)
  for (int c = 0; c < C; ++c) add_column_sums<kRMSNorm>(dweight, nullptr, partial.data(), C, chunks, c);
}

}  // namespace dufu::trainer::cpu
