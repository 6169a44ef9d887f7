// A Llama-shaped model trained end to end by the `train` tool on real shards (the
// fixture corpus, fortune cookies as in the quickstart): 4 layers, d_model 256, 8
// heads over 2 K/V heads (grouped-query attention), Llama's SwiGLU width (768), an
// untied head. Its loss falls; the same run under mpirun as (dp, tp, pp) = (2, 2, 2)
// on 8 ranks gives the same per-step and validation losses within 1e-5 relative (the
// tolerance of the GPT-2 layout tests, data_parallel_test); a run stopped at a
// checkpoint and resumed gives the uninterrupted run's bits; bf16 trains the same
// shape to within 2% of fp32's loss.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "support/float_compare.h"
#include "support/fortunes_shard.h"
#include "support/run_dir.h"
#include "support/temp_dir.h"
#include "support/tool_runner.h"

namespace {

using namespace dufu::testing;  // the tool runner, run-directory and fixture-shard helpers of tests/support

constexpr int kSteps = 8;

class LlamaTrainingTest : public ::testing::Test {
 protected:
  // The shape of configs/llama_small.toml at 32 positions on the fixture corpus
  // (2000 pieces); global batch 8 of micro-batches of 2, so dp 2 with pp 2's
  // micro-batches divides it; evaluations at steps 4 and 8, checkpoints at 4 and 8.
  std::string config() {
    const std::string path = dir_.file("llama.toml");
    if (!std::filesystem::exists(path)) {
      write_all(path, "[model]\narch = \"llama\"\nn_layer = 4\nd_model = 256\nn_head = 8\nn_kv_head = 2\n"
                      "vocab_size = 2000\nseq_length = 32\n"
                      "[data]\nblend = \"" +
                          fortunes_shard() + "\"\ncache_dir = \"" + fortunes_shard_dir() + "/cache" +
                          "\"\nsplit = \"90,10,0\"\nworkers = 1\n"
                          "[train]\nmicro_batch = 2\nglobal_batch = 8\nsteps = " +
                          std::to_string(kSteps) +
                          "\nthreads = 1\n"
                          "[optim]\nlr = 3e-3\nmin_lr = 3e-4\nwarmup_steps = 2\n"
                          "[eval]\ninterval = 4\nbatches = 2\n"
                          "[checkpoint]\ninterval = 4\nkeep = 2\n");
    }
    return shell_quote(path);
  }

  CommandResult train(const std::string& arguments) {
    return run_command("timeout -k 5 300 " + shell_quote(train_tool()) + " " + arguments);
  }

  // The single-process run every other run is compared with, made once.
  const std::string& reference() {
    if (reference_.empty()) {
      reference_ = dir_.file("single");
      const CommandResult result = train(config() + " run.dir=" + reference_);
      EXPECT_EQ(result.exit_code, 0) << result.output;
      EXPECT_NE(result.output.find("llama"), std::string::npos) << result.output;
    }
    return reference_;
  }

  TempDir dir_;
  std::string reference_;
};

TEST_F(LlamaTrainingTest, LossFallsAndTwoByTwoByTwoGivesTheSameLosses) {
  const std::string single = reference();
  const auto losses = metric_values(single, "loss");
  const auto val = metric_values(single, "val_loss");
  ASSERT_EQ(losses.size(), static_cast<std::size_t>(kSteps));
  ASSERT_EQ(val.size(), 2u);
  // From about ln 2000 = 7.6 (near-uniform logits) to about 6.75 in 8 steps.
  EXPECT_GT(losses.front(), 7.0);
  EXPECT_LT(losses.back(), losses.front() - 0.5);
  EXPECT_LT(val.back(), val.front());
  std::printf("one process: loss %.4f -> %.4f, validation %.4f -> %.4f\n", losses.front(), losses.back(), val.front(),
              val.back());

  const std::string dir = dir_.file("dp2-tp2-pp2");
  const CommandResult result =
      run_command(std::string("timeout -k 5 300 ") + DUFU_MPIRUN + " -np 8 " + shell_quote(train_tool()) + " " +
                  config() + " run.dir=" + dir + " dist.tensor_parallel_size=2 dist.pipeline_parallel_size=2");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("world 8 = tp 2 x dp 2 x pp 2"), std::string::npos) << result.output;
  const auto parallel_losses = metric_values(dir, "loss");
  ASSERT_EQ(parallel_losses.size(), losses.size());
  double worst = 0.0;
  for (std::size_t i = 0; i < losses.size(); ++i) {
    EXPECT_RELATIVE_NEAR(parallel_losses[i], losses[i], 1e-5) << "step " << i + 1;
    worst = std::max(worst, dufu::testing::relative_error(parallel_losses[i], losses[i]));
  }
  const auto parallel_val = metric_values(dir, "val_loss");
  ASSERT_EQ(parallel_val.size(), val.size());
  for (std::size_t i = 0; i < val.size(); ++i) EXPECT_RELATIVE_NEAR(parallel_val[i], val[i], 1e-5);
  std::printf("(dp, tp, pp) = (2, 2, 2): losses within %.2e of one process's\n", worst);
}

TEST_F(LlamaTrainingTest, ResumeFromACheckpointGivesTheSameBits) {
  const std::string dir = dir_.file("stopped");
  const CommandResult first = train(config() + " run.dir=" + dir + " train.exit_at_step=4");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  ASSERT_TRUE(std::filesystem::exists(checkpoint_dir(dir, 4) + "/state.json")) << first.output;
  const CommandResult second = train("--resume " + shell_quote(dir) + " train.exit_at_step=0");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_EQ(second.output.find("step 4/"), std::string::npos) << second.output;
  const auto fields = [](const std::string& run) {
    return metric_fields(run, {"step", "loss", "grad_norm", "val_loss"});
  };
  EXPECT_EQ(fields(dir), fields(reference()));
  for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
    EXPECT_TRUE(read_all(checkpoint_dir(dir, kSteps) + "/" + file) ==
                read_all(checkpoint_dir(reference(), kSteps) + "/" + file))
        << file << " differs from the uninterrupted run's";
  }
}

TEST_F(LlamaTrainingTest, Bf16TrainsLikeFp32) {
  const std::string dir = dir_.file("bf16");
  const CommandResult result = train(config() + " run.dir=" + dir + " train.precision=bf16");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  const auto losses = metric_values(dir, "loss");
  const auto expected = metric_values(reference(), "loss");
  ASSERT_EQ(losses.size(), expected.size());
  EXPECT_LT(losses.back(), losses.front() - 0.5);
  EXPECT_NEAR(losses.back(), expected.back(), 0.02 * expected.back());
  EXPECT_NE(losses, expected);  // bf16 rounds: not fp32's bits
}

}  // namespace
