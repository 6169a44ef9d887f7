// Tests for Topology: every world size 1..64 and every (tp, pp) whose product divides
// it, against groups built the way Megatron's initialize_model_parallel builds them
// (plain loops over rank ranges, no coordinates), plus the 16-rank example of
// docs/rank-layout.md and the validation messages.
#include "dufu/common/topology.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/expect_error.h"

namespace dufu {
namespace {

using dufu::testing::expect_error;

struct Oracle {
  std::vector<RankCoordinates> coordinates;  // by rank
  std::vector<std::vector<int>> tensor_groups, data_groups, pipeline_groups, embedding_groups;
};

std::vector<int> range(int begin, int end, int step) {
  std::vector<int> ranks;
  for (int r = begin; r < end; r += step) ranks.push_back(r);
  return ranks;
}

Oracle oracle(int world, int tp, int pp) {
  Oracle o;
  const int dp = world / (tp * pp);
  // Tensor parallel innermost, pipeline outermost.
  for (int p = 0; p < pp; ++p) {
    for (int d = 0; d < dp; ++d) {
      for (int t = 0; t < tp; ++t) o.coordinates.push_back(RankCoordinates{t, d, p});
    }
  }
  const int stage = world / pp;  // ranks per pipeline stage
  for (int i = 0; i < world / tp; ++i) o.tensor_groups.push_back(range(i * tp, (i + 1) * tp, 1));
  for (int p = 0; p < pp; ++p) {
    for (int t = 0; t < tp; ++t) o.data_groups.push_back(range(p * stage + t, (p + 1) * stage, tp));
  }
  for (int i = 0; i < stage; ++i) {
    const std::vector<int> ranks = range(i, world, stage);
    o.pipeline_groups.push_back(ranks);
    o.embedding_groups.push_back(ranks.size() > 1 ? std::vector<int>{ranks.front(), ranks.back()} : ranks);
  }
  return o;
}

// The group of `groups` that holds rank, or {} when none does.
std::vector<int> containing(const std::vector<std::vector<int>>& groups, int rank) {
  std::vector<int> found;
  for (const auto& group : groups) {
    if (std::find(group.begin(), group.end(), rank) != group.end()) {
      EXPECT_TRUE(found.empty()) << "rank " << rank << " is in two groups";
      found = group;
    }
  }
  return found;
}

TEST(Topology, MatchesNestedLoopsForEveryLayoutUpTo64Ranks) {
  int layouts = 0;
  for (int world = 1; world <= 64; ++world) {
    for (int tp = 1; tp <= world; ++tp) {
      for (int pp = 1; pp <= world; ++pp) {
        if (world % (tp * pp) != 0) continue;
        ++layouts;
        const Oracle o = oracle(world, tp, pp);
        for (int rank = 0; rank < world; ++rank) {
          SCOPED_TRACE(::testing::Message() << "world " << world << " tp " << tp << " pp " << pp << " rank " << rank);
          const Topology t(world, tp, pp, rank);
          ASSERT_EQ(t.data_parallel_size(), world / (tp * pp));
          ASSERT_EQ(t.coordinates(), o.coordinates[static_cast<std::size_t>(rank)]);
          ASSERT_EQ(t.coordinates_of(rank), t.coordinates());
          ASSERT_EQ(t.rank_of(t.coordinates()), rank);
          ASSERT_EQ(t.tensor_group(), containing(o.tensor_groups, rank));
          ASSERT_EQ(t.data_group(), containing(o.data_groups, rank));
          ASSERT_EQ(t.pipeline_group(), containing(o.pipeline_groups, rank));
          ASSERT_EQ(t.embedding_group(), containing(o.embedding_groups, rank));
          const std::vector<int> pipeline = t.pipeline_group();
          const auto position = std::find(pipeline.begin(), pipeline.end(), rank) - pipeline.begin();
          ASSERT_EQ(t.is_first_stage(), position == 0);
          ASSERT_EQ(t.is_last_stage(), position == static_cast<long>(pipeline.size()) - 1);
          ASSERT_EQ(t.previous_stage_rank().value_or(-1), position == 0 ? -1 : pipeline[position - 1]);
          ASSERT_EQ(t.next_stage_rank().value_or(-1),
                    position + 1 == static_cast<long>(pipeline.size()) ? -1 : pipeline[position + 1]);
        }
      }
    }
  }
  EXPECT_EQ(layouts, 796);  // sum over W <= 64 of the number of ordered (tp, pp) with tp*pp | W
}

TEST(Topology, Formats7Example) {
  // 16 ranks, tp=2, pp=4: tensor groups [0,1], [2,3], ...; data groups [0,2], [1,3],
  // [4,6], ...; pipeline groups [0,4,8,12], ...
  EXPECT_EQ(Topology(16, 2, 4, 0).tensor_group(), (std::vector<int>{0, 1}));
  EXPECT_EQ(Topology(16, 2, 4, 3).tensor_group(), (std::vector<int>{2, 3}));
  EXPECT_EQ(Topology(16, 2, 4, 0).data_group(), (std::vector<int>{0, 2}));
  EXPECT_EQ(Topology(16, 2, 4, 1).data_group(), (std::vector<int>{1, 3}));
  EXPECT_EQ(Topology(16, 2, 4, 6).data_group(), (std::vector<int>{4, 6}));
  EXPECT_EQ(Topology(16, 2, 4, 8).pipeline_group(), (std::vector<int>{0, 4, 8, 12}));
  EXPECT_EQ(Topology(16, 2, 4, 12).embedding_group(), (std::vector<int>{0, 12}));
  EXPECT_TRUE(Topology(16, 2, 4, 4).embedding_group().empty());

  const Topology t(16, 2, 4, 5);
  EXPECT_EQ(t.coordinates(), (RankCoordinates{1, 0, 1}));
  EXPECT_EQ(t.previous_stage_rank(), 1);
  EXPECT_EQ(t.next_stage_rank(), 9);
  EXPECT_FALSE(t.is_first_stage());
  EXPECT_FALSE(t.is_last_stage());
  EXPECT_EQ(t.describe(),
            "world 16 = tp 2 x dp 2 x pp 4; rank 5 is tp 1, dp 0, pp 1; tensor group [4,5], data group [5,7], "
            "pipeline group [1,5,9,13], embedding group none");
  EXPECT_EQ(Topology(16, 2, 4, 13).describe(),
            "world 16 = tp 2 x dp 2 x pp 4; rank 13 is tp 1, dp 0, pp 3; tensor group [12,13], data group [13,15], "
            "pipeline group [1,5,9,13], embedding group [1,13]");
}

TEST(Topology, SingleRank) {
  const Topology t(1, 1, 1, 0);
  EXPECT_EQ(t.tensor_group(), std::vector<int>{0});
  EXPECT_EQ(t.embedding_group(), std::vector<int>{0});
  EXPECT_TRUE(t.is_first_stage());
  EXPECT_TRUE(t.is_last_stage());
  EXPECT_FALSE(t.previous_stage_rank().has_value());
  EXPECT_FALSE(t.next_stage_rank().has_value());
}

TEST(Topology, RefusesInvalidLayouts) {
  expect_error([] { Topology(6, 4, 1, 0); },
               {"world size 6 is not divisible by tensor_parallel_size (4) x pipeline_parallel_size (1)",
                "multiple of 4"});
  expect_error([] { Topology(8, 2, 3, 0); },
               {"world size 8 is not divisible by tensor_parallel_size (2) x pipeline_parallel_size (3)"});
  expect_error([] { Topology(4, 8, 1, 0); }, {"world size 4 is not divisible by tensor_parallel_size (8)"});
  expect_error([] { Topology(0, 1, 1, 0); }, {"world size must be at least 1, got 0"});
  expect_error([] { Topology(4, 0, 1, 0); }, {"tensor_parallel_size must be at least 1, got 0"});
  expect_error([] { Topology(4, 1, -2, 0); }, {"pipeline_parallel_size must be at least 1, got -2"});
  expect_error([] { Topology(4, 2, 2, 4); }, {"rank 4 is outside world size 4"});
  expect_error([] { Topology(4, 2, 2, -1); }, {"rank -1 is outside world size 4"});
  // tp x pp overflowing int is still a clean refusal.
  expect_error([] { Topology(64, 1 << 20, 1 << 20, 0); }, {"is not divisible"});
}

TEST(Topology, RankOfChecksCoordinates) {
  const Topology t(8, 2, 2, 0);
  EXPECT_EQ(t.rank_of(RankCoordinates{1, 1, 1}), 7);
  expect_error([&] { t.rank_of(RankCoordinates{2, 0, 0}); }, {"coordinates (tp 2, dp 0, pp 0) are outside"});
  expect_error([&] { t.coordinates_of(8); }, {"rank 8 is outside world size 8"});
}

TEST(Topology, GroupNames) {
  EXPECT_STREQ(parallel_group_name(ParallelGroup::kTensor), "tensor");
  EXPECT_STREQ(parallel_group_name(ParallelGroup::kData), "data");
  EXPECT_STREQ(parallel_group_name(ParallelGroup::kPipeline), "pipeline");
  EXPECT_STREQ(parallel_group_name(ParallelGroup::kEmbedding), "embedding");
}

}  // namespace
}  // namespace dufu
