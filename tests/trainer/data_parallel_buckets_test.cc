// Data-parallel reduction in buckets, run by ctest under mpirun -np 2 and 3: the MPI
// backend's sums and maxima against collective_fold.h's fold (the NCCL backend's
// per-element math), bit for bit, and training steps with buckets that cut tensors
// unevenly against one bucket, replicated and ZeRO-1: the parameters must not differ
// in a single bit, on any rank; the optimizer offloaded to the host, against the
// run that keeps it on the device; and ZeRO-2 against stage 0. (rank_groups_test.cc, in the same program, checks the
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
#include "device/collective_fold.h"
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

// A run of train() below.
struct TrainingRun {
  int zero_stage = 0;
  std::size_t bucket_elements = std::size_t{1} << 30;
  Precision precision = Precision::kFp32;
  bool offload = false;
  int micro_batches = 1;  // per step, each rank
  bool reduce_each_micro_batch = false;
  int n_layer = 2;
  bool overlap = false;  // overlap_reduction
};

struct Trained {
  std::vector<float> params;
  std::size_t peak_device_bytes = 0;  // the model's and the optimizer's, at most at once
};

// Parameters after a few steps of a small GPT; each rank trains on its own batches.
// The device is a counting CPU device: the CPU's kernels (the same bits), and a device
// that is not the host's for the model, as optim.offload = cpu asks, whose memory MPI
// moves.
Trained train(const TrainingRun& run) {
  constexpr int kB = 2;
  constexpr int kT = 8;
  constexpr int kVocab = 97;
  dufu::testing::CountingCpuDevice device;
  GPT model(dufu::testing::small_gpt_config({.n_layer = run.n_layer,
                                             .n_head = 2,
                                             .d_model = 32,
                                             .vocab_size = kVocab,
                                             .vocab_multiple = 8,
                                             .seq_length = kT}),
            nullptr, {}, &device, GPTRecipe{.precision = run.precision, .optimizer_offload = run.offload});
  model.init_gpt2(5);
  DataParallelOptimizer optimizer(model, AdamWOptions{}, world(), run.zero_stage, nullptr, nullptr,
                                  run.bucket_elements, run.reduce_each_micro_batch, run.overlap);
  device.reset_peak();  // training's peak, not the set-up's (the model is made whole first)
  for (int step = 0; step < 3; ++step) {
    model.zero_grad();
    for (int micro = 0; micro < run.micro_batches; ++micro) {
      const auto batch = dufu::testing::next_token_batch(
          kB, kT, kVocab, static_cast<std::uint32_t>(100 + 10 * step + micro + 1000 * world().rank()), {});
      model.forward(batch.tokens, batch.targets, kB, kT, 1.0f / static_cast<float>(kB * kT * run.micro_batches));
      model.backward();
    }
    optimizer.reduce_gradients_and_clip(0.5);  // clipping on: the norm goes into the update
    optimizer.step(1e-2f);
  }
  const std::size_t peak = device.peak_bytes();
  return {model.download_parameters(), peak};
}

std::vector<float> train(bool zero1, std::size_t bucket_elements, Precision precision = Precision::kFp32,
                         bool offload = false) {
  return train({.zero_stage = zero1 ? 1 : 0,
                .bucket_elements = bucket_elements,
                .precision = precision,
                .offload = offload})
      .params;
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

// With three micro-batches a step, stage `zero_stage` (2 or 3) in one bucket and in
// buckets of 777 (cutting layers and shards) against stage 0 reducing each
// micro-batch's layer gradients, and that plain stage 0 (summing over the ranks once)
// differs, or the test could not tell the two orders apart.
void expect_stage_zeros_bits_with_accumulation(int zero_stage, Precision precision, int n_layer) {
  const TrainingRun reference{
      .precision = precision, .micro_batches = 3, .reduce_each_micro_batch = true, .n_layer = n_layer};
  const std::vector<float> expected = train(reference).params;
  for (const std::size_t bucket : {std::size_t{1} << 30, std::size_t{777}}) {
    TrainingRun zero = reference;
    zero.zero_stage = zero_stage;
    zero.reduce_each_micro_batch = false;
    zero.bucket_elements = bucket;
    expect_bitwise_equal(train(zero).params, expected, "against stage 0 reducing each micro-batch");
  }
  TrainingRun plain = reference;
  plain.reduce_each_micro_batch = false;
  EXPECT_NE(train(plain).params, expected) << "stage 0 summing over ranks once gave the same bits";
}

// Every rank ends with the same parameters.
void expect_every_rank_the_same(const std::vector<float>& mine, const char* what) {
  std::vector<float> rank0 = mine;
  world().broadcast(rank0, 0);
  expect_bitwise_equal(mine, rank0, what);
}

// ZeRO-2: each layer's gradient reduce-scattered as the backward makes it. One
// micro-batch per step: stage 0's bits. Several: the bits of stage 0 reducing each
// micro-batch's layer gradients (the sums ZeRO-2 makes; data_parallel_optimizer.h
// says why no scheme that frees them can give plain stage 0's). Buckets that cut
// layers and shards unevenly, fp32 and bf16, and offloaded.
TEST(ZeroStage2Test, GivesStageZerosBitsForTheSameSums) {
  const std::vector<float> stage0 = train({.zero_stage = 0}).params;
  expect_bitwise_equal(train({.zero_stage = 2}).params, stage0, "ZeRO-2 against stage 0, one micro-batch");
  expect_bitwise_equal(train({.zero_stage = 2, .bucket_elements = 1000}).params, stage0,
                       "ZeRO-2 in buckets of 1000, one micro-batch");
  for (const Precision precision : {Precision::kFp32, Precision::kBf16}) {
    SCOPED_TRACE(precision_name(precision));
    expect_stage_zeros_bits_with_accumulation(2, precision, 2);
  }
  const TrainingRun offloaded{
      .zero_stage = 2, .bucket_elements = 1000, .precision = Precision::kBf16, .micro_batches = 2};
  TrainingRun host = offloaded;
  host.offload = true;
  expect_bitwise_equal(train(host).params, train(offloaded).params, "ZeRO-2 offloaded against on the device");
  expect_every_rank_the_same(train({.zero_stage = 2, .micro_batches = 2}).params, "ZeRO-2: this rank against rank 0");
}

// What ZeRO-2 saves, measured on the counting device: the layers' gradients but one,
// on a model of 6 layers; stage 1 keeps the whole gradient.
TEST(ZeroStage2Test, KeepsOneLayersGradientInsteadOfAll) {
  GPT shape(dufu::testing::small_gpt_config(
      {.n_layer = 6, .n_head = 2, .d_model = 32, .vocab_size = 97, .vocab_multiple = 8, .seq_length = 8}));
  const std::size_t layer_bytes = shape.layer_range(0).second * sizeof(float);
  const std::size_t bucket = 4096;
  const std::size_t stage1 =
      train({.zero_stage = 1, .bucket_elements = bucket, .n_layer = 6}).peak_device_bytes;
  const std::size_t stage2 =
      train({.zero_stage = 2, .bucket_elements = bucket, .n_layer = 6}).peak_device_bytes;
  // Five layers' gradients fewer, less the bucket-sized piece the reduction lands in.
  ASSERT_GT(stage1, stage2);
  EXPECT_GE(stage1 - stage2, 5 * layer_bytes - bucket * sizeof(float))
      << "stage 1 " << stage1 << " bytes, stage 2 " << stage2 << ", a layer's gradient " << layer_bytes;
  EXPECT_LE(stage1 - stage2, 5 * layer_bytes);
}

// ZeRO-3: the parameters sharded too, each layer's gathered before its use. Its sums
// are ZeRO-2's, so its bits are: stage 0's at one micro-batch per step, stage 0
// reducing each micro-batch's with accumulation. Three layers use both windows and
// reuse the first; buckets of 777 cut layers, shards and the gathers unevenly.
TEST(ZeroStage3Test, GivesZeroStage2sBits) {
  const std::vector<float> stage0 = train({.zero_stage = 0, .n_layer = 3}).params;
  expect_bitwise_equal(train({.zero_stage = 3, .n_layer = 3}).params, stage0,
                       "ZeRO-3 against stage 0, one micro-batch");
  for (const Precision precision : {Precision::kFp32, Precision::kBf16}) {
    SCOPED_TRACE(precision_name(precision));
    expect_stage_zeros_bits_with_accumulation(3, precision, 3);
  }
  expect_every_rank_the_same(train({.zero_stage = 3, .micro_batches = 2, .n_layer = 3}).params,
                             "ZeRO-3: this rank against rank 0");
}

// What ZeRO-3 saves over ZeRO-2, measured on the counting device: the whole piece of
// parameters gives way to this rank's shard, the edge tensors and two layer windows.
// Nothing else differs between the two, so the difference is exact.
TEST(ZeroStage3Test, KeepsTheShardTheEdgesAndTwoLayersOfParameters) {
  GPT shape(dufu::testing::small_gpt_config(
      {.n_layer = 6, .n_head = 2, .d_model = 32, .vocab_size = 97, .vocab_multiple = 8, .seq_length = 8}));
  const std::size_t n = shape.num_parameters();
  const std::size_t layer = shape.layer_range(0).second;
  const std::size_t edges = n - 6 * layer;
  const auto [begin, end] = zero_shard_range(n, world().size(), world().rank());
  const std::size_t stage2 = train({.zero_stage = 2, .bucket_elements = 4096, .n_layer = 6}).peak_device_bytes;
  const std::size_t stage3 = train({.zero_stage = 3, .bucket_elements = 4096, .n_layer = 6}).peak_device_bytes;
  const std::size_t kept = std::max<std::size_t>(end - begin, 1) + edges + 2 * layer;
  ASSERT_GT(n, kept);
  EXPECT_EQ(stage2 - stage3, (n - kept) * sizeof(float)) << "stage 2 " << stage2 << " bytes, stage 3 " << stage3;
}

// The reduction overlapped with the backward: each layer's reduce-scatter started as
// the model hands the layer over and finished when the model needs its window again
// (or before the edges are reduced). The same collectives and sums, added in the same
// order: the bits of the blocking path, stages 2 and 3, fp32 and bf16, three layers
// (the windows wrap), three micro-batches, buckets that cut layers and shards.
TEST(OverlappedReductionTest, GivesTheBlockingBits) {
  for (const int zero_stage : {2, 3}) {
    for (const Precision precision : {Precision::kFp32, Precision::kBf16}) {
      for (const std::size_t bucket : {std::size_t{1} << 30, std::size_t{777}}) {
        SCOPED_TRACE("stage " + std::to_string(zero_stage) + ", " + precision_name(precision) + ", buckets of " +
                     std::to_string(bucket));
        TrainingRun blocking{.zero_stage = zero_stage,
                             .bucket_elements = bucket,
                             .precision = precision,
                             .micro_batches = 3,
                             .n_layer = 3};
        TrainingRun overlapped = blocking;
        overlapped.overlap = true;
        expect_bitwise_equal(train(overlapped).params, train(blocking).params, "overlapped against blocking");
      }
    }
  }
}

// What the overlap costs, measured on the counting device: a second layer window of
// gradient and, per window, the piece of a layer that its reduction lands in (this
// rank's part of the layer, at most a layer or a shard).
TEST(OverlappedReductionTest, HoldsASecondLayerWindowAndTwoReducedPieces) {
  GPT shape(dufu::testing::small_gpt_config(
      {.n_layer = 6, .n_head = 2, .d_model = 32, .vocab_size = 97, .vocab_multiple = 8, .seq_length = 8}));
  const std::size_t layer = shape.layer_range(0).second;
  const std::size_t shard = (shape.num_parameters() + world().size() - 1) / world().size();
  for (const int zero_stage : {2, 3}) {
    const TrainingRun blocking{.zero_stage = zero_stage, .bucket_elements = 4096, .n_layer = 6};
    TrainingRun overlapped = blocking;
    overlapped.overlap = true;
    const std::size_t without = train(blocking).peak_device_bytes;
    const std::size_t with = train(overlapped).peak_device_bytes;
    EXPECT_EQ(with - without, (layer + 2 * std::min(layer, shard)) * sizeof(float)) << "stage " << zero_stage;
  }
}

// Sharded, the parameters are read through the gather: download_parameters and
// gather_full_parameters give the whole piece, params() refuses in words, and a piece
// uploaded comes back as it went.
TEST(ZeroStage3Test, ReadsAndWritesTheWholePieceThroughTheShards) {
  const GPTConfig config = dufu::testing::small_gpt_config(
      {.n_layer = 3, .n_head = 2, .d_model = 32, .vocab_size = 97, .vocab_multiple = 8, .seq_length = 8});
  GPT whole(config);
  whole.init_gpt2(9);
  const std::vector<float> expected(whole.params().begin(), whole.params().end());
  GPT model(config);
  model.init_gpt2(9);
  DataParallelOptimizer optimizer(model, AdamWOptions{}, world(), 3, nullptr, nullptr, 777);
  ASSERT_FALSE(model.parameters_whole());
  expect_bitwise_equal(model.download_parameters(), expected, "downloaded");
  expect_bitwise_equal(model.gather_full_parameters(), expected, "gathered full");
  EXPECT_THROW((void)model.params(), Error);
  std::vector<float> changed = expected;
  for (float& value : changed) value *= 0.5f;
  model.upload_parameters(changed);
  expect_bitwise_equal(model.download_parameters(), changed, "uploaded, then downloaded");
}

}  // namespace
}  // namespace dufu::trainer
