// `train` end to end on real shards (the fixture corpus tokenized by `dataprep
// preprocess`): a run's loss falls; stopping and resuming - by train.exit_at_step,
// SIGTERM, SIGKILL mid-step or SIGKILL mid-checkpoint - gives the loss sequence and
// final weights of the uninterrupted run bit for bit; a corrupt newest checkpoint is
// refused and the previous one used; configuration errors and non-finite losses stop
// with clear messages. And what must never happen to a run (issue 15): a run
// directory whose checkpoints are all unusable is not started over, leftovers of dead
// processes are removed by the next run, non-finite hyper-parameters are refused and
// no checkpoint with non-finite weights is published, a shard truncated under the run
// or changed since its checkpoint is named in one line, a model too large for the
// machine is refused naming what does not fit, and a bad command line is one line
// with status 1.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "dufu/common/file_lock.h"
#include "dufu/trainer/device/device.h"
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
  // The memory plan, before the first step.
  EXPECT_LT(result.output.find("memory plan of this rank: weights "), result.output.find("step 1/30")) << result.output;
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

// Without a usable CUDA device the reason is the device layer's own,
// in one line, and nothing is created; a misspelt device is refused naming the knob.
TEST_F(TrainToolTest, CudaDeviceIsRefusedWithTheReason) {
  const CommandResult misspelt = train(shell_quote(write_config("cuda")) + " train.device=gpu");
  EXPECT_EQ(misspelt.exit_code, 1);
  EXPECT_NE(misspelt.output.find("train.device: unknown device 'gpu'"), std::string::npos) << misspelt.output;
  const dufu::trainer::DeviceAvailability availability =
      dufu::trainer::device_availability(dufu::trainer::DeviceKind::kCuda);
  if (availability.available) GTEST_SKIP() << "a CUDA device is here, so train.device=cuda trains";
  const std::string dir = run_dir("cuda");
  const CommandResult cuda =
      train(shell_quote(write_config("cuda")) + " train.device=cuda run.dir=" + shell_quote(dir));
  EXPECT_EQ(cuda.exit_code, 1) << cuda.output;
  EXPECT_NE(cuda.output.find("train.device = \"cuda\": " + availability.reason), std::string::npos) << cuda.output;
  EXPECT_EQ(std::count(cuda.output.begin(), cuda.output.end(), '\n'), 1) << cuda.output;
  EXPECT_FALSE(std::filesystem::exists(dir));
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

namespace {

// ---- never lose a run (issue 15) ----

// Every file under `dir` with its bytes, to compare a directory before and after.
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) files[fs::relative(entry.path(), dir).string()] = read_all(entry.path().string());
  }
  return files;
}

// Whether `needle` is in a line of `output` that is the tool's error line.
bool is_one_line(const std::string& output, const std::string& needle) {
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.starts_with("train: error: ") && line.find(needle) != std::string::npos) return true;
  }
  return false;
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

TEST_F(TrainToolTest, NonFiniteHyperParametersAreRefusedNamingTheKnob) {
  const std::string config = shell_quote(write_config("nonfinite"));
  for (const std::string knob : {"optim.lr=inf", "optim.lr=nan", "optim.min_lr=-inf", "optim.beta1=nan",
                                  "optim.eps=inf", "optim.weight_decay=nan", "optim.grad_clip=inf"}) {
    const std::string dir = run_dir("nonfinite");
    const CommandResult result = train(config + " run.dir=" + shell_quote(dir) + " " + knob);
    EXPECT_EQ(result.exit_code, 1) << knob << ": " << result.output;
    const std::string name = knob.substr(0, knob.find('='));
    EXPECT_TRUE(is_one_line(result.output, name + " must be a finite number")) << knob << ": " << result.output;
    EXPECT_FALSE(file_exists(dir + "/checkpoints")) << knob;
  }
  // Finite as a double, infinite as the float the optimizer computes in.
  const CommandResult beyond = train(config + " run.dir=" + shell_quote(run_dir("beyond")) + " optim.lr=1e39");
  EXPECT_EQ(beyond.exit_code, 1) << beyond.output;
  EXPECT_TRUE(is_one_line(beyond.output, "optim.lr is 1e+39, beyond the float range")) << beyond.output;
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

// A copy of the fixture shard that a test may damage.
std::string copy_of_fixture_shard(const TempDir& dir, const std::string& name) {
  for (const char* extension : {".bin", ".idx"}) fs::copy_file(fortunes_shard() + extension, dir.file(name) + extension);
  return dir.file(name);
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

// Token ids rewritten in place at the start of the .bin: the sizes and the index stay
// what they were, so only the shard's identity in the checkpoint tells.
void rewrite_first_token(const std::string& shard) {
  std::fstream bin(shard + ".bin", std::ios::binary | std::ios::in | std::ios::out);
  char byte = 0;
  bin.read(&byte, 1);
  bin.seekp(0);
  bin.put(static_cast<char>(byte ^ 1));
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

TEST_F(TrainToolTest, SizesBeyondTheMachinesMemoryAreRefusedNamingWhat) {
  // Refused from the sizes before anything is allocated (the address-space limit,
  // where the sanitizers allow one, keeps a regression from reaching the OOM killer).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  const std::string limit;
#else
  const std::string limit = "ulimit -v 16000000; ";
#endif
  const std::string config = shell_quote(write_config("memory"));
  const CommandResult model = run_command(limit + shell_quote(train_tool()) + " " + config + " run.dir=" +
                                          shell_quote(run_dir("memory")) + " model.d_model=65536 model.n_head=1");
  EXPECT_EQ(model.exit_code, 1) << model.output;
  EXPECT_TRUE(is_one_line(model.output, "not enough memory for the model (")) << model.output;
  EXPECT_NE(model.output.find("(needs "), std::string::npos) << model.output;
  const CommandResult batch =
      run_command(limit + shell_quote(train_tool()) + " " + config + " run.dir=" + shell_quote(run_dir("memory")) +
                  " train.micro_batch=100000000 train.global_batch=0 train.steps=2");
  EXPECT_EQ(batch.exit_code, 1) << batch.output;
  EXPECT_TRUE(is_one_line(batch.output, "not enough memory for the model (")) << batch.output;
  EXPECT_NE(batch.output.find("the activations of 1 micro-batch of 100000000 x 32 tokens"), std::string::npos)
      << batch.output;
}

TEST_F(TrainToolTest, CommandLineErrorsAreOneLineWithStatus1) {
  for (const std::string& arguments : {std::string("--bogus"), std::string("generate --max-tokens x"),
                                       std::string("plot"), std::string("generate --top-k 1e999")}) {
    const CommandResult result = train(arguments);
    EXPECT_EQ(result.exit_code, 1) << arguments << ": " << result.output;
    EXPECT_EQ(result.output.rfind("train: error: ", 0), 0u) << arguments << ": " << result.output;
    EXPECT_EQ(std::count(result.output.begin(), result.output.end(), '\n'), 1) << arguments << ": " << result.output;
  }
  EXPECT_EQ(train("--help").exit_code, 0);
  EXPECT_EQ(train("--version").exit_code, 0);
}

}  // namespace
