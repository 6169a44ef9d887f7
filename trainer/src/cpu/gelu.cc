// CPU bias + GELU (the MLP's activation), fused so the pre-activation is written once
// and read once; the MLP's first projection ending in it and its second projection's
// backward through it (a GPU fuses each into the matmul's epilogue).
#include <cstddef>

#include "cpu_kernels.h"
#include "dufu/trainer/device/kernel_math.h"

namespace dufu::trainer::cpu {

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
void matmul_bias_gelu_forward(float* out, float* pre, TensorIn x, TensorIn weight, const float* bias, int N, int C,
                              int OC) {
  matmul_forward(pre, x, weight, nullptr, N, C, OC);
  bias_gelu_forward(out, pre, pre, bias, N, OC);
}

namespace {

// d[i] *= gelu'(pre[i]): the GELU's backward, in place on the gradient of its output.
DUFU_CPU_CLONES void multiply_by_gelu_grad(float* d, const float* pre, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const std::size_t offset = static_cast<std::size_t>(n) * C;
#pragma omp simd
    for (int c = 0; c < C; ++c) d[offset + c] *= gelu_tanh_grad(pre[offset + c]);
  }
}

}  // namespace

// Two passes (OpenBLAS has no epilogue): the gradient of the GELU's output lands in
// dpre, which its derivative then scales in place.
void matmul_gelu_backward(float* dpre, float* dweight, float* dbias, const float* dout, TensorIn x, TensorIn weight,
                          const float* pre, int N, int C, int OC) {
  matmul_backward(dpre, dweight, dbias, dout, x, weight, N, C, OC);
  multiply_by_gelu_grad(dpre, pre, N, C);
}

}  // namespace dufu::trainer::cpu
