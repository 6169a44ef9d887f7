// The matmuls of the bf16 recipe on the tensor cores. Under train.precision = bf16 every
// matmul operand is already on the bf16 grid (the weights' working copy, LayerNorm and
// attention outputs, the activation gradients: the rounding table of
// docs/architecture.md), so copying it to bf16 loses nothing, and a bf16 GEMM with
// fp32 accumulation computes what the fp32 GEMM of matmul.cu computes on the same
// values, up to the order of the fp32 sums inside cuBLAS. The outputs stay fp32, as the
// recipe rounds them itself where it stores bf16.
//
// The bf16 copies live in the shared scratch (block_reduce.cuh), carved per call; work on
// the stream is ordered, so a later user of the scratch (the bias gradient's partial
// sums) starts after these GEMMs have read it.
//
// Compiled and linked here; no GPU has run it.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "block_reduce.cuh"
#include "cuda_check.h"
#include "cuda_kernels.h"
#include "dufu/trainer/kernel_partition.h"

namespace dufu::trainer::cuda {

namespace {

// Regions of the scratch start 256 bytes apart at least, the alignment cuBLASLt's
// fastest kernels want.
constexpr std::size_t kAlignElements = 128;

std::size_t aligned(std::size_t elements) { return (elements + kAlignElements - 1) / kAlignElements * kAlignElements; }

// bf16 copies of up to three operands, one after the other in the scratch.
struct Bf16Operands {
  std::uint16_t* first = nullptr;
  std::uint16_t* second = nullptr;
  std::uint16_t* third = nullptr;
  Bf16Operands(const float* a, std::size_t a_count, const float* b, std::size_t b_count, const float* c = nullptr,
               std::size_t c_count = 0) {
    auto* base = static_cast<std::uint16_t*>(
        scratch((aligned(a_count) + aligned(b_count) + aligned(c_count)) * sizeof(std::uint16_t)));
    first = base;
    second = first + aligned(a_count);
    third = second + aligned(b_count);
    to_bf16_bits(first, a, a_count);
    to_bf16_bits(second, b, b_count);
    if (c != nullptr) to_bf16_bits(third, c, c_count);
  }
};

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
    auto* partial = static_cast<double*>(scratch(static_cast<std::size_t>(row_chunk_count(N)) * OC * sizeof(double)));
    accumulate_column_sums(dbias, dout, N, OC, partial);
  }
}

}  // namespace

void matmul_forward_bf16(float* out, const float* x, const float* weight, const float* bias, int N, int C, int OC) {
  if (N == 0 || OC == 0) return;
  const Bf16Operands operands(x, static_cast<std::size_t>(N) * C, weight, static_cast<std::size_t>(OC) * C);
  const LtProduct product{.out = out,
                          .a = operands.first,
                          .b = operands.second,
                          .rows = N,
                          .inner = C,
                          .cols = OC,
                          .b_transposed = true,
                          .input_type = CUDA_R_16BF,
                          .epilogue = bias != nullptr ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT,
                          .bias = bias};
  if (!lt_matmul(product)) {
    DUFU_FAIL("cuBLASLt has no bf16 algorithm for matmul_forward with N ", N, ", C ", C, ", OC ", OC);
  }
}

void matmul_bias_gelu_forward_bf16(float* out, float* pre, const float* x, const float* weight, const float* bias,
                                   int N, int C, int OC) {
  if (N == 0 || OC == 0) return;
  if (OC % 8 == 0) {
    const Bf16Operands operands(x, static_cast<std::size_t>(N) * C, weight, static_cast<std::size_t>(OC) * C);
    const LtProduct product{.out = out,
                            .a = operands.first,
                            .b = operands.second,
                            .rows = N,
                            .inner = C,
                            .cols = OC,
                            .b_transposed = true,
                            .input_type = CUDA_R_16BF,
                            .epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
                            .bias = bias,
                            .aux = pre};
    if (lt_matmul(product)) return;
  }
  // As matmul_bias_gelu_forward: widths the epilogue cannot keep take two kernels.
  matmul_forward_bf16(pre, x, weight, nullptr, N, C, OC);
  bias_gelu_forward(out, pre, pre, bias, N, OC);
}

void matmul_backward_bf16(float* dx, float* dweight, float* dbias, const float* dout, const float* x,
                          const float* weight, int N, int C, int OC) {
  if (N == 0 || OC == 0) return;
  const Bf16Operands operands(dout, static_cast<std::size_t>(N) * OC, x, static_cast<std::size_t>(N) * C, weight,
                              static_cast<std::size_t>(OC) * C);
  if (dx != nullptr) input_grad_bf16(dx, operands.first, operands.third, N, C, OC);
  weight_and_bias_grads_bf16(dweight, dbias, dout, operands.first, operands.second, N, C, OC);
}

void matmul_gelu_backward_bf16(float* dpre, float* dweight, float* dbias, const float* dout, const float* x,
                               const float* weight, const float* pre, int N, int C, int OC) {
  if (N == 0 || OC == 0) return;
  const Bf16Operands operands(dout, static_cast<std::size_t>(N) * OC, x, static_cast<std::size_t>(N) * C, weight,
                              static_cast<std::size_t>(OC) * C);
  // As matmul_gelu_backward: gelu'(pre) applied in the dx product's epilogue (pre stays
  // fp32, the epilogue's aux type follows the fp32 output), else a GEMM and a kernel.
  const LtProduct product{.out = dpre,
                          .a = operands.first,
                          .b = operands.third,
                          .rows = N,
                          .inner = OC,
                          .cols = C,
                          .input_type = CUDA_R_16BF,
                          .epilogue = CUBLASLT_EPILOGUE_DGELU,
                          .aux = const_cast<float*>(pre)};
  if (C % 8 != 0 || !lt_matmul(product)) {
    input_grad_bf16(dpre, operands.first, operands.third, N, C, OC);
    multiply_by_gelu_grad(dpre, pre, static_cast<std::size_t>(N) * C);
  }
  weight_and_bias_grads_bf16(dweight, dbias, dout, operands.first, operands.second, N, C, OC);
}

const KernelTable& bf16_operand_kernel_table() {
  static const KernelTable table = [] {
    KernelTable bf16 = kernel_table();
    bf16.matmul_forward = matmul_forward_bf16;
    bf16.matmul_backward = matmul_backward_bf16;
    bf16.matmul_bias_gelu_forward = matmul_bias_gelu_forward_bf16;
    bf16.matmul_gelu_backward = matmul_gelu_backward_bf16;
    return bf16;
  }();
  return table;
}

}  // namespace dufu::trainer::cuda
