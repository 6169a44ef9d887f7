// `train` when its data changes (issue 15): a shard truncated under a running run, or
// changed since the checkpoint a run resumes from, is named in one line, unless
// data.allow_changed_shards says to go on.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "train_tool_fixture.h"

namespace {

using namespace train_tool_testing;  // the suite and helpers the train tool's tests share
namespace fs = std::filesystem;

// A copy of the fixture shard that a test may damage.
std::string copy_of_fixture_shard(const TempDir& dir, const std::string& name) {
  for (const char* extension : {".bin", ".idx"}) fs::copy_file(fortunes_shard() + extension, dir.file(name) + extension);
  return dir.file(name);
}

// Token ids rewritten in place at the start of the .bin: the sizes and the index stay
// what they were, so only the shard's identity in the checkpoint tells.
void rewrite_first_token(const std::string& shard) {
  std::fstream bin(shard + ".bin", std::ios::binary | std::ios::in | std::ios::out);
  char byte = 0;
  bin.read(&byte, 1);
  bin.seekp(0);
  bin.put(static_cast<char>(byte ^ 1));
}

TEST_F(TrainToolTest, ShardTruncatedWhileTrainingEndsInOneLineNamingTheFile) {
  const std::string shard = copy_of_fixture_shard(dir_, "truncated");
  const std::string dir = run_dir("truncated-run");
  const std::string log = dir_.file("truncated.log");
  {
    BackgroundTrain run(shell_quote(write_config("truncated")) + " run.dir=" + shell_quote(dir) + " data.blend=" +
                            shell_quote(shard) + " train.steps=100000 checkpoint.interval=0 eval.interval=0",
                        log);
    while (run.running() && count_lines_with(dir + "/metrics.jsonl", "\"type\":\"train\"") < 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ASSERT_TRUE(run.running()) << read_all(log);
    fs::resize_file(shard + ".bin", 1000);
    const int status = run.wait();
    ASSERT_TRUE(WIFEXITED(status)) << "ended by signal " << WTERMSIG(status) << ": " << read_all(log);
    EXPECT_EQ(WEXITSTATUS(status), 1) << read_all(log);
  }
  // The dataset's size check before each read names the file; a truncation that lands
  // between that check and the read faults instead, and the SIGBUS handler names it.
  const std::string output = read_all(log);
  const bool checked = is_one_line(output, "'" + shard + ".bin' was truncated while open");
  const bool faulted = is_one_line(output, shard + ".bin: reading byte ") &&
                       output.find("truncated while in use") != std::string::npos;
  EXPECT_TRUE(checked || faulted) << output;
}

TEST_F(TrainToolTest, ShardChangedSinceTheCheckpointIsRefusedOnResume) {
  const std::string shard = copy_of_fixture_shard(dir_, "changing");
  const std::string dir = run_dir("changing-run");
  const std::string config = shell_quote(write_config("changing")) + " run.dir=" + shell_quote(dir) +
                             " data.blend=" + shell_quote(shard);
  const CommandResult first = train(config + " train.exit_at_step=2");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_NE(read_all(checkpoint_dir(dir, 2) + "/state.json").find("\"shards\":[{\"prefix\":"), std::string::npos);

  const std::string original = read_all(shard + ".bin");
  rewrite_first_token(shard);
  const CommandResult changed = train(config);
  EXPECT_EQ(changed.exit_code, 1) << changed.output;
  EXPECT_TRUE(is_one_line(changed.output, "data shard '" + shard + "' changed since " + checkpoint_dir(dir, 2) +
                                              " was written: " + shard + ".bin holds other tokens"))
      << changed.output;
  EXPECT_NE(changed.output.find("HINT: resume with the shards the run was trained on"), std::string::npos);

  // The same bytes written anew (another modification time, as a copy to another
  // disk has) are the same shard: the run resumes.
  fs::remove(shard + ".bin");
  write_all(shard + ".bin", original);
  const CommandResult resumed = train(config);
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resuming from " + checkpoint_dir(dir, 2)), std::string::npos) << resumed.output;
}

TEST_F(TrainToolTest, ShardChangeIsAcceptedWithTheOverrideKnob) {
  const std::string shard = copy_of_fixture_shard(dir_, "override");
  const std::string dir = run_dir("override-run");
  const std::string config = shell_quote(write_config("override")) + " run.dir=" + shell_quote(dir) +
                             " data.blend=" + shell_quote(shard);
  ASSERT_EQ(train(config + " train.exit_at_step=2").exit_code, 0);
  rewrite_first_token(shard);
  const CommandResult resumed = train(config + " data.allow_changed_shards=true");
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resuming as data.allow_changed_shards=true says, although the data shard"),
            std::string::npos)
      << resumed.output;
}

}  // namespace

namespace {

// Document masking in a run (issue 40): the end-of-document token comes from the
// shard's sidecar, the loss is the mean over the global batch's counted positions, so
// a global batch of 8 as 2 micro-batches of 4 or 1 of 8 trains the same model (within
// float32's summation order), and the switches change the run.
TEST_F(TrainToolTest, DocumentMaskingTrainsTheSameModelForAnySplitOfTheGlobalBatch) {
  const std::string masking =
      " data.reset_position_ids=true data.reset_attention_mask=true data.eod_mask_loss=true"
      " train.steps=3 checkpoint.interval=0 eval.interval=3";
  const std::string config = shell_quote(write_config("documents"));
  const std::string split = run_dir("documents-split");
  const std::string whole = run_dir("documents-whole");
  const std::string plain = run_dir("documents-off");
  const CommandResult first = train(config + " run.dir=" + shell_quote(split) + masking);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  // The same 8 validation samples: 2 batches of 4, or 1 of 8.
  const CommandResult second =
      train(config + " run.dir=" + shell_quote(whole) + masking + " train.micro_batch=8 eval.batches=1");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  const CommandResult third =
      train(config + " run.dir=" + shell_quote(plain) + " train.steps=3 checkpoint.interval=0 eval.interval=3");
  ASSERT_EQ(third.exit_code, 0) << third.output;
  const std::vector<double> split_losses = dufu::testing::metric_values(split, "loss");
  const std::vector<double> whole_losses = dufu::testing::metric_values(whole, "loss");
  const std::vector<double> plain_losses = dufu::testing::metric_values(plain, "loss");
  ASSERT_EQ(split_losses.size(), 3u);
  ASSERT_EQ(whole_losses.size(), 3u);
  for (std::size_t i = 0; i < split_losses.size(); ++i) {
    EXPECT_NEAR(split_losses[i], whole_losses[i], 1e-5 * whole_losses[i]) << "step " << i + 1;
  }
  const std::vector<double> split_val = dufu::testing::metric_values(split, "val_loss");
  const std::vector<double> whole_val = dufu::testing::metric_values(whole, "val_loss");
  ASSERT_EQ(split_val.size(), 1u);
  ASSERT_EQ(whole_val.size(), 1u);
  EXPECT_NEAR(split_val[0], whole_val[0], 1e-5 * whole_val[0]);
  ASSERT_EQ(plain_losses.size(), 3u);
  EXPECT_GT(std::abs(plain_losses[0] - split_losses[0]), 1e-4) << "the switches did not change the loss";
  EXPECT_NE(read_all(split + "/config.toml").find("reset_attention_mask = true"), std::string::npos);
}

TEST_F(TrainToolTest, DocumentMaskingRefusesAnEndOfDocumentTokenOutsideTheVocabulary) {
  const std::string dir = run_dir("documents-bad-eod");
  const CommandResult result = train(shell_quote(write_config("documents-bad-eod")) + " run.dir=" + shell_quote(dir) +
                                     " data.reset_attention_mask=true data.eod_id=2000");
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_TRUE(is_one_line(result.output, "data.eod_id = 2000 is outside the model's vocabulary")) << result.output;
  EXPECT_FALSE(fs::exists(dir));
}

}  // namespace
