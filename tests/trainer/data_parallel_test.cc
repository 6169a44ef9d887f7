// Data-, tensor- and pipeline-parallel training under mpirun against the single-process
// run: the same config, seed and data give the same per-step losses (within 1e-5
// relative: the gradients are summed in another order) and, merged with `train
// merge-checkpoint`, the same final weights; checkpoints hold one model file per
// (tp, pp) piece and optimizer files per ZeRO shard; a run that stops and resumes in
// the same layout continues bitwise, and in another layout with the same losses; a
// rank that raises or is killed takes the job down with it instead of leaving the
// others waiting.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <utility>
#include <string>
#include <vector>

#include "dufu/trainer/checkpoint/safetensors.h"
#include "dufu/trainer/model/gpt.h"
#include "support/float_compare.h"
#include "support/fortunes_shard.h"
#include "support/run_dir.h"
#include "support/temp_dir.h"
#include "support/tool_runner.h"

namespace {

using dufu::testing::checkpoint_dir;
using dufu::testing::CommandResult;
using dufu::testing::metric_fields;
using dufu::testing::metric_values;
using dufu::testing::read_all;
using dufu::testing::run_command;
using dufu::testing::shell_quote;
using dufu::testing::TempDir;
using dufu::testing::train_tool;
using dufu::testing::write_all;

class DataParallelTest : public ::testing::Test {
 protected:

  std::string config() {
    const std::string path = dir_.file("config.toml");
    write_all(path, dufu::testing::fortunes_layout_config_toml());
    return shell_quote(path);
  }

  static CommandResult mpirun(int ranks, const std::string& arguments) {
    return run_command(std::string("timeout -k 5 300 ") + DUFU_MPIRUN + " -np " + std::to_string(ranks) + " " +
                       shell_quote(train_tool()) + " " + arguments);
  }

  // model.safetensors of the run's checkpoint of `step`, merged by `train
  // merge-checkpoint` from the pieces when the checkpoint is sharded.
  static std::string weights(const std::string& run_dir, int step = 6) {
    const std::string source = checkpoint_dir(run_dir, step);
    if (std::filesystem::exists(source + "/model.safetensors")) return source + "/model.safetensors";
    const std::string merged = run_dir + "/merged-" + std::to_string(step);
    const CommandResult merge =
        run_command(shell_quote(train_tool()) + " merge-checkpoint " + shell_quote(source) + " " + shell_quote(merged));
    EXPECT_EQ(merge.exit_code, 0) << merge.output;
    EXPECT_NE(merge.output.find("merged into " + merged), std::string::npos) << merge.output;
    return merged + "/model.safetensors";
  }

  // The .safetensors files of a checkpoint, by kind: "model" or "optimizer".
  static std::vector<std::string> files(const std::string& checkpoint, const std::string& kind) {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(checkpoint)) {
      const std::string name = entry.path().filename().string();
      if (name.starts_with(kind) && name.ends_with(".safetensors")) names.push_back(name);
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  // Largest absolute difference between two model.safetensors files' weights.
  static double largest_difference(const std::string& actual_path, const std::string& expected_path) {
    const auto expected = dufu::trainer::safetensors::File::open(expected_path);
    const auto actual = dufu::trainer::safetensors::File::open(actual_path);
    EXPECT_EQ(actual.tensors().size(), expected.tensors().size());
    double worst = 0.0;
    for (const auto& tensor : expected.tensors()) {
      SCOPED_TRACE(tensor.name);
      worst = std::max(worst, dufu::testing::largest_difference(actual.view<float>(tensor.name),
                                                                 expected.view<float>(tensor.name)));
    }
    return worst;
  }

  TempDir dir_;
};

TEST_F(DataParallelTest, MatchesTheSingleProcessRun) {
  const std::string single = dir_.file("single");
  const CommandResult reference = run_command(shell_quote(train_tool()) + " " + config() + " run.dir=" + single);
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  const auto expected_losses = metric_values(single, "loss");
  const auto expected_val = metric_values(single, "val_loss");
  ASSERT_EQ(expected_losses.size(), 6u);
  ASSERT_EQ(expected_val.size(), 2u);
  const std::string expected = weights(single);

  // Every layout (dp, tp, pp) of the issue, plus ZeRO-1 and dp 4 and a 1-3 split.
  struct Layout {
    int dp;
    int tp;
    int pp;
    int zero_stage;
    const char* extra;
  };
  for (const Layout& layout :
       {Layout{2, 1, 1, 0, ""}, Layout{1, 2, 1, 0, ""}, Layout{1, 1, 2, 0, ""}, Layout{1, 1, 4, 0, ""},
        Layout{2, 2, 1, 0, ""}, Layout{2, 1, 2, 0, ""}, Layout{1, 2, 2, 0, ""}, Layout{2, 2, 2, 0, ""},
        Layout{4, 1, 1, 0, ""}, Layout{2, 1, 1, 1, ""}, Layout{4, 1, 1, 1, ""}, Layout{2, 2, 1, 1, ""},
        Layout{2, 1, 2, 1, ""}, Layout{2, 2, 2, 1, ""},
        Layout{1, 1, 2, 0, " dist.pipeline_num_layers=1,3"}, Layout{1, 1, 2, 0, " dist.pipeline_stage_ids=0,0,0,1"}}) {
    const auto [dp, tp, pp, zero_stage, extra] = layout;
    const int ranks = dp * tp * pp;
    const std::string name = "world " + std::to_string(ranks) + " = tp " + std::to_string(tp) + " x dp " +
                             std::to_string(dp) + " x pp " + std::to_string(pp);
    SCOPED_TRACE(name + ", ZeRO stage " + std::to_string(zero_stage) + extra);
    char run_name[64];
    std::snprintf(run_name, sizeof(run_name), "dp%d-tp%d-pp%d-zero%d-%zu", dp, tp, pp, zero_stage,
                  std::strlen(extra));
    const std::string dir = dir_.file(run_name);
    char layout_overrides[160];
    std::snprintf(layout_overrides, sizeof(layout_overrides),
                  " dist.zero_stage=%d dist.tensor_parallel_size=%d dist.pipeline_parallel_size=%d%s", zero_stage, tp,
                  pp, extra);
    const CommandResult result = mpirun(ranks, config() + " run.dir=" + dir + layout_overrides);
    ASSERT_EQ(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find(name), std::string::npos) << result.output;
    // One rank speaks: one line per step.
    std::size_t step_lines = 0;
    for (std::size_t at = result.output.find("step 6/6"); at != std::string::npos;
         at = result.output.find("step 6/6", at + 1)) {
      ++step_lines;
    }
    EXPECT_EQ(step_lines, 1u) << result.output;
    const auto losses = metric_values(dir, "loss");
    ASSERT_EQ(losses.size(), expected_losses.size());
    for (std::size_t i = 0; i < losses.size(); ++i) {
      EXPECT_RELATIVE_NEAR(losses[i], expected_losses[i], 1e-5) << "step " << i + 1;
    }
    // Communication per step and rank: the gradient all-reduce (or ZeRO-1's reduce-
    // scatter and all-gather of the padded shards) plus the 8-byte loss sum (and
    // ZeRO-1's 8-byte sum of squares), at the volume ring algorithms move.
    dufu::trainer::GPTConfig model;
    model.n_layer = 4;
    model.n_head = 2;
    model.d_model = 64;
    model.vocab_size = 2000;
    model.seq_length = 32;
    const double n = dp;
    const double parameters = static_cast<double>(dufu::trainer::GPT(model).num_parameters());
    const double shard = std::ceil(parameters / n);
    const double expected_bytes = zero_stage == 0 ? 2 * (n - 1) / n * (4 * parameters + 8)
                                                  : 2 * (n - 1) * 4 * shard + 2 * (2 * (n - 1) / n * 8);
    if (tp == 1 && pp == 1) {
      for (const double bytes : metric_values(dir, "comm_bytes")) EXPECT_EQ(bytes, std::floor(expected_bytes));
    }
    const auto val = metric_values(dir, "val_loss");
    ASSERT_EQ(val.size(), expected_val.size());
    for (std::size_t i = 0; i < val.size(); ++i) EXPECT_RELATIVE_NEAR(val[i], expected_val[i], 1e-5);

    // One weights file per (tp, pp) piece, the moments once per piece or per ZeRO shard.
    const std::string last = checkpoint_dir(dir, 6);
    EXPECT_EQ(files(last, "model").size(), static_cast<std::size_t>(tp * pp));
    EXPECT_EQ(files(last, "optimizer").size(), static_cast<std::size_t>(tp * pp * (zero_stage == 1 ? dp : 1)));
    const double worst = largest_difference(weights(dir), expected);
    // AdamW moves every weight by up to lr per step whatever the gradient's size, so
    // summation-order noise in a near-zero gradient can change a weight by a fraction
    // of lr (3e-3 here): the bound is absolute, a few percent of one step.
    EXPECT_LT(worst, 1e-4) << "largest weight difference after 6 steps";
    std::printf("%s, ZeRO %d: largest weight difference after 6 steps %.3g\n", name.c_str(), zero_stage, worst);
  }
}

TEST_F(DataParallelTest, BytesPerCollectiveKindAreTheZeroVolumes) {
  // The ZeRO paper's volumes for one rank of dp 2: stage 0 all-reduces the gradient
  // (a ring sends 2 (n - 1) / n of it); stages 1 and 2 reduce-scatter it (stage 2 a
  // layer at a time, each micro-batch: two here) and all-gather the updated weights,
  // (n - 1) / n each, the same total in two kinds; stage 3 gathers the weights as each
  // layer is used (below). The parameters are
  // counted by hand (comm_volume_analytic.py's formula): the vocabulary padded to 2048
  // rows, wpe, 4 blocks, ln_f.
  const double C = 64, T = 32, layers = 4, padded_vocab = 2048, n = 2;
  const double parameters = padded_vocab * C + T * C + layers * (12 * C * C + 13 * C) + 2 * C;
  const double gradient_ring = 2 * (n - 1) / n * 4 * parameters;
  // Stage 3 gathers each layer's weights into one of two windows (layer l in window
  // l % 2) before use: the forward layer after layer (the next one with it), the
  // backward back down; a layer still in its window is not gathered again, and the
  // windows are emptied by each update. The gathers of one step, two micro-batches:
  std::vector<int> gathered_layers;
  {
    int window[2] = {-1, -1};
    const auto use = [&](int layer) {
      if (window[layer % 2] != layer) gathered_layers.push_back(window[layer % 2] = layer);
    };
    for (int micro_batch = 0; micro_batch < 2; ++micro_batch) {
      use(0);
      for (int layer = 0; layer < layers; ++layer) {
        use(layer);
        if (layer + 1 < layers) use(layer + 1);
      }
      for (int layer = static_cast<int>(layers) - 1; layer >= 0; --layer) use(layer);
    }
  }
  for (const int zero_stage : {0, 1, 2, 3}) {
    SCOPED_TRACE("ZeRO stage " + std::to_string(zero_stage));
    const std::string dir = dir_.file("kinds-zero" + std::to_string(zero_stage));
    const CommandResult result = mpirun(2, config() + " run.dir=" + dir + " train.steps=2 eval.interval=0" +
                                               " dist.zero_stage=" + std::to_string(zero_stage));
    ASSERT_EQ(result.exit_code, 0) << result.output;
    const auto totals = metric_values(dir, "comm_bytes");
    const auto all_reduce = metric_values(dir, "comm_bytes_all_reduce");
    const auto reduce_scatter = metric_values(dir, "comm_bytes_reduce_scatter");
    const auto all_gather = metric_values(dir, "comm_bytes_all_gather");
    const auto broadcast = metric_values(dir, "comm_bytes_broadcast");
    const auto send_recv = metric_values(dir, "comm_bytes_send_recv");
    ASSERT_EQ(totals.size(), 2u);
    for (const auto* kind : {&all_reduce, &reduce_scatter, &all_gather, &broadcast, &send_recv}) {
      ASSERT_EQ(kind->size(), totals.size());
    }
    for (std::size_t step = 0; step < totals.size(); ++step) {
      SCOPED_TRACE("step " + std::to_string(step + 1));
      EXPECT_EQ(all_reduce[step] + reduce_scatter[step] + all_gather[step] + broadcast[step] + send_recv[step],
                totals[step]);
      EXPECT_EQ(broadcast[step], 0.0);
      EXPECT_EQ(send_recv[step], 0.0);
      if (zero_stage == 0) {
        EXPECT_NEAR(all_reduce[step], gradient_ring, 0.05 * gradient_ring);
        EXPECT_EQ(reduce_scatter[step] + all_gather[step], 0.0);
      } else if (zero_stage >= 2) {
        // What rank 0 (whose metrics these are) sends: the part of each reduction outside
        // its shard [0, S). The layers' gradients go once per micro-batch (two here),
        // the edges once: wte and wpe lie before the layers, inside rank 0's shard, and
        // ln_f after them, outside it.
        const double shard = std::ceil(parameters / n);
        const double layers_begin = padded_vocab * C + T * C;
        const double layer_size = 12 * C * C + 13 * C;
        const double layers_end = layers_begin + layers * layer_size;
        const double expected =
            4 * (2 * (layers_end - std::max(shard, layers_begin)) + (parameters - std::max(shard, layers_end)));
        EXPECT_EQ(reduce_scatter[step], expected);
        EXPECT_LT(all_reduce[step], 64.0);
        if (zero_stage == 2) {
          EXPECT_NEAR(all_gather[step], gradient_ring / 2, 0.05 * gradient_ring / 2);
        } else {
          // Rank 0 gives its piece of each gather: the edges before the layers (in its
          // shard) once a step, and its part of every gathered layer (layer 0's here).
          double gathered = layers_begin;
          for (const int layer : gathered_layers) {
            const double begin = layers_begin + layer * layer_size;
            gathered += std::max(0.0, std::min(shard, begin + layer_size) - begin);
          }
          EXPECT_EQ(all_gather[step], 4 * gathered);
        }
      } else {
        EXPECT_NEAR(reduce_scatter[step], gradient_ring / 2, 0.05 * gradient_ring / 2);
        EXPECT_NEAR(all_gather[step], gradient_ring / 2, 0.05 * gradient_ring / 2);
        EXPECT_LT(all_reduce[step], 64.0);  // the loss and the squared norm: scalars
      }
    }
    EXPECT_GT(metric_values(dir, "peak_rss_bytes").front(), 0.0);
    std::printf("dp 2, ZeRO %d, step 2: all-reduce %.0f, reduce-scatter %.0f, all-gather %.0f bytes; analytic "
                "gradient ring %.0f\n",
                zero_stage, all_reduce.back(), reduce_scatter.back(), all_gather.back(), gradient_ring);
  }
}

TEST_F(DataParallelTest, ResumeIsBitwiseForAFixedLayout) {
  std::string split;
  const std::vector<std::string> layouts = {"dist.zero_stage=0", "dist.zero_stage=1", "dist.tensor_parallel_size=2",
                                            "dist.pipeline_parallel_size=2"};
  for (std::size_t i = 0; i < layouts.size(); ++i) {
    SCOPED_TRACE(layouts[i]);
    const std::string zero = " " + layouts[i];
    const std::string zero_stage = std::to_string(i);
    const std::string whole = dir_.file(std::string("whole") + zero_stage);
    const CommandResult uninterrupted = mpirun(2, config() + zero + " run.dir=" + whole);
    ASSERT_EQ(uninterrupted.exit_code, 0) << uninterrupted.output;
    split = dir_.file(std::string("split") + zero_stage);
    const CommandResult first = mpirun(2, config() + zero + " run.dir=" + split + " train.exit_at_step=4");
    ASSERT_EQ(first.exit_code, 0) << first.output;
    const CommandResult second = mpirun(2, config() + zero + " run.dir=" + split);
    ASSERT_EQ(second.exit_code, 0) << second.output;
    EXPECT_NE(second.output.find("resuming from"), std::string::npos) << second.output;
    EXPECT_EQ(metric_fields(split, {"loss"}), metric_fields(whole, {"loss"}));
    // Every file of the last checkpoint byte for byte: weights and moments of every
    // piece and shard.
    const std::vector<std::string> names = files(checkpoint_dir(whole, 6), "");
    EXPECT_EQ(files(checkpoint_dir(split, 6), ""), names);
    for (const std::string& name : names) {
      EXPECT_TRUE(read_all(checkpoint_dir(split, 6) + "/" + name) == read_all(checkpoint_dir(whole, 6) + "/" + name))
          << name;
    }
  }

}

// ZeRO-2 and 3 reduce each layer's gradient as the backward makes it (stage 3 also
// gathers each layer's parameters before use). With several micro-batches a step:
// losses and every weight bit for bit those of stage 0 reducing each micro-batch's
// layer gradients (data_parallel_optimizer.h says why no scheme that frees them gives
// plain stage 0's bits); with one (dp 4), plain stage 0's; fp32 and bf16, and dp 2 x
// tp 2 x pp 2 with uneven stages. A run stopped and resumed gives the same bits, and
// its checkpoint resumes as stage 1.
TEST_F(DataParallelTest, ZeroStages2And3GiveStageZerosBitsForTheSameSums) {
  const auto same_files = [](const std::string& got, const std::string& expected, const std::string& kind) {
    const std::vector<std::string> names = files(expected, kind);
    EXPECT_EQ(files(got, kind), names);
    for (const std::string& name : names) {
      EXPECT_TRUE(read_all(got + "/" + name) == read_all(expected + "/" + name)) << name << " differs";
    }
  };
  struct Layout {
    int ranks;
    std::string overrides;
    bool one_micro_batch;
  };
  const std::string three_d =
      " dist.tensor_parallel_size=2 dist.pipeline_parallel_size=2 dist.pipeline_num_layers=1,3 train.precision=bf16";
  int index = 0;
  for (const Layout& layout : {Layout{2, "", false}, Layout{4, " train.precision=bf16", true},
                               Layout{8, three_d, false}}) {
    SCOPED_TRACE(std::to_string(layout.ranks) + " ranks," + layout.overrides);
    const std::string reference = dir_.file("stage0-" + std::to_string(index));
    const std::string stage0 =
        layout.one_micro_batch ? " dist.zero_stage=0" : " dist.zero_stage=0 dist.reduce_each_micro_batch=true";
    const CommandResult expected = mpirun(layout.ranks, config() + layout.overrides + stage0 + " run.dir=" + reference);
    ASSERT_EQ(expected.exit_code, 0) << expected.output;
    for (const int zero_stage : {2, 3}) {
      SCOPED_TRACE("stage " + std::to_string(zero_stage));
      const std::string zero = dir_.file("stage" + std::to_string(zero_stage) + "-" + std::to_string(index));
      // Stage 3 with the reduction overlapped (the same sums): it gives the same bits too.
      const std::string overlap = zero_stage == 3 ? " dist.overlap_reduction=true" : "";
      const CommandResult got = mpirun(layout.ranks, config() + layout.overrides + " dist.zero_stage=" +
                                                         std::to_string(zero_stage) + overlap + " run.dir=" + zero);
      ASSERT_EQ(got.exit_code, 0) << got.output;
      EXPECT_EQ(metric_fields(zero, {"loss", "val_loss"}), metric_fields(reference, {"loss", "val_loss"}));
      same_files(checkpoint_dir(zero, 6), checkpoint_dir(reference, 6), "model");
    }
    ++index;
  }
  for (const int zero_stage : {2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(zero_stage));
    const std::string stage = " dist.zero_stage=" + std::to_string(zero_stage);
    const std::string name = "stage" + std::to_string(zero_stage);
    // Stopped at step 4 and resumed: every file of the last checkpoint, the optimizer's
    // shards too, as the uninterrupted dp 2 run above wrote them.
    const std::string split = dir_.file(name + "-split");
    for (const char* stop : {" train.exit_at_step=4", ""}) {
      const CommandResult run = mpirun(2, config() + stage + " run.dir=" + split + stop);
      ASSERT_EQ(run.exit_code, 0) << run.output;
    }
    EXPECT_EQ(metric_fields(split, {"loss"}), metric_fields(dir_.file(name + "-0"), {"loss"}));
    same_files(checkpoint_dir(split, 6), checkpoint_dir(dir_.file(name + "-0"), 6), "");
    // At one micro-batch a step stages 1 to 3 make the same sums: the checkpoint
    // continues as stage 1 with the bits the stage would have made.
    const std::string one_micro = " train.global_batch=4" + stage;
    const std::string whole = dir_.file(name + "-whole");
    const std::string as_stage1 = dir_.file(name + "-as-stage1");
    for (const auto& [dir, arguments] :
         {std::pair{whole, one_micro}, std::pair{as_stage1, one_micro + " train.exit_at_step=3"},
          std::pair{as_stage1, std::string(" train.global_batch=4 dist.zero_stage=1")}}) {
      const CommandResult run = mpirun(2, config() + arguments + " run.dir=" + dir);
      ASSERT_EQ(run.exit_code, 0) << run.output;
    }
    EXPECT_EQ(metric_fields(as_stage1, {"loss"}), metric_fields(whole, {"loss"}));
    same_files(checkpoint_dir(as_stage1, 6), checkpoint_dir(whole, 6), "model");
  }
}

// The story of the FSDP guide (GPT-2 XL out of memory under plain data parallelism,
// trained under ZeRO-3) at a size that runs here: 8 layers on 4 ranks, a memory cap of
// 16 MB that the plan of stage 0 exceeds (19.5 MB: `train plan` prints it) and stage 3
// fits (14.2 MB). Both count the checkpoint save's host copy (8.0 and 7.0 MB: the
// ZeRO-3 save gathers the whole piece), which on the CPU device is in the plan's total.
// Stage 0 is refused before anything is allocated, naming the plan; stage 3 trains
// under the same cap.
TEST_F(DataParallelTest, ZeroStage3TrainsWhatTheCapRefusesAtStage0) {
  const std::string model = " model.n_layer=8 train.memory_limit=16MB";
  const std::string refused = dir_.file("capped-stage0");
  const CommandResult stage0 = mpirun(4, config() + model + " dist.zero_stage=0 run.dir=" + refused);
  EXPECT_NE(stage0.exit_code, 0) << stage0.output;
  EXPECT_NE(stage0.output.find("does not fit"), std::string::npos) << stage0.output;
  const std::string trained = dir_.file("capped-stage3");
  const CommandResult stage3 = mpirun(4, config() + model + " dist.zero_stage=3 run.dir=" + trained);
  ASSERT_EQ(stage3.exit_code, 0) << stage3.output;
  const auto losses = metric_values(trained, "loss");
  ASSERT_EQ(losses.size(), 6u);
  EXPECT_LT(losses.back(), losses.front());
}

// A (dp 2, tp 2, pp 2) checkpoint, merged, equals the single-process weights, and
// continues under (1, 2, 1) and (2, 1, 2) with the single-process losses; a ZeRO-1
// checkpoint of 2 shards continues with 4 shards, and in one process; a ZeRO-3 one
// (the same files) under dp 2 x tp 2 at stage 3.
TEST_F(DataParallelTest, CheckpointsReshardOnLoad) {
  const std::string single = dir_.file("single");
  const CommandResult reference = run_command(shell_quote(train_tool()) + " " + config() + " run.dir=" + single);
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  const auto expected = metric_values(single, "loss");
  const std::string three_d = " dist.tensor_parallel_size=2 dist.pipeline_parallel_size=2";
  const std::string zero_2 = " dist.zero_stage=1";
  struct Resumed {
    const char* name;
    int first_ranks;
    std::string first_layout;
    int ranks;
    std::string layout;
  };
  for (const Resumed& resumed : {Resumed{"as-1-2-1", 8, three_d, 2, " dist.tensor_parallel_size=2"},
                                 Resumed{"as-2-1-2", 8, three_d, 4, " dist.pipeline_parallel_size=2"},
                                 Resumed{"zero-2-as-zero-4", 2, zero_2, 4, " dist.zero_stage=1"},
                                 Resumed{"zero-2-as-single", 2, zero_2, 1, ""},
                                 Resumed{"zero3-2-as-zero3-tp2", 2, " dist.zero_stage=3", 4,
                                         " dist.zero_stage=3 dist.tensor_parallel_size=2"}}) {
    SCOPED_TRACE(resumed.name);
    const std::string dir = dir_.file(resumed.name);
    const CommandResult first =
        mpirun(resumed.first_ranks, config() + " run.dir=" + dir + resumed.first_layout + " train.exit_at_step=3");
    ASSERT_EQ(first.exit_code, 0) << first.output;
    const double merged_difference = largest_difference(weights(dir, 3), weights(single, 3));
    // As for the final weights in MatchesTheSingleProcessRun: AdamW's steps of up to lr.
    EXPECT_LT(merged_difference, 1e-4) << "the merged step-3 checkpoint against the single process's";
    const CommandResult second = mpirun(resumed.ranks, config() + " run.dir=" + dir + resumed.layout);
    ASSERT_EQ(second.exit_code, 0) << second.output;
    const auto losses = metric_values(dir, "loss");
    ASSERT_EQ(losses.size(), expected.size());
    for (std::size_t i = 0; i < losses.size(); ++i) {
      EXPECT_RELATIVE_NEAR(losses[i], expected[i], 1e-5) << "step " << i + 1;
    }
  }
}

// Checkpoints hold the serial layout, so a tensor-parallel checkpoint resumes in one
// process and a single-process one under tensor parallelism (same data-parallel size).
TEST_F(DataParallelTest, CheckpointsLoadIntoAnotherTensorParallelSize) {
  const std::string single = dir_.file("single");
  const CommandResult reference = run_command(shell_quote(train_tool()) + " " + config() + " run.dir=" + single);
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  const auto expected = metric_values(single, "loss");

  const std::string from_tp = dir_.file("from-tp");
  ASSERT_EQ(mpirun(2, config() + " run.dir=" + from_tp + " dist.tensor_parallel_size=2 train.exit_at_step=3").exit_code,
            0);
  const CommandResult serial_resume = run_command(shell_quote(train_tool()) + " " + config() + " run.dir=" + from_tp);
  ASSERT_EQ(serial_resume.exit_code, 0) << serial_resume.output;

  const std::string to_tp = dir_.file("to-tp");
  const CommandResult serial_start =
      run_command(shell_quote(train_tool()) + " " + config() + " run.dir=" + to_tp + " train.exit_at_step=3");
  ASSERT_EQ(serial_start.exit_code, 0) << serial_start.output;
  const CommandResult tp_resume = mpirun(2, config() + " run.dir=" + to_tp + " dist.tensor_parallel_size=2");
  ASSERT_EQ(tp_resume.exit_code, 0) << tp_resume.output;

  for (const std::string& dir : {from_tp, to_tp}) {
    const auto losses = metric_values(dir, "loss");
    ASSERT_EQ(losses.size(), expected.size()) << dir;
    for (std::size_t i = 0; i < losses.size(); ++i) {
      EXPECT_RELATIVE_NEAR(losses[i], expected[i], 1e-5) << dir << " step " << i + 1;
    }
  }
}

TEST_F(DataParallelTest, MergeCheckpointRefusesWhatItCannotMerge) {
  const std::string dir = dir_.file("sharded");
  ASSERT_EQ(mpirun(2, config() + " run.dir=" + dir + " dist.tensor_parallel_size=2 train.steps=3").exit_code, 0);
  const std::string source = checkpoint_dir(dir, 3);
  const std::string merge = shell_quote(train_tool()) + " merge-checkpoint " + shell_quote(source) + " ";
  // `train generate` reads the sharded checkpoint and the merged one alike.
  weights(dir, 3);  // merges the checkpoint into dir/merged-3
  const std::string generate = shell_quote(train_tool()) + " generate --model " +
                               shell_quote(dufu::testing::fixture_path("fortunes.model")) +
                               " --prompt 'The fortune' --temperature 0 --max-tokens 12 --checkpoint ";
  const CommandResult from_pieces = run_command(generate + shell_quote(source));
  const CommandResult from_merged = run_command(generate + shell_quote(dir + "/merged-3"));
  ASSERT_EQ(from_pieces.exit_code, 0) << from_pieces.output;
  ASSERT_EQ(from_merged.exit_code, 0) << from_merged.output;
  // After the line naming the checkpoint, the same greedy text.
  const auto text = [](const std::string& output) { return output.substr(output.find("\nThe fortune")); };
  EXPECT_EQ(text(from_pieces.output), text(from_merged.output));
  EXPECT_NE(from_pieces.output.find("step 3, 4 layers"), std::string::npos) << from_pieces.output;
  const CommandResult exists = run_command(merge + shell_quote(dir));
  EXPECT_NE(exists.exit_code, 0);
  EXPECT_NE(exists.output.find(dir + ": already exists"), std::string::npos) << exists.output;
  // A damaged piece is named; nothing is written.
  const std::string piece = source + "/model-tp01.safetensors";
  std::string bytes = read_all(piece);
  bytes[bytes.size() - 5] ^= 0x40;
  write_all(piece, bytes);
  const CommandResult corrupt = run_command(merge + shell_quote(dir_.file("merged")));
  EXPECT_NE(corrupt.exit_code, 0);
  EXPECT_NE(corrupt.output.find("model-tp01.safetensors has SHA-256"), std::string::npos) << corrupt.output;
  EXPECT_FALSE(std::filesystem::exists(dir_.file("merged")));
  const CommandResult missing = run_command(merge.substr(0, merge.find(shell_quote(source))) +
                                            shell_quote(dir_.file("nothing")) + " " + shell_quote(dir_.file("m2")));
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.output.find("no such run or checkpoint directory"), std::string::npos) << missing.output;
}

TEST_F(DataParallelTest, InvalidLayoutsAndFailingRanksStopTheJob) {
  const CommandResult not_divisible = mpirun(3, config() + " run.dir=" + dir_.file("three"));
  EXPECT_NE(not_divisible.exit_code, 0);
  EXPECT_NE(not_divisible.output.find("train.global_batch (8) must be a multiple of train.micro_batch (2) x the "
                                      "data-parallel size (3)"),
            std::string::npos)
      << not_divisible.output;
  const CommandResult stages = mpirun(2, config() + " run.dir=" + dir_.file("pp") + " dist.pipeline_parallel_size=2 "
                                                   "model.n_layer=1");
  EXPECT_NE(stages.exit_code, 0);
  EXPECT_NE(stages.output.find("pipeline_parallel_size 2 is more stages than the model's 1"), std::string::npos)
      << stages.output;
  const CommandResult split = mpirun(2, config() + " run.dir=" + dir_.file("split") + " dist.pipeline_parallel_size=2 "
                                                  "dist.pipeline_num_layers=1,2");
  EXPECT_NE(split.exit_code, 0);
  EXPECT_NE(split.output.find("pipeline_num_layers sums to 3 layers, the model has n_layer 4"), std::string::npos)
      << split.output;
  const CommandResult heads = mpirun(4, config() + " run.dir=" + dir_.file("heads") + " dist.tensor_parallel_size=4");
  EXPECT_NE(heads.exit_code, 0);
  EXPECT_NE(heads.output.find("n_head 2 is not divisible by the tensor parallel size 4"), std::string::npos)
      << heads.output;
  const CommandResult world = mpirun(3, config() + " run.dir=" + dir_.file("world") + " dist.tensor_parallel_size=2");
  EXPECT_NE(world.exit_code, 0);
  EXPECT_NE(world.output.find("world size 3 is not divisible by tensor_parallel_size (2)"), std::string::npos)
      << world.output;
  // Rank 1 alone gets a shard that does not exist: it fails while building the data,
  // rank 0 waits in the first collective, and the job must end with rank 1 named.
  const std::string script = dir_.file("one_bad_rank.sh");
  write_all(script, "#!/bin/sh\nif [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then exec \"$@\" data.blend=/nonexistent/shard; "
                    "fi\nexec \"$@\"\n");
  const CommandResult failing =
      run_command(std::string("timeout -k 5 120 ") + DUFU_MPIRUN + " -np 2 sh " +
                  shell_quote(script) + " " + shell_quote(train_tool()) + " " + config() + " run.dir=" +
                  dir_.file("failing"));
  EXPECT_NE(failing.exit_code, 0);
  EXPECT_NE(failing.exit_code, 124) << "the job hung until timeout killed it";
  EXPECT_NE(failing.output.find("/nonexistent/shard"), std::string::npos) << failing.output;
  EXPECT_NE(failing.output.find("rank 1"), std::string::npos) << failing.output;

  // Rank 1 of a tensor- and data-parallel job is killed (SIGKILL: no handler, no
  // message of its own) once step 2 is logged; the job must end promptly, saying
  // which rank died and how.
  const std::string killed_dir = dir_.file("killed");
  const std::string killer = dir_.file("kill_rank_1.sh");
  write_all(killer, "#!/bin/sh\nif [ \"$OMPI_COMM_WORLD_RANK\" = 1 ]; then\n"
                    "  (while ! grep -q '\"step\":2,' " + shell_quote(killed_dir + "/metrics.jsonl") +
                        " 2>/dev/null; do sleep 0.05; done; kill -9 $$) &\nfi\nexec \"$@\"\n");
  const auto start = std::chrono::steady_clock::now();
  const CommandResult killed =
      run_command(std::string("timeout -k 5 120 ") + DUFU_MPIRUN + " -np 4 sh " + shell_quote(killer) + " " +
                  shell_quote(train_tool()) + " " + config() + " run.dir=" + killed_dir +
                  " dist.tensor_parallel_size=2 train.steps=100000 checkpoint.interval=0 eval.interval=0");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(killed.exit_code, 0);
  EXPECT_NE(killed.exit_code, 124) << "the job hung until timeout killed it";
  EXPECT_NE(killed.output.find("rank 1"), std::string::npos) << killed.output;
  EXPECT_NE(killed.output.find("signal 9"), std::string::npos) << killed.output;
  EXPECT_LT(seconds, 100.0);
  std::printf("a killed rank ended the 4-rank job after %.1f s in all\n", seconds);
}

// Document masking (issue 40) in every kind of layout: the loss is the mean over the
// global batch's counted positions, so data-parallel ranks (each counting its own
// micro-batches, summed over the group) and pipeline stages (every stage reading the
// documents) train the one-process model.
TEST_F(DataParallelTest, DocumentMaskingMatchesTheSingleProcessRun) {
  const std::string masking =
      " data.reset_position_ids=true data.reset_attention_mask=true data.eod_mask_loss=true train.steps=3"
      " checkpoint.interval=0 eval.interval=3";
  const std::string single = dir_.file("documents-single");
  const CommandResult reference =
      run_command(shell_quote(train_tool()) + " " + config() + " run.dir=" + single + masking);
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  const auto expected_losses = metric_values(single, "loss");
  const auto expected_val = metric_values(single, "val_loss");
  ASSERT_EQ(expected_losses.size(), 3u);
  for (const char* layout : {" dist.zero_stage=3", " dist.tensor_parallel_size=2 dist.pipeline_parallel_size=2",
                             " dist.pipeline_parallel_size=2 dist.zero_stage=1"}) {
    SCOPED_TRACE(layout);
    const std::string dir = dir_.file("documents-" + std::to_string(std::strlen(layout)));
    const CommandResult result = mpirun(4, config() + " run.dir=" + dir + masking + layout);
    ASSERT_EQ(result.exit_code, 0) << result.output;
    const auto losses = metric_values(dir, "loss");
    ASSERT_EQ(losses.size(), expected_losses.size());
    for (std::size_t i = 0; i < losses.size(); ++i) {
      EXPECT_RELATIVE_NEAR(losses[i], expected_losses[i], 1e-5) << "step " << i + 1;
    }
    const auto val = metric_values(dir, "val_loss");
    ASSERT_EQ(val.size(), expected_val.size());
    for (std::size_t i = 0; i < val.size(); ++i) EXPECT_RELATIVE_NEAR(val[i], expected_val[i], 1e-5);
  }
}

}  // namespace
