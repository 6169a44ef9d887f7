// CUDA matmuls: the forward through cuBLASLt with the bias added in its epilogue, the
// backward through cuBLAS GEMMs (dx overwritten, dweight accumulated with beta = 1)
// and the bias gradient as deterministic column sums. A row-major [rows, cols] matrix
// is a column-major [cols, rows] one to cuBLAS: each call below says which product it
// computes in those terms.
// cuBLASLt is asked for algorithms without split-K reductions (reduction scheme
// NONE), and cuBLAS runs with atomics disallowed, so the sums keep one order.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "block_reduce.cuh"
#include "cuda_check.h"
#include "cuda_kernels.h"
#include "dufu/trainer/kernel_partition.h"

namespace dufu::trainer::cuda {

namespace {

// A cuBLASLt object released when it leaves scope.
template <typename Handle, cublasStatus_t (*Destroy)(Handle)>
struct LtObject {
  Handle handle = nullptr;
  ~LtObject() {
    if (handle != nullptr) Destroy(handle);
  }
};

}  // namespace

void matmul_forward(float* out, const float* x, const float* weight, const float* bias, int N, int C, int OC) {
  if (N == 0 || OC == 0) return;
  auto lt = static_cast<cublasLtHandle_t>(cublaslt_handle());
  LtObject<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy> operation;
  DUFU_CUBLAS_CHECK(cublasLtMatmulDescCreate(&operation.handle, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t transpose = CUBLAS_OP_T;
  const cublasOperation_t keep = CUBLAS_OP_N;
  DUFU_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(operation.handle, CUBLASLT_MATMUL_DESC_TRANSA, &transpose,
                                                   sizeof(transpose)));
  DUFU_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(operation.handle, CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof(keep)));
  if (bias != nullptr) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    DUFU_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(operation.handle, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                                     sizeof(epilogue)));
    DUFU_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(operation.handle, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                     sizeof(bias)));
  }
  // Column-major: W is [C, OC] (ld C), used transposed; x is [C, N] (ld C); out is [OC, N].
  LtObject<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy> a, b, d;
  DUFU_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a.handle, CUDA_R_32F, C, OC, C));
  DUFU_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b.handle, CUDA_R_32F, C, N, C));
  DUFU_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.handle, CUDA_R_32F, OC, N, OC));
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
  DUFU_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, operation.handle, a.handle, b.handle, d.handle, d.handle,
                                                   preference.handle, 1, &heuristic, &found));
  if (found == 0) DUFU_FAIL("cuBLASLt has no algorithm for matmul_forward with N ", N, ", C ", C, ", OC ", OC);
  const float one = 1.0f;
  const float zero = 0.0f;
  DUFU_CUBLAS_CHECK(cublasLtMatmul(lt, operation.handle, &one, weight, a.handle, x, b.handle, &zero, out, d.handle,
                                   out, d.handle, &heuristic.algo, matmul_workspace(), workspace_bytes, stream()));
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
