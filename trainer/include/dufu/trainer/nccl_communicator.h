// A Communicator over NCCL for CUDA device memory (memory_space() == kCudaDevice), the
// way Megatron-LM and PyTorch move gradients and activations between GPUs. The NCCL
// calls live in the CUDA device's module (src/cuda/nccl_collectives.cu); this side keeps
// the Communicator contract (communicator.h): sums are the left fold over ranks in
// rank order, bitwise the same on every rank and as the MPI backend's.
//
// Compiled and linked; no GPU has run it (the tests that would are labelled gpu and
// skip here with the reason).
#pragma once

#include <memory>

#include "dufu/common/communicator.h"
#include "dufu/trainer/device.h"

namespace dufu::trainer {

// Whether NCCL communicators can be made here: a CUDA device is available and the
// CUDA module was built with NCCL; `reason` says why not.
DeviceAvailability nccl_availability();

// Collective over `host` (an MPI or single-process communicator): a communicator over
// the same ranks in the same order, with the same name, moving memory of the process's
// CUDA device (device_of_kind(kCuda)). `host` stays its control plane: rank 0 makes
// the ncclUniqueId and broadcasts it over `host`; split and subgroup agree through it;
// all_reduce_value and barrier run on it. Throws dufu::Error with nccl_availability's
// reason when there is no NCCL here.
std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> host);

}  // namespace dufu::trainer
