// The NCCL communicator over given NCCL entries: make_nccl_communicator passes the CUDA
// module's, and a CPU test passes host stand-ins of NCCL's calls over MPI
// (tests/trainer/nccl_host_logic_test.cc), which check this side's chunks, folds,
// stream discipline and started collectives without a GPU.
#pragma once

#include <memory>

#include "device/cuda_module.h"
#include "dufu/common/communicator.h"
#include "dufu/trainer/device/device.h"

namespace dufu::trainer {

// Collective over `host`, as make_nccl_communicator (nccl_communicator.h): the
// communicator's NCCL calls go to `nccl`, its copies and scratch to `device`, and
// is_device_memory tells a device buffer from a host one (host ones go through `host`).
std::unique_ptr<Communicator> make_nccl_communicator_with(std::unique_ptr<Communicator> host, const CudaNccl& nccl,
                                                          bool (*is_device_memory)(const void*), Device& device);

}  // namespace dufu::trainer
