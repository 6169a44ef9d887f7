// Issue 44, "never lose a run", on the train process: SIGTERM sent more than once (as
// `timeout` and Slurm do) is still one orderly stop with a complete checkpoint; a run
// SIGKILLed while checkpoint.keep prunes an old checkpoint leaves no directory under a
// checkpoint's name that is not a whole checkpoint, and the next run cleans up and
// keeps `keep`; train.exit_at_step at or before the step a run resumes from is refused
// before anything is written.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "train_tool_fixture.h"

namespace {

using namespace train_tool_testing;  // the suite and helpers the train tool's tests share
namespace fs = std::filesystem;

// The names in RUN_DIR/checkpoints.
std::set<std::string> checkpoint_names(const std::string& dir) {
  std::set<std::string> names;
  std::error_code ignored;
  for (const auto& entry : fs::directory_iterator(dir + "/checkpoints", ignored)) {
    names.insert(entry.path().filename().string());
  }
  return names;
}

// Whether `name` is a checkpoint's own name (step_ and digits only).
bool is_step_name(const std::string& name) {
  return name.starts_with("step_") && name.size() > 5 && name.find_first_not_of("0123456789", 5) == std::string::npos;
}

// A whole serial checkpoint: what save_checkpoint writes, state.json last.
bool is_whole_checkpoint(const std::string& path) {
  for (const char* file : {"state.json", "config.toml", "model.safetensors", "optimizer.safetensors"}) {
    if (!file_exists(path + "/" + file)) return false;
  }
  return true;
}

// Every file under `dir` with its bytes, to compare a directory before and after.
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) files[fs::relative(entry.path(), dir).string()] = read_all(entry.path().string());
  }
  return files;
}

// The stop a signal asked for: status 130, "stopped by a signal", a complete
// checkpoint of the last step logged, and no partial directory.
void expect_orderly_stop(const std::string& dir, int exit_status, const std::string& log) {
  EXPECT_EQ(exit_status, 130) << log;
  EXPECT_NE(log.find("stopped by a signal at step "), std::string::npos) << log;
  const int steps = count_lines_with(dir + "/metrics.jsonl", "\"type\":\"train\"");
  ASSERT_GT(steps, 0) << log;
  EXPECT_TRUE(is_whole_checkpoint(checkpoint_dir(dir, steps)))
      << "no final checkpoint of step " << steps << "\n" << log;
  for (const std::string& name : checkpoint_names(dir)) {
    EXPECT_EQ(name.find(".partial-"), std::string::npos) << name << " left\n" << log;
  }
}

TEST_F(TrainToolTest, SigtermFromTimeoutIsOneOrderlyStop) {
  // timeout signals the command, then its whole process group: train gets SIGTERM twice.
  const std::string dir = run_dir("timeout");
  const CommandResult result =
      run_command("timeout --preserve-status -s TERM 3 " + shell_quote(train_tool()) + " " +
                  shell_quote(write_config("timeout")) + " run.dir=" + shell_quote(dir) +
                  " train.steps=100000 checkpoint.interval=0 eval.interval=0");
  expect_orderly_stop(dir, result.exit_code, result.output);
}

TEST_F(TrainToolTest, SigtermsUntilItExitsAreOneOrderlyStop) {
  // A SIGTERM every few milliseconds until the process is gone: the first is handled
  // before the next arrives (signals sent while one is pending merge into one), so the
  // stop, the checkpoint and the exit all happen under further SIGTERMs.
  const std::string dir = run_dir("sigterms");
  const std::string log = dir_.file("sigterms.log");
  BackgroundTrain run(shell_quote(write_config("sigterms")) + " run.dir=" + shell_quote(dir) +
                          " train.steps=100000 checkpoint.interval=0 eval.interval=0",
                      log);
  while (run.running() && count_lines_with(dir + "/metrics.jsonl", "\"type\":\"train\"") < 2) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  int sent = 0;
  for (; run.running() && sent < 5000; ++sent) {
    kill(run.pid(), SIGTERM);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const int status = run.wait();
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status) << " after " << sent << " SIGTERMs\n"
                                 << read_all(log);
  expect_orderly_stop(dir, WEXITSTATUS(status), read_all(log));
}

TEST_F(TrainToolTest, KilledWhilePruningLeavesNoHalfCheckpointAndTheNextRunCleansUp) {
  // keep = 1 and a checkpoint every step: each save prunes the one before. Each run
  // resumes from the newest checkpoint and is killed at a random moment once pruning
  // of that checkpoint has begun (a file of it, or the directory, is gone).
  const std::string dir = run_dir("pruning");
  const std::string arguments = shell_quote(write_config("pruning")) + " run.dir=" + shell_quote(dir) +
                                " train.steps=100000 checkpoint.interval=1 checkpoint.keep=1 eval.interval=0";
  const CommandResult first = train(arguments + " train.exit_at_step=1");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  std::mt19937 random(44);
  std::uniform_int_distribution<int> delay_us(0, 400);
  int killed_mid_prune = 0;
  for (int attempt = 0; attempt < 20; ++attempt) {
    std::string oldest;
    for (const std::string& name : checkpoint_names(dir)) {
      if (is_step_name(name) && is_whole_checkpoint(dir + "/checkpoints/" + name)) oldest = name;
    }
    ASSERT_FALSE(oldest.empty()) << "no checkpoint to resume from before attempt " << attempt;
    const std::string pruned = dir + "/checkpoints/" + oldest;
    BackgroundTrain run(arguments, dir_.file("pruning.log"));
    while (run.running() && is_whole_checkpoint(pruned)) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us(random)));
    if (run.running()) kill(run.pid(), SIGKILL);
    run.wait();
    // Nothing under a checkpoint's name is anything but a whole checkpoint.
    for (const std::string& name : checkpoint_names(dir)) {
      if (!is_step_name(name)) {
        killed_mid_prune += name.find(".pruning-") != std::string::npos;
        continue;
      }
      ASSERT_TRUE(is_whole_checkpoint(dir + "/checkpoints/" + name))
          << name << " is half deleted after attempt " << attempt << "\n"
          << read_all(dir_.file("pruning.log"));
    }
  }
  RecordProperty("runs_killed_mid_prune", killed_mid_prune);
  // The next run removes what pruning left, saying so, and keeps one checkpoint. (A
  // run also removes what earlier kills left, so only a leftover of the last attempt is
  // still there to be named.)
  int newest = 0;
  bool pruning_left = false;
  for (const std::string& name : checkpoint_names(dir)) {
    if (is_step_name(name)) newest = std::max(newest, std::stoi(name.substr(5)));
    pruning_left = pruning_left || name.find(".pruning-") != std::string::npos;
  }
  const CommandResult last = train(arguments + " train.exit_at_step=" + std::to_string(newest + 1));
  ASSERT_EQ(last.exit_code, 0) << last.output;
  if (pruning_left) {
    EXPECT_NE(last.output.find("half-pruned checkpoint"), std::string::npos) << last.output;
  }
  const std::string kept = fs::path(checkpoint_dir(dir, newest + 1)).filename().string();
  EXPECT_EQ(checkpoint_names(dir), std::set<std::string>{kept}) << last.output;
}

TEST_F(TrainToolTest, HalfPrunedCheckpointOfAnEarlierVersionIsRemovedByTheNextSave) {
  // What a kill in the middle of pruning left before pruning renamed first: the old
  // checkpoint under its own name, without state.json.
  const std::string dir = run_dir("half-pruned");
  const std::string arguments = shell_quote(write_config("half-pruned")) + " run.dir=" + shell_quote(dir);
  const CommandResult first = train(arguments + " train.exit_at_step=4");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  fs::remove(checkpoint_dir(dir, 2) + "/state.json");
  fs::remove(checkpoint_dir(dir, 2) + "/model.safetensors");
  const CommandResult next = train(arguments + " train.exit_at_step=6");
  ASSERT_EQ(next.exit_code, 0) << next.output;
  EXPECT_NE(next.output.find("removing half-pruned checkpoint '" + checkpoint_dir(dir, 2) + "'"), std::string::npos)
      << next.output;
  EXPECT_EQ(checkpoint_names(dir), (std::set<std::string>{"step_00000004", "step_00000006"})) << next.output;
}

TEST_F(TrainToolTest, ExitAtStepNotAfterTheResumedStepIsRefused) {
  const std::string dir = run_dir("exit-at");
  const std::string arguments = shell_quote(write_config("exit-at")) + " run.dir=" + shell_quote(dir);
  const CommandResult first = train(arguments + " train.exit_at_step=4");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const auto before = snapshot(dir);
  for (const int exit_at : {4, 3}) {
    const CommandResult again = train(arguments + " train.exit_at_step=" + std::to_string(exit_at));
    EXPECT_EQ(again.exit_code, 1) << again.output;
    EXPECT_TRUE(is_one_line(again.output, "train.exit_at_step = " + std::to_string(exit_at))) << again.output;
    EXPECT_TRUE(is_one_line(again.output, "step 4")) << again.output;
    EXPECT_EQ(again.output.find("step 5/8"), std::string::npos) << "trained on: " << again.output;
    EXPECT_TRUE(snapshot(dir) == before) << "the run directory changed: " << again.output;
  }
}

}  // namespace
