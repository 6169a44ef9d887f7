// cuBLASLt products (cuda_kernels.h's LtCall): descriptors for one product, and the
// algorithm chosen for its kind, kept in the device so the heuristic runs once per
// kind of product rather than on every call. A row-major [rows, cols] matrix is a
// column-major [cols, rows] one to cuBLAS: the layouts below say which product that is.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <utility>

#include "cuda_check.h"
#include "cuda_kernels.h"
#include "cuda_scratch.h"
#include "lt_algorithm_choice.h"

namespace dufu::trainer::cuda {

namespace {

LtAlgorithmCache<cublasLtMatmulAlgo_t>& algorithms() {
  static LtAlgorithmCache<cublasLtMatmulAlgo_t> cache;
  return cache;
}

LtProductKey key_of(const LtProduct& p) {
  return {.rows = p.rows,
          .inner = p.inner,
          .cols = p.cols,
          .a_transposed = p.a_transposed,
          .b_transposed = p.b_transposed,
          .input_type = static_cast<int>(p.input_type),
          .output_type = static_cast<int>(p.output_type),
          .epilogue = static_cast<int>(p.epilogue),
          .bias_alignment = p.bias != nullptr ? operand_alignment_bytes(p.bias) : 0,
          .aux_alignment = p.aux != nullptr ? operand_alignment_bytes(p.aux) : 0,
          .a_alignment = operand_alignment_bytes(p.a),
          .b_alignment = operand_alignment_bytes(p.b),
          .out_alignment = operand_alignment_bytes(p.out)};
}

const char* type_name(cudaDataType_t type) { return type == CUDA_R_16BF ? "bf16" : type == CUDA_R_32F ? "fp32" : "?"; }

const char* epilogue_name(cublasLtEpilogue_t epilogue) {
  switch (epilogue) {
    case CUBLASLT_EPILOGUE_DEFAULT: return "none";
    case CUBLASLT_EPILOGUE_BIAS: return "BIAS";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS: return "GELU_AUX_BIAS";
    case CUBLASLT_EPILOGUE_DGELU: return "DGELU";
    default: return "other";
  }
}

template <typename Value>
void set_attribute(cublasLtMatmulDesc_t operation, cublasLtMatmulDescAttributes_t attribute, const Value& value) {
  DUFU_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(operation, attribute, &value, sizeof(value)));
}

template <typename Value>
void set_preference(cublasLtMatmulPreference_t preference, cublasLtMatmulPreferenceAttributes_t attribute,
                    const Value& value) {
  DUFU_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, attribute, &value, sizeof(value)));
}

}  // namespace

std::string describe_lt_product(const LtProduct& p) {
  const LtProductKey key = key_of(p);
  return str_cat(type_name(p.input_type), " x ", type_name(p.input_type), " -> ", type_name(p.output_type), " [",
                 p.rows, ", ", p.inner, "]", p.a_transposed ? "^T" : "", " x [", p.inner, ", ", p.cols, "]",
                 p.b_transposed ? "^T" : "", " with epilogue ", epilogue_name(p.epilogue), ", operands aligned to ",
                 key.a_alignment, "/", key.b_alignment, "/", key.out_alignment, " bytes");
}

LtCall::LtCall(const LtProduct& product) : product_(product) {
  DUFU_CUBLAS_CHECK(cublasLtMatmulDescCreate(&operation_.handle, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // Column-major, out^T [cols, rows] = op(b)^T [cols, inner] · op(a)^T [inner, rows]:
  // cuBLASLt's A is b and its B is a, each transposed when stored transposed.
  const cublasOperation_t op_a = product.b_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = product.a_transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_attribute(operation_.handle, CUBLASLT_MATMUL_DESC_TRANSA, op_a);
  set_attribute(operation_.handle, CUBLASLT_MATMUL_DESC_TRANSB, op_b);
  set_attribute(operation_.handle, CUBLASLT_MATMUL_DESC_EPILOGUE, product.epilogue);
  if (product.bias != nullptr) set_attribute(operation_.handle, CUBLASLT_MATMUL_DESC_BIAS_POINTER, product.bias);
  if (product.aux != nullptr) {
    const std::int64_t aux_rows = product.cols;  // column-major: the aux matrix is [cols, rows], as out
    set_attribute(operation_.handle, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, product.aux);
    set_attribute(operation_.handle, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_rows);
  }
  // The stored matrices, column-major (lt_a is b, lt_b is a): b is [cols, inner] (ld
  // cols), or [inner, cols] (ld inner) when transposed; a is [inner, rows] (ld inner),
  // or [rows, inner] (ld rows) when transposed; out is [cols, rows] (ld cols).
  const auto [lt_a_rows, lt_a_cols] =
      product.b_transposed ? std::pair{product.inner, product.cols} : std::pair{product.cols, product.inner};
  const auto [lt_b_rows, lt_b_cols] =
      product.a_transposed ? std::pair{product.rows, product.inner} : std::pair{product.inner, product.rows};
  DUFU_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lt_a_.handle, product.input_type, lt_a_rows, lt_a_cols, lt_a_rows));
  DUFU_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lt_b_.handle, product.input_type, lt_b_rows, lt_b_cols, lt_b_rows));
  DUFU_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&d_.handle, product.output_type, product.cols, product.rows, product.cols));

  const LtProductKey key = key_of(product);
  algorithm_ = algorithms().find_or_choose(key, [&]() -> std::optional<cublasLtMatmulAlgo_t> {
    LtObject<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy> preference;
    DUFU_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference.handle));
    set_preference(preference.handle, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, kMatmulWorkspaceBytes);
    set_preference(preference.handle, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                   std::uint32_t{CUBLASLT_REDUCTION_SCHEME_NONE});
    // The operands' real alignment (cuBLASLt's A is b, its B is a; C and D are out): left
    // at its default of 256 bytes, a tensor that is less aligned gets an algorithm that
    // then fails with NOT_SUPPORTED or a misaligned address.
    set_preference(preference.handle, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.b_alignment);
    set_preference(preference.handle, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.a_alignment);
    set_preference(preference.handle, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.out_alignment);
    set_preference(preference.handle, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.out_alignment);
    cublasLtMatmulHeuristicResult_t heuristic{};
    int found = 0;
    const cublasStatus_t asked =
        cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(cublaslt_handle()), operation_.handle,
                                       lt_a_.handle, lt_b_.handle, d_.handle, d_.handle, preference.handle, 1,
                                       &heuristic, &found);
    if (asked == CUBLAS_STATUS_NOT_SUPPORTED) return std::nullopt;
    DUFU_CUBLAS_CHECK(asked);
    if (found == 0) return std::nullopt;
    if (heuristic.state != CUBLAS_STATUS_SUCCESS) {
      fail_cublas("cublasLtMatmulAlgoGetHeuristic (the state of its answer)", heuristic.state, __FILE__, __LINE__);
    }
    return heuristic.algo;
  });
  if (!algorithm_) {
    no_algorithm_reason_ = str_cat("cuBLASLt's heuristic has no algorithm for ", describe_lt_product(product));
  }
}

void LtCall::launch() const {
  DUFU_CHECK(algorithm_.has_value(), "LtCall::launch without an algorithm: ", no_algorithm_reason_);
  const float one = 1.0f;
  const float zero = 0.0f;
  DUFU_CUBLAS_CHECK(cublasLtMatmul(static_cast<cublasLtHandle_t>(cublaslt_handle()), operation_.handle, &one,
                                   product_.b, lt_a_.handle, product_.a, lt_b_.handle, &zero, product_.out, d_.handle,
                                   product_.out, d_.handle, &*algorithm_, matmul_workspace(), kMatmulWorkspaceBytes,
                                   stream()));
}

bool lt_matmul(const LtProduct& product, std::string* reason) {
  const LtCall call(product);
  if (!call.has_algorithm()) {
    if (reason != nullptr) *reason = call.no_algorithm_reason();
    return false;
  }
  call.launch();
  return true;
}

}  // namespace dufu::trainer::cuda
