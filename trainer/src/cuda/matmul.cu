// CUDA matmuls: the forward through cuBLASLt with the bias (and for the MLP's first
// projection the GELU, keeping its input for backward) added in its epilogue, the
// backward through cuBLAS GEMMs (dx overwritten, dweight accumulated with beta = 1)
// and the bias gradient as deterministic column sums. A row-major [rows, cols] matrix
// is a column-major [cols, rows] one to cuBLAS: each call below says which product it
// computes in those terms.
// cuBLASLt is asked for algorithms without split-K reductions (reduction scheme
// NONE), and cuBLAS runs with atomics disallowed, so the sums keep one order.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "block_reduce.cuh"
#include "cuda_check.h"
#include "cuda_kernels.h"
#include "dufu/trainer/kernel_partition.h"
#include "lt_object.h"

namespace dufu::trainer::cuda {

bool lt_matmul(void* out, const void* x, const void* weight, const float* bias, int N, int C, int OC,
               cudaDataType_t input_type, cudaDataType_t output_type, cublasLtEpilogue_t epilogue, float* aux) {
  auto lt = static_cast<cublasLtHandle_t>(cublaslt_handle());
  LtObject<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy> operation;
  DUFU_CUBLAS_CHECK(cublasLtMatmulDescCreate(&operation.handle, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transpose = CUBLAS_OP_T;
  const cublasOperation_t keep = CUBLAS_OP_N;
  DUFU_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(operation.handle, CUBLASLT_MATMUL_DESC_TRANSA, &transpose,
                                                   sizeof(transpose)));
  DUFU_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(operation.handle, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof(keep)));
  DUFU_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(operation.handle, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  if (bias != nullptr) {
    DUFU_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(operation.handle, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                     sizeof(bias)));
  }
  if (aux != nullptr) {
    const std::int64_t aux_rows = OC;  // column-major: the aux matrix is [OC, N]
    DUFU_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(operation.handle, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
    DUFU_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(operation.handle, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_rows,
                                                     sizeof(aux_rows)));
  }
  // Column-major: W is [C, OC] (ld C), used transposed; x is [C, N] (ld C); out is [OC, N].
  LtObject<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy> a, b, d;
  DUFU_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a.handle, input_type, C, OC, C));
  DUFU_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b.handle, input_type, C, N, C));
  DUFU_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.handle, output_type, OC, N, OC));
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
  const cublasStatus_t asked = cublasLtMatmulAlgoGetHeuristic(lt, operation.handle, a.handle, b.handle, d.handle,
                                                              d.handle, preference.handle, 1, &heuristic, &found);
  if (asked == CUBLAS_STATUS_NOT_SUPPORTED || found == 0) return false;
  DUFU_CUBLAS_CHECK(asked);
  const float one = 1.0f;
  const float zero = 0.0f;
  DUFU_CUBLAS_CHECK(cublasLtMatmul(lt, operation.handle, &one, weight, a.handle, x, b.handle, &zero, out, d.handle,
                                   out, d.handle, &heuristic.algo, matmul_workspace(), workspace_bytes, stream()));
  return true;
}

void matmul_forward(float* out, const float* x, const float* weight, const float* bias, int N, int C, int OC) {
  if (N == 0 || OC == 0) return;
  const cublasLtEpilogue_t epilogue = bias != nullptr ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  if (!lt_matmul(out, x, weight, bias, N, C, OC, CUDA_R_32F, CUDA_R_32F, epilogue, nullptr)) {
    DUFU_FAIL("cuBLASLt has no algorithm for matmul_forward with N ", N, ", C ", C, ", OC ", OC);
  }
}

void matmul_bias_gelu_forward(float* out, float* pre, const float* x, const float* weight, const float* bias, int N,
                              int C, int OC) {
  if (N == 0 || OC == 0) return;
  // cuBLASLt's GELU epilogue keeps the pre-activation with a leading dimension that is
  // a multiple of 8; other widths (a tensor-parallel slice of an odd d_model) take
  // the unfused path, as does a shape with no fused algorithm.
  if (OC % 8 == 0 &&
      lt_matmul(out, x, weight, bias, N, C, OC, CUDA_R_32F, CUDA_R_32F, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, pre)) {
    return;
  }
  matmul_forward(pre, x, weight, nullptr, N, C, OC);
  bias_gelu_forward(out, pre, pre, bias, N, OC);
}

void matmul_backward(float* dx, float* dweight, float* dbias, const float* dout, const float* x, const float* weight,
                     int N, int C, int OC) {
  if (N == 0 || OC == 0) return;
  auto blas = static_cast<cublasHandle_t>(cublas_handle());
  const float one = 1.0f;
  const float zero = 0.0f;
  if (dx != nullptr) {
    // dx^T [C, N] = W^T [C, OC] · dout^T [OC, N]
    DUFU_CUBLAS_CHECK(
        cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, &one, weight, C, dout, OC, &zero, dx, C));
  }
  // dW^T [C, OC] += x^T [C, N] · dout [N, OC]
  DUFU_CUBLAS_CHECK(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, &one, x, C, dout, OC, &one, dweight, C));
  if (dbias != nullptr) {
    auto* partial = static_cast<double*>(scratch(static_cast<std::size_t>(row_chunk_count(N)) * OC * sizeof(double)));
    accumulate_column_sums(dbias, dout, N, OC, partial);
  }
}

}  // namespace dufu::trainer::cuda
