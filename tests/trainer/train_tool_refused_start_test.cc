// Issue 44, item 10: a start that is refused writes nothing. A fresh run.dir is not
// left behind (no config.toml, tokenizer/ or .lock in a directory the refused run
// made), and an existing one is byte for byte as it was: every path and every file's
// bytes, before and after. The refusals come at different points of the start: the
// vocabulary before run.dir is claimed, a model.init_from that is not there and a
// resume that changes the model after it.
#include <map>
#include <string>

#include "train_tool_fixture.h"

namespace train_tool_testing {
namespace {

// A bound on every command: a hang fails the test instead of hanging ctest.
constexpr char kBound[] = "timeout -s KILL 20 ";

// Every path under `root` and, for a file, its bytes ("<dir>" for a directory).
std::map<std::string, std::string> tree(const std::string& root) {
  std::map<std::string, std::string> entries;
  for (const fs::directory_entry& entry : fs::recursive_directory_iterator(root)) {
    const std::string name = fs::relative(entry.path(), root).string();
    entries[name] = entry.is_directory() ? "<dir>" : read_all(entry.path().string());
  }
  return entries;
}

class TrainRefusedStartTest : public TrainToolTest {
 protected:
  CommandResult start(const std::string& dir, const std::string& overrides) {
    return run_command(kBound + shell_quote(train_tool()) + " " + shell_quote(write_config("run")) + " run.dir=" +
                       shell_quote(dir) + " train.steps=2 eval.interval=0 " + overrides);
  }
};

TEST_F(TrainRefusedStartTest, RefusedStartAtAFreshRunDirLeavesNoRunDir) {
  for (const std::string& overrides : {std::string("model.vocab_size=10"),
                                      "model.init_from=" + shell_quote(dir_.file("no_such_checkpoint"))}) {
    SCOPED_TRACE(overrides);
    const std::string dir = run_dir("fresh");
    const CommandResult result = start(dir, overrides);
    EXPECT_EQ(result.exit_code, 1) << result.output;
    EXPECT_FALSE(fs::exists(dir)) << "the refused start left " << dir;
    std::error_code ignored;
    fs::remove_all(dir, ignored);
  }
}

TEST_F(TrainRefusedStartTest, RefusedStartAtAnExistingRunDirLeavesItByteForByte) {
  // A directory the user made, empty.
  const std::string empty = run_dir("empty");
  fs::create_directories(empty);
  const CommandResult init_from = start(empty, "model.init_from=" + shell_quote(dir_.file("no_such_checkpoint")));
  EXPECT_EQ(init_from.exit_code, 1) << init_from.output;
  EXPECT_TRUE(tree(empty).empty()) << "the refused start wrote in " << empty;
  // A run that saved, resumed with another model.
  const std::string trained = run_dir("trained");
  const CommandResult first = start(trained, "");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  const auto before = tree(trained);
  const CommandResult changed = start(trained, "train.steps=4 model.n_head=4");
  EXPECT_EQ(changed.exit_code, 1) << changed.output;
  EXPECT_TRUE(is_one_line(changed.output, "model.n_head")) << changed.output;
  const auto after = tree(trained);
  EXPECT_EQ(after.size(), before.size());
  for (const auto& [name, bytes] : before) {
    EXPECT_TRUE(after.contains(name) && after.at(name) == bytes) << name << " changed or went";
  }
  for (const auto& [name, bytes] : after) EXPECT_TRUE(before.contains(name)) << name << " is new";
}

}  // namespace
}  // namespace train_tool_testing
