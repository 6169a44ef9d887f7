// Issue 44, item 7: the memory plan against what a real `train` on the CPU device holds
// at its peak, which is while it saves a checkpoint (host_staging.h's copy of the
// weights and the AdamW moments, and the GPT-2 layout's transposed matrices, beside
// everything training holds). The CPU device's memory is the process's, so the peak
// RSS is the plan's total plus what no plan counts: the process's fixed part (code,
// libraries, allocator arenas, thread stacks, the tokenizer, the data's mapping and
// index). That part is measured by the same run with a tiny model and subtracted from
// both: the difference of the two peaks must be the difference of the two plans,
// within 15%.
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "dufu/common/config.h"
#include "dufu/common/human_units.h"
#include "dufu/trainer/device/device.h"
#include "dufu/trainer/run/training_config.h"
#include "dufu/trainer/run/training_memory.h"
#include "support/fortunes_shard.h"
#include "support/run_dir.h"
#include "support/tool_runner.h"

extern char** environ;

namespace {

using dufu::human_bytes;
using dufu::testing::checkpoint_dir;
using dufu::testing::file_exists;
using dufu::testing::fortunes_shard;
using dufu::testing::fortunes_shard_dir;
using dufu::testing::TempDir;
using dufu::testing::train_tool;
using dufu::testing::write_all;
namespace trainer = dufu::trainer;

class TrainMemoryPeakTest : public ::testing::Test {
 protected:
  // Three steps on the CPU device, a checkpoint after the second and the last.
  std::string write_config(const std::string& name, const std::string& model) {
    const std::string text = "[model]\n" + model + "vocab_size = 2000\nseq_length = 32\n" +
                             "[data]\nblend = \"" + fortunes_shard() + "\"\ncache_dir = \"" + fortunes_shard_dir() +
                             "/cache\"\nsplit = \"90,10,0\"\nworkers = 2\n"
                             "[train]\ndevice = \"cpu\"\nmicro_batch = 2\nglobal_batch = 2\nsteps = 3\nthreads = 2\n"
                             "[optim]\nwarmup_steps = 1\n[eval]\ninterval = 0\n[checkpoint]\ninterval = 2\nkeep = 1\n"
                             "[run]\ndir = \"" + dir_.file(name) + "\"\n";
    const std::string path = dir_.file(name + ".toml");
    write_all(path, text);
    return path;
  }

  // The peak resident set of `train CONFIG`, in bytes (wait4's ru_maxrss, in KiB).
  static double peak_rss_bytes(const std::string& config) {
    const std::string tool = train_tool();
    const char* argv[] = {tool.c_str(), config.c_str(), nullptr};
    pid_t pid = -1;
    if (posix_spawn(&pid, tool.c_str(), nullptr, nullptr, const_cast<char**>(argv), environ) != 0) return -1.0;
    int status = 0;
    rusage usage{};
    if (wait4(pid, &status, 0, &usage) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return -1.0;
    return static_cast<double>(usage.ru_maxrss) * 1024.0;
  }

  // The plan `train` checks at start (and `train plan` prints) for the same config.
  static double planned_bytes(const std::string& config) {
    const trainer::TrainingOptions options =
        trainer::training_options(dufu::Config::load(trainer::training_config_schema(), config, {}));
    const trainer::PipelineStage stage{};
    const trainer::MemoryPlan plan = trainer::rank_memory_plan(
        options.model, options.micro_batch, options.model.seq_length, 1, 1, stage, 1, options.prefetch_batches,
        options.precision, options.zero_stage, trainer::device_of_kind(trainer::DeviceKind::kCpu), options.recompute);
    return plan.host_total();
  }

  TempDir dir_;
};

TEST_F(TrainMemoryPeakTest, PeakOfARunThatSavesIsItsPlanWithin15Percent) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // Measured there: 624 MB against the plan's 372 MB. The shadow memory and the
  // quarantine of freed blocks are not the program's, and no plan counts them.
  GTEST_SKIP() << "a sanitizer's shadow memory and quarantine inflate the peak RSS; the Release build measures it";
#endif
  // 6 layers of width 384: 11.6 M parameters, 46 MB of them; their weights, gradients,
  // moments and the save's copy are most of the run's memory.
  const std::string large = write_config("large", "n_layer = 6\nn_head = 6\nd_model = 384\n");
  const std::string tiny = write_config("tiny", "n_layer = 1\nn_head = 2\nd_model = 32\n");
  const double large_peak = peak_rss_bytes(large);
  const double tiny_peak = peak_rss_bytes(tiny);
  ASSERT_GT(large_peak, 0.0) << "the large run failed";
  ASSERT_GT(tiny_peak, 0.0) << "the tiny run failed";
  ASSERT_TRUE(file_exists(checkpoint_dir(dir_.file("large"), 3) + "/model.safetensors"));
  const double measured = large_peak - tiny_peak;
  const double planned = planned_bytes(large) - planned_bytes(tiny);
  std::printf("peak RSS: large %s, tiny %s (the fixed part no plan counts); large - tiny: measured %s, planned %s "
              "(ratio %.3f)\n",
              human_bytes(large_peak).c_str(), human_bytes(tiny_peak).c_str(), human_bytes(measured).c_str(),
              human_bytes(planned).c_str(), measured / planned);
  EXPECT_LT(std::abs(measured - planned), 0.15 * measured)
      << "measured " << human_bytes(measured) << ", planned " << human_bytes(planned);
}

}  // namespace
