// The rank groups the trainer makes for a device (rank_groups.h), under mpirun -np 2
// and 3 (in data_parallel_buckets_test's program): host groups for the CPU device; for
// a CUDA device, groups of one rank stay host groups (a one-GPU run needs no NCCL), and
// where NCCL is missing every rank fails together with the first failing rank's reason
// instead of one rank giving up while the others wait for it.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "dufu/common/communicator.h"
#include "dufu/common/topology.h"
#include "dufu/trainer/device/device.h"
#include "dufu/trainer/parallel/nccl_communicator.h"
#include "dufu/trainer/parallel/rank_groups.h"
#include "support/expect_error.h"
#include "support/mpi_world.h"

namespace dufu::trainer {
namespace {

Communicator& world() { return dufu::testing::mpi_world(); }

TEST(RankGroupsTest, HostGroupsForTheCpuDevice) {
  const Topology topology(world().size(), 1, 1, world().rank());
  const RankGroups groups = make_rank_groups(world(), topology, cpu_device());
  EXPECT_EQ(groups.data->size(), world().size());
  EXPECT_EQ(groups.data->rank(), world().rank());
  EXPECT_EQ(groups.data->memory_space(), MemorySpace::kHost);
  EXPECT_EQ(groups.tensor->size(), 1);
  EXPECT_EQ(groups.pipeline->size(), 1);
  ASSERT_NE(groups.embedding, nullptr);  // one stage: first and last
  EXPECT_EQ(groups.embedding->size(), 1);
}

// A device whose memory is a GPU's, for asking for NCCL groups where there is no NCCL;
// nothing of it but its names is used.
class NamedCudaDevice final : public Device {
 public:
  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string describe() const override { return "cuda:0 (stand-in)"; }
  MemorySpace memory_space() const override { return MemorySpace::kCudaDevice; }
  const KernelTable& kernels() const override { return cpu_device().kernels(); }
  double memory_capacity_bytes() const override { return 0.0; }
  double scratch_bytes(const StepShapes&) const override { return 0.0; }
  void* allocate(std::size_t) override { return nullptr; }
  void release(void*) noexcept override {}
  void upload(void*, const void*, std::size_t) override {}
  void download(void*, const void*, std::size_t) override {}
  void copy(void*, const void*, std::size_t) override {}
  void fill(float*, float, std::size_t) override {}
  void zero(void*, std::size_t) override {}
  void synchronize() override {}
};

TEST(RankGroupsTest, CudaDeviceWithoutNcclGetsTheReason) {
  const DeviceAvailability nccl = nccl_availability();
  if (nccl.available) GTEST_SKIP() << "NCCL is available here; the gpu-labelled nccl_communicator_test covers it";
  ASSERT_FALSE(nccl.reason.empty());
  NamedCudaDevice gpu;
  const Topology topology(world().size(), 1, 1, world().rank());
  dufu::testing::expect_error([&] { make_rank_groups(world(), topology, gpu); },
                              {"rank groups on cuda:0 (stand-in) need NCCL: ", nccl.reason});
  dufu::testing::expect_error([&] { make_nccl_communicator(world().split(0, world().rank(), "nccl")); },
                              {"NCCL communicator 'nccl': ", nccl.reason});
}


TEST(RankGroupsTest, OneRankGroupsOfACudaDeviceStayHostGroupsAndNeedNoNccl) {
  // A one-GPU run: every group has one rank, so nothing asks for NCCL (absent here).
  const std::unique_ptr<Communicator> alone = make_single_process_communicator("world");
  NamedCudaDevice gpu;
  const RankGroups groups = make_rank_groups(*alone, Topology(1, 1, 1, 0), gpu);
  for (const Communicator* group : {groups.tensor.get(), groups.data.get(), groups.pipeline.get(),
                                    groups.embedding.get()}) {
    ASSERT_NE(group, nullptr);
    EXPECT_EQ(group->size(), 1);
    EXPECT_EQ(group->memory_space(), MemorySpace::kHost) << group->describe();
  }
}

TEST(AgreeOnAvailability, EveryRankGetsTheLowestFailingRanksReason) {
  const int last = world().size() - 1;
  const DeviceAvailability all = agree_on_availability(world(), {true, ""});
  EXPECT_TRUE(all.available);
  EXPECT_EQ(all.reason, "");

  // Only the last rank lacks a GPU: every rank hears it, with the last rank's words.
  const DeviceAvailability one = agree_on_availability(
      world(), world().rank() == last ? DeviceAvailability{false, "local rank 1 of a machine with 1 GPU"}
                                      : DeviceAvailability{true, ""});
  EXPECT_FALSE(one.available);
  EXPECT_EQ(one.reason, str_cat("rank ", last, " of ", world().size(), ": local rank 1 of a machine with 1 GPU"));

  // Several fail: the lowest of them is named.
  const DeviceAvailability several = agree_on_availability(
      world(), world().rank() == 0 ? DeviceAvailability{true, ""}
                                   : DeviceAvailability{false, str_cat("reason of rank ", world().rank())});
  EXPECT_FALSE(several.available);
  EXPECT_EQ(several.reason, str_cat("rank 1 of ", world().size(), ": reason of rank 1"));
}

}  // namespace
}  // namespace dufu::trainer
