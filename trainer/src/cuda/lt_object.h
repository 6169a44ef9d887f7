// Ownership of cuBLASLt's descriptor objects (matmul, layout and preference
// descriptors): created into `handle`, destroyed when the holder leaves scope, so
// every early return or thrown check releases them.
#pragma once

#include <cublasLt.h>

namespace dufu::trainer::cuda {

template <typename Handle, cublasStatus_t (*Destroy)(Handle)>
struct LtObject {
  Handle handle = nullptr;
  LtObject() = default;
  LtObject(const LtObject&) = delete;
  LtObject& operator=(const LtObject&) = delete;
  ~LtObject() {
    if (handle != nullptr) Destroy(handle);
  }
};

}  // namespace dufu::trainer::cuda
