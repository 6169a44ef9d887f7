// CUDA matmuls through cuBLASLt with what follows a product fused in its epilogue: the
// bias in the forward (and for the MLP's first projection the GELU, keeping its input
// for backward), and in the MLP's second projection's backward the GELU's derivative
// applied to dx. The other backward products are cuBLAS GEMMs (dx overwritten, dweight
// accumulated with beta = 1), and every bias gradient is a deterministic column sum
// (accumulate_column_sums), never cuBLASLt's BGRAD epilogues, whose reduction order is
// not documented. A row-major [rows, cols] matrix is a column-major [cols, rows] one to
// cuBLAS: each call below says which product it computes in those terms.
// cuBLASLt is asked for algorithms without split-K reductions (reduction scheme
// NONE, lt_matmul.cu), and cuBLAS runs with atomics disallowed, so the sums keep one
// order.
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

// dx [N, C] = dout [N, OC] · weight [OC, C]: column-major, dx^T [C, N] = W^T [C, OC] · dout^T [OC, N].
void input_grad(float* dx, const float* dout, const float* weight, int N, int C, int OC) {
  auto blas = static_cast<cublasHandle_t>(cublas_handle());
  const float one = 1.0f;
  const float zero = 0.0f;
  DUFU_CUBLAS_CHECK(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, &one, weight, C, dout, OC, &zero, dx, C));
}

// dweight += dout^T · x (column-major, dW^T [C, OC] += x^T [C, N] · dout [N, OC]);
// dbias += the column sums of dout unless it is null.
void weight_and_bias_grads(float* dweight, float* dbias, const float* dout, const float* x, int N, int C, int OC) {
  auto blas = static_cast<cublasHandle_t>(cublas_handle());
  const float one = 1.0f;
  DUFU_CUBLAS_CHECK(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, &one, x, C, dout, OC, &one, dweight, C));
  if (dbias != nullptr) {
    auto* partial = static_cast<double*>(scratch(column_sum_scratch_bytes(N, OC)));
    accumulate_column_sums(dbias, dout, N, OC, partial);
  }
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
  const cudaDataType_t type = bf16_operands("matmul_forward", x, weight) ? CUDA_R_16BF : CUDA_R_32F;
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
  const cudaDataType_t type = bf16_operands("matmul_bias_gelu_forward", x, weight) ? CUDA_R_16BF : CUDA_R_32F;
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
  const bool bf16 = bf16_operands("matmul_backward", x, weight);
  if (N == 0 || OC == 0) return;
  if (bf16) {
    bf16_matmul_backward(dx.values, dweight, dbias, dout, x.bits(), weight.bits(), N, C, OC);
  } else {
    if (dx.values != nullptr) input_grad(dx.values, dout.values, weight.values(), N, C, OC);
    weight_and_bias_grads(dweight, dbias, dout.values, x.values(), N, C, OC);
  }
  if (dx.values != nullptr) keep(dx, static_cast<std::size_t>(N) * C);
}

void matmul_gelu_backward(TensorOut kept_dpre, float* dweight, float* dbias, KeptIn kept_dout, TensorIn x_in,
                          TensorIn weight_in, const float* pre, int N, int C, int OC) {
  float* dpre = kept_dpre.values;
  const std::size_t count = static_cast<std::size_t>(N) * C;
  const bool bf16 = bf16_operands("matmul_gelu_backward", x_in, weight_in);
  if (N == 0 || OC == 0) return;
  if (bf16) {
    bf16_matmul_gelu_backward(dpre, dweight, dbias, kept_dout, x_in.bits(), weight_in.bits(), pre, N, C, OC);
    keep(kept_dpre, count);
    return;
  }
  const float* dout = kept_dout.values;
  const float* x = x_in.values();
  const float* weight = weight_in.values();
  // dpre [N, C] = gelu'(pre) ⊙ (dout [N, OC] · weight [OC, C]), the derivative applied in
  // the epilogue. As in the forward, a width that is not a multiple of 8 or a shape
  // with no fused algorithm takes a GEMM and an element-wise kernel.
  if (!gelu_input_grad_product(dpre, dout, weight, pre, N, C, OC, CUDA_R_32F)) {
    input_grad(dpre, dout, weight, N, C, OC);
    multiply_by_gelu_grad(dpre, pre, static_cast<std::size_t>(N) * C);
  }
  // dweight keeps matmul_backward's cuBLAS GEMM: nothing follows it to fuse, and the
  // c_proj weight gradient is then computed as every other weight gradient is.
  weight_and_bias_grads(dweight, dbias, dout, x, N, C, OC);
  keep(kept_dpre, count);
}

}  // namespace dufu::trainer::cuda
