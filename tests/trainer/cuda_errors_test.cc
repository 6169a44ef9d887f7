// A failing cuBLAS or CUDA call names its status in the library's own words
// (cuda_errors.cc): "CUBLAS_STATUS_NOT_SUPPORTED", not "status 15". Both lookups are
// tables in the libraries, so this runs without a GPU; built only with the CUDA backend.
#include <gtest/gtest.h>

#include <string>

#include "cuda_check.h"
#include "dufu/common/error.h"

namespace dufu::trainer::cuda {
namespace {

std::string message_of(void (*fail)()) {
  try {
    fail();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(CudaErrors, CublasStatusesAreNamed) {
  const std::string message = message_of(
      [] { fail_cublas("cublasLtMatmul(...)", CUBLAS_STATUS_NOT_SUPPORTED, "lt_matmul.cu", 7); });
  EXPECT_NE(message.find("cuBLAS call cublasLtMatmul(...) failed at lt_matmul.cu:7: CUBLAS_STATUS_NOT_SUPPORTED ("),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find("status 15"), std::string::npos) << message;
  const std::string invalid = message_of([] { fail_cublas("x", CUBLAS_STATUS_INVALID_VALUE, "f", 1); });
  EXPECT_NE(invalid.find("CUBLAS_STATUS_INVALID_VALUE"), std::string::npos) << invalid;
}

TEST(CudaErrors, CudaErrorsAreNamed) {
  const std::string message = message_of([] { fail_cuda("cudaMalloc(&p, n)", cudaErrorMemoryAllocation, "f.cu", 3); });
  EXPECT_NE(message.find("cudaErrorMemoryAllocation ("), std::string::npos) << message;
}

}  // namespace
}  // namespace dufu::trainer::cuda
