// The train tool on CUDA devices, end to end (ctest labels gpu and mpi): the single-GPU
// run against the CPU run of the same config (fp32 losses within 1e-4 relative, bf16
// within 1e-2), a CUDA run stopped and resumed continuing bitwise, a checkpoint
// written on the GPU resumed on the CPU, and the data-, tensor- and pipeline-parallel
// layouts over NCCL on 2 GPUs against the single-GPU run (losses within 1e-5 relative,
// as the CPU layouts are checked in data_parallel_test).
//
// None of this has run: no machine of this project has a GPU. Without a CUDA device
// every test is skipped with device_availability's reason, and the layouts also need
// two devices (one per rank).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "dufu/trainer/device/device.h"
#include "support/float_compare.h"
#include "support/fortunes_shard.h"
#include "support/run_dir.h"
#include "support/temp_dir.h"
#include "support/tool_runner.h"

namespace {

using dufu::testing::CommandResult;
using dufu::testing::metric_values;
using dufu::testing::run_command;
using dufu::testing::shell_quote;
using dufu::testing::TempDir;
using dufu::testing::train_tool;
using dufu::testing::write_all;
using dufu::trainer::DeviceKind;

class CudaTrainingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto cuda = dufu::trainer::device_availability(DeviceKind::kCuda);
    if (!cuda.available) GTEST_SKIP() << "needs a CUDA device: " << cuda.reason;
  }

  std::string config(const std::string& extra = "") {
    const std::string path = dir_.file("config.toml");
    write_all(path, dufu::testing::fortunes_layout_config_toml());
    return shell_quote(path) + extra;
  }

  CommandResult train(const std::string& run, const std::string& overrides) {
    return run_command(std::string("timeout -k 5 300 ") + shell_quote(train_tool()) + " " + config() +
                       " run.dir=" + shell_quote(dir_.file(run)) + " " + overrides);
  }

  CommandResult mpirun(int ranks, const std::string& run, const std::string& overrides) {
    return run_command(std::string("timeout -k 5 300 ") + DUFU_MPIRUN + " -np " + std::to_string(ranks) + " " +
                       shell_quote(train_tool()) + " " + config() + " run.dir=" + shell_quote(dir_.file(run)) + " " +
                       overrides);
  }

  std::vector<double> losses(const std::string& run, const char* field = "loss") {
    return metric_values(dir_.file(run), field);
  }

  TempDir dir_;
};

void expect_relative_near(const std::vector<double>& actual, const std::vector<double>& expected, double tolerance) {
  ASSERT_EQ(actual.size(), expected.size());
  for (std::size_t i = 0; i < actual.size(); ++i) {
    EXPECT_RELATIVE_NEAR(actual[i], expected[i], tolerance) << "value " << i;
  }
}

TEST_F(CudaTrainingTest, MatchesTheCpuRunInFp32AndBf16) {
  for (const char* precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    const std::string knob = std::string("train.precision=") + precision;
    const CommandResult cpu = train(std::string("cpu-") + precision, knob + " train.device=cpu");
    ASSERT_EQ(cpu.exit_code, 0) << cpu.output;
    const CommandResult cuda = train(std::string("cuda-") + precision, knob + " train.device=cuda");
    ASSERT_EQ(cuda.exit_code, 0) << cuda.output;
    EXPECT_NE(cuda.output.find("memory plan of this rank"), std::string::npos) << cuda.output;
    const double tolerance = std::string(precision) == "fp32" ? 1e-4 : 1e-2;
    expect_relative_near(losses(std::string("cuda-") + precision), losses(std::string("cpu-") + precision), tolerance);
    expect_relative_near(losses(std::string("cuda-") + precision, "val_loss"),
                         losses(std::string("cpu-") + precision, "val_loss"), tolerance);
  }
}

TEST_F(CudaTrainingTest, ResumeIsBitwiseAndCheckpointsCrossDevices) {
  const CommandResult whole = train("whole", "train.device=cuda");
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  // Stopped after the checkpoint of step 3, then resumed on the same device.
  const CommandResult first = train("resumed", "train.device=cuda train.exit_at_step=3");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const CommandResult second = train("resumed", "train.device=cuda");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  const auto expected = losses("whole");
  const auto resumed = losses("resumed");
  ASSERT_EQ(resumed.size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(resumed[i], expected[i]) << "step " << i + 1;

  // The GPU's checkpoint of step 3 resumed on the CPU: the formats are the same, so
  // the run goes on, and its losses follow the GPU run's within fp32 noise.
  const CommandResult on_gpu = train("crossed", "train.device=cuda train.exit_at_step=3");
  ASSERT_EQ(on_gpu.exit_code, 0) << on_gpu.output;
  const CommandResult on_cpu = train("crossed", "train.device=cpu");
  ASSERT_EQ(on_cpu.exit_code, 0) << on_cpu.output;
  expect_relative_near(losses("crossed"), expected, 1e-4);
}

TEST_F(CudaTrainingTest, LayoutsOverNcclMatchTheSingleGpuRun) {
  const CommandResult single = train("single", "train.device=cuda");
  ASSERT_EQ(single.exit_code, 0) << single.output;
  const auto expected = losses("single");
  for (const char* layout : {"dist.tensor_parallel_size=1", "dist.zero_stage=1", "dist.tensor_parallel_size=2",
                             "dist.pipeline_parallel_size=2"}) {
    SCOPED_TRACE(layout);
    const std::string run = std::string("layout-") + std::to_string(std::hash<std::string>{}(layout) % 100000);
    const CommandResult result = mpirun(2, run, std::string("train.device=cuda ") + layout);
    if (result.exit_code != 0 && result.output.find("needs one GPU per rank") != std::string::npos) {
      GTEST_SKIP() << "needs 2 CUDA devices: " << result.output;
    }
    ASSERT_EQ(result.exit_code, 0) << result.output;
    expect_relative_near(losses(run), expected, 1e-5);
  }
}

}  // namespace
