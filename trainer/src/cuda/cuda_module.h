// The entry point of the CUDA device module (libdufu_cuda.so), which dufu_trainer
// loads with dlopen the first time a CUDA device is asked for. Both sides compile this
// header, so the struct is the contract between them.
#pragma once

#include "dufu/trainer/device.h"

namespace dufu::trainer {

struct CudaModule {
  // Whether a CUDA device can be used here (the driver answers and has a GPU).
  DeviceAvailability (*availability)();
  // The process's CUDA device; only after availability() said yes.
  Device& (*device)();
  // For MFU on a GPU: FLOP/s of a bf16 GEMM [rows, inner] x [inner, cols] through
  // cuBLASLt, measured over about `seconds`.
  double (*bf16_gemm_flops)(int rows, int inner, int cols, double seconds);
};

using CudaModuleEntry = const CudaModule* (*)();
inline constexpr const char* kCudaModuleEntry = "dufu_cuda_module";

}  // namespace dufu::trainer
