// A Communicator over NCCL for CUDA device memory (memory_space() == kCudaDevice), the
// way Megatron-LM and PyTorch move gradients and activations between GPUs. The NCCL
// calls live in the CUDA device's module (src/cuda/nccl_collectives.cu); this side keeps
// the Communicator contract (communicator.h): sums are the left fold over ranks in
// rank order, bitwise the same on every rank and as the MPI backend's.
#pragma once

#include <memory>

#include "dufu/common/communicator.h"
#include "dufu/trainer/device/device.h"

namespace dufu::trainer {

// Whether this process can take part in an NCCL communicator: it has a GPU of its own
// (device.h's gpu_for_this_process), the CUDA module was built with NCCL's header, and
// NCCL's library (libnccl.so.2) loads; `reason` says why not.
DeviceAvailability nccl_availability();
// Collective over `ranks` (a host communicator): nccl_availability of every rank,
// agreed (device.h's agree_on_availability), so that all of them go on to make NCCL
// communicators, or all skip or fail with the same reason, and none waits forever in
// the ncclUniqueId broadcast for a rank that gave up.
DeviceAvailability nccl_availability(Communicator& ranks);

// Collective over `host` (an MPI or single-process communicator): a communicator over
// the same ranks in the same order, with the same name, moving memory of the process's
// CUDA device (device_of_kind(kCuda)). `host` stays its control plane: rank 0 makes
// the ncclUniqueId and broadcasts it over `host`; split and subgroup agree through it;
// all_reduce_value and barrier run on it. Throws dufu::Error with nccl_availability's
// reason when there is no NCCL here (on this rank alone: ask the collective
// nccl_availability first where ranks may differ).
std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> host);

}  // namespace dufu::trainer
