// CPU LayerNorm forward (plain and fused with the residual add) and backward.
// The backward's dweight/dbias are sums over rows: rows are cut into a fixed number
// of chunks (independent of the thread count), each chunk sums privately, and the
// chunks are added in order, so the result does not depend on scheduling.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "cpu_kernels.h"
#include "dufu/trainer/device/kernel_math.h"
#include "dufu/trainer/device/kernel_partition.h"

namespace dufu::trainer::cpu {

namespace {

// Normalizes one row whose values are already in `x` (two passes over a row that is
// in cache: a centred variance is accurate where E[x^2] - E[x]^2 is not).
inline void normalize_row(float* out, float* mean_out, float* rstd_out, const float* x, const float* weight,
                          const float* bias, int C) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int c = 0; c < C; ++c) sum += x[c];
  const float mean = sum / static_cast<float>(C);
  float sum_sq = 0.0f;
#pragma omp simd reduction(+ : sum_sq)
  for (int c = 0; c < C; ++c) {
    const float d = x[c] - mean;
    sum_sq += d * d;
  }
  const float rstd = 1.0f / std::sqrt(sum_sq / static_cast<float>(C) + kLayerNormEps);
  for (int c = 0; c < C; ++c) out[c] = (x[c] - mean) * rstd * weight[c] + bias[c];
  *mean_out = mean;
  *rstd_out = rstd;
}

}  // namespace

DUFU_CPU_CLONES void layernorm_forward(TensorOut out, float* mean, float* rstd, const float* x, const float* weight,
                                       const float* bias, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const std::size_t offset = static_cast<std::size_t>(n) * C;
    normalize_row(out.values + offset, mean + n, rstd + n, x + offset, weight, bias, C);
    keep_row(out, offset, C);
  }
}

DUFU_CPU_CLONES void residual_layernorm_forward(TensorOut residual_out, TensorOut norm_out, float* mean, float* rstd,
                                                const float* residual, const float* branch, const float* weight,
                                                const float* bias, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const std::size_t offset = static_cast<std::size_t>(n) * C;
    float* r = residual_out.values + offset;
    const float* a = residual + offset;
    const float* b = branch + offset;
    for (int c = 0; c < C; ++c) r[c] = a[c] + b[c];
    keep_row(residual_out, offset, C);
    normalize_row(norm_out.values + offset, mean + n, rstd + n, r, weight, bias, C);
    keep_row(norm_out, offset, C);
  }
}

DUFU_CPU_CLONES void layernorm_backward(TensorOut kept_dx, float* dweight, float* dbias, const float* dout,
                                        const float* x, const float* weight, const float* mean, const float* rstd,
                                        int N, int C) {
  float* dx = kept_dx.values;
  // Chunks of rows as kernel_partition.h cuts them (the CUDA kernel cuts the same).
  const int chunks = row_chunk_count(N);
  // Per chunk: C partial sums for dweight, then C for dbias.
  std::vector<double> partial(static_cast<std::size_t>(chunks) * 2 * C, 0.0);

#pragma omp parallel for schedule(static)
  for (int chunk = 0; chunk < chunks; ++chunk) {
    double* dweight_partial = partial.data() + static_cast<std::size_t>(chunk) * 2 * C;
    double* dbias_partial = dweight_partial + C;
    const int n0 = row_chunk_begin(N, chunks, chunk);
    const int n1 = row_chunk_begin(N, chunks, chunk + 1);
    for (int n = n0; n < n1; ++n) {
      const std::size_t offset = static_cast<std::size_t>(n) * C;
      const float* g = dout + offset;
      const float* xn = x + offset;
      float* dxn = dx + offset;
      const float m = mean[n];
      const float s = rstd[n];
      // dL/dnorm = weight * dout; the two row means are the projections that
      // normalization removes (onto the constant and onto norm itself).
      float dnorm_mean = 0.0f;
      float dnorm_norm_mean = 0.0f;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
      for (int c = 0; c < C; ++c) {
        const float norm = (xn[c] - m) * s;
        const float dnorm = weight[c] * g[c];
        dnorm_mean += dnorm;
        dnorm_norm_mean += dnorm * norm;
      }
      dnorm_mean /= static_cast<float>(C);
      dnorm_norm_mean /= static_cast<float>(C);
      for (int c = 0; c < C; ++c) {
        const float norm = (xn[c] - m) * s;
        const float dnorm = weight[c] * g[c];
        dxn[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
        dweight_partial[c] += static_cast<double>(norm * g[c]);
        dbias_partial[c] += static_cast<double>(g[c]);
      }
      keep_row(kept_dx, offset, C);
    }
  }

#pragma omp parallel for schedule(static)
  for (int c = 0; c < C; ++c) {
    double sum_weight = 0.0;
    double sum_bias = 0.0;
    for (int chunk = 0; chunk < chunks; ++chunk) {
      const double* dweight_partial = partial.data() + static_cast<std::size_t>(chunk) * 2 * C;
      sum_weight += dweight_partial[c];
      sum_bias += dweight_partial[C + c];
    }
    dweight[c] += static_cast<float>(sum_weight);
    dbias[c] += static_cast<float>(sum_bias);
  }
}

}  // namespace dufu::trainer::cpu
