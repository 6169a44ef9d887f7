// CUDA matmuls, one path for both operand types: fp32 values, or under the bf16 recipe
// bf16 bits (the activations kept for the backward, the weights' working copy, dout's
// kept bits) on the tensor cores, always with fp32 accumulation and fp32 outputs unless
// the recipe keeps the output in bf16. The forward goes through cuBLASLt with what
// follows a product fused in its epilogue: the bias (and for the MLP's first projection
// the GELU, keeping its input for backward); in the MLP's second projection's backward
// the GELU's derivative is applied to dx the same way. The other backward products are
// cuBLAS GEMMs (cublasGemmEx: dx overwritten, dweight accumulated with beta = 1), and
// every bias gradient is a deterministic column sum of dout's fp32 values
// (accumulate_column_sums), never cuBLASLt's BGRAD epilogues, whose reduction order is
// not documented. A row-major [rows, cols] matrix is a column-major [cols, rows] one to
// cuBLAS: each call below says which product it computes in those terms.
// cuBLASLt is asked for algorithms without split-K reductions (reduction scheme
// NONE, lt_matmul.cu), and cuBLAS runs with atomics disallowed, so the sums keep one
// order.
//
// Under bf16 without dout's kept bits (a caller that stored none), its values, on the
// bf16 grid (the rounding table of docs/architecture.md), are copied to bf16 exactly,
// into the shared scratch (block_reduce.cuh); work on the stream is ordered, and
// scratch() waits for the stream before it grows, so a later user of the scratch (the
// bias gradient's partial sums) starts after these GEMMs have read it.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "block_reduce.cuh"
#include "cuda_check.h"
#include "cuda_kernels.h"
#include "cuda_scratch.h"

namespace dufu::trainer::cuda {

namespace {

// A backward's GEMM operands in the type its products read, and dout's fp32 values for
// the bias gradient.
struct BackwardOperands {
  const void* dout;
  const void* x;
  const void* weight;
  cudaDataType_t type;
  const float* dout_values;
};

// dout's bits: those kept beside it, else a copy in the scratch (exact: its values are on
// the bf16 grid).
const std::uint16_t* bf16_bits(KeptIn dout, std::size_t count) {
  if (dout.bits != nullptr) return dout.bits;
  auto* bits = static_cast<std::uint16_t*>(scratch(bf16_copy_scratch_bytes(count)));
  to_bf16_bits(bits, dout.values, count);
  return bits;
}

BackwardOperands backward_operands(cudaDataType_t type, KeptIn dout, TensorIn x, TensorIn weight, int N, int OC) {
  if (type == CUDA_R_16BF) {
    return {bf16_bits(dout, static_cast<std::size_t>(N) * OC), x.bits(), weight.bits(), type, dout.values};
  }
  return {dout.values, x.values(), weight.values(), type, dout.values};
}

// dx [N, C] = dout [N, OC] · weight [OC, C]: column-major, dx^T [C, N] = W^T [C, OC] · dout^T [OC, N].
void input_grad(float* dx, const BackwardOperands& operands, int N, int C, int OC) {
  auto blas = static_cast<cublasHandle_t>(cublas_handle());
  const float one = 1.0f;
  const float zero = 0.0f;
  DUFU_CUBLAS_CHECK(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, &one, operands.weight, operands.type, C,
                                 operands.dout, operands.type, OC, &zero, dx, CUDA_R_32F, C, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
}

// dweight += dout^T · x (column-major, dW^T [C, OC] += x^T [C, N] · dout [N, OC]);
// dbias += the column sums of dout unless it is null.
void weight_and_bias_grads(float* dweight, float* dbias, const BackwardOperands& operands, int N, int C, int OC) {
  auto blas = static_cast<cublasHandle_t>(cublas_handle());
  const float one = 1.0f;
  DUFU_CUBLAS_CHECK(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, &one, operands.x, operands.type, C,
                                 operands.dout, operands.type, OC, &one, dweight, CUDA_R_32F, C, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT));
  if (dbias != nullptr) {
    auto* partial = static_cast<double*>(scratch(column_sum_scratch_bytes(N, OC)));
    accumulate_column_sums(dbias, operands.dout_values, N, OC, partial);
  }
}

cudaDataType_t operand_type(const char* operation, TensorIn x, TensorIn weight) {
  return bf16_operands(operation, x, weight) ? CUDA_R_16BF : CUDA_R_32F;
}

}  // namespace

void keep(TensorOut out, std::size_t count) {
  if (!out.bf16() || count == 0) return;
  if (out.bits != nullptr) {
    store_bf16(out.bits, out.values, count);
  } else {
    round_to_bf16(out.values, count);
  }
}

namespace {

// The forward product out [N, OC] = x [N, C] · weight [OC, C]^T, its output type and
// epilogue left to the caller.
LtProduct forward_product(void* out, const void* x, const void* weight, int N, int C, int OC,
                          cudaDataType_t input_type) {
  return {.out = out,
          .a = x,
          .b = weight,
          .rows = N,
          .inner = C,
          .cols = OC,
          .b_transposed = true,
          .input_type = input_type};
}

// The bias's bf16 copy, in the scratch: cuBLASLt's bias is of the output's type. Under
// the bf16 recipe the bias is read from the working copy, on the bf16 grid, so the copy
// is exact.
const std::uint16_t* bf16_bias(const float* bias, int OC) {
  if (bias == nullptr) return nullptr;
  auto* bits = static_cast<std::uint16_t*>(scratch(bf16_copy_scratch_bytes(static_cast<std::size_t>(OC))));
  to_bf16_bits(bits, bias, static_cast<std::size_t>(OC));
  return bits;
}

void note_no_bf16_output(const std::string& reason) {
  note_fallback(FusedFallback::kBf16OutputNoAlgorithm,
                str_cat("a bf16-kept product is written in fp32 and rounded by a kernel after the GEMM: ", reason));
}

// A product whose result the recipe keeps in bf16, written by the GEMM's epilogue as
// bf16 (out.bits, and under GELU_AUX_BIAS pre.bits) and widened into the fp32 values
// from those bits: two bytes stored per element and a read of them, where an fp32
// product and store_bf16 move fourteen. False (nothing written) when cuBLASLt has no
// algorithm for it.
bool product_into_bits(TensorOut out, TensorOut pre, const void* x, const void* weight, const float* bias, int N,
                       int C, int OC, cudaDataType_t input_type, cublasLtEpilogue_t epilogue) {
  LtProduct product = forward_product(out.bits, x, weight, N, C, OC, input_type);
  product.output_type = CUDA_R_16BF;
  product.epilogue = epilogue;
  product.bias = bf16_bias(bias, OC);
  product.aux = pre.bits;
  std::string reason;
  if (!lt_matmul(product, &reason)) {
    note_no_bf16_output(reason);
    return false;
  }
  const std::size_t count = static_cast<std::size_t>(N) * OC;
  load_bf16(out.values, out.bits, count);
  if (pre.bits != nullptr) load_bf16(pre.values, pre.bits, count);
  return true;
}

}  // namespace

void linear_product(float* out, const void* x, const void* weight, const float* bias, int N, int C, int OC,
                    cudaDataType_t input_type) {
  LtProduct product = forward_product(out, x, weight, N, C, OC, input_type);
  product.epilogue = bias != nullptr ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  product.bias = bias;
  std::string reason;
  if (!lt_matmul(product, &reason)) {
    DUFU_FAIL("matmul_forward with N ", N, ", C ", C, ", OC ", OC, ": ", reason);
  }
}

bool linear_gelu_product(float* out, float* pre, const void* x, const void* weight, const float* bias, int N, int C,
                         int OC, cudaDataType_t input_type) {
  // cuBLASLt's GELU epilogue keeps the pre-activation with a leading dimension that is
  // a multiple of 8; other widths (a tensor-parallel slice of an odd d_model) take
  // the unfused path, as does a shape with no fused algorithm.
  if (OC % 8 != 0) {
    note_fallback(FusedFallback::kGeluForwardWidth,
                  str_cat("the MLP's bias and GELU run as a kernel after the GEMM, not in cuBLASLt's epilogue: its "
                          "width ", OC, " is not a multiple of 8"));
    return false;
  }
  LtProduct product = forward_product(out, x, weight, N, C, OC, input_type);
  product.epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  product.bias = bias;
  product.aux = pre;
  std::string reason;
  if (lt_matmul(product, &reason)) return true;
  note_fallback(
      FusedFallback::kGeluForwardNoAlgorithm,
      str_cat("the MLP's bias and GELU run as a kernel after the GEMM, not in cuBLASLt's epilogue: ", reason));
  return false;
}

bool gelu_input_grad_product(float* dpre, const void* dout, const void* weight, const float* pre, int N, int C, int OC,
                             cudaDataType_t input_type) {
  if (C % 8 != 0) {
    note_fallback(FusedFallback::kDgeluWidth,
                  str_cat("the GELU's backward runs as a kernel after the GEMM, not in cuBLASLt's epilogue: its width ",
                          C, " is not a multiple of 8"));
    return false;
  }
  // cuBLASLt only reads the aux matrix under DGELU.
  std::string reason;
  if (lt_matmul({.out = dpre,
                 .a = dout,
                 .b = weight,
                 .rows = N,
                 .inner = OC,
                 .cols = C,
                 .input_type = input_type,
                 .epilogue = CUBLASLT_EPILOGUE_DGELU,
                 .aux = const_cast<float*>(pre)},
                &reason)) {
    return true;
  }
  note_fallback(FusedFallback::kDgeluNoAlgorithm,
                str_cat("the GELU's backward runs as a kernel after the GEMM, not in cuBLASLt's epilogue: ", reason));
  return false;
}

void matmul_forward(TensorOut out, TensorIn x, TensorIn weight, const float* bias, int N, int C, int OC) {
  const cudaDataType_t type = operand_type("matmul_forward", x, weight);
  if (N == 0 || OC == 0) return;
  if (out.bf16() && out.bits != nullptr &&
      product_into_bits(out, {}, x.data, weight.data, bias, N, C, OC, type,
                        bias != nullptr ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT)) {
    return;
  }
  linear_product(out.values, x.data, weight.data, bias, N, C, OC, type);
  keep(out, static_cast<std::size_t>(N) * OC);
}

void matmul_bias_gelu_forward(TensorOut out, TensorOut pre, TensorIn x, TensorIn weight, const float* bias, int N,
                              int C, int OC) {
  const cudaDataType_t type = operand_type("matmul_bias_gelu_forward", x, weight);
  if (N == 0 || OC == 0) return;
  const std::size_t count = static_cast<std::size_t>(N) * OC;
  if (out.bf16() && pre.bf16() && out.bits != nullptr && pre.bits != nullptr && OC % 8 == 0 &&
      product_into_bits(out, pre, x.data, weight.data, bias, N, C, OC, type, CUBLASLT_EPILOGUE_GELU_AUX_BIAS)) {
    return;
  }
  if (!linear_gelu_product(out.values, pre.values, x.data, weight.data, bias, N, C, OC, type)) {
    // Widths the epilogue cannot keep take two kernels.
    linear_product(pre.values, x.data, weight.data, nullptr, N, C, OC, type);
    bias_gelu_forward(out.values, pre.values, pre.values, bias, N, OC);
  }
  keep(pre, count);
  keep(out, count);
}

void matmul_backward(TensorOut dx, float* dweight, float* dbias, KeptIn dout, TensorIn x, TensorIn weight, int N,
                     int C, int OC) {
  const cudaDataType_t type = operand_type("matmul_backward", x, weight);
  if (N == 0 || OC == 0) return;
  const BackwardOperands operands = backward_operands(type, dout, x, weight, N, OC);
  if (dx.values != nullptr) input_grad(dx.values, operands, N, C, OC);
  weight_and_bias_grads(dweight, dbias, operands, N, C, OC);
  if (dx.values != nullptr) keep(dx, static_cast<std::size_t>(N) * C);
}

void matmul_gelu_backward(TensorOut kept_dpre, float* dweight, float* dbias, KeptIn kept_dout, TensorIn x,
                          TensorIn weight, const float* pre, int N, int C, int OC) {
  const cudaDataType_t type = operand_type("matmul_gelu_backward", x, weight);
  if (N == 0 || OC == 0) return;
  const BackwardOperands operands = backward_operands(type, kept_dout, x, weight, N, OC);
  float* dpre = kept_dpre.values;
  // dpre [N, C] = gelu'(pre) ⊙ (dout [N, OC] · weight [OC, C]), the derivative applied in
  // the epilogue (pre stays fp32, the epilogue's aux type follows the fp32 output). As
  // in the forward, a width that is not a multiple of 8 or a shape with no fused
  // algorithm takes a GEMM and an element-wise kernel.
  if (!gelu_input_grad_product(dpre, operands.dout, operands.weight, pre, N, C, OC, type)) {
    input_grad(dpre, operands, N, C, OC);
    multiply_by_gelu_grad(dpre, pre, static_cast<std::size_t>(N) * C);
  }
  // dweight keeps matmul_backward's cuBLAS GEMM: nothing follows it to fuse, and the
  // c_proj weight gradient is then computed as every other weight gradient is.
  weight_and_bias_grads(dweight, dbias, operands, N, C, OC);
  keep(kept_dpre, static_cast<std::size_t>(N) * C);
}

}  // namespace dufu::trainer::cuda
