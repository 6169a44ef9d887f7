// NcclCommunicator's collectives against the MPI communicator's on the same inputs,
// bit for bit, under mpirun -np 2 with one GPU per rank (labelled gpu;mpi; a launcher
// may give each rank its own GPU through CUDA_VISIBLE_DEVICES). Where any rank lacks a
// GPU of its own or NCCL, every rank skips every test with that rank's reason (the
// collective nccl_availability, asked before any rank waits in the ncclUniqueId
// broadcast) and ctest reports it skipped.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "dufu/common/communicator.h"
#include "dufu/trainer/device/device.h"
#include "dufu/trainer/parallel/nccl_communicator.h"
#include "support/mpi_world.h"
#include "support/uneven_counts.h"

namespace dufu::trainer {
namespace {

Communicator& world() { return dufu::testing::mpi_world(); }

class NcclCommunicatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const DeviceAvailability nccl = nccl_availability(world());
    if (!nccl.available) GTEST_SKIP() << "NCCL communicator skipped: " << nccl.reason;
    nccl_ = make_nccl_communicator(world().split(0, world().rank(), "nccl"));
  }

  Device& gpu() { return device_of_kind(DeviceKind::kCuda); }

  template <typename T>
  DeviceBuffer<T> on_gpu(const std::vector<T>& host) {
    DeviceBuffer<T> buffer(gpu(), host.size());
    buffer.upload(host);
    return buffer;
  }

  std::unique_ptr<Communicator> nccl_;
};

// This rank's floats: magnitudes from 1e-8 to 1e8 (the order of additions shows), and
// NaN at every 11th element of rank 1 when asked.
std::vector<float> rank_floats(std::size_t n, bool nans) {
  std::mt19937 engine(static_cast<std::uint32_t>(7 + world().rank()));
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-8, 8);
  std::vector<float> values(n);
  for (float& x : values) x = mantissa(engine) * std::pow(10.0f, static_cast<float>(exponent(engine)));
  if (nans && world().rank() == 1) {
    for (std::size_t i = 0; i < n; i += 11) values[i] = std::numeric_limits<float>::quiet_NaN();
  }
  return values;
}

template <typename T>
void expect_bitwise(const std::vector<T>& got, const std::vector<T>& expected) {
  ASSERT_EQ(got.size(), expected.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    if constexpr (std::is_same_v<T, float>) {
      ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(expected[i])) << "element " << i;
    } else {
      ASSERT_EQ(got[i], expected[i]) << "element " << i;
    }
  }
}

TEST_F(NcclCommunicatorTest, IsADeviceCommunicatorOverTheWorldsRanks) {
  EXPECT_EQ(nccl_->memory_space(), MemorySpace::kCudaDevice);
  EXPECT_EQ(nccl_->rank(), world().rank());
  EXPECT_EQ(nccl_->size(), world().size());
  EXPECT_EQ(nccl_->all_reduce_value(world().rank() + 1), world().size() * (world().size() + 1) / 2);
}

TEST_F(NcclCommunicatorTest, AllReduceSumAndMaxMatchMpiBitForBit) {
  for (const std::size_t n : {std::size_t{1}, std::size_t{1001}, std::size_t{1} << 20}) {
    for (const ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      std::vector<float> expected = rank_floats(n, op == ReduceOp::kMax);
      DeviceBuffer<float> data = on_gpu(expected);
      nccl_->all_reduce(data.span(), op);
      world().all_reduce(expected, op);
      expect_bitwise(data.to_host(), expected);
    }
  }
  std::vector<std::int32_t> integers = {std::numeric_limits<std::int32_t>::max(), -5, world().rank()};
  DeviceBuffer<std::int32_t> data = on_gpu(integers);
  nccl_->all_reduce(data.span());
  world().all_reduce(integers);
  expect_bitwise(data.to_host(), integers);
}

TEST_F(NcclCommunicatorTest, ReduceScatterAndAllGatherMatchMpi) {
  const std::size_t m = 777;
  const std::vector<float> input = rank_floats(m * static_cast<std::size_t>(world().size()), false);
  DeviceBuffer<float> gpu_input = on_gpu(input);
  DeviceBuffer<float> gpu_output(gpu(), m);
  nccl_->reduce_scatter(gpu_input.span(), gpu_output.span());
  std::vector<float> expected(m);
  world().reduce_scatter(input, expected);
  expect_bitwise(gpu_output.to_host(), expected);

  DeviceBuffer<float> gathered(gpu(), m * static_cast<std::size_t>(world().size()));
  nccl_->all_gather(gpu_output.span(), gathered.span());
  std::vector<float> expected_gathered(gathered.size());
  world().all_gather(expected, expected_gathered);
  expect_bitwise(gathered.to_host(), expected_gathered);
}

// The uneven collectives' counts: zeros between shards, growing, all on the last rank.
std::vector<std::vector<std::size_t>> uneven_counts() {
  return dufu::testing::uneven_count_patterns(static_cast<std::size_t>(world().size()), 1000);
}

TEST_F(NcclCommunicatorTest, ReduceScatterVMatchesMpi) {
  const std::size_t own_index = static_cast<std::size_t>(world().rank());
  for (const std::vector<std::size_t>& counts : uneven_counts()) {
    SCOPED_TRACE(::testing::PrintToString(counts));
    std::size_t total = 0;
    for (const std::size_t count : counts) total += count;
    const std::vector<float> input = rank_floats(total, false);
    DeviceBuffer<float> gpu_input = on_gpu(input);
    // A rank that gets nothing passes an empty device buffer.
    DeviceBuffer<float> gpu_output(gpu(), counts[own_index]);
    nccl_->reduce_scatter_v(gpu_input.span(), gpu_output.span(), counts);
    std::vector<float> expected(counts[own_index]);
    world().reduce_scatter_v(input, expected, counts);
    expect_bitwise(gpu_output.to_host(), expected);
    // Host buffers go through the control plane.
    std::vector<float> host_output(counts[own_index]);
    nccl_->reduce_scatter_v(input, host_output, counts);
    expect_bitwise(host_output, expected);
  }
}

TEST_F(NcclCommunicatorTest, AllGatherVMatchesMpi) {
  const std::size_t ranks = static_cast<std::size_t>(world().size());
  const std::size_t own_index = static_cast<std::size_t>(world().rank());
  std::vector<std::vector<std::size_t>> patterns = uneven_counts();
  patterns.push_back(std::vector<std::size_t>(ranks, 129));  // equal: ncclAllGather's path
  for (const std::vector<std::size_t>& counts : patterns) {
    SCOPED_TRACE(::testing::PrintToString(counts));
    std::size_t total = 0;
    std::size_t begin = 0;
    for (std::size_t k = 0; k < ranks; ++k) {
      if (k == own_index) begin = total;
      total += counts[k];
    }
    const std::vector<float> input = rank_floats(counts[own_index], false);
    std::vector<float> expected(total);
    world().all_gather_v(input, expected, counts);
    // A rank that gives nothing passes an empty device buffer.
    DeviceBuffer<float> gpu_input = on_gpu(input);
    DeviceBuffer<float> gpu_output(gpu(), total);
    nccl_->all_gather_v(gpu_input.span(), gpu_output.span(), counts);
    expect_bitwise(gpu_output.to_host(), expected);
    // In place: the input is this rank's chunk of the output.
    std::vector<float> staged(total, -1.0f);
    std::copy(input.begin(), input.end(), staged.begin() + static_cast<std::ptrdiff_t>(begin));
    DeviceBuffer<float> in_place = on_gpu(staged);
    nccl_->all_gather_v(std::span<const float>(in_place.data() + begin, input.size()), in_place.span(), counts);
    expect_bitwise(in_place.to_host(), expected);
    // Host buffers go through the control plane.
    std::vector<float> host_output(total);
    nccl_->all_gather_v(input, host_output, counts);
    expect_bitwise(host_output, expected);
  }
}

// Started collectives run on the communicator's own stream: several outstanding, a
// blocking one between them, waited out of order, polled, or dropped unwaited, each
// gives the blocking call's bits once the device's stream has waited for it.
TEST_F(NcclCommunicatorTest, StartedCollectivesGiveTheBlockingBits) {
  const std::size_t own_index = static_cast<std::size_t>(world().rank());
  for (const std::vector<std::size_t>& counts : uneven_counts()) {
    SCOPED_TRACE(::testing::PrintToString(counts));
    std::size_t total = 0;
    for (const std::size_t count : counts) total += count;
    const std::vector<float> scattered_input = rank_floats(total, false);
    std::vector<float> scattered(counts[own_index]);
    world().reduce_scatter_v(scattered_input, scattered, counts);
    const std::vector<float> gathered_input = rank_floats(counts[own_index], false);
    std::vector<float> gathered(total);
    world().all_gather_v(gathered_input, gathered, counts);
    std::vector<float> summed = rank_floats(1000, false);
    const std::vector<float> summed_input = summed;
    world().all_reduce(summed);

    DeviceBuffer<float> gpu_scattered_input = on_gpu(scattered_input);
    DeviceBuffer<float> gpu_gathered_input = on_gpu(gathered_input);
    DeviceBuffer<float> gpu_summed = on_gpu(summed_input);
    DeviceBuffer<float> gpu_scattered(gpu(), counts[own_index]);
    DeviceBuffer<float> gpu_gathered(gpu(), total);
    auto scatter = nccl_->start_reduce_scatter_v(gpu_scattered_input.span(), gpu_scattered.span(), counts);
    auto gather = nccl_->start_all_gather_v(gpu_gathered_input.span(), gpu_gathered.span(), counts);
    nccl_->all_reduce(gpu_summed.span());
    gather->wait();
    while (!scatter->test()) {
    }
    scatter->wait();
    expect_bitwise(gpu_scattered.to_host(), scattered);
    expect_bitwise(gpu_gathered.to_host(), gathered);
    expect_bitwise(gpu_summed.to_host(), summed);

    DeviceBuffer<float> dropped_output(gpu(), counts[own_index]);
    nccl_->start_reduce_scatter_v(gpu_scattered_input.span(), dropped_output.span(), counts).reset();
    expect_bitwise(dropped_output.to_host(), scattered);
  }
}

TEST_F(NcclCommunicatorTest, BroadcastAndSendRecvMatchMpi) {
  std::vector<float> expected = rank_floats(513, false);
  DeviceBuffer<float> data = on_gpu(expected);
  nccl_->broadcast(data.span(), 1);
  world().broadcast(expected, 1);
  expect_bitwise(data.to_host(), expected);

  // A ring: send to the next rank, receive from the previous.
  const int next = (world().rank() + 1) % world().size();
  const int previous = (world().rank() + world().size() - 1) % world().size();
  const std::vector<float> mine = rank_floats(300, false);
  DeviceBuffer<float> send = on_gpu(mine);
  DeviceBuffer<float> received(gpu(), mine.size());
  nccl_->send_recv(send.span(), next, received.span(), previous);
  std::vector<float> expected_received(mine.size());
  world().send_recv(mine, next, expected_received, previous);
  expect_bitwise(received.to_host(), expected_received);
}

TEST_F(NcclCommunicatorTest, SubgroupsAgreeOnTheHostAndReduceOnTheDevice) {
  // Every rank alone, then all ranks in reverse order.
  std::unique_ptr<Communicator> alone = nccl_->subgroup({world().rank()}, "alone");
  ASSERT_NE(alone, nullptr);
  EXPECT_EQ(alone->size(), 1);
  std::vector<int> reversed;
  for (int r = world().size() - 1; r >= 0; --r) reversed.push_back(r);
  std::unique_ptr<Communicator> group = nccl_->subgroup(reversed, "reversed");
  ASSERT_NE(group, nullptr);
  EXPECT_EQ(group->memory_space(), MemorySpace::kCudaDevice);
  EXPECT_EQ(group->rank(), world().size() - 1 - world().rank());
  std::vector<float> expected = rank_floats(999, false);
  DeviceBuffer<float> data = on_gpu(expected);
  group->all_reduce(data.span());
  std::unique_ptr<Communicator> host_group = world().subgroup(reversed, "reversed");
  host_group->all_reduce(expected);
  expect_bitwise(data.to_host(), expected);
}

}  // namespace
}  // namespace dufu::trainer
