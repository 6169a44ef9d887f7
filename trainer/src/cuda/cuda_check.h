// One check macro per CUDA library: a failing call becomes a dufu::Error naming the
// call, the file and line, and the library's own description of the error.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "dufu/common/error.h"

namespace dufu::trainer::cuda {

[[noreturn]] void fail_cuda(const char* call, cudaError_t status, const char* file, int line);
[[noreturn]] void fail_cublas(const char* call, cublasStatus_t status, const char* file, int line);
// NCCL's status as its number and NCCL's own two strings, so this header needs no nccl.h
// (a toolkit without NCCL still builds the rest of the module); nccl_collectives.cu's
// DUFU_NCCL_CHECK calls it with the strings of the library it loaded.
[[noreturn]] void fail_nccl(const char* call, int status, const char* description, const char* last_error,
                            const char* file, int line);

}  // namespace dufu::trainer::cuda

#define DUFU_CUDA_CHECK(call)                                                                  \
  do {                                                                                         \
    const cudaError_t dufu_cuda_status_ = (call);                                              \
    if (dufu_cuda_status_ != cudaSuccess) {                                                    \
      ::dufu::trainer::cuda::fail_cuda(#call, dufu_cuda_status_, __FILE__, __LINE__);          \
    }                                                                                          \
  } while (false)

#define DUFU_CUBLAS_CHECK(call)                                                                \
  do {                                                                                         \
    const cublasStatus_t dufu_cublas_status_ = (call);                                         \
    if (dufu_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                        \
      ::dufu::trainer::cuda::fail_cublas(#call, dufu_cublas_status_, __FILE__, __LINE__);      \
    }                                                                                          \
  } while (false)

// After a kernel launch: launch errors (bad geometry, no device) surface here.
#define DUFU_CUDA_CHECK_LAUNCH() DUFU_CUDA_CHECK(cudaGetLastError())

// A query (cudaEventQuery, cudaStreamQuery): true when the work is done, false when it
// is not yet, a dufu::Error for anything else. "Not ready" is an answer, but the
// runtime also leaves it as the thread's last error, which the next launch check would
// report against an unrelated kernel: it is cleared here (PyTorch's CUDAStream::query
// clears it the same way).
#define DUFU_CUDA_QUERY_DONE(call) ::dufu::trainer::cuda::query_done((call), #call, __FILE__, __LINE__)

namespace dufu::trainer::cuda {
inline bool query_done(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  if (status != cudaSuccess) fail_cuda(call, status, file, line);
  return true;
}
}  // namespace dufu::trainer::cuda
