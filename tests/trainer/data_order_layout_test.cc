// Issue 45: under data.order = stable a run made longer also changes layout on the way:
// stopped at step 3 at dp 1 (on a 10-document shard, so the run is epochs past its
// first), resumed at dp 2 with train.steps raised from 8 to 12 and stopped at 6, then
// at dp 4 with the micro-batch halved (gradient accumulation), it gives the losses of
// the 12-step run at dp 1 without a stop, within 1e-5 (sums over ranks and
// micro-batches are taken in another order, so not bit for bit).
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "support/fortunes_shard.h"
#include "support/run_dir.h"
#include "support/temp_dir.h"
#include "support/tool_runner.h"

namespace {

using dufu::testing::CommandResult;
using dufu::testing::dataprep_tool;
using dufu::testing::fixture_path;
using dufu::testing::metric_values;
using dufu::testing::read_all;
using dufu::testing::run_command;
using dufu::testing::shell_quote;
using dufu::testing::TempDir;
using dufu::testing::train_tool;
using dufu::testing::write_all;

CommandResult mpirun(int ranks, const std::string& arguments) {
  return run_command(std::string("timeout -k 5 300 ") + DUFU_MPIRUN + " -np " + std::to_string(ranks) + " " +
                     shell_quote(train_tool()) + " " + arguments);
}

TEST(StableOrderLayouts, ALongerRunAtOtherDataParallelSizesAndMicroBatchesGivesTheOneProcessLosses) {
  TempDir dir;
  std::istringstream corpus(read_all(fixture_path("fortunes.jsonl")));
  std::string documents, line;
  for (int i = 0; i < 10 && std::getline(corpus, line); ++i) documents += line + "\n";
  write_all(dir.file("ten.jsonl"), documents);
  const CommandResult made = run_command(shell_quote(dataprep_tool()) + " preprocess -q --append-eod -i " +
                                         shell_quote(dir.file("ten.jsonl")) + " -m " +
                                         shell_quote(fixture_path("fortunes.model")) + " -o " +
                                         shell_quote(dir.file("ten")));
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const std::string config = dir.file("config.toml");
  write_all(config, dufu::testing::fortunes_layout_config_toml());
  const std::string common = shell_quote(config) + " data.blend=" + shell_quote(dir.file("ten")) +
                             " data.cache_dir=" + shell_quote(dir.file("cache")) +
                             " data.split=100,0,0 data.order=stable eval.interval=0 checkpoint.interval=3";
  const std::string reference = dir.file("reference");
  const CommandResult whole = mpirun(1, common + " run.dir=" + reference + " train.steps=12");
  ASSERT_EQ(whole.exit_code, 0) << whole.output;

  const std::string changed = dir.file("changed");
  const std::string run = common + " run.dir=" + changed;
  CommandResult part = mpirun(1, run + " train.steps=8 train.exit_at_step=3");
  ASSERT_EQ(part.exit_code, 0) << part.output;
  part = mpirun(2, run + " train.steps=12 train.exit_at_step=6");
  ASSERT_EQ(part.exit_code, 0) << part.output;
  part = mpirun(4, run + " train.steps=12 train.micro_batch=1");
  ASSERT_EQ(part.exit_code, 0) << part.output;

  const std::vector<double> expected = metric_values(reference, "loss");
  const std::vector<double> got = metric_values(changed, "loss");
  ASSERT_EQ(expected.size(), 12u);
  ASSERT_EQ(got.size(), 12u) << part.output;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(got[i], expected[i], 1e-5 * std::abs(expected[i])) << "step " << i + 1;
  }
}

}  // namespace
