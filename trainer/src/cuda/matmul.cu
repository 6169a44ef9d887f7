// CUDA matmuls through cuBLASLt with what follows a product fused in its epilogue: the
// bias in the forward (and for the MLP's first projection the GELU, keeping its input
// for backward), and in the MLP's second projection's backward the GELU's derivative
// applied to dx. The other backward products are cuBLAS GEMMs (dx overwritten, dweight
// accumulated with beta = 1), and every bias gradient is a deterministic column sum
// (accumulate_column_sums), never cuBLASLt's BGRAD epilogues, whose reduction order is
// not documented. A row-major [rows, cols] matrix is a column-major [cols, rows] one to
// cuBLAS: each call below says which product it computes in those terms.
// cuBLASLt is asked for algorithms without split-K reductions (reduction scheme
// NONE), and cuBLAS runs with atomics disallowed, so the sums keep one order.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <utility>

#include "block_reduce.cuh"
#include "cuda_check.h"
#include "cuda_kernels.h"
#include "dufu/trainer/kernel_partition.h"
#include "lt_object.h"

namespace dufu::trainer::cuda {

bool lt_matmul(const LtProduct& product) {
  auto lt = static_cast<cublasLtHandle_t>(cublaslt_handle());
  LtObject<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy> operation;
  DUFU_CUBLAS_CHECK(cublasLtMatmulDescCreate(&operation.handle, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // Column-major, out^T [cols, rows] = op(b)^T [cols, inner] · op(a)^T [inner, rows]:
  // cuBLASLt's A is b and its B is a, each transposed when stored transposed.
  const cublasOperation_t op_a = product.b_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = product.a_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  DUFU_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(operation.handle, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
  DUFU_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(operation.handle, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
  DUFU_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(operation.handle, CUBLASLT_MATMUL_DESC_EPILOGUE, &product.epilogue,
                                                   sizeof(product.epilogue)));
  if (product.bias != nullptr) {
    DUFU_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(operation.handle, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &product.bias,
                                                     sizeof(product.bias)));
  }
  if (product.aux != nullptr) {
    const std::int64_t aux_rows = product.cols;  // column-major: the aux matrix is [cols, rows], as out
    DUFU_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(operation.handle, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                     &product.aux, sizeof(product.aux)));
    DUFU_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(operation.handle, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_rows,
                                                     sizeof(aux_rows)));
  }
  // The stored matrices, column-major (lt_a is b, lt_b is a): b is [cols, inner] (ld cols), or [inner, cols]
  // (ld inner) when transposed; a is [inner, rows] (ld inner), or [rows, inner] (ld
  // rows) when transposed; out is [cols, rows] (ld cols).
  const auto [lt_a_rows, lt_a_cols] =
      product.b_transposed ? std::pair{product.inner, product.cols} : std::pair{product.cols, product.inner};
  const auto [lt_b_rows, lt_b_cols] =
      product.a_transposed ? std::pair{product.rows, product.inner} : std::pair{product.inner, product.rows};
  LtObject<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy> lt_a, lt_b, d;
  DUFU_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lt_a.handle, product.input_type, lt_a_rows, lt_a_cols, lt_a_rows));
  DUFU_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lt_b.handle, product.input_type, lt_b_rows, lt_b_cols, lt_b_rows));
  DUFU_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&d.handle, product.output_type, product.cols, product.rows, product.cols));
  LtObject<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy> preference;
  DUFU_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference.handle));
  const std::size_t workspace_bytes = matmul_workspace_bytes();
  DUFU_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference.handle, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                         &workspace_bytes, sizeof(workspace_bytes)));
  const std::uint32_t no_split_reduction = CUBLASLT_REDUCTION_SCHEME_NONE;
  DUFU_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference.handle,
                                                         CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                         &no_split_reduction, sizeof(no_split_reduction)));
  cublasLtMatmulHeuristicResult_t heuristic{};
  int found = 0;
  const cublasStatus_t asked = cublasLtMatmulAlgoGetHeuristic(lt, operation.handle, lt_a.handle, lt_b.handle, d.handle,
                                                              d.handle, preference.handle, 1, &heuristic, &found);
  if (asked == CUBLAS_STATUS_NOT_SUPPORTED || found == 0) return false;
  DUFU_CUBLAS_CHECK(asked);
  const float one = 1.0f;
  const float zero = 0.0f;
  DUFU_CUBLAS_CHECK(cublasLtMatmul(lt, operation.handle, &one, product.b, lt_a.handle, product.a, lt_b.handle, &zero,
                                   product.out, d.handle, product.out, d.handle, &heuristic.algo, matmul_workspace(),
                                   workspace_bytes, stream()));
  return true;
}

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
    auto* partial = static_cast<double*>(scratch(static_cast<std::size_t>(row_chunk_count(N)) * OC * sizeof(double)));
    accumulate_column_sums(dbias, dout, N, OC, partial);
  }
}

}  // namespace

bool linear_product(float* out, float* pre, const void* x, const void* weight, const float* bias, int N, int C, int OC,
                    cudaDataType_t input_type) {
  if (pre != nullptr && OC % 8 != 0) return false;
  const cublasLtEpilogue_t epilogue = pre != nullptr    ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS
                                      : bias != nullptr ? CUBLASLT_EPILOGUE_BIAS
                                                        : CUBLASLT_EPILOGUE_DEFAULT;
  return lt_matmul({.out = out,
                    .a = x,
                    .b = weight,
                    .rows = N,
                    .inner = C,
                    .cols = OC,
                    .b_transposed = true,
                    .input_type = input_type,
                    .epilogue = epilogue,
                    .bias = bias,
                    .aux = pre});
}

bool gelu_input_grad_product(float* dpre, const void* dout, const void* weight, const float* pre, int N, int C, int OC,
                             cudaDataType_t input_type) {
  if (C % 8 != 0) return false;
  // cuBLASLt only reads the aux matrix under DGELU.
  return lt_matmul({.out = dpre,
                    .a = dout,
                    .b = weight,
                    .rows = N,
                    .inner = OC,
                    .cols = C,
                    .input_type = input_type,
                    .epilogue = CUBLASLT_EPILOGUE_DGELU,
                    .aux = const_cast<float*>(pre)});
}

void matmul_forward(float* out, const float* x, const float* weight, const float* bias, int N, int C, int OC) {
  if (N == 0 || OC == 0) return;
  if (!linear_product(out, nullptr, x, weight, bias, N, C, OC, CUDA_R_32F)) {
    DUFU_FAIL("cuBLASLt has no algorithm for matmul_forward with N ", N, ", C ", C, ", OC ", OC);
  }
}

void matmul_bias_gelu_forward(float* out, float* pre, const float* x, const float* weight, const float* bias, int N,
                              int C, int OC) {
  if (N == 0 || OC == 0) return;
  // cuBLASLt's GELU epilogue keeps the pre-activation with a leading dimension that is
  // a multiple of 8; other widths (a tensor-parallel slice of an odd d_model) take
  // the unfused path, as does a shape with no fused algorithm.
  if (linear_product(out, pre, x, weight, bias, N, C, OC, CUDA_R_32F)) return;
  matmul_forward(pre, x, weight, nullptr, N, C, OC);
  bias_gelu_forward(out, pre, pre, bias, N, OC);
}

void matmul_backward(float* dx, float* dweight, float* dbias, const float* dout, const float* x, const float* weight,
                     int N, int C, int OC) {
  if (N == 0 || OC == 0) return;
  if (dx != nullptr) input_grad(dx, dout, weight, N, C, OC);
  weight_and_bias_grads(dweight, dbias, dout, x, N, C, OC);
}

void matmul_gelu_backward(float* dpre, float* dweight, float* dbias, const float* dout, const float* x,
                          const float* weight, const float* pre, int N, int C, int OC) {
  if (N == 0 || OC == 0) return;
  // dpre [N, C] = gelu'(pre) ⊙ (dout [N, OC] · weight [OC, C]), the derivative applied in
  // the epilogue. cuBLASLt only reads the aux matrix under DGELU. As in the forward, a
  // width that is not a multiple of 8 or a shape with no fused algorithm takes a GEMM
  // and an element-wise kernel.
  if (!gelu_input_grad_product(dpre, dout, weight, pre, N, C, OC, CUDA_R_32F)) {
    input_grad(dpre, dout, weight, N, C, OC);
    multiply_by_gelu_grad(dpre, pre, static_cast<std::size_t>(N) * C);
  }
  // dweight keeps matmul_backward's cuBLAS GEMM: nothing follows it to fuse, and the
  // c_proj weight gradient is then computed as every other weight gradient is.
  weight_and_bias_grads(dweight, dbias, dout, x, N, C, OC);
}

}  // namespace dufu::trainer::cuda
