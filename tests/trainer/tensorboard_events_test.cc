// The TensorBoard event files of real `train` runs read by TensorBoard's own reader
// (tests/reference/tensorboard_events_check.py, in the venv of
// scripts/setup_reference_venv.sh --tensorboard): every scalar of metrics.jsonl at the
// same step and value, also after a SIGKILL, a resume, and with the file cut inside a
// record. Skipped, with the reason, where the venv cannot be made (no PyPI).
#include <chrono>
#include <thread>

#include "train_tool_fixture.h"

namespace train_tool_testing {
namespace {

struct ReferencePython {
  std::string path;            // empty when the venv could not be made
  std::string failure_output;  // then: why
};

const ReferencePython& tensorboard_python() {
  static const ReferencePython python = [] {
    const CommandResult result =
        run_command(shell_quote(std::string(DUFU_SOURCE_DIR) + "/scripts/setup_reference_venv.sh") +
                    " --tensorboard 2>&1");
    ReferencePython made;
    if (result.exit_code != 0) {
      made.failure_output = result.output;
      return made;
    }
    std::string output = result.output;
    while (!output.empty() && (output.back() == '\n' || output.back() == '\r')) output.pop_back();
    made.path = output.substr(output.find_last_of('\n') + 1);
    return made;
  }();
  return python;
}

class TensorBoardEventsTest : public TrainToolTest {
 protected:
  void SetUp() override {
    if (tensorboard_python().path.empty()) {
      GTEST_SKIP() << "no TensorBoard to read the event files: setup_reference_venv.sh --tensorboard failed:\n"
                   << tensorboard_python().failure_output;
    }
  }

  CommandResult check(const std::string& arguments) {
    return run_command(shell_quote(tensorboard_python().path) + " " +
                       shell_quote(std::string(DUFU_SOURCE_DIR) + "/tests/reference/tensorboard_events_check.py") +
                       " " + arguments + " 2>&1");
  }
};

TEST_F(TensorBoardEventsTest, EveryScalarOfTheRunReadsAsInMetricsJsonl) {
  const std::string dir = run_dir("whole");
  // 4 steps, evaluated at 2 and 4: every kind of record, in about a second.
  const CommandResult run = train(shell_quote(write_config("whole")) + " run.dir=" + shell_quote(dir) +
                                  " train.steps=4 eval.interval=2 checkpoint.interval=0");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const CommandResult whole = check("check " + shell_quote(dir));
  EXPECT_EQ(whole.exit_code, 0) << whole.output;
  const CommandResult cut = check("truncated " + shell_quote(dir));
  EXPECT_EQ(cut.exit_code, 0) << cut.output;
  // The check can fail: a record whose loss differs from metrics.jsonl's.
  std::string metrics = read_all(dir + "/metrics.jsonl");
  const std::size_t loss = metrics.find("\"loss\":");
  ASSERT_NE(loss, std::string::npos);
  metrics.insert(loss + 7, "1");
  write_all(dir + "/metrics.jsonl", metrics);
  const CommandResult altered = check("check " + shell_quote(dir));
  EXPECT_NE(altered.exit_code, 0) << altered.output;
  EXPECT_NE(altered.output.find("train/loss"), std::string::npos) << altered.output;
}

TEST_F(TensorBoardEventsTest, KilledRunReadsToItsLastRecordAndItsResumeAsOneRun) {
  const std::string dir = run_dir("killed");
  const std::string arguments = shell_quote(write_config("killed")) + " run.dir=" + shell_quote(dir);
  {
    BackgroundTrain run(arguments, dir_.file("killed.log"));
    // Killed after step 5 is logged: the newest checkpoint is step 4, so the resumed
    // run writes step 5 again.
    while (run.running() && count_lines_with(dir + "/metrics.jsonl", "\"type\":\"train\"") < 5) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    kill(run.pid(), SIGKILL);
    run.wait();
  }
  ASSERT_FALSE(file_exists(checkpoint_dir(dir, 8))) << read_all(dir_.file("killed.log"));
  const CommandResult killed = check("check --killed " + shell_quote(dir));
  EXPECT_EQ(killed.exit_code, 0) << killed.output;

  const CommandResult resumed = train(arguments);
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resuming from"), std::string::npos) << resumed.output;
  int event_files = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    event_files += entry.path().filename().string().starts_with("events.out.tfevents.");
  }
  EXPECT_EQ(event_files, 2);
  // TensorBoard drops the first file's steps after the checkpoint: the second has them.
  const CommandResult whole = check("check " + shell_quote(dir));
  EXPECT_EQ(whole.exit_code, 0) << whole.output;
}

}  // namespace
}  // namespace train_tool_testing
