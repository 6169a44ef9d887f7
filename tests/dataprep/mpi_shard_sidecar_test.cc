// The sidecar (PREFIX.dufu.json) of a preprocess job divided among mpirun's ranks:
// rank 0 publishes it with the pair, the same bytes one process writes.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "support/tool_runner.h"

namespace dufu::testing {
namespace {

TEST(MpiShardSidecar, RanksPublishTheSidecarOneProcessWrites) {
  TempDir dir;
  std::string lines;
  for (int i = 0; i < 200; ++i) lines += "{\"text\": \"Rank fortune " + std::to_string(i) + " is shared.\"}\n";
  write_all(dir.file("corpus.jsonl"), lines);
  const auto flags = [&](const std::string& name) {
    return " preprocess -q --append-eod -j 1 -i " + shell_quote(dir.file("corpus.jsonl")) + " -o " +
           shell_quote(dir.file(name)) + " --tokenizer " + shell_quote(fixture_path("fortunes.model"));
  };
  const CommandResult single = run_command(shell_quote(dataprep_tool()) + flags("single"));
  ASSERT_EQ(single.exit_code, 0) << single.output;
  const CommandResult ranks = run_command(std::string("timeout -k 5 120 ") + DUFU_MPIRUN + " -np 2 " +
                                          shell_quote(dataprep_tool()) + flags("np2"));
  ASSERT_EQ(ranks.exit_code, 0) << ranks.output;
  ASSERT_TRUE(std::filesystem::exists(dir.file("np2.dufu.json"))) << ranks.output;
  EXPECT_EQ(read_all(dir.file("np2.dufu.json")), read_all(dir.file("single.dufu.json")));
  EXPECT_EQ(read_all(dir.file("np2.bin")), read_all(dir.file("single.bin")));
}

}  // namespace
}  // namespace dufu::testing
