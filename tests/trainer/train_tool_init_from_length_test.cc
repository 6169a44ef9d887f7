// Issue 44: model.init_from at another model.seq_length, as fine-tuning at another
// context length does. RoPE (model.arch = llama) has no table of positions, so any
// length trains; GPT-2's learned positions (wpe) cover the checkpoint's length, so a
// shorter run starts from the table's first rows and a longer one is refused in one
// line naming model.seq_length and both values.
#include <algorithm>
#include <string>

#include "dufu/trainer/checkpoint/safetensors.h"
#include "train_tool_fixture.h"

namespace train_tool_testing {
namespace {

namespace safetensors = dufu::trainer::safetensors;

// A bound on every command: a hang fails the test instead of hanging ctest.
constexpr char kBound[] = "timeout -s KILL 20 ";

class TrainInitFromLengthTest : public TrainToolTest {
 protected:
  // Two steps of `write_config(name)` with `overrides`, a checkpoint at step 2.
  CommandResult two_steps(const std::string& name, const std::string& overrides) {
    return run_command(kBound + shell_quote(train_tool()) + " " + shell_quote(write_config(name)) + " run.dir=" +
                       shell_quote(run_dir(name)) + " train.steps=2 eval.interval=0 " + overrides);
  }
};

TEST_F(TrainInitFromLengthTest, LlamaTrainsFromACheckpointAtALongerSeqLength) {
  const CommandResult source = two_steps("source", "model.arch=llama");
  ASSERT_EQ(source.exit_code, 0) << source.output;
  const CommandResult longer = two_steps(
      "longer", "model.arch=llama model.seq_length=64 model.init_from=" + shell_quote(checkpoint_dir(run_dir("source"), 2)));
  ASSERT_EQ(longer.exit_code, 0) << longer.output;
  EXPECT_TRUE(file_exists(checkpoint_dir(run_dir("longer"), 2) + "/model.safetensors"));
}

TEST_F(TrainInitFromLengthTest, Gpt2AtAShorterSeqLengthStartsFromTheFirstRowsOfWpe) {
  const CommandResult source = two_steps("source", "");
  ASSERT_EQ(source.exit_code, 0) << source.output;
  const std::string source_checkpoint = checkpoint_dir(run_dir("source"), 2);
  // Learning rate 0 keeps the weights the run started from.
  const CommandResult shorter = two_steps("shorter", "model.seq_length=16 optim.lr=0 optim.min_lr=0 "
                                                     "model.init_from=" + shell_quote(source_checkpoint));
  ASSERT_EQ(shorter.exit_code, 0) << shorter.output;
  const auto source_model = safetensors::File::open(source_checkpoint + "/model.safetensors");
  const auto shorter_model = safetensors::File::open(checkpoint_dir(run_dir("shorter"), 2) + "/model.safetensors");
  const auto source_wpe = source_model.view<float>("wpe.weight");
  const auto shorter_wpe = shorter_model.view<float>("wpe.weight");
  ASSERT_EQ(source_wpe.size(), 32u * 64);
  ASSERT_EQ(shorter_wpe.size(), 16u * 64);
  EXPECT_TRUE(std::equal(shorter_wpe.begin(), shorter_wpe.end(), source_wpe.begin()))
      << "wpe is not the first 16 rows of the checkpoint's";
  const auto source_wte = source_model.view<float>("wte.weight");
  const auto shorter_wte = shorter_model.view<float>("wte.weight");
  EXPECT_TRUE(std::equal(shorter_wte.begin(), shorter_wte.end(), source_wte.begin(), source_wte.end()));
}

TEST_F(TrainInitFromLengthTest, Gpt2AtALongerSeqLengthIsRefusedNamingTheKnob) {
  const CommandResult source = two_steps("source", "");
  ASSERT_EQ(source.exit_code, 0) << source.output;
  const CommandResult longer =
      two_steps("longer", "model.seq_length=64 model.init_from=" + shell_quote(checkpoint_dir(run_dir("source"), 2)));
  EXPECT_EQ(longer.exit_code, 1) << longer.output;
  EXPECT_TRUE(is_one_line(longer.output, "model.seq_length = 64")) << longer.output;
  EXPECT_TRUE(is_one_line(longer.output, "32")) << longer.output;
  EXPECT_FALSE(fs::exists(run_dir("longer"))) << "the refused start left its run.dir";
}

}  // namespace
}  // namespace train_tool_testing
