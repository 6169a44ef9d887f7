// Issue 26: under a file size limit (`ulimit -f`) with SIGXFSZ as a shell leaves it,
// a write past the limit ended `train` and `train export-hf` without a word (exit
// status 153, the signal's), and export-hf left its DIR.partial-PID directory for
// good. The tools ignore the signal, so the write fails with EFBIG and is reported in
// one line like a full disk, and export-hf removes the partial directories of exports
// that died, as the trainer does with a run's unfinished checkpoints.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <set>
#include <string>

#include "dufu/trainer/checkpoint/checkpoint.h"
#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/model/optimizer.h"
#include "support/fortunes_shard.h"
#include "support/gpt_fixture.h"
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

// `train ARGUMENTS` in a shell that set `ulimit -f BLOCKS` (512-byte blocks), SIGXFSZ
// at its default as a login shell has it, whatever the test runner set.
CommandResult train_limited(int blocks, const std::string& arguments) {
  ::signal(SIGXFSZ, SIG_DFL);
  return run_command("ulimit -f " + std::to_string(blocks) + "; exec " + shell_quote(train_tool()) + " " + arguments +
                     " 2>&1");
}

std::set<std::string> names_in(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.insert(entry.path().filename().string());
  return names;
}

TEST(FileSizeLimit, ATrainingRunReportsTheFailedCheckpointWriteInOneLine) {
  TempDir dir;
  write_all(dir.file("config.toml"), dufu::testing::fortunes_layout_config_toml());
  const std::string config = shell_quote(dir.file("config.toml")) + " train.steps=2 eval.interval=0";
  // Without a limit first, so that the index caches exist and the checkpoint is the
  // first file too large (its model file is about 1.3 MB).
  const CommandResult unlimited = run_command(shell_quote(train_tool()) + " " + config + " run.dir=" +
                                              shell_quote(dir.file("first")) + " 2>&1");
  ASSERT_EQ(unlimited.exit_code, 0) << unlimited.output;
  const std::string run = dir.file("limited");
  // 500 KB: room for the copy of the data's 266 KB tokenizer the run keeps
  // (run_tokenizer.h), not for the model file.
  const CommandResult limited = train_limited(1000, config + " run.dir=" + shell_quote(run));
  EXPECT_EQ(limited.exit_code, 1) << limited.output;
  EXPECT_NE(limited.output.find("train: error: "), std::string::npos) << limited.output;
  EXPECT_NE(limited.output.find("File too large"), std::string::npos) << limited.output;
  ASSERT_TRUE(fs::exists(run + "/checkpoints"));
  EXPECT_EQ(names_in(run + "/checkpoints"), std::set<std::string>{}) << "a checkpoint or its partial was left";
}

class ExportFileSizeLimit : public ::testing::Test {
 protected:
  void SetUp() override {
    dufu::trainer::GPT model(dufu::testing::small_gpt_config(
        {.n_layer = 1, .n_head = 2, .d_model = 16, .vocab_size = 2000, .vocab_multiple = 64, .seq_length = 16}));
    model.init_gpt2(5);
    dufu::trainer::AdamW optimizer(model, {});
    dufu::trainer::TrainingState state;
    state.step = 1;
    state.model = model.config();
    state.config_toml = "# written by train_file_size_limit_test\n";
    dufu::trainer::save_checkpoint(dir_.file("run"), model, optimizer, state, 1);
    fs::create_directories(exports_);
  }

  std::string export_arguments(const std::string& destination) const {
    return "export-hf " + shell_quote(dir_.file("run")) + " " + shell_quote(destination) + " -m " +
           shell_quote(fixture_path("fortunes.model"));
  }

  TempDir dir_;
  std::string exports_ = dir_.file("exports");
};

TEST_F(ExportFileSizeLimit, AFailedWriteIsReportedInOneLineAndLeavesNothing) {
  // The model file alone is over 130 KB; the limit is 50 KB.
  const CommandResult limited = train_limited(100, export_arguments(exports_ + "/hf"));
  EXPECT_EQ(limited.exit_code, 1) << limited.output;
  EXPECT_NE(limited.output.find("train: error: "), std::string::npos) << limited.output;
  EXPECT_NE(limited.output.find("File too large"), std::string::npos) << limited.output;
  EXPECT_EQ(names_in(exports_), std::set<std::string>{});
}

TEST_F(ExportFileSizeLimit, TheNextExportRemovesThePartialDirectoriesOfDeadExports) {
  // The pid of a process that has ended, and one that lives (this test).
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);
  const std::string dead = exports_ + "/hf.partial-" + std::to_string(child);
  const std::string living = exports_ + "/hf.partial-" + std::to_string(::getpid());
  for (const std::string& partial : {dead, living}) {
    fs::create_directories(partial);
    write_all(partial + "/model.safetensors", "cut short");
  }
  const CommandResult exported =
      run_command(shell_quote(train_tool()) + " " + export_arguments(exports_ + "/hf") + " 2>&1");
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_EQ(names_in(exports_), (std::set<std::string>{"hf", fs::path(living).filename().string()}));
}

}  // namespace
