// Issue 45, a run made longer: under data.order = stable, raising train.steps of a
// finished run (a constant learning rate), or of a run stopped before its WSD decay,
// continues bit for bit as the longer run planned from the start: the same losses and
// gradient norms at every step, the same final weights and optimizer state. Across
// epoch boundaries (a 10-document shard read many times over) and for a blend of 3
// shards. Under Megatron's order the same extension sees other samples (checked, so
// the test can fail), and a resume that changes data.order is refused in one line.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "train_tool_fixture.h"

namespace train_tool_testing {
namespace {

using dufu::testing::dataprep_tool;
using dufu::testing::fixture_path;

class TrainDataOrderTest : public TrainToolTest {
 protected:
  // A shard of fortunes documents [first, first + count).
  std::string small_shard(const std::string& name, int first, int count) {
    std::istringstream corpus(read_all(fixture_path("fortunes.jsonl")));
    std::string documents, line;
    for (int i = 0; i < first + count && std::getline(corpus, line); ++i) {
      if (i >= first) documents += line + "\n";
    }
    write_all(dir_.file(name + ".jsonl"), documents);
    const std::string prefix = dir_.file(name);
    const CommandResult made =
        run_command(shell_quote(dataprep_tool()) + " preprocess -q --append-eod -i " +
                    shell_quote(dir_.file(name + ".jsonl")) + " -m " + shell_quote(fixture_path("fortunes.model")) +
                    " -o " + shell_quote(prefix));
    EXPECT_EQ(made.exit_code, 0) << made.output;
    return prefix;
  }

  // The arguments of a run of `blend` in its own run.dir, with `knobs` after them.
  std::string run(const std::string& name, const std::string& blend, const std::string& knobs) {
    return shell_quote(write_config(name)) + " run.dir=" + shell_quote(run_dir(name)) + " data.blend=" +
           shell_quote(blend) + " data.cache_dir=" + shell_quote(dir_.file("cache")) +
           " data.split=100,0,0 eval.interval=0 checkpoint.interval=2 " + knobs;
  }

  void expect_bitwise(const std::string& extended, const std::string& reference, int step) {
    const std::vector<std::string> expected = metric_fields(run_dir(reference), {"step", "loss", "grad_norm", "lr"});
    ASSERT_EQ(expected.size(), 4u * static_cast<std::size_t>(step)) << reference << " logged other records";
    EXPECT_EQ(metric_fields(run_dir(extended), {"step", "loss", "grad_norm", "lr"}), expected)
        << extended << " against " << reference;
    for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
      EXPECT_TRUE(read_all(checkpoint_dir(run_dir(extended), step) + "/" + file) ==
                  read_all(checkpoint_dir(run_dir(reference), step) + "/" + file))
          << extended << ": " << file << " differs from " << reference << "'s";
    }
  }

  void train_ok(const std::string& arguments) {
    const CommandResult result = train(arguments);
    ASSERT_EQ(result.exit_code, 0) << result.output;
  }
};

TEST_F(TrainDataOrderTest, UnderTheStableOrderARunMadeLongerIsTheLongerRunBitForBit) {
  const std::string ten = small_shard("ten", 0, 10);
  const std::string blend =
      "0.5 " + ten + " 0.3 " + small_shard("twenty", 10, 20) + " 0.2 " + fortunes_shard();
  const std::string constant = " optim.warmup_steps=0 optim.min_lr=3e-3 optim.lr=3e-3";
  const std::string wsd = " optim.schedule=wsd optim.wsd_decay_steps=2";
  for (const auto& [label, data] : std::vector<std::pair<std::string, std::string>>{{"one", ten}, {"blend", blend}}) {
    SCOPED_TRACE(label);
    const std::string stable = " data.order=stable";
    // Constant rate: 4 steps, then train.steps 8, against 8 from the start.
    train_ok(run(label + "-c", data, stable + constant + " train.steps=4"));
    const CommandResult longer = train(run(label + "-c", data, stable + constant + " train.steps=8"));
    ASSERT_EQ(longer.exit_code, 0) << longer.output;
    EXPECT_NE(longer.output.find("train.steps 4 -> 8: continuing; under data.order = stable the samples so far are "
                                 "the first of the longer run"),
              std::string::npos)
        << longer.output;
    train_ok(run(label + "-c-reference", data, stable + constant + " train.steps=8"));
    expect_bitwise(label + "-c", label + "-c-reference", 8);
    // WSD: 8 steps planned, stopped at 4 (before the decay), then train.steps 16.
    train_ok(run(label + "-w", data, stable + wsd + " train.steps=8 train.exit_at_step=4"));
    train_ok(run(label + "-w", data, stable + wsd + " train.steps=16"));
    train_ok(run(label + "-w-reference", data, stable + wsd + " train.steps=16"));
    expect_bitwise(label + "-w", label + "-w-reference", 16);
  }
  // Megatron's order: the 10-document shard's 4 steps span other epochs than 8 steps'
  // (it sizes its epochs to the run), so the extension goes on in another order.
  train_ok(run("m", ten, constant + " train.steps=4"));
  train_ok(run("m", ten, constant + " train.steps=8"));
  train_ok(run("m-reference", ten, constant + " train.steps=8"));
  EXPECT_NE(metric_fields(run_dir("m"), {"step", "loss"}), metric_fields(run_dir("m-reference"), {"step", "loss"}))
      << "Megatron's order extended exactly too: the shard is not read over enough epochs to test anything";
}

TEST_F(TrainDataOrderTest, AResumeThatChangesTheOrderIsRefusedInOneLine) {
  const std::string ten = small_shard("ten", 0, 10);
  train_ok(run("changed", ten, " train.steps=2"));
  const CommandResult changed = train(run("changed", ten, " train.steps=4 data.order=stable"));
  EXPECT_EQ(changed.exit_code, 1) << changed.output;
  EXPECT_NE(changed.output.find("data.order is stable but the run was trained with data.order = megatron"),
            std::string::npos)
      << changed.output;
}

}  // namespace
}  // namespace train_tool_testing
