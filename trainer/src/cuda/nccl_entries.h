// The module's NCCL entries: nccl_collectives.cu when the toolkit has NCCL,
// nccl_absent.cu (nullptr) when it does not.
#pragma once

#include "device/cuda_module.h"

namespace dufu::trainer::cuda {
const CudaNccl* nccl_entries();
}  // namespace dufu::trainer::cuda
