// What the tests of the train tool share (train_tool_test.cc,
// train_tool_resume_test.cc, train_tool_data_test.cc): a suite whose runs all read
// the fixture shard, training processes started in the background to be stopped, and
// reading what a run wrote and said.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "support/fortunes_shard.h"
#include "support/run_dir.h"
#include "support/temp_dir.h"
#include "support/tool_runner.h"

extern char** environ;

namespace train_tool_testing {

namespace fs = std::filesystem;
using dufu::testing::checkpoint_dir;
using dufu::testing::CommandResult;
using dufu::testing::file_exists;
using dufu::testing::fortunes_shard;
using dufu::testing::fortunes_shard_dir;
using dufu::testing::metric_fields;
using dufu::testing::read_all;
using dufu::testing::run_command;
using dufu::testing::shell_quote;
using dufu::testing::TempDir;
using dufu::testing::train_tool;
using dufu::testing::write_all;

// One shard and one index cache for the whole suite: every run reads the same data.
class TrainToolTest : public ::testing::Test {
 protected:

  // A small GPT on the fortunes shard; `extra` lines are appended to the TOML.
  std::string write_config(const std::string& name, const std::string& extra = "") {
    const std::string text =
        "[model]\nn_layer = 2\nn_head = 2\nd_model = 64\nvocab_size = 2000\nseq_length = 32\n"
        "[data]\nblend = \"" + fortunes_shard() + "\"\n" +
        "cache_dir = \"" + fortunes_shard_dir() + "/cache" + "\"\nsplit = \"90,10,0\"\nworkers = 2\n"
        "[train]\nmicro_batch = 4\nglobal_batch = 8\nsteps = 8\nthreads = 2\n"
        "[optim]\nlr = 3e-3\nmin_lr = 3e-4\nwarmup_steps = 2\n"
        "[eval]\ninterval = 4\nbatches = 2\n"
        "[checkpoint]\ninterval = 2\nkeep = 2\n" +
        extra;
    const std::string path = dir_.file(name + ".toml");
    write_all(path, text);
    return path;
  }

  std::string run_dir(const std::string& name) const { return dir_.file(name); }

  CommandResult train(const std::string& arguments) {
    return run_command(shell_quote(train_tool()) + " " + arguments);
  }

  // The "step", "loss", "grad_norm" and "val_loss" fields of every record, as written:
  // equal text is equal bits.
  static std::vector<std::string> loss_sequence(const std::string& dir) {
    return metric_fields(dir, {"step", "loss", "grad_norm", "val_loss"});
  }

  // The uninterrupted run every interrupted one is compared with.
  void expect_same_as_uninterrupted(const std::string& dir) {
    const std::string reference = run_dir("reference");
    if (!file_exists(reference + "/metrics.jsonl")) {
      const CommandResult result = train(shell_quote(write_config("reference")) + " run.dir=" + shell_quote(reference));
      ASSERT_EQ(result.exit_code, 0) << result.output;
    }
    const auto expected = loss_sequence(reference);
    ASSERT_EQ(expected.size(), 8u * 3 + 2u * 2);  // 8 steps x (step, loss, norm) + 2 evals x (step, val_loss)
    EXPECT_EQ(loss_sequence(dir), expected);
    for (const char* file : {"model.safetensors", "optimizer.safetensors"}) {
      EXPECT_TRUE(read_all(checkpoint_dir(dir, 8) + "/" + file) == read_all(checkpoint_dir(reference, 8) + "/" + file))
          << file << " differs from the uninterrupted run's";
    }
  }

  TempDir dir_;
};

// A training process started in the background, so the test can kill it.
class BackgroundTrain {
 public:
  explicit BackgroundTrain(const std::string& arguments, const std::string& log) {
    const std::string command = "exec " + shell_quote(train_tool()) + " " + arguments + " > " + shell_quote(log) + " 2>&1";
    const char* argv[] = {"sh", "-c", command.c_str(), nullptr};
    if (posix_spawn(&pid_, "/bin/sh", nullptr, nullptr, const_cast<char**>(argv), environ) != 0) pid_ = -1;
  }
  ~BackgroundTrain() {
    if (pid_ > 0 && !ended_) {
      kill(pid_, SIGKILL);
      wait();
    }
  }
  pid_t pid() const { return pid_; }
  // The wait status of the process (kept when running() saw it end).
  int wait() {
    if (pid_ > 0 && !ended_ && waitpid(pid_, &status_, 0) == pid_) ended_ = true;
    return status_;
  }
  bool running() {
    if (pid_ <= 0 || ended_) return false;
    if (waitpid(pid_, &status_, WNOHANG) == 0) return true;
    ended_ = true;
    return false;
  }

 private:
  pid_t pid_ = -1;
  bool ended_ = false;
  int status_ = 0;
};

// Lines of the file at `path` that contain `needle`.
inline int count_lines_with(const std::string& path, const std::string& needle) {
  std::ifstream in(path);
  std::string line;
  int count = 0;
  while (std::getline(in, line)) count += line.find(needle) != std::string::npos;
  return count;
}

// Whether `needle` is in a line of `output` that is the tool's error line.
inline bool is_one_line(const std::string& output, const std::string& needle) {
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.starts_with("train: error: ") && line.find(needle) != std::string::npos) return true;
  }
  return false;
}

}  // namespace train_tool_testing
