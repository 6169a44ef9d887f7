// Data-parallel reduction in buckets, run by ctest under mpirun -np 2 and 3: the MPI
// backend's sums and maxima against collective_fold.h's fold (the NCCL backend's
// per-element math), bit for bit, and training steps with buckets that cut tensors
// unevenly against one bucket, replicated and ZeRO-1: the parameters must not differ
// in a single bit, on any rank; and the optimizer offloaded to the host, against the
// run that keeps it on the device. (rank_groups_test.cc, in the same program, checks the
// rank groups the trainer makes for a device.)
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "dufu/common/communicator.h"
#include "dufu/trainer/device/collective_fold.h"
#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/parallel/data_parallel_optimizer.h"
#include "support/counting_cpu_device.h"
#include "support/gpt_fixture.h"
#include "support/mpi_world.h"

namespace dufu::trainer {
namespace {

Communicator& world() { return dufu::testing::mpi_world(); }

// Every rank's block, the same on every rank: magnitudes from 1e-8 to 1e8, so the
// order of the additions shows in the bits, and NaNs at every 37th element of odd ranks.
std::vector<float> all_blocks(int ranks, std::size_t n) {
  std::mt19937 engine(29);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-8, 8);
  std::vector<float> blocks(static_cast<std::size_t>(ranks) * n);
  for (float& x : blocks) x = mantissa(engine) * std::pow(10.0f, static_cast<float>(exponent(engine)));
  return blocks;
}

std::vector<float> with_nans(std::vector<float> blocks, int ranks, std::size_t n) {
  for (int r = 1; r < ranks; r += 2) {
    for (std::size_t i = static_cast<std::size_t>(r); i < n; i += 37) {
      blocks[static_cast<std::size_t>(r) * n + i] = std::numeric_limits<float>::quiet_NaN();
    }
  }
  return blocks;
}

void expect_same_bits(std::span<const float> got, const std::vector<float>& blocks, std::size_t stride,
                      std::size_t first, bool is_max) {
  const int ranks = world().size();
  for (std::size_t i = 0; i < got.size(); ++i) {
    const float expected = fold_element(blocks.data(), stride, ranks, first + i, is_max);
    ASSERT_EQ(std::bit_cast<std::uint32_t>(got[i]), std::bit_cast<std::uint32_t>(expected))
        << "element " << first + i << ": " << got[i] << " vs the fold's " << expected;
  }
}

TEST(FoldAgainstMpiTest, AllReduceIsTheFoldBitForBit) {
  const int ranks = world().size();
  const auto rank = static_cast<std::size_t>(world().rank());
  constexpr std::size_t n = 1001;  // no multiple of 2 or 3: uneven chunks
  for (const bool is_max : {false, true}) {
    const std::vector<float> blocks = is_max ? with_nans(all_blocks(ranks, n), ranks, n) : all_blocks(ranks, n);
    std::vector<float> mine(blocks.begin() + static_cast<std::ptrdiff_t>(rank * n),
                            blocks.begin() + static_cast<std::ptrdiff_t>((rank + 1) * n));
    world().all_reduce(mine, is_max ? ReduceOp::kMax : ReduceOp::kSum);
    expect_same_bits(mine, blocks, n, 0, is_max);
  }
  // Integers wrap around on both.
  std::vector<std::int32_t> blocks(static_cast<std::size_t>(ranks) * 3);
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    blocks[i] = std::numeric_limits<std::int32_t>::max() - static_cast<std::int32_t>(i);
  }
  std::vector<std::int32_t> mine(blocks.begin() + static_cast<std::ptrdiff_t>(rank * 3),
                                 blocks.begin() + static_cast<std::ptrdiff_t>(rank * 3 + 3));
  world().all_reduce(mine);
  for (std::size_t i = 0; i < 3; ++i) EXPECT_EQ(mine[i], fold_element(blocks.data(), 3, ranks, i, false));
}

TEST(FoldAgainstMpiTest, ReduceScatterIsTheFoldOfThisRanksChunk) {
  const int ranks = world().size();
  const auto rank = static_cast<std::size_t>(world().rank());
  constexpr std::size_t m = 333;
  const std::size_t n = m * static_cast<std::size_t>(ranks);
  const std::vector<float> blocks = all_blocks(ranks, n);
  const std::span<const float> input(blocks.data() + rank * n, n);
  std::vector<float> output(m);
  world().reduce_scatter(input, output);
  expect_same_bits(output, blocks, n, rank * m, false);
}

// Parameters after a few steps of a small GPT with `bucket_elements` floats per
// collective; each rank trains on its own batches. The device is a counting CPU
// device: the CPU's kernels (the same bits), and a device that is not the host's for
// the model, as optim.offload = cpu asks, whose memory MPI moves.
std::vector<float> train(bool zero1, std::size_t bucket_elements, Precision precision = Precision::kFp32,
                         bool offload = false) {
  constexpr int kB = 2;
  constexpr int kT = 8;
  constexpr int kVocab = 97;
  dufu::testing::CountingCpuDevice device;
  GPT model(dufu::testing::small_gpt_config(
                {.n_layer = 2, .n_head = 2, .d_model = 32, .vocab_size = kVocab, .vocab_multiple = 8, .seq_length = kT}),
            nullptr, {}, &device);
  model.set_precision(precision);
  model.set_optimizer_offload(offload);
  model.init_gpt2(5);
  DataParallelOptimizer optimizer(model, AdamWOptions{}, world(), zero1, nullptr, nullptr, bucket_elements);
  for (int step = 0; step < 3; ++step) {
    const auto batch = dufu::testing::next_token_batch(
        kB, kT, kVocab, static_cast<std::uint32_t>(100 + 10 * step + world().rank()), {});
    model.zero_grad();
    model.forward(batch.tokens, batch.targets, kB, kT);
    model.backward();
    optimizer.reduce_gradients_and_clip(0.5);  // clipping on: the norm goes into the update
    optimizer.step(1e-2f);
  }
  std::vector<float> params(model.num_parameters());
  model.parameter_device().download(params.data(), model.params().data(), params.size() * sizeof(float));
  return params;
}

void expect_bitwise_equal(const std::vector<float>& got, const std::vector<float>& expected, const char* what) {
  ASSERT_EQ(got.size(), expected.size());
  std::size_t differing = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    differing += std::bit_cast<std::uint32_t>(got[i]) != std::bit_cast<std::uint32_t>(expected[i]) ? 1 : 0;
  }
  EXPECT_EQ(differing, 0u) << what << ": " << differing << " of " << got.size() << " parameters differ";
}

TEST(BucketedReductionTest, BucketsDoNotChangeABitReplicatedOrZero1) {
  const std::size_t one_bucket = std::size_t{1} << 30;
  for (const bool zero1 : {false, true}) {
    const std::vector<float> whole = train(zero1, one_bucket);
    // 1000 and 4099 floats cut tensors (and, under ZeRO-1, each rank's shard) unevenly.
    expect_bitwise_equal(train(zero1, 1000), whole, zero1 ? "ZeRO-1, buckets of 1000" : "buckets of 1000");
    expect_bitwise_equal(train(zero1, 4099), whole, zero1 ? "ZeRO-1, buckets of 4099" : "buckets of 4099");
    // Every rank ends with the same parameters.
    std::vector<float> rank0 = whole;
    world().broadcast(rank0, 0);
    expect_bitwise_equal(whole, rank0, "this rank against rank 0");
  }
  // Both layouts train the same model: replicated and ZeRO-1 agree too.
  expect_bitwise_equal(train(true, 1000), train(false, one_bucket), "ZeRO-1 against replicated");
}

// optim.offload = cpu over the data-parallel ranks, replicated and ZeRO-1 (the host
// updates its shard, the shards meet through the device's communicator): the bits of
// the run that keeps the masters and moments on the device.
TEST(OffloadedOptimizerTest, ReplicatedAndZero1GiveTheDeviceRunsBits) {
  for (const bool zero1 : {false, true}) {
    expect_bitwise_equal(train(zero1, 1000, Precision::kBf16, true), train(zero1, 1000, Precision::kBf16, false),
                         zero1 ? "ZeRO-1, offloaded against on the device" : "offloaded against on the device");
  }
}

}  // namespace
}  // namespace dufu::trainer
