// Issue 26: the ranks of a training run must have been started alike. An MPMD command
// line gives one rank other knobs (it hung, or trained on its own terms), and a data
// path that names another file on another node (node-local copies) trains that rank
// on other tokens. The ranks compare their configurations, then the identities of the
// shards they opened, before anything is written: one error line naming the knob or
// the shard, no run directory. Knobs that only tune a rank may differ.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "support/fortunes_shard.h"
#include "support/temp_dir.h"
#include "support/tool_runner.h"

namespace {

namespace fs = std::filesystem;
using dufu::testing::CommandResult;
using dufu::testing::fixture_path;
using dufu::testing::run_command;
using dufu::testing::shell_quote;
using dufu::testing::TempDir;
using dufu::testing::train_tool;
using dufu::testing::write_all;

std::size_t count_of(const std::string& text, const std::string& part) {
  std::size_t count = 0;
  for (std::size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++count;
  return count;
}

class TrainRankAgreement : public ::testing::Test {
 protected:
  // Each rank runs in a directory of its own that holds a copy of the shard under the
  // same relative name, as each node would hold its own copy.
  void SetUp() override {
    for (const std::string& rank : {rank0_, rank1_}) {
      fs::create_directories(rank + "/data");
      for (const char* extension : {".bin", ".idx"}) {
        fs::copy_file(dufu::testing::fortunes_shard() + extension, rank + "/data/fortunes" + extension);
      }
    }
    std::string toml = dufu::testing::fortunes_layout_config_toml();
    const std::string blend = "blend = \"" + dufu::testing::fortunes_shard() + "\"";
    toml.replace(toml.find(blend), blend.size(), "blend = \"data/fortunes\"");
    const std::string cache = "cache_dir = \"" + dufu::testing::fortunes_shard_dir() + "/cache\"";
    toml.replace(toml.find(cache), cache.size(), "cache_dir = \"" + dir_.file("cache") + "\"");
    write_all(config_, toml);
  }

  // Rank 0 and rank 1 each in its directory, with the config file and their overrides.
  CommandResult mpmd(const std::string& rank0_overrides, const std::string& rank1_overrides) const {
    const std::string train = shell_quote(train_tool()) + " " + shell_quote(config_) + " run.dir=" + shell_quote(run_);
    return run_command(std::string("timeout -k 5 120 ") + DUFU_MPIRUN + " -np 1 -wdir " + shell_quote(rank0_) + " " +
                       train + " " + rank0_overrides + " : -np 1 -wdir " + shell_quote(rank1_) + " " + train + " " +
                       rank1_overrides + " 2>&1");
  }

  void expect_refused(const CommandResult& run, const std::string& difference) const {
    EXPECT_EQ(run.exit_code, 1) << run.output;
    EXPECT_EQ(count_of(run.output, "train: error: "), 1u) << run.output;
    EXPECT_NE(run.output.find("train: error: the ranks were not started alike: " + difference), std::string::npos)
        << run.output;
    EXPECT_NE(run.output.find("(rank 1 of 2 differs from rank 0); HINT: give every rank the same options"),
              std::string::npos)
        << run.output;
    EXPECT_FALSE(fs::exists(run_)) << "the run directory was made";
  }

  TempDir dir_;
  std::string rank0_ = dir_.file("rank0");
  std::string rank1_ = dir_.file("rank1");
  std::string config_ = dir_.file("config.toml");
  std::string run_ = dir_.file("run");
};

TEST_F(TrainRankAgreement, AKnobGivenToOneRankOnlyStopsTheRunBeforeAnythingIsWritten) {
  expect_refused(mpmd("", "train.steps=7"), "train.steps is '7' on rank 1 but '6' on rank 0");
  expect_refused(mpmd("optim.lr=1e-3", ""), "optim.lr is '0.003' on rank 1 but '0.001' on rank 0");
  // What only tunes a rank may differ: its threads and loader.
  const std::string short_run = "train.steps=2 eval.interval=0 checkpoint.interval=0";
  const CommandResult tuned = mpmd(short_run + " train.threads=1 data.workers=1",
                                   short_run + " train.threads=2 data.workers=2 data.prefetch=2");
  EXPECT_EQ(tuned.exit_code, 0) << tuned.output;
}

TEST_F(TrainRankAgreement, AShardThatIsAnotherFileOnOneRankStopsTheRunBeforeAnythingIsWritten) {
  // Rank 1's copy holds other documents: the first 2000 fortunes alone.
  const CommandResult other = run_command(
      "head -n 2000 " + shell_quote(fixture_path("fortunes.jsonl")) + " > " + shell_quote(dir_.file("other.jsonl")) +
      " && " + shell_quote(dufu::testing::dataprep_tool()) + " preprocess -q --append-eod -i " +
      shell_quote(dir_.file("other.jsonl")) + " -m " + shell_quote(fixture_path("fortunes.model")) + " -o " +
      shell_quote(dir_.file("other")) + " 2>&1");
  ASSERT_EQ(other.exit_code, 0) << other.output;
  for (const char* extension : {".bin", ".idx"}) {
    fs::copy_file(dir_.file("other") + extension, rank1_ + "/data/fortunes" + extension,
                  fs::copy_options::overwrite_existing);
  }
  const CommandResult run = mpmd("", "");
  expect_refused(run, "the data shard 'data/fortunes' is 'data/fortunes.bin of ");
  EXPECT_NE(run.output.find("' on rank 1 but 'data/fortunes.bin of "), std::string::npos) << run.output;
}

}  // namespace
