// `train plan`: the table of each pipeline stage's memory against rank_memory_plan
// computed here for the same layout (stages, slots and data-parallel size worked out
// by hand), under ZeRO-1 with recompute none and full and under ZeRO-2, and the exit
// status under a cap that is too small; under ZeRO-3 the lines that say what is held
// whole. The layout (8 ranks) is larger than this machine: plan starts no ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "dufu/common/human_units.h"
#include "dufu/trainer/device/device.h"
#include "dufu/trainer/run/training_memory.h"
#include "support/tool_runner.h"

namespace {

using dufu::human_bytes;
using dufu::testing::CommandResult;
using dufu::testing::run_command;
using dufu::testing::shell_quote;
using dufu::testing::TempDir;
using dufu::testing::train_tool;
using dufu::testing::write_all;
namespace trainer = dufu::trainer;

// 3 layers over 2 stages (2 + 1), tensor parallel 2, 8 ranks: data parallel 2.
constexpr const char* kConfig =
    "[model]\nn_layer = 3\nn_head = 2\nd_model = 64\nvocab_size = 2000\nseq_length = 32\n"
    "[train]\nmicro_batch = 4\nglobal_batch = 16\n"
    "[dist]\ntensor_parallel_size = 2\npipeline_parallel_size = 2\nzero_stage = 1\n";

// kConfig's model.
trainer::GPTConfig config_model() {
  trainer::GPTConfig model;
  model.n_layer = 3;
  model.n_head = 2;
  model.d_model = 64;
  model.vocab_size = 2000;
  model.seq_length = 32;
  return model;
}

class TrainPlanTest : public ::testing::Test {
 protected:
  CommandResult plan(const std::string& overrides) {
    const std::string config = dir_.file("plan.toml");
    write_all(config, kConfig);
    return run_command(shell_quote(train_tool()) + " plan " + shell_quote(config) + " --ranks 8 " + overrides);
  }

  // The table's line of `stage` (it starts with the stage number).
  static std::string row(const std::string& output, int stage) {
    std::istringstream lines(output);
    std::string line;
    while (std::getline(lines, line)) {
      if (line.starts_with(std::to_string(stage) + " ")) return line;
    }
    return "";
  }

  // Whether `row` holds every one of `cells`, in order.
  static ::testing::AssertionResult has_in_order(const std::string& row, const std::vector<std::string>& cells) {
    std::size_t at = 0;
    for (const std::string& cell : cells) {
      at = row.find(cell, at);
      if (at == std::string::npos) return ::testing::AssertionFailure() << "'" << cell << "' missing in: " << row;
      at += cell.size();
    }
    return ::testing::AssertionSuccess();
  }

  TempDir dir_;
};

TEST_F(TrainPlanTest, RowsAreTheRankMemoryPlanOfEachStage) {
  const trainer::GPTConfig model = config_model();
  const std::vector<int> split = {2, 1};
  double stage0_activations[2] = {0.0, 0.0};
  double gradients[4][2] = {};  // by ZeRO stage and pipeline stage
  double weights[4][2] = {};
  struct Case {
    int zero_stage;
    trainer::Recompute recompute;
    bool overlap;  // dist.overlap_reduction (stages 2 and 3)
  };
  double overlapped_gradients = 0.0;  // ZeRO-2's on the first stage
  for (const auto [zero_stage, recompute, overlap] :
       {Case{1, trainer::Recompute::kNone, false}, Case{1, trainer::Recompute::kFull, false},
        Case{2, trainer::Recompute::kNone, false}, Case{3, trainer::Recompute::kNone, false},
        Case{2, trainer::Recompute::kNone, true}}) {
    SCOPED_TRACE("ZeRO " + std::to_string(zero_stage) + (overlap ? ", overlapped" : ""));
    const CommandResult result = plan(std::string("train.memory_limit=100GB train.recompute=") +
                                      trainer::recompute_name(recompute) + " dist.zero_stage=" +
                                      std::to_string(zero_stage) + " train.dp_bucket_mb=0.01" +
                                      (overlap ? " dist.overlap_reduction=true" : ""));
    ASSERT_EQ(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("8 ranks (dp 2 x tp 2 x pp 2)"), std::string::npos) << result.output;
    for (int stage = 0; stage < 2; ++stage) {
      const int slots = 2 - stage;  // 1F1B: the first stage holds both micro-batches in flight
      const trainer::MemoryPlan expected =
          trainer::rank_memory_plan(model, 4, 32, 2, 2, trainer::pipeline_stage(split, stage), slots, 4,
                                    trainer::Precision::kFp32, zero_stage, trainer::cpu_device(), recompute,
                                    static_cast<double>(trainer::bucket_elements_for(0.01)), overlap);
      EXPECT_TRUE(has_in_order(row(result.output, stage),
                               {std::to_string(split[static_cast<std::size_t>(stage)]), human_bytes(expected.weights),
                                human_bytes(expected.gradients), human_bytes(expected.moments),
                                human_bytes(expected.activations), human_bytes(expected.total()), "fits"}));
      if (stage == 0 && zero_stage == 1) {
        stage0_activations[recompute == trainer::Recompute::kFull] = expected.activations;
      }
      if (overlap && zero_stage == 2) {
        if (stage == 0) overlapped_gradients = expected.gradients;
        continue;
      }
      gradients[zero_stage][stage] = expected.gradients;
      weights[zero_stage][stage] = expected.weights;
    }
  }
  EXPECT_LT(stage0_activations[1], stage0_activations[0]);  // the two runs planned different things
  // ZeRO-2 keeps one layer's gradient of the first stage's two (and adds a bucket of
  // 0.01 MB that each reduction lands in): less on the first stage; the second has
  // one layer only.
  EXPECT_LT(gradients[2][0], gradients[1][0]);
  // ZeRO-3 keeps ZeRO-2's gradients, and a shard of the weights beside the edges and
  // two layer windows: a stage of two layers holds both in its windows, so the shard
  // only adds (the saving needs more layers: training_test's GPT-2 XL plan).
  EXPECT_EQ(gradients[3][0], gradients[2][0]);
  EXPECT_GT(weights[3][0], weights[2][0]);
  // Overlapping the reduction holds a second layer window and two reduced pieces.
  EXPECT_GT(overlapped_gradients, gradients[2][0]);
}

TEST_F(TrainPlanTest, AStageOverTheCapFailsNamingNeedAndCap) {
  const CommandResult result = plan("train.memory_limit=1MiB");
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_NE(row(result.output, 0).find("does not fit (needs "), std::string::npos) << result.output;
  EXPECT_NE(row(result.output, 0).find("cap " + human_bytes(1024.0 * 1024.0) + ")"), std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("train: error: the memory plan of pipeline stages 0, 1 does not fit"),
            std::string::npos)
      << result.output;

  const CommandResult bad = plan("train.memory_limit=lots");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.output.find("train.memory_limit: 'lots' is not a size"), std::string::npos) << bad.output;
}

TEST_F(TrainPlanTest, CudaWithoutADeviceLeavesOutOnlyTheScratch) {
  const trainer::DeviceAvailability cuda = trainer::device_availability(trainer::DeviceKind::kCuda);
  if (cuda.available) GTEST_SKIP() << "a CUDA device is here: its scratch is known";
  const CommandResult result = plan("train.device=cuda train.memory_limit=100GB");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("device scratch unknown: train.device cuda cannot be opened here (" + cuda.reason),
            std::string::npos)
      << result.output;
  for (int stage = 0; stage < 2; ++stage) {
    EXPECT_TRUE(has_in_order(row(result.output, stage), {"unknown", "fits without the scratch"})) << result.output;
  }
}

// ZeRO-3 says what keeps each stage's model state above 1/dp of stage 0's: the shards,
// then each part held whole, worked out here from the stage's layer and edge counts:
// the edges' weights and gradients, two layers of weights and one of gradients (the
// windows), the piece a bucket's reduction lands in; under bf16 the weights' parts
// with their working copy (6 bytes a parameter).
TEST_F(TrainPlanTest, ZeroThreeSaysWhatEachStageHoldsWhole) {
  const trainer::GPTConfig model = config_model();
  const std::vector<int> split = {2, 1};
  const double bucket = static_cast<double>(trainer::bucket_elements_for(0.01));
  for (const trainer::Precision precision : {trainer::Precision::kFp32, trainer::Precision::kBf16}) {
    SCOPED_TRACE(trainer::precision_name(precision));
    const bool bf16 = precision == trainer::Precision::kBf16;
    const CommandResult result = plan(std::string("train.memory_limit=100GB dist.zero_stage=3 "
                                                  "train.dp_bucket_mb=0.01 train.precision=") +
                                      trainer::precision_name(precision));
    ASSERT_EQ(result.exit_code, 0) << result.output;
    for (int stage = 0; stage < 2; ++stage) {
      SCOPED_TRACE("stage " + std::to_string(stage));
      const trainer::PipelineStage pipeline_stage = trainer::pipeline_stage(split, stage);
      const auto counts = trainer::rank_parameters(model, 2, pipeline_stage);
      const double parameters = counts.layers * counts.layer + counts.edges;
      const double shard = std::ceil(parameters / 2);
      const double weight_bytes = bf16 ? 6.0 : 4.0;
      const double windows = std::min(counts.layers, 2.0);
      const double parts[5] = {weight_bytes * counts.edges, 4.0 * counts.edges, weight_bytes * windows * counts.layer,
                               4.0 * counts.layer, 4.0 * std::min(bucket, shard)};
      const double held = parts[0] + parts[1] + parts[2] + parts[3] + parts[4];
      const trainer::MemoryPlan expected =
          trainer::rank_memory_plan(model, 4, 32, 2, 2, pipeline_stage, 2 - stage, 4, precision, 3,
                                    trainer::cpu_device(), trainer::Recompute::kNone, bucket);
      // The shards: a weight and a gradient shard, the moments 1/2 of the parameters'.
      EXPECT_NEAR(expected.model() - held, 4.0 * 2.0 * shard + 4.0 * parameters, 1e-6 * expected.model());
      const double stage0 = 4.0 * 4.0 * parameters + (bf16 ? 2.0 * parameters : 0.0);
      const std::string lines = result.output.substr(result.output.find(row(result.output, stage)));
      EXPECT_TRUE(has_in_order(lines, {"model state " + human_bytes(expected.model()),
                                       "shards " + human_bytes(expected.model() - held),
                                       "stage 0 holds " + human_bytes(stage0), "1/2 of it " + human_bytes(stage0 / 2),
                                       "held whole " + human_bytes(held), "held whole: edges",
                                       human_bytes(parts[0]) + " of weights and " + human_bytes(parts[1]),
                                       "layer windows " + human_bytes(parts[2]) + " of weights and " +
                                           human_bytes(parts[3]) + " of gradients",
                                       "reduced piece " + human_bytes(parts[4])}));
    }
  }
  // Only ZeRO-3 shards the weights: stage 2's plan has no such lines.
  const CommandResult stage2 = plan("train.memory_limit=100GB dist.zero_stage=2");
  ASSERT_EQ(stage2.exit_code, 0) << stage2.output;
  EXPECT_EQ(stage2.output.find("held whole"), std::string::npos) << stage2.output;
}

// `--search`: every layout of the 8 ranks that training accepts for this model and
// batch, each with its largest stage's total as rank_memory_plan gives it here, in the
// documented order, and the first under the cap named as the cheapest.
TEST_F(TrainPlanTest, SearchListsEveryLayoutWithItsLargestStageCheapestFirst) {
  const trainer::GPTConfig model = config_model();
  // 2 heads: tp 1 or 2; 3 layers: pp up to 3; global batch 16 of micro-batches of 4:
  // at most 4 replicas. Of 8 ranks that leaves tp 1 x pp 2 x dp 4, tp 2 x pp 1 x dp 4
  // and tp 2 x pp 2 x dp 2.
  struct Layout {
    int tp, pp, dp, zero;
    trainer::Recompute recompute;
    double largest;
    auto cost() const { return std::tuple(static_cast<int>(recompute), tp * pp, zero, pp); }
  };
  std::vector<Layout> expected;
  for (const auto& [tp, pp, dp] : {std::tuple(1, 2, 4), std::tuple(2, 1, 4), std::tuple(2, 2, 2)}) {
    for (int zero = 0; zero <= 3; ++zero) {
      for (const trainer::Recompute recompute :
           {trainer::Recompute::kNone, trainer::Recompute::kSelective, trainer::Recompute::kFull}) {
        const std::vector<int> split = pp == 2 ? std::vector<int>{2, 1} : std::vector<int>{3};
        const double bucket = static_cast<double>(trainer::bucket_elements_for(25.0));
        double largest = 0.0;
        for (int stage = 0; stage < pp; ++stage) {
          const trainer::PipelineStage where = pp > 1 ? trainer::pipeline_stage(split, stage) : trainer::PipelineStage{};
          const trainer::MemoryPlan plan =
              trainer::rank_memory_plan(model, 4, 32, tp, dp, where, pp - stage, 4, trainer::Precision::kFp32, zero,
                                        trainer::cpu_device(), recompute, bucket, false);
          largest = std::max(largest, plan.total());
        }
        expected.push_back({tp, pp, dp, zero, recompute, largest});
      }
    }
  }
  std::stable_sort(expected.begin(), expected.end(),
                   [](const Layout& a, const Layout& b) { return a.cost() < b.cost(); });
  // A cap between the smallest and the largest: some fit, some do not.
  double smallest = expected.front().largest, biggest = 0.0;
  for (const Layout& layout : expected) {
    smallest = std::min(smallest, layout.largest);
    biggest = std::max(biggest, layout.largest);
  }
  const double cap = (smallest + biggest) / 2;
  const CommandResult result = plan("--search train.memory_limit=" + std::to_string(static_cast<long long>(cap)) + "B");
  ASSERT_EQ(result.exit_code, 0) << result.output;

  std::istringstream lines(result.output);
  std::string line;
  std::size_t listed = 0;
  const Layout* cheapest = nullptr;
  while (std::getline(lines, line)) {
    int tp = 0, pp = 0, dp = 0, zero = 0;
    char recompute[16] = {};
    if (std::sscanf(line.c_str(), "%d %d %d %d %15s", &tp, &pp, &dp, &zero, recompute) != 5) continue;
    ASSERT_LT(listed, expected.size()) << result.output;
    const Layout& want = expected[listed++];
    EXPECT_EQ(std::tuple(tp, pp, dp, zero, std::string(recompute)),
              std::tuple(want.tp, want.pp, want.dp, want.zero, std::string(trainer::recompute_name(want.recompute))))
        << line;
    const bool fits = want.largest <= static_cast<double>(static_cast<long long>(cap));
    EXPECT_TRUE(has_in_order(line, {human_bytes(want.largest), fits ? "fits" : "does not fit"}));
    if (fits && cheapest == nullptr) cheapest = &want;
  }
  EXPECT_EQ(listed, expected.size()) << result.output;
  ASSERT_NE(cheapest, nullptr);
  EXPECT_NE(result.output.find(std::string("cheapest that fits: dist.tensor_parallel_size=") +
                               std::to_string(cheapest->tp) + " dist.pipeline_parallel_size=" +
                               std::to_string(cheapest->pp) + " dist.zero_stage=" + std::to_string(cheapest->zero) +
                               " train.recompute=" + trainer::recompute_name(cheapest->recompute)),
            std::string::npos)
      << result.output;

  const CommandResult none = plan("--search train.memory_limit=1KiB");
  EXPECT_NE(none.exit_code, 0) << none.output;
  EXPECT_NE(none.output.find("no layout of 8 ranks fits"), std::string::npos) << none.output;
}

TEST_F(TrainPlanTest, RanksBelowOneIsOneShortLine) {
  const std::string config = dir_.file("plan.toml");
  write_all(config, kConfig);
  for (const std::string ranks : {"0", "-3", "1e99", "four"}) {
    const CommandResult result =
        run_command(shell_quote(train_tool()) + " plan " + shell_quote(config) + " --ranks " + ranks);
    EXPECT_EQ(result.exit_code, 1) << ranks << ": " << result.output;
    EXPECT_EQ(result.output.rfind("train: error: --ranks: ", 0), 0u) << ranks << ": " << result.output;
    EXPECT_EQ(std::count(result.output.begin(), result.output.end(), '\n'), 1) << ranks << ": " << result.output;
    EXPECT_LT(result.output.size(), 160u) << ranks << ": " << result.output;
  }
}

}  // namespace
