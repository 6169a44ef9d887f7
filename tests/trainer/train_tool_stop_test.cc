// Issue 44, "never lose a run", on the train process: SIGTERM sent more than once (as
// `timeout` and Slurm do) is still one orderly stop with a complete checkpoint.
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

// A whole serial checkpoint: what save_checkpoint writes, state.json last.
bool is_whole_checkpoint(const std::string& path) {
  for (const char* file : {"state.json", "config.toml", "model.safetensors", "optimizer.safetensors"}) {
    if (!file_exists(path + "/" + file)) return false;
  }
  return true;
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

}  // namespace
