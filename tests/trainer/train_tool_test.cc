// `train` end to end on real shards (the fixture corpus tokenized by `dataprep
// preprocess`): a run's loss falls; stopping and resuming - by train.exit_at_step,
// SIGTERM, SIGKILL mid-step or SIGKILL mid-checkpoint - gives the loss sequence and
// final weights of the uninterrupted run bit for bit; a corrupt newest checkpoint is
// refused and the previous one used; configuration errors and non-finite losses stop
// with clear messages.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dufu/common/file_lock.h"
#include "support/float_compare.h"
#include "support/fortunes_shard.h"
#include "support/run_dir.h"
#include "support/temp_dir.h"
#include "support/tool_runner.h"

extern char** environ;

namespace {

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
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      wait();
    }
  }
  pid_t pid() const { return pid_; }
  int wait() {
    int status = 0;
    if (pid_ > 0 && waitpid(pid_, &status, 0) == pid_) pid_ = -1;
    return status;
  }
  bool running() {
    int status = 0;
    return pid_ > 0 && waitpid(pid_, &status, WNOHANG) == 0;
  }

 private:
  pid_t pid_ = -1;
};

int count_lines_with(const std::string& path, const std::string& needle) {
  std::ifstream in(path);
  std::string line;
  int count = 0;
  while (std::getline(in, line)) count += line.find(needle) != std::string::npos;
  return count;
}

bool has_partial_checkpoint(const std::string& dir) {
  std::error_code ignored;
  for (const auto& entry : fs::directory_iterator(dir + "/checkpoints", ignored)) {
    if (entry.path().filename().string().find(".partial-") != std::string::npos) return true;
  }
  return false;
}

TEST_F(TrainToolTest, TrainsEvaluatesAndCheckpoints) {
  const std::string dir = run_dir("run");
  const CommandResult result =
      train(shell_quote(write_config("run")) + " run.dir=" + shell_quote(dir) + " train.steps=30 eval.interval=10");
  ASSERT_EQ(result.exit_code, 0) << result.output;
  // The effective configuration, the step lines and the evaluations are printed.
  EXPECT_NE(result.output.find("# effective configuration"), std::string::npos);
  EXPECT_NE(result.output.find("steps = 30"), std::string::npos);
  EXPECT_NE(result.output.find("step 30/30 | loss "), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("MFU "), std::string::npos);
  EXPECT_NE(result.output.find("eval at step 20 | val loss "), std::string::npos);
  EXPECT_EQ(count_lines_with(dir + "/metrics.jsonl", "\"type\":\"train\""), 30);
  EXPECT_EQ(count_lines_with(dir + "/metrics.jsonl", "\"type\":\"eval\""), 3);
  EXPECT_TRUE(file_exists(dir + "/config.toml"));
  // keep = 2: only the newest two of the checkpoints at 2, 4, ..., 30 remain.
  EXPECT_FALSE(file_exists(checkpoint_dir(dir, 26)));
  EXPECT_TRUE(file_exists(checkpoint_dir(dir, 28) + "/state.json"));
  EXPECT_TRUE(file_exists(checkpoint_dir(dir, 30) + "/model.safetensors"));
  // The loss falls from ln(2000) ~ 7.6 at the start.
  const auto losses = loss_sequence(dir);
  const double first = std::stod(losses[1].substr(losses[1].find(':') + 1));
  double last = 0;
  for (const auto& value : losses) {
    if (value.starts_with("\"loss\":")) last = std::stod(value.substr(7));
  }
  EXPECT_GT(first, 7.0);
  EXPECT_LT(last, first - 0.5);
  // Perplexity is exp(val_loss).
  const std::string metrics = read_all(dir + "/metrics.jsonl");
  const auto eval_at = metrics.find("\"val_loss\":");
  const double val_loss = std::stod(metrics.substr(eval_at + 11));
  const double perplexity = std::stod(metrics.substr(metrics.find("\"val_perplexity\":", eval_at) + 17));
  EXPECT_RELATIVE_NEAR(std::exp(val_loss), perplexity, 1e-9);

  // Running it again finds the finished run and does nothing.
  const CommandResult again = train(shell_quote(write_config("run")) + " run.dir=" + shell_quote(dir) +
                                    " train.steps=30 eval.interval=10");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("nothing to do: the run is at step 30 of 30"), std::string::npos) << again.output;
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

TEST_F(TrainToolTest, ConfigurationErrorsAreClear) {
  const std::string config = shell_quote(write_config("errors"));
  const CommandResult unknown = train(config + " model.nlayer=3");
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_NE(unknown.output.find("did you mean \"model.n_layer\""), std::string::npos) << unknown.output;
  const CommandResult wrong_type = train(config + " optim.lr=fast");
  EXPECT_EQ(wrong_type.exit_code, 1);
  EXPECT_NE(wrong_type.output.find("optim.lr: expected a number"), std::string::npos) << wrong_type.output;
  const CommandResult not_override = train(config + " model.n_layer");
  EXPECT_EQ(not_override.exit_code, 1);
  EXPECT_NE(not_override.output.find("key=value"), std::string::npos) << not_override.output;
  write_all(dir_.file("broken.toml"), "[model]\nn_layer = = 3\n");
  const CommandResult syntax = train(shell_quote(dir_.file("broken.toml")));
  EXPECT_EQ(syntax.exit_code, 1);
  EXPECT_NE(syntax.output.find("broken.toml:2:"), std::string::npos) << syntax.output;
  const CommandResult missing_data = train(config + " data.blend=" + shell_quote(dir_.file("nothing")));
  EXPECT_EQ(missing_data.exit_code, 1);
  EXPECT_NE(missing_data.output.find("nothing"), std::string::npos) << missing_data.output;
  const CommandResult no_config = train("");
  EXPECT_EQ(no_config.exit_code, 1);
  EXPECT_NE(no_config.output.find("no configuration"), std::string::npos) << no_config.output;
  // --help lists every knob with its help.
  const CommandResult help = train("--help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.output.find("optim.warmup_steps"), std::string::npos) << help.output;
  EXPECT_NE(help.output.find("train.on_nonfinite"), std::string::npos);
  // --print-config shows the effective values.
  const CommandResult printed = train(config + " optim.lr=0.5 --print-config");
  EXPECT_EQ(printed.exit_code, 0) << printed.output;
  EXPECT_NE(printed.output.find("lr = 0.5"), std::string::npos) << printed.output;
}

TEST_F(TrainToolTest, NonFiniteLossStopsNamingTheStepOrIsSkipped) {
  // A learning rate of 1e30 blows the weights up within a step or two.
  const std::string config = shell_quote(write_config("nan")) + " optim.lr=1e30 optim.min_lr=0 optim.warmup_steps=0";
  const CommandResult stopped = train(config + " run.dir=" + shell_quote(run_dir("nan-stop")));
  EXPECT_EQ(stopped.exit_code, 1) << stopped.output;
  EXPECT_NE(stopped.output.find("train: error: step "), std::string::npos) << stopped.output;
  EXPECT_NE(stopped.output.find("train.on_nonfinite=skip"), std::string::npos) << stopped.output;
  const CommandResult skipped =
      train(config + " run.dir=" + shell_quote(run_dir("nan-skip")) + " train.on_nonfinite=skip");
  EXPECT_EQ(skipped.exit_code, 0) << skipped.output;
  EXPECT_NE(skipped.output.find("| skipped"), std::string::npos) << skipped.output;
  EXPECT_GT(count_lines_with(run_dir("nan-skip") + "/metrics.jsonl", "\"skipped\":true"), 0);
}

TEST_F(TrainToolTest, RunDirectoryInUseIsRefused) {
  const std::string dir = run_dir("locked");
  fs::create_directories(dir);
  dufu::FileLock held(dir + "/.lock");
  const CommandResult result = train(shell_quote(write_config("locked")) + " run.dir=" + shell_quote(dir));
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.output.find("is in use by another training process"), std::string::npos) << result.output;
}

}  // namespace
