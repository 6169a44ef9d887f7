// CPU bias + GELU (the MLP's activation), fused so the pre-activation is written once
// and read once, and the MLP's first projection ending in it (a GPU fuses all three). The backward's dbias is a column
// sum: threads own blocks of columns and walk the rows in order, so it is identical for any thread count.
#include <algorithm>
#include <cstddef>

#include "cpu_kernels.h"
#include "dufu/trainer/kernel_math.h"

namespace dufu::trainer::cpu {

namespace {
constexpr int kColumnBlock = 64;
}  // namespace

DUFU_CPU_CLONES void bias_gelu_forward(float* out, float* pre, const float* x, const float* bias, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const std::size_t offset = static_cast<std::size_t>(n) * C;
#pragma omp simd
    for (int c = 0; c < C; ++c) {
      const float p = x[offset + c] + bias[c];
      pre[offset + c] = p;
      out[offset + c] = gelu_tanh(p);
    }
  }
}

// Two passes here (OpenBLAS has no epilogue): the product lands in `pre`, which the
// bias and GELU then update in place.
void matmul_bias_gelu_forward(float* out, float* pre, const float* x, const float* weight, const float* bias, int N,
                              int C, int OC) {
  matmul_forward(pre, x, weight, nullptr, N, C, OC);
  bias_gelu_forward(out, pre, pre, bias, N, OC);
}

DUFU_CPU_CLONES void bias_gelu_backward(float* dx, float* dbias, const float* dout, const float* pre, int N, int C) {
  const int blocks = (C + kColumnBlock - 1) / kColumnBlock;
#pragma omp parallel for schedule(static)
  for (int block = 0; block < blocks; ++block) {
    const int c0 = block * kColumnBlock;
    const int width = std::min(kColumnBlock, C - c0);
    double sum[kColumnBlock] = {};
    for (int n = 0; n < N; ++n) {
      const std::size_t offset = static_cast<std::size_t>(n) * C + c0;
#pragma omp simd
      for (int j = 0; j < width; ++j) {
        const float d = gelu_tanh_grad(pre[offset + j]) * dout[offset + j];
        dx[offset + j] = d;
        sum[j] += d;
      }
    }
    for (int j = 0; j < width; ++j) dbias[c0 + j] += static_cast<float>(sum[j]);
  }
}

}  // namespace dufu::trainer::cpu
