// Stopping and resuming `train`: by train.exit_at_step, SIGTERM, SIGKILL mid-step or
// SIGKILL mid-checkpoint, the resumed run gives the loss sequence and final weights of
// the uninterrupted run bit for bit; a corrupt newest checkpoint is refused and the
// previous one used. And what must never happen to a run's checkpoints (issue 15): a
// run directory whose checkpoints are all unusable is not started over, leftovers of
// dead processes are removed by the next run, and no checkpoint with non-finite
// weights is published.
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

// Whether a checkpoint is being written in run directory `dir`.
bool has_partial_checkpoint(const std::string& dir) {
  std::error_code ignored;
  for (const auto& entry : fs::directory_iterator(dir + "/checkpoints", ignored)) {
    if (entry.path().filename().string().find(".partial-") != std::string::npos) return true;
  }
  return false;
}

// Every file under `dir` with its bytes, to compare a directory before and after.
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) files[fs::relative(entry.path(), dir).string()] = read_all(entry.path().string());
  }
  return files;
}

TEST_F(TrainToolTest, ResumeAfterExitAtStepIsBitwiseIdentical) {
  const std::string dir = run_dir("split");
  const std::string config = shell_quote(write_config("split"));
  CommandResult first = train(config + " run.dir=" + shell_quote(dir) + " train.exit_at_step=3");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_NE(first.output.find("stopping at step 3"), std::string::npos) << first.output;
  EXPECT_TRUE(file_exists(checkpoint_dir(dir, 3) + "/state.json"));
  // --resume with the checkpoint's own configuration (no config file).
  CommandResult second = train("--resume " + shell_quote(dir) + " train.exit_at_step=0");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find("step 4/8"), std::string::npos) << second.output;
  EXPECT_EQ(second.output.find("step 3/8"), std::string::npos) << second.output;
  expect_same_as_uninterrupted(dir);
}

TEST_F(TrainToolTest, SigtermSavesACheckpointAndResumesIdentically) {
  const std::string dir = run_dir("sigterm");
  const std::string arguments = shell_quote(write_config("sigterm")) + " run.dir=" + shell_quote(dir) +
                                " checkpoint.interval=0";
  {
    BackgroundTrain run(arguments, dir_.file("sigterm.log"));
    while (run.running() && count_lines_with(dir + "/metrics.jsonl", "\"type\":\"train\"") < 3) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    kill(run.pid(), SIGTERM);
    const int status = run.wait();
    ASSERT_TRUE(WIFEXITED(status)) << read_all(dir_.file("sigterm.log"));
    EXPECT_EQ(WEXITSTATUS(status), 130) << read_all(dir_.file("sigterm.log"));
  }
  EXPECT_NE(read_all(dir_.file("sigterm.log")).find("stopped by a signal"), std::string::npos);
  const CommandResult resumed = train(arguments);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  expect_same_as_uninterrupted(dir);
}

TEST_F(TrainToolTest, SigkillMidStepResumesIdentically) {
  const std::string dir = run_dir("killed");
  const std::string arguments = shell_quote(write_config("killed")) + " run.dir=" + shell_quote(dir);
  {
    BackgroundTrain run(arguments, dir_.file("killed.log"));
    // Killed after step 5 is logged: step 6 is under way, the newest checkpoint is 4.
    while (run.running() && count_lines_with(dir + "/metrics.jsonl", "\"type\":\"train\"") < 5) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    kill(run.pid(), SIGKILL);
    run.wait();
  }
  ASSERT_FALSE(file_exists(checkpoint_dir(dir, 8))) << read_all(dir_.file("killed.log"));
  const CommandResult resumed = train(arguments);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resuming from"), std::string::npos) << resumed.output;
  expect_same_as_uninterrupted(dir);
}

TEST_F(TrainToolTest, SigkillMidCheckpointResumesIdentically) {
  // A run that is killed while a checkpoint directory is still partial; tried a few
  // times, since the kill must land inside the write.
  bool killed_inside = false;
  std::string dir;
  std::string arguments;
  for (int attempt = 0; attempt < 8 && !killed_inside; ++attempt) {
    dir = run_dir("midcheckpoint" + std::to_string(attempt));
    arguments = shell_quote(write_config("midcheckpoint")) + " run.dir=" + shell_quote(dir);
    BackgroundTrain run(arguments, dir_.file("midcheckpoint.log"));
    // Skip the first checkpoint (step 2) so one complete checkpoint exists before.
    while (run.running() && !file_exists(checkpoint_dir(dir, 2) + "/state.json")) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    while (run.running() && !has_partial_checkpoint(dir)) std::this_thread::yield();
    kill(run.pid(), SIGKILL);
    run.wait();
    killed_inside = has_partial_checkpoint(dir) && !file_exists(checkpoint_dir(dir, 8));
  }
  ASSERT_TRUE(killed_inside) << "never caught a checkpoint mid-write in 8 attempts";
  const CommandResult resumed = train(arguments);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_FALSE(has_partial_checkpoint(dir)) << "the partial checkpoint was not cleaned up";
  expect_same_as_uninterrupted(dir);
}

TEST_F(TrainToolTest, CorruptNewestCheckpointIsRefusedAndThePreviousUsed) {
  const std::string dir = run_dir("corrupt");
  const std::string config = shell_quote(write_config("corrupt"));
  const CommandResult first = train(config + " run.dir=" + shell_quote(dir) + " train.exit_at_step=6");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  // Truncate the newest checkpoint's weights.
  const std::string weights = checkpoint_dir(dir, 6) + "/model.safetensors";
  fs::resize_file(weights, fs::file_size(weights) / 2);
  const CommandResult resumed = train(config + " run.dir=" + shell_quote(dir));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("step_00000006"), std::string::npos) << resumed.output;
  EXPECT_NE(resumed.output.find("model.safetensors"), std::string::npos) << resumed.output;
  EXPECT_NE(resumed.output.find("resuming from " + checkpoint_dir(dir, 4)), std::string::npos) << resumed.output;
  expect_same_as_uninterrupted(dir);

  // Named explicitly, a corrupt checkpoint is an error.
  const std::string bad = checkpoint_dir(dir, 8) + "/optimizer.safetensors";
  fs::resize_file(bad, 100);
  const CommandResult refused = train("--resume " + shell_quote(checkpoint_dir(dir, 8)));
  EXPECT_EQ(refused.exit_code, 1) << refused.output;
  EXPECT_NE(refused.output.find("optimizer.safetensors"), std::string::npos) << refused.output;
}

TEST_F(TrainToolTest, RunWhoseCheckpointsAreAllUnusableIsNotStartedOver) {
  const std::string dir = run_dir("unusable");
  const std::string config = shell_quote(write_config("unusable")) + " run.dir=" + shell_quote(dir);
  const CommandResult first = train(config + " train.exit_at_step=4");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  // Both checkpoints (2 and 4) lose their state.json, as a bad copy or a damaged disk
  // leaves them.
  const std::string state_of_2 = read_all(checkpoint_dir(dir, 2) + "/state.json");
  fs::remove(checkpoint_dir(dir, 2) + "/state.json");
  fs::remove(checkpoint_dir(dir, 4) + "/state.json");
  const auto before = snapshot(dir + "/checkpoints");
  const CommandResult again = train(config);
  EXPECT_EQ(again.exit_code, 1) << again.output;
  EXPECT_TRUE(is_one_line(again.output, "none of its 2 checkpoints verifies")) << again.output;
  EXPECT_NE(again.output.find(checkpoint_dir(dir, 4) + ": it has no state.json"), std::string::npos) << again.output;
  EXPECT_NE(again.output.find("HINT: restore a good checkpoint there, or remove " + dir + "/checkpoints"),
            std::string::npos)
      << again.output;
  EXPECT_EQ(again.output.find("step 1/8"), std::string::npos) << "started over: " << again.output;
  EXPECT_TRUE(snapshot(dir + "/checkpoints") == before) << "the checkpoints changed";

  // With one usable checkpoint the run resumes from it, naming the one skipped.
  write_all(checkpoint_dir(dir, 2) + "/state.json", state_of_2);
  const CommandResult resumed = train(config);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("skipping checkpoint '" + checkpoint_dir(dir, 4) + "'"), std::string::npos)
      << resumed.output;
  EXPECT_NE(resumed.output.find("resuming from " + checkpoint_dir(dir, 2)), std::string::npos) << resumed.output;
}

TEST_F(TrainToolTest, LeftoversOfDeadProcessesAreRemovedByTheNextRun) {
  const std::string dir = run_dir("leftovers");
  const std::string config = shell_quote(write_config("leftovers")) + " run.dir=" + shell_quote(dir);
  const CommandResult first = train(config);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  // What processes killed while saving leave: a partial checkpoint, and a checkpoint
  // moved aside for a new version of its step, once with the new version in place
  // and once without (killed between the two renames: it is put back).
  const std::string checkpoints = dir + "/checkpoints";
  fs::create_directories(checkpoints + "/step_00000010.partial-4194303");
  write_all(checkpoints + "/step_00000010.partial-4194303/model.safetensors", "half a file");
  fs::copy(checkpoint_dir(dir, 8), checkpoints + "/step_00000008.replaced-4194302");
  fs::rename(checkpoint_dir(dir, 6), checkpoints + "/step_00000006.replaced-4194301");
  const auto kept = snapshot(checkpoint_dir(dir, 8));
  const auto moved = snapshot(checkpoints + "/step_00000006.replaced-4194301");
  // The next run has nothing to do, and still cleans up.
  const CommandResult again = train(config);
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("nothing to do"), std::string::npos) << again.output;
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(checkpoints)) names.insert(entry.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"step_00000006", "step_00000008"})) << again.output;
  EXPECT_TRUE(snapshot(checkpoint_dir(dir, 8)) == kept);
  EXPECT_TRUE(snapshot(checkpoint_dir(dir, 6)) == moved);
}

TEST_F(TrainToolTest, CheckpointWithNonFiniteWeightsIsNeverPublished) {
  // A finite but absurd rate makes every weight infinite at the first update, while
  // the loss and gradient of that step are still finite. (A vocabulary without
  // padding rows, so nothing else stops the save first.)
  const std::string dir = run_dir("infinite-weights");
  const CommandResult result =
      train(shell_quote(write_config("infinite-weights")) + " run.dir=" + shell_quote(dir) +
            " model.vocab_size=2048 optim.lr=1e38 optim.warmup_steps=0 optim.min_lr=0 checkpoint.interval=1");
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_TRUE(is_one_line(result.output, "checkpoint of step 1: model.safetensors: ")) << result.output;
  EXPECT_NE(result.output.find("weights are not finite (the first in wte.weight"), std::string::npos)
      << result.output;
  std::set<std::string> left;
  for (const auto& entry : fs::directory_iterator(dir + "/checkpoints")) left.insert(entry.path().string());
  EXPECT_TRUE(left.empty()) << *left.begin();
}

}  // namespace
