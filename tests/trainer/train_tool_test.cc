// `train` end to end on real shards (the fixture corpus tokenized by `dataprep
// preprocess`): a run's loss falls and it evaluates and checkpoints; configuration
// errors, an unavailable device, non-finite losses and hyper-parameters, a run
// directory in use or one that cannot be a directory, and a model too large for the
// machine stop with clear messages naming what is wrong, and a bad command line is
// one line with status 1. Stopping and resuming is train_tool_resume_test.cc's, the
// data changing under a run train_tool_data_test.cc's.
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

#include "dufu/common/file_lock.h"
#include "dufu/trainer/device/device.h"
#include "support/float_compare.h"
#include "train_tool_fixture.h"

namespace {

using namespace train_tool_testing;  // the suite and helpers the train tool's tests share
namespace fs = std::filesystem;

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
  EXPECT_NE(misspelt.output.find("train.device must be \"cpu\" or \"cuda\", got \"gpu\""), std::string::npos) << misspelt.output;
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

TEST_F(TrainToolTest, RunDirectoryThatCannotBeOneIsRefusedNamingRunDir) {
  const std::string config = shell_quote(write_config("not-a-dir"));
  const std::string file = dir_.file("a-file");
  write_all(file, "not a run\n");
  const auto expect_refused = [&](const std::string& prefix, const std::string& run_dir, const std::string& reason) {
    const CommandResult result = run_command(prefix + shell_quote(train_tool()) + " " + config +
                                             " run.dir=" + shell_quote(run_dir));
    EXPECT_EQ(result.exit_code, 1) << result.output;
    EXPECT_TRUE(is_one_line(result.output, "run.dir " + run_dir + ": " + reason)) << result.output;
    EXPECT_EQ(result.output.find("unexpected error"), std::string::npos) << result.output;
  };
  expect_refused("", file, "is a file, not a directory");
  expect_refused("", file + "/run", "cannot create it: " + file + " is a file, not a directory");
  EXPECT_EQ(read_all(file), "not a run\n");
  // Root writes regardless of permissions: drop that capability when running as root.
  const std::string as_user = ::geteuid() == 0 ? "setpriv --bounding-set=-dac_override,-dac_read_search " : "";
  if (!as_user.empty() && run_command(as_user + "true").exit_code != 0) {
    GTEST_SKIP() << "setpriv cannot drop CAP_DAC_OVERRIDE";
  }
  const std::string read_only = dir_.file("read-only");
  fs::create_directories(read_only);
  fs::permissions(read_only, fs::perms::owner_read | fs::perms::owner_exec | fs::perms::group_read |
                                 fs::perms::group_exec | fs::perms::others_read | fs::perms::others_exec);
  expect_refused(as_user, read_only, "cannot write in it (Permission denied)");
  expect_refused(as_user, read_only + "/run", "cannot create it: Permission denied");
  EXPECT_TRUE(fs::is_empty(read_only));
  fs::permissions(read_only, fs::perms::owner_all);
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

TEST_F(TrainToolTest, MemoryLimitRefusesAPlanOverItBeforeTraining) {
  // The same refusal on any machine: the cap is the knob's, not the host's memory.
  const std::string config = shell_quote(write_config("capped"));
  const CommandResult capped =
      train(config + " run.dir=" + shell_quote(run_dir("capped")) + " train.memory_limit=1MB");
  EXPECT_EQ(capped.exit_code, 1) << capped.output;
  EXPECT_TRUE(is_one_line(capped.output, "does not fit cpu")) << capped.output;
  EXPECT_NE(capped.output.find("under train.memory_limit = 1.00 MB"), std::string::npos) << capped.output;
  EXPECT_FALSE(file_exists(run_dir("capped") + "/metrics.jsonl"));
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
