// The module's NCCL entries in a build whose CUDA toolkit has no NCCL (no nccl.h or
// libnccl found): none, so a request for NCCL communicators gets a clear reason.
#include "nccl_entries.h"

namespace dufu::trainer::cuda {
const CudaNccl* nccl_entries() { return nullptr; }
}  // namespace dufu::trainer::cuda
