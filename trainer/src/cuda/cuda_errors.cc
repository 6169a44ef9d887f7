// The module's failing CUDA and cuBLAS calls as dufu::Error (cuda_check.h): the call,
// where it was made, and the library's own name and description of the status, e.g.
// "CUBLAS_STATUS_NOT_SUPPORTED (the functionality requested is not supported)". A
// plain C++ file, so a CPU test can link it with the libraries and read the words
// (neither lookup needs a GPU).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "cuda_check.h"
#include "dufu/common/error.h"

namespace dufu::trainer::cuda {

void fail_cuda(const char* call, cudaError_t status, const char* file, int line) {
  DUFU_FAIL("CUDA call ", call, " failed at ", file, ":", line, ": ", cudaGetErrorName(status), " (",
            cudaGetErrorString(status), ")");
}

void fail_cublas(const char* call, cublasStatus_t status, const char* file, int line) {
  DUFU_FAIL("cuBLAS call ", call, " failed at ", file, ":", line, ": ", cublasGetStatusName(status), " (",
            cublasGetStatusString(status), ")");
}

}  // namespace dufu::trainer::cuda
