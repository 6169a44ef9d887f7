// train.precision = bf16 end to end with the `train` tool on real shards (the fixture
// corpus): the quickstart's model shape (configs/quickstart.toml: 4 layers, 4 heads,
// d_model 192, 128 positions, 16 samples per step) trained in fp32 and in bf16 from
// the same seed reaches a validation loss within 2% of fp32's at the same step (issue
// 11's criterion) without being fp32 bit for bit; a bf16 run repeats to the same bits,
// resumes bit for bit from a checkpoint, and its checkpoints keep the fp32 masters.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "dufu/trainer/checkpoint/safetensors.h"
#include "device/bf16.h"
#include "support/fortunes_shard.h"
#include "support/run_dir.h"
#include "support/temp_dir.h"
#include "support/tool_runner.h"

namespace {

using namespace dufu::testing;  // the tool runner, run-directory and fixture-shard helpers of tests/support

class Bf16TrainingTest : public ::testing::Test {
 protected:
  // The quickstart's shape on the fixture corpus, whose tokenizer has 2000 pieces;
  // `steps` steps with an evaluation every `eval_interval`.
  std::string write_config(int steps, int eval_interval) {
    const std::string text =
        "[model]\nn_layer = 4\nn_head = 4\nd_model = 192\nvocab_size = 2000\nseq_length = 128\n"
        "[data]\nblend = \"" +
        fortunes_shard() + "\"\n" + "cache_dir = \"" + fortunes_shard_dir() + "/cache" +
        "\"\nsplit = \"90,10,0\"\nworkers = 2\n"
        "[train]\nmicro_batch = 8\nglobal_batch = 16\nthreads = 2\nsteps = " +
        std::to_string(steps) + "\n" +
        "[optim]\nlr = 1e-3\nmin_lr = 1e-4\nwarmup_steps = 5\n"
        "[eval]\nbatches = 4\ninterval = " +
        std::to_string(eval_interval) + "\n" + "[checkpoint]\ninterval = 0\nkeep = 2\n";
    const std::string path = dir_.file("config_" + std::to_string(steps) + ".toml");
    write_all(path, text);
    return path;
  }

  // Runs `train CONFIG run.dir=DIR OVERRIDES` and fails the test unless it succeeds.
  void train(const std::string& config, const std::string& run_dir, const std::string& overrides) {
    const CommandResult result = run_command(shell_quote(train_tool()) + " " + shell_quote(config) +
                                             " run.dir=" + shell_quote(run_dir) + " " + overrides);
    ASSERT_EQ(result.exit_code, 0) << result.output;
  }

  static std::vector<std::string> loss_sequence(const std::string& run_dir) {
    return metric_fields(run_dir, {"step", "loss", "grad_norm", "val_loss"});
  }

  TempDir dir_;
};

TEST_F(Bf16TrainingTest, ValidationLossWithinTwoPercentOfFp32) {
  constexpr int kSteps = 16;
  const std::string config = write_config(kSteps, kSteps / 2);
  const std::string fp32 = dir_.file("fp32");
  const std::string bf16 = dir_.file("bf16");
  ASSERT_NO_FATAL_FAILURE(train(config, fp32, ""));
  ASSERT_NO_FATAL_FAILURE(train(config, bf16, "train.precision=bf16"));

  const std::vector<double> fp32_val = metric_values(fp32, "val_loss");
  const std::vector<double> bf16_val = metric_values(bf16, "val_loss");
  ASSERT_EQ(fp32_val.size(), 2u);
  ASSERT_EQ(bf16_val.size(), 2u);
  for (std::size_t i = 0; i < fp32_val.size(); ++i) {
    std::printf("val loss at step %d: fp32 %.6f, bf16 %.6f (%+.3f%%)\n", static_cast<int>(i + 1) * kSteps / 2,
                fp32_val[i], bf16_val[i], 100.0 * (bf16_val[i] - fp32_val[i]) / fp32_val[i]);
    EXPECT_LE(std::fabs(bf16_val[i] - fp32_val[i]), 0.02 * fp32_val[i]) << "evaluation " << i;
  }
  // Both learn: the loss falls well below log(2000) = 7.6 of a uniform guess.
  EXPECT_LT(bf16_val.back(), bf16_val.front());
  EXPECT_LT(bf16_val.back(), 7.0);
  // The rounding happens: bf16's training losses are not fp32's bits.
  const std::vector<std::string> fp32_losses = metric_fields(fp32, {"loss"});
  const std::vector<std::string> bf16_losses = metric_fields(bf16, {"loss"});
  ASSERT_EQ(fp32_losses.size(), static_cast<std::size_t>(kSteps));
  ASSERT_EQ(bf16_losses.size(), fp32_losses.size());
  int differing = 0;
  for (std::size_t i = 0; i < fp32_losses.size(); ++i) differing += fp32_losses[i] != bf16_losses[i];
  EXPECT_GE(differing, kSteps / 2);
  EXPECT_NE(read_all(checkpoint_dir(fp32, kSteps) + "/model.safetensors"),
            read_all(checkpoint_dir(bf16, kSteps) + "/model.safetensors"));

  // train.attention_products = bf16 (attention's products on bf16 operands, P and dS
  // rounded): also within 2% of fp32, and not the bits of bf16 with fp32 products.
  const std::string bf16_attention = dir_.file("bf16_attention");
  ASSERT_NO_FATAL_FAILURE(train(config, bf16_attention, "train.precision=bf16 train.attention_products=bf16"));
  const std::vector<double> attention_val = metric_values(bf16_attention, "val_loss");
  ASSERT_EQ(attention_val.size(), 2u);
  for (std::size_t i = 0; i < fp32_val.size(); ++i) {
    std::printf("val loss at step %d: bf16 with bf16 attention products %.6f (%+.3f%% of fp32)\n",
                static_cast<int>(i + 1) * kSteps / 2, attention_val[i],
                100.0 * (attention_val[i] - fp32_val[i]) / fp32_val[i]);
    EXPECT_LE(std::fabs(attention_val[i] - fp32_val[i]), 0.02 * fp32_val[i]) << "evaluation " << i;
  }
  EXPECT_NE(metric_fields(bf16_attention, {"loss"}), bf16_losses);
}

// bf16 attention products need the bf16 recipe's copy of qkv: refused under fp32.
TEST_F(Bf16TrainingTest, Bf16AttentionProductsNeedBf16Precision) {
  const std::string config = write_config(2, 2);
  const CommandResult result = run_command(shell_quote(train_tool()) + " " + shell_quote(config) +
                                           " run.dir=" + shell_quote(dir_.file("refused")) +
                                           " train.attention_products=bf16 2>&1");
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("train.attention_products = bf16 needs train.precision = bf16"), std::string::npos)
      << result.output;
}

// A bf16 run stopped by train.exit_at_step and resumed: its first half is a second
// run of the uninterrupted one's first half (the same bits twice), and the resumed
// half ends in the uninterrupted run's losses, weights and moments bit for bit. The
// checkpoint holds the fp32 masters, not the bf16 working copy.
TEST_F(Bf16TrainingTest, RepeatsAndResumesBitForBit) {
  constexpr int kSteps = 8;
  const std::string config = write_config(kSteps, kSteps / 2);
  const std::string whole = dir_.file("whole");
  const std::string split = dir_.file("split");
  ASSERT_NO_FATAL_FAILURE(train(config, whole, "train.precision=bf16"));
  ASSERT_NO_FATAL_FAILURE(
      train(config, split, "train.precision=bf16 train.exit_at_step=" + std::to_string(kSteps / 2)));
  const std::vector<std::string> expected = loss_sequence(whole);
  ASSERT_EQ(expected.size(), static_cast<std::size_t>(kSteps) * 3 + 2 * 2);  // steps x 3 fields + 2 evals x 2
  const std::vector<std::string> first_half = loss_sequence(split);
  ASSERT_EQ(first_half, std::vector<std::string>(expected.begin(), expected.begin() + (kSteps / 2) * 3 + 2));
  EXPECT_EQ(read_all(checkpoint_dir(split, kSteps / 2) + "/model.safetensors").empty(), false);

  ASSERT_NO_FATAL_FAILURE(train(config, split, "train.precision=bf16"));
  EXPECT_EQ(loss_sequence(split), expected);
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    EXPECT_TRUE(read_all(checkpoint_dir(split, kSteps) + "/" + file) ==
                read_all(checkpoint_dir(whole, kSteps) + "/" + file))
        << file << " differs from the uninterrupted bf16 run's";
  }

  // The checkpoint's weights are the F32 masters, which AdamW moved off bf16's grid.
  const auto model = dufu::trainer::safetensors::File::open(checkpoint_dir(whole, kSteps) + "/model.safetensors");
  std::size_t values = 0;
  std::size_t off_grid = 0;
  for (const auto& tensor : model.tensors()) {
    ASSERT_EQ(tensor.dtype, dufu::trainer::safetensors::Dtype::kF32) << tensor.name;
    for (const float value : model.view<float>(tensor.name)) {
      ++values;
      off_grid += dufu::trainer::round_to_bf16(value) != value;
    }
  }
  EXPECT_GT(off_grid, values / 2) << "the checkpoint holds bf16-rounded weights, not the fp32 masters";
}

}  // namespace
