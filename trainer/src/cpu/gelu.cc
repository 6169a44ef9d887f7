// CPU bias + GELU (the MLP's activation), fused so the pre-activation is written once
// and read once; the MLP's first projection ending in it and its second projection's
// backward through it (a GPU fuses each into the matmul's epilogue).
#include <cstddef>

#include "cpu_kernels.h"
#include "device/kernel_math.h"

namespace dufu::trainer::cpu {

namespace {

DUFU_CPU_CLONES void bias_gelu_row(float* out, float* pre, const float* x, const float* bias, int C) {
#pragma omp simd
  for (int c = 0; c < C; ++c) {
    const float p = x[c] + bias[c];
    pre[c] = p;
    out[c] = gelu_tanh(p);
  }
}

}  // namespace

void bias_gelu_forward(float* out, float* pre, const float* x, const float* bias, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const std::size_t offset = static_cast<std::size_t>(n) * C;
    bias_gelu_row(out + offset, pre + offset, x + offset, bias, C);
  }
}

// Two passes here (OpenBLAS has no epilogue): the product lands in `pre`, which the
// bias and GELU then update in place, keeping each row of both as it goes.
void matmul_bias_gelu_forward(TensorOut out, TensorOut pre, TensorIn x, TensorIn weight, const float* bias, int N,
                              int C, int OC) {
  matmul_forward(pre.values, x, weight, nullptr, N, C, OC);
  if (!out.bf16() && !pre.bf16()) {
    bias_gelu_forward(out.values, pre.values, pre.values, bias, N, OC);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const std::size_t offset = static_cast<std::size_t>(n) * OC;
    bias_gelu_row(out.values + offset, pre.values + offset, pre.values + offset, bias, OC);
    keep_row(pre, offset, OC);
    keep_row(out, offset, OC);
  }
}

namespace {

DUFU_CPU_CLONES void multiply_by_gelu_grad_row(float* d, const float* pre, int C) {
#pragma omp simd
  for (int c = 0; c < C; ++c) d[c] *= gelu_tanh_grad(pre[c]);
}

// d[i] *= gelu'(pre[i]): the GELU's backward, in place on the gradient of its output,
// kept row by row.
void multiply_by_gelu_grad(TensorOut d, const float* pre, int N, int C) {
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const std::size_t offset = static_cast<std::size_t>(n) * C;
    multiply_by_gelu_grad_row(d.values + offset, pre + offset, C);
    keep_row(d, offset, C);
  }
}

}  // namespace

// Two passes (OpenBLAS has no epilogue): the gradient of the GELU's output lands in
// dpre, which its derivative then scales in place.
void matmul_gelu_backward(TensorOut dpre, float* dweight, float* dbias, KeptIn dout, TensorIn x, TensorIn weight,
                          const float* pre, int N, int C, int OC) {
  matmul_backward(dpre.values, dweight, dbias, dout, x, weight, N, C, OC);
  multiply_by_gelu_grad(dpre, pre, N, C);
}

}  // namespace dufu::trainer::cpu
