// Finding the checkpoint to resume from (find_usable_checkpoint, checkpoint.h): a
// corrupt newest one is skipped with a warning, a run whose checkpoints are all
// unusable is refused rather than started over, and what processes killed while
// saving leave behind is cleaned up.
#include <gtest/gtest.h>

#include <filesystem>
#include <optional>
#include <set>
#include <string>

#include "checkpoint_test_support.h"
#include "dufu/trainer/checkpoint/checkpoint.h"
#include "support/expect_error.h"
#include "support/tool_runner.h"

namespace dufu::trainer {
namespace {

using namespace checkpoint_testing;  // the fixture and helpers the checkpoint tests share
using dufu::testing::expect_error;
using dufu::testing::read_all;
using dufu::testing::write_all;

TEST_F(CheckpointTest, FindUsableSkipsCorruptNewestWithAWarning) {
  Trained run(26, 1);
  const std::string older = save(run, 10);
  const std::string newer = save(run, 20);
  std::string bytes = read_all(newer + "/model.safetensors");
  bytes[bytes.size() - 5] ^= 0x01;
  write_all(newer + "/model.safetensors", bytes);

  ::testing::internal::CaptureStderr();
  const std::optional<std::string> found = find_usable_checkpoint(run_dir());
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(*found, older);
  EXPECT_NE(log.find("WARN"), std::string::npos) << log;
  EXPECT_NE(log.find("skipping checkpoint '" + newer + "'"), std::string::npos) << log;
  EXPECT_NE(log.find("model.safetensors has SHA-256"), std::string::npos) << log;

  // A checkpoint directory named directly is returned as it is, or refused.
  EXPECT_EQ(find_usable_checkpoint(older), older);
  expect_error([&] { find_usable_checkpoint(newer); }, {newer, "(corrupt)"});

  // None usable: the newest one's reason.
  fs::resize_file(older + "/optimizer.safetensors", 64);
  ::testing::internal::CaptureStderr();
  expect_error([&] { find_usable_checkpoint(run_dir()); },
               {run_dir(), "none of its 2 checkpoints verifies", "model.safetensors has SHA-256"});
  ::testing::internal::GetCapturedStderr();
}

TEST_F(CheckpointTest, FindUsableOnRunWithoutCheckpointsOrMissingPath) {
  fs::create_directories(run_dir());
  EXPECT_EQ(find_usable_checkpoint(run_dir()), std::nullopt);
  fs::create_directories(run_dir() + "/checkpoints/step_00000005.partial-3");
  EXPECT_EQ(find_usable_checkpoint(run_dir()), std::nullopt);

  expect_error([&] { find_usable_checkpoint(dir_.file("nowhere")); }, {dir_.file("nowhere"), "no such"});
  write_all(dir_.file("file"), "x");
  expect_error([&] { find_usable_checkpoint(dir_.file("file")); }, {dir_.file("file"), "not a directory"});

  // Neither is the checkpoints/ directory, nor a checkpoint without its state.json.
  Trained run(27, 1);
  const std::string dir = save(run, 1);
  expect_error([&] { find_usable_checkpoint(run_dir() + "/checkpoints"); },
               {run_dir() + "/checkpoints", "checkpoints/ directory", "HINT"});
  fs::remove(dir + "/state.json");
  expect_error([&] { find_usable_checkpoint(dir); }, {dir, "incomplete checkpoint", "no state.json"});
}

// A step directory without state.json is a checkpoint that cannot be used: skipped
// with a warning when an older one verifies, and when none does the run directory is
// refused (training must not start over it and replace them), naming the newest and
// why.
TEST_F(CheckpointTest, FindUsableRefusesARunWhoseCheckpointsLackStateJson) {
  Trained run(28, 1);
  const std::string older = save(run, 10);
  const std::string newer = save(run, 20);
  fs::remove(newer + "/state.json");
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(find_usable_checkpoint(run_dir()), older);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("skipping checkpoint '" + newer + "': " + newer + ": it has no state.json"), std::string::npos)
      << log;

  fs::remove(older + "/state.json");
  ::testing::internal::CaptureStderr();
  expect_error([&] { find_usable_checkpoint(run_dir()); },
               {run_dir() + ": none of its 2 checkpoints verifies, and training will not start over them",
                newer + ": it has no state.json", "HINT: restore a good checkpoint there, or remove " + run_dir() +
                                                      "/checkpoints (or choose another run.dir)"});
  ::testing::internal::GetCapturedStderr();
  // Not even a partial directory beside them makes it a run without checkpoints.
  fs::remove_all(older);
  ::testing::internal::CaptureStderr();
  expect_error([&] { find_usable_checkpoint(run_dir()); }, {"none of its 1 checkpoints verifies"});
  ::testing::internal::GetCapturedStderr();
}

// What processes killed while saving leave behind, cleaned up by the next run: partial
// directories go; a checkpoint moved aside for a new version of its step goes once the
// new one is in place, and is put back when it is not (killed between the renames).
TEST_F(CheckpointTest, LeftoversAreRemovedAndAReplacedCheckpointPutBack) {
  Trained run(29, 1);
  save(run, 1);
  const std::string second = save(run, 2);
  const std::string checkpoints = run_dir() + "/checkpoints";
  const std::string model_bytes = read_all(second + "/model.safetensors");
  fs::rename(second, checkpoints + "/step_00000002.replaced-31");
  fs::create_directories(checkpoints + "/step_00000001.replaced-32");
  fs::create_directories(checkpoints + "/step_00000003.partial-33");
  write_all(checkpoints + "/step_00000003.partial-33/model.safetensors", "half");
  fs::create_directories(checkpoints + "/notes.replaced-34");  // not a checkpoint's name: not ours
  ::testing::internal::CaptureStderr();
  remove_checkpoint_leftovers(run_dir());
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(list_dir(checkpoints),
            (std::set<std::string>{"step_00000001", "step_00000002", "notes.replaced-34"}));
  EXPECT_NE(log.find("restored checkpoint '" + second + "'"), std::string::npos) << log;
  EXPECT_EQ(read_all(second + "/model.safetensors"), model_bytes);
  EXPECT_EQ(find_usable_checkpoint(run_dir()), second);
  remove_checkpoint_leftovers(dir_.file("no-run"));  // nothing there: nothing to do
}

}  // namespace
}  // namespace dufu::trainer
