// The per-element math of the deterministic reductions (collective_fold.h), which the
// NCCL backend's fold kernel runs on the GPU, against a naive loop written here; the
// chunking of the NCCL all-reduce and the data-parallel bucket plan against
// hand-computed cases. (data_parallel_buckets_test holds the fold against the MPI
// backend's results.)
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "device/collective_fold.h"
#include "dufu/trainer/parallel/data_parallel_optimizer.h"

namespace dufu::trainer {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// ranks blocks of n floats with magnitudes from 1e-8 to 1e8, so that the order of the
// additions shows in the bits.
std::vector<float> mixed_blocks(int ranks, std::size_t n, std::uint32_t seed) {
  std::mt19937 engine(seed);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-8, 8);
  std::vector<float> blocks(static_cast<std::size_t>(ranks) * n);
  for (float& x : blocks) x = mantissa(engine) * std::pow(10.0f, static_cast<float>(exponent(engine)));
  return blocks;
}

TEST(CollectiveFoldTest, SumIsTheLeftFoldInRankOrder) {
  for (const int ranks : {1, 2, 3, 5}) {
    const std::size_t n = 257;
    const std::vector<float> blocks = mixed_blocks(ranks, n, 17u + static_cast<std::uint32_t>(ranks));
    bool some_order_matters = false;
    for (std::size_t i = 0; i < n; ++i) {
      float naive = blocks[i];
      for (int r = 1; r < ranks; ++r) naive = naive + blocks[static_cast<std::size_t>(r) * n + i];
      const float folded = fold_element(blocks.data(), n, ranks, i, /*is_max=*/false);
      ASSERT_EQ(std::bit_cast<std::uint32_t>(folded), std::bit_cast<std::uint32_t>(naive))
          << ranks << " ranks, element " << i;
      float reversed = blocks[static_cast<std::size_t>(ranks - 1) * n + i];
      for (int r = ranks - 2; r >= 0; --r) reversed = reversed + blocks[static_cast<std::size_t>(r) * n + i];
      some_order_matters |= reversed != naive;
    }
    // The data would tell a fold in another order apart.
    if (ranks >= 3) {
      EXPECT_TRUE(some_order_matters) << ranks << " ranks";
    }
  }
}

TEST(CollectiveFoldTest, MaxPropagatesNaNWhereverItIs) {
  // Three ranks' blocks of 6 elements; NaN on rank 0, 1, 2, on two ranks, nowhere.
  const std::vector<float> blocks = {kNaN, 1.0f, 2.0f, kNaN, -3.0f, 0.5f,   //
                                     5.0f, kNaN, 7.0f, 1.0f, -2.0f, 0.25f,  //
                                     6.0f, 2.0f, kNaN, kNaN, -1.0f, 0.75f};
  const float expected[] = {kNaN, kNaN, kNaN, kNaN, -1.0f, 0.75f};
  for (std::size_t i = 0; i < 6; ++i) {
    const float folded = fold_element(blocks.data(), 6, 3, i, /*is_max=*/true);
    if (std::isnan(expected[i])) {
      EXPECT_TRUE(std::isnan(folded)) << "element " << i;
    } else {
      EXPECT_EQ(folded, expected[i]) << "element " << i;
    }
  }
  EXPECT_EQ(fold_max(-0.0f, 0.0f), 0.0f);
  EXPECT_EQ(fold_max(1.0, -std::numeric_limits<double>::infinity()), 1.0);
}

TEST(CollectiveFoldTest, IntegerSumsWrapAroundAndMaximaCompare) {
  const std::int32_t big = std::numeric_limits<std::int32_t>::max();
  EXPECT_EQ(fold_sum<std::int32_t>(big, 1), std::numeric_limits<std::int32_t>::min());
  EXPECT_EQ(fold_sum<std::int64_t>(-5, 3), -2);
  EXPECT_EQ(fold_sum<std::uint8_t>(250, 10), 4);
  const std::vector<std::int32_t> blocks = {3, -7, big, 9, 1, 1};  // 2 ranks x 3
  EXPECT_EQ(fold_element(blocks.data(), 3, 2, 0, true), 9);
  EXPECT_EQ(fold_element(blocks.data(), 3, 2, 1, true), 1);
  EXPECT_EQ(fold_element(blocks.data(), 3, 2, 2, false),
            static_cast<std::int32_t>(std::int64_t{big} + 1 - (std::int64_t{1} << 32)));
}

TEST(CollectiveFoldTest, ChunksCutTheBufferIntoCeilPiecesTheLastShorterOrEmpty) {
  // 10 elements over 4 ranks: stride 3, chunks [0,3) [3,6) [6,9) [9,10).
  EXPECT_EQ(fold_chunk_stride(10, 4), 3u);
  const std::pair<std::size_t, std::size_t> expected[] = {{0, 3}, {3, 3}, {6, 3}, {9, 1}};
  for (int r = 0; r < 4; ++r) {
    const FoldChunk chunk = fold_chunk(10, 4, r);
    EXPECT_EQ(chunk.begin, expected[r].first) << "rank " << r;
    EXPECT_EQ(chunk.count, expected[r].second) << "rank " << r;
  }
  // 2 elements over 3 ranks: the last rank's chunk is empty.
  EXPECT_EQ(fold_chunk(2, 3, 1).begin, 1u);
  EXPECT_EQ(fold_chunk(2, 3, 2).count, 0u);
  EXPECT_EQ(fold_chunk(0, 2, 0).count, 0u);
  EXPECT_EQ(fold_chunk(6, 3, 2).count, 2u);
}

TEST(GradientBucketsTest, CutsTheGradientIntoBucketsTheLastShorter) {
  using Buckets = std::vector<std::pair<std::size_t, std::size_t>>;
  EXPECT_EQ(gradient_buckets(10, 4), (Buckets{{0, 4}, {4, 8}, {8, 10}}));
  EXPECT_EQ(gradient_buckets(8, 4), (Buckets{{0, 4}, {4, 8}}));
  EXPECT_EQ(gradient_buckets(3, 100), (Buckets{{0, 3}}));
  EXPECT_EQ(gradient_buckets(3, 1), (Buckets{{0, 1}, {1, 2}, {2, 3}}));
  EXPECT_TRUE(gradient_buckets(0, 5).empty());
}

TEST(GradientBucketsTest, MegabytesBecomeFloats) {
  EXPECT_EQ(bucket_elements_for(25.0), 25u * 1024 * 1024 / 4);  // 6553600
  EXPECT_EQ(bucket_elements_for(1.0 / 1024), 256u);             // 1 KiB
  EXPECT_EQ(bucket_elements_for(1e-9), 1u);                     // at least one float
}

}  // namespace
}  // namespace dufu::trainer
