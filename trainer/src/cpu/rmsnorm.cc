// CPU RMSNorm forward (plain and fused with the residual add) and backward. As in
// layernorm.cc, dweight is a sum over rows taken per row chunk (kernel_partition.h,
// independent of the thread count) and the chunks added in order, so the result does
// not depend on scheduling.
#include <cstddef>
#include <vector>

#include "cpu_kernels.h"
#include "dufu/trainer/device/kernel_partition.h"
#include "dufu/trainer/device/llama_math.h"

namespace dufu::trainer::cpu {

namespace {

// Normalizes one row whose values are already in `x`.
inline void rms_normalize_row(float* out, float* rstd_out, const float* x, const float* weight, float eps, int C) {
  float sum_sq = 0.0f;
#pragma omp simd reduction(+ : sum_sq)
  for (int c = 0; c < C; ++c) sum_sq += x[c] * x[c];
  const float rstd = rmsnorm_rstd(sum_sq, C, eps);
  for (int c = 0; c < C; ++c) out[c] = x[c] * rstd * weight[c];
  *rstd_out = rstd;
}

}  // namespace

DUFU_CPU_CLONES void rmsnorm_forward(TensorOut out, float* rstd, const float* x, const float* weight, float eps, int N,
                                     int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const std::size_t offset = static_cast<std::size_t>(n) * C;
    rms_normalize_row(out.values + offset, rstd + n, x + offset, weight, eps, C);
    keep_row(out, offset, C);
  }
}

DUFU_CPU_CLONES void residual_rmsnorm_forward(TensorOut residual_out, TensorOut norm_out, float* rstd,
                                              const float* residual, const float* branch, const float* weight,
                                              float eps, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const std::size_t offset = static_cast<std::size_t>(n) * C;
    float* r = residual_out.values + offset;
    const float* a = residual + offset;
    const float* b = branch + offset;
    for (int c = 0; c < C; ++c) r[c] = a[c] + b[c];
    keep_row(residual_out, offset, C);
    rms_normalize_row(norm_out.values + offset, rstd + n, r, weight, eps, C);
    keep_row(norm_out, offset, C);
  }
}

DUFU_CPU_CLONES void rmsnorm_backward(TensorOut kept_dx, float* dweight, const float* dout, const float* x,
                                      const float* weight, const float* rstd, int N, int C) {
  float* dx = kept_dx.values;
  const int chunks = row_chunk_count(N);
  std::vector<double> partial(static_cast<std::size_t>(chunks) * C, 0.0);

#pragma omp parallel for schedule(static)
  for (int chunk = 0; chunk < chunks; ++chunk) {
    double* dweight_partial = partial.data() + static_cast<std::size_t>(chunk) * C;
    const int n0 = row_chunk_begin(N, chunks, chunk);
    const int n1 = row_chunk_begin(N, chunks, chunk + 1);
    for (int n = n0; n < n1; ++n) {
      const std::size_t offset = static_cast<std::size_t>(n) * C;
      const float* g = dout + offset;
      const float* xn = x + offset;
      float* dxn = dx + offset;
      const float s = rstd[n];
      float dnorm_norm_sum = 0.0f;
#pragma omp simd reduction(+ : dnorm_norm_sum)
      for (int c = 0; c < C; ++c) dnorm_norm_sum += weight[c] * g[c] * (xn[c] * s);
      const float dnorm_norm_mean = dnorm_norm_sum / static_cast<float>(C);
      for (int c = 0; c < C; ++c) {
        const float norm = xn[c] * s;
        dxn[c] += rmsnorm_dx(weight[c] * g[c], norm, dnorm_norm_mean, s);
        dweight_partial[c] += static_cast<double>(norm * g[c]);
      }
      keep_row(kept_dx, offset, C);
    }
  }

#pragma omp parallel for schedule(static)
  for (int c = 0; c < C; ++c) {
    double sum = 0.0;
    for (int chunk = 0; chunk < chunks; ++chunk) sum += partial[static_cast<std::size_t>(chunk) * C + c];
    dweight[c] += static_cast<float>(sum);
  }
}

}  // namespace dufu::trainer::cpu
