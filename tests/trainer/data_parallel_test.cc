// Data-parallel training under mpirun against the single-process run: the same
// config, seed and data give the same per-step losses (within 1e-5 relative: the
// gradients are summed in another order) and final weights; a data-parallel run that
// stops and resumes continues bitwise; a rank that dies takes the job down with it
// instead of leaving the others waiting.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <utility>
#include <string>
#include <vector>

#include "dufu/trainer/gpt.h"
#include "dufu/trainer/safetensors.h"
#include "support/fortunes_shard.h"
#include "support/temp_dir.h"
#include "support/tool_runner.h"

namespace {

using dufu::testing::CommandResult;
using dufu::testing::fortunes_shard;
using dufu::testing::fortunes_shard_dir;
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
    write_all(path,
              "[model]\nn_layer = 2\nn_head = 2\nd_model = 64\nvocab_size = 2000\nseq_length = 32\n"
              "[data]\nblend = \"" + fortunes_shard() + "\"\ncache_dir = \"" + fortunes_shard_dir() + "/cache" +
                  "\"\nsplit = \"90,10,0\"\nworkers = 1\n"
                  "[train]\nmicro_batch = 2\nglobal_batch = 8\nsteps = 6\nthreads = 1\n"
                  "[optim]\nlr = 3e-3\nmin_lr = 3e-4\nwarmup_steps = 2\n"
                  "[eval]\ninterval = 3\nbatches = 2\n"
                  "[checkpoint]\ninterval = 3\nkeep = 3\n");
    return shell_quote(path);
  }

  static CommandResult mpirun(int ranks, const std::string& arguments) {
    return run_command(std::string("timeout -k 5 300 ") + DUFU_MPIRUN + " -np " + std::to_string(ranks) + " " +
                       shell_quote(train_tool()) + " " + arguments);
  }

  static std::vector<double> values(const std::string& run_dir, const std::string& key) {
    std::vector<double> out;
    std::ifstream in(run_dir + "/metrics.jsonl");
    std::string line;
    const std::string needle = "\"" + key + "\":";
    while (std::getline(in, line)) {
      const auto at = line.find(needle);
      if (at != std::string::npos) out.push_back(std::stod(line.substr(at + needle.size())));
    }
    return out;
  }

  static std::vector<std::string> exact_losses(const std::string& run_dir) {
    std::vector<std::string> out;
    std::ifstream in(run_dir + "/metrics.jsonl");
    std::string line;
    while (std::getline(in, line)) {
      const auto at = line.find("\"loss\":");
      if (at != std::string::npos) out.push_back(line.substr(at, line.find(',', at) - at));
    }
    return out;
  }

  static std::string weights(const std::string& run_dir) {
    return run_dir + "/checkpoints/step_00000006/model.safetensors";
  }

  TempDir dir_;
};

TEST_F(DataParallelTest, MatchesTheSingleProcessRun) {
  const std::string single = dir_.file("single");
  const CommandResult reference = run_command(shell_quote(train_tool()) + " " + config() + " run.dir=" + single);
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  const auto expected_losses = values(single, "loss");
  const auto expected_val = values(single, "val_loss");
  ASSERT_EQ(expected_losses.size(), 6u);
  ASSERT_EQ(expected_val.size(), 2u);
  const auto expected = dufu::trainer::safetensors::File::open(weights(single));

  // (ranks, ZeRO stage): the replicated optimizer and ZeRO-1's sharded one.
  for (const auto& [ranks, zero_stage] : {std::pair{2, 0}, std::pair{4, 0}, std::pair{2, 1}, std::pair{4, 1}}) {
    SCOPED_TRACE("data-parallel ranks: " + std::to_string(ranks) + ", ZeRO stage " + std::to_string(zero_stage));
    const std::string dir = dir_.file("dp" + std::to_string(ranks) + "-zero" + std::to_string(zero_stage));
    const CommandResult result =
        mpirun(ranks, config() + " run.dir=" + dir + " dist.zero_stage=" + std::to_string(zero_stage));
    ASSERT_EQ(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("world " + std::to_string(ranks) + " = tp 1 x dp " + std::to_string(ranks)),
              std::string::npos)
        << result.output;
    // One rank speaks: one line per step.
    std::size_t step_lines = 0;
    for (std::size_t at = result.output.find("step 6/6"); at != std::string::npos;
         at = result.output.find("step 6/6", at + 1)) {
      ++step_lines;
    }
    EXPECT_EQ(step_lines, 1u) << result.output;
    const auto losses = values(dir, "loss");
    ASSERT_EQ(losses.size(), expected_losses.size());
    for (std::size_t i = 0; i < losses.size(); ++i) {
      EXPECT_NEAR(losses[i], expected_losses[i], 1e-5 * std::abs(expected_losses[i])) << "step " << i + 1;
    }
    // Communication per step and rank: the gradient all-reduce (or ZeRO-1's reduce-
    // scatter and all-gather of the padded shards) plus the 8-byte loss sum (and
    // ZeRO-1's 8-byte sum of squares), at the volume ring algorithms move.
    dufu::trainer::GPTConfig model;
    model.n_layer = 2;
    model.n_head = 2;
    model.d_model = 64;
    model.vocab_size = 2000;
    model.seq_length = 32;
    const double n = ranks;
    const double parameters = static_cast<double>(dufu::trainer::GPT(model).num_parameters());
    const double shard = std::ceil(parameters / n);
    const double expected_bytes = zero_stage == 0 ? 2 * (n - 1) / n * (4 * parameters + 8)
                                                  : 2 * (n - 1) * 4 * shard + 2 * (2 * (n - 1) / n * 8);
    for (const double bytes : values(dir, "comm_bytes")) EXPECT_EQ(bytes, std::floor(expected_bytes));
    const auto val = values(dir, "val_loss");
    ASSERT_EQ(val.size(), expected_val.size());
    for (std::size_t i = 0; i < val.size(); ++i) EXPECT_NEAR(val[i], expected_val[i], 1e-5 * expected_val[i]);

    const auto actual = dufu::trainer::safetensors::File::open(weights(dir));
    ASSERT_EQ(actual.tensors().size(), expected.tensors().size());
    double worst = 0.0;
    for (const auto& tensor : expected.tensors()) {
      const auto a = actual.view<float>(tensor.name);
      const auto e = expected.view<float>(tensor.name);
      ASSERT_EQ(a.size(), e.size()) << tensor.name;
      for (std::size_t i = 0; i < a.size(); ++i) {
        worst = std::max(worst, std::abs(static_cast<double>(a[i]) - e[i]));
      }
    }
    // AdamW moves every weight by up to lr per step whatever the gradient's size, so
    // summation-order noise in a near-zero gradient can change a weight by a fraction
    // of lr (3e-3 here): the bound is absolute, a few percent of one step.
    EXPECT_LT(worst, 1e-4) << "largest weight difference after 6 steps";
    std::printf("dp %d, ZeRO %d: largest weight difference after 6 steps %.3g\n", ranks, zero_stage, worst);
  }
}

TEST_F(DataParallelTest, ResumeIsBitwiseForAFixedLayout) {
  std::string split;
  for (const char* zero_stage : {"0", "1"}) {
    SCOPED_TRACE(std::string("ZeRO stage ") + zero_stage);
    const std::string zero = std::string(" dist.zero_stage=") + zero_stage;
    const std::string whole = dir_.file(std::string("whole") + zero_stage);
    const CommandResult uninterrupted = mpirun(2, config() + zero + " run.dir=" + whole);
    ASSERT_EQ(uninterrupted.exit_code, 0) << uninterrupted.output;
    split = dir_.file(std::string("split") + zero_stage);
    const CommandResult first = mpirun(2, config() + zero + " run.dir=" + split + " train.exit_at_step=4");
    ASSERT_EQ(first.exit_code, 0) << first.output;
    const CommandResult second = mpirun(2, config() + zero + " run.dir=" + split);
    ASSERT_EQ(second.exit_code, 0) << second.output;
    EXPECT_NE(second.output.find("resuming from"), std::string::npos) << second.output;
    EXPECT_EQ(exact_losses(split), exact_losses(whole));
    EXPECT_TRUE(read_all(weights(split)) == read_all(weights(whole)));
  }

  // The same checkpoint under another data-parallel size is refused, not misread.
  const CommandResult other_layout = mpirun(4, config() + " run.dir=" + split + " train.steps=9");
  EXPECT_NE(other_layout.exit_code, 0);
  EXPECT_NE(other_layout.output.find("different layout is not supported yet"), std::string::npos)
      << other_layout.output;
}

TEST_F(DataParallelTest, InvalidLayoutsAndFailingRanksStopTheJob) {
  const CommandResult not_divisible = mpirun(3, config() + " run.dir=" + dir_.file("three"));
  EXPECT_NE(not_divisible.exit_code, 0);
  EXPECT_NE(not_divisible.output.find("train.global_batch (8) must be a multiple of train.micro_batch (2) x the "
                                      "data-parallel size (3)"),
            std::string::npos)
      << not_divisible.output;
  const CommandResult tensor_parallel = mpirun(2, config() + " dist.tensor_parallel_size=2");
  EXPECT_NE(tensor_parallel.exit_code, 0);
  EXPECT_NE(tensor_parallel.output.find("not implemented yet"), std::string::npos) << tensor_parallel.output;
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
}

}  // namespace
