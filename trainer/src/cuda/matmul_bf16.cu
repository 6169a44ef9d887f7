// The backward matmuls of the bf16 recipe on the tensor cores (matmul_backward and
// matmul_gelu_backward with bf16 operands; the forward ones are matmul.cu's, whose
// products take either type). x and the weights come from bf16 storage (the activations
// kept for the backward, the weights' working copy) and go to cuBLAS(Lt) as they are;
// so does dout, the activation gradient, from the bits its kernel kept beside its
// values (KeptIn). Without them (a caller that stored none) its values, on the bf16
// grid (the rounding table of docs/architecture.md), are copied to bf16 exactly. The
// column sums of the bias gradient read the fp32 values. A bf16 GEMM with fp32 accumulation
// computes what the fp32 GEMM of matmul.cu computes on the same values, up to the order
// of the fp32 sums inside cuBLAS. The outputs stay fp32, as the recipe rounds them
// itself where it stores bf16.
//
// A copy of dout lives in the shared scratch (block_reduce.cuh); work on the stream is
// ordered, and scratch() waits for the stream before it grows, so a later user of the
// scratch (the bias gradient's partial sums) starts after these GEMMs have read it.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "block_reduce.cuh"
#include "cuda_check.h"
#include "cuda_kernels.h"
#include "cuda_scratch.h"

namespace dufu::trainer::cuda {

namespace {

// dout's bits: those kept beside it, else a copy in the scratch (exact: its values are on
// the bf16 grid).
const std::uint16_t* bf16_bits(KeptIn dout, std::size_t count) {
  if (dout.bits != nullptr) return dout.bits;
  auto* bits = static_cast<std::uint16_t*>(scratch(bf16_copy_scratch_bytes(count)));
  to_bf16_bits(bits, dout.values, count);
  return bits;
}

// dx [N, C] = dout [N, OC] · weight [OC, C] on bf16 operands, as matmul.cu's input_grad.
void input_grad_bf16(float* dx, const std::uint16_t* dout16, const std::uint16_t* weight16, int N, int C, int OC) {
  auto blas = static_cast<cublasHandle_t>(cublas_handle());
  const float one = 1.0f;
  const float zero = 0.0f;
  DUFU_CUBLAS_CHECK(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, &one, weight16, CUDA_R_16BF, C, dout16,
                                 CUDA_R_16BF, OC, &zero, dx, CUDA_R_32F, C, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// dW^T [C, OC] += x^T [C, N] · dout [N, OC], accumulated into the fp32 gradient; dbias
// += the column sums of dout (the fp32 values, the same as the bf16 copy's).
void weight_and_bias_grads_bf16(float* dweight, float* dbias, const float* dout, const std::uint16_t* dout16,
                                const std::uint16_t* x16, int N, int C, int OC) {
  auto blas = static_cast<cublasHandle_t>(cublas_handle());
  const float one = 1.0f;
  DUFU_CUBLAS_CHECK(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, &one, x16, CUDA_R_16BF, C, dout16,
                                 CUDA_R_16BF, OC, &one, dweight, CUDA_R_32F, C, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
  if (dbias != nullptr) {
    auto* partial = static_cast<double*>(scratch(column_sum_scratch_bytes(N, OC)));
    accumulate_column_sums(dbias, dout, N, OC, partial);
  }
}

}  // namespace

void bf16_matmul_backward(float* dx, float* dweight, float* dbias, KeptIn dout, const std::uint16_t* x,
                          const std::uint16_t* weight, int N, int C, int OC) {
  if (N == 0 || OC == 0) return;
  const std::uint16_t* dout16 = bf16_bits(dout, static_cast<std::size_t>(N) * OC);
  if (dx != nullptr) input_grad_bf16(dx, dout16, weight, N, C, OC);
  weight_and_bias_grads_bf16(dweight, dbias, dout.values, dout16, x, N, C, OC);
}

void bf16_matmul_gelu_backward(float* dpre, float* dweight, float* dbias, KeptIn dout, const std::uint16_t* x,
                               const std::uint16_t* weight, const float* pre, int N, int C, int OC) {
  if (N == 0 || OC == 0) return;
  const std::uint16_t* dout16 = bf16_bits(dout, static_cast<std::size_t>(N) * OC);
  // As the fp32 operands' path: gelu'(pre) applied in the dx product's epilogue (pre stays
  // fp32, the epilogue's aux type follows the fp32 output), else a GEMM and a kernel.
  if (!gelu_input_grad_product(dpre, dout16, weight, pre, N, C, OC, CUDA_R_16BF)) {
    input_grad_bf16(dpre, dout16, weight, N, C, OC);
    multiply_by_gelu_grad(dpre, pre, static_cast<std::size_t>(N) * C);
  }
  weight_and_bias_grads_bf16(dweight, dbias, dout.values, dout16, x, N, C, OC);
}

}  // namespace dufu::trainer::cuda
