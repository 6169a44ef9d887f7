// The communicators a rank trains in (docs/rank-layout.md), made from the world and
// the Topology: the other tensor-parallel shards of its stage, the other data-parallel
// replicas of its shard, the stages of its pipeline, and the first and last stage of
// that pipeline (the tied embedding; null on middle stages). Their collectives move
// the memory of the device the model runs on: host groups (MPI or single process) for
// the CPU device, NCCL groups over those host groups for a CUDA device, so gradients,
// tensor-parallel partial sums and pipeline activations (send/recv: ncclSend/ncclRecv)
// stay on the GPU.
#pragma once

#include <memory>

#include "dufu/common/communicator.h"
#include "dufu/common/topology.h"
#include "dufu/trainer/device/device.h"

namespace dufu::trainer {

struct RankGroups {
  std::unique_ptr<Communicator> tensor;
  std::unique_ptr<Communicator> data;
  std::unique_ptr<Communicator> pipeline;
  std::unique_ptr<Communicator> embedding;
};

// Collective over `world` (a host communicator). For a CUDA device every group of
// several ranks is an NCCL communicator (nccl_communicator.h) and a
// group of one rank a host one (nothing moves); throws dufu::Error on every rank, with
// the first failing rank's reason, when NCCL is not available to all of them. For the
// CPU device, host groups.
RankGroups make_rank_groups(Communicator& world, const Topology& topology, Device& device);

}  // namespace dufu::trainer
