// The rank groups of a Topology as communicators for the model's device.
#include "dufu/trainer/parallel/rank_groups.h"

#include <utility>

#include "dufu/common/error.h"
#include "dufu/trainer/parallel/nccl_communicator.h"

namespace dufu::trainer {

namespace {

RankGroups make_host_rank_groups(Communicator& world, const Topology& topology) {
  const auto c = topology.coordinates();
  const int tp = topology.tensor_parallel_size();
  const int dp = topology.data_parallel_size();
  const bool holds_embedding = c.pp_rank == 0 || c.pp_rank + 1 == topology.pipeline_parallel_size();
  RankGroups groups;
  groups.tensor = world.split(c.pp_rank * dp + c.dp_rank, c.tp_rank, "tensor");
  groups.data = world.split(c.pp_rank * tp + c.tp_rank, c.dp_rank, "data");
  groups.pipeline = world.split(c.dp_rank * tp + c.tp_rank, c.pp_rank, "pipeline");
  groups.embedding = world.split(holds_embedding ? c.dp_rank * tp + c.tp_rank : -1, c.pp_rank, "embedding");
  return groups;
}

}  // namespace

RankGroups make_rank_groups(Communicator& world, const Topology& topology, Device& device) {
  if (world.memory_space() != MemorySpace::kHost) {
    DUFU_FAIL("make_rank_groups: the world communicator ", world.describe(), " must move host memory");
  }
  RankGroups groups = make_host_rank_groups(world, topology);
  if (device.memory_space() == MemorySpace::kHost) return groups;
  if (device.memory_space() != MemorySpace::kCudaDevice) {
    DUFU_FAIL("no communicator moves ", memory_space_name(device.memory_space()), " of ", device.describe());
  }
  // A group of one rank has nothing to move: it stays a host communicator, whose
  // collectives over one rank return at once, so a one-GPU run needs no NCCL. With
  // more than one rank some group spans ranks on every rank (the Topology's sizes
  // multiply to the world's), so all ranks ask whether NCCL can be had, together, and
  // fail together with the same reason when it cannot.
  const auto spans_ranks = [](const std::unique_ptr<Communicator>& group) {
    return group != nullptr && group->size() > 1;
  };
  if (world.size() == 1) return groups;
  const DeviceAvailability nccl = nccl_availability(world);
  if (!nccl.available) DUFU_FAIL("rank groups on ", device.describe(), " need NCCL: ", nccl.reason);
  // Every rank makes the NCCL groups in the same order (tensor, data, pipeline,
  // embedding), as ncclCommInitRank of one group must not wait on another's. The
  // embedding group exists only on the first and last stages, which all make it.
  for (std::unique_ptr<Communicator>* group : {&groups.tensor, &groups.data, &groups.pipeline, &groups.embedding}) {
    if (spans_ranks(*group)) *group = make_nccl_communicator(std::move(*group));
  }
  return groups;
}

}  // namespace dufu::trainer
