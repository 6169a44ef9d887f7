// The fixture corpus (tests/fixtures/make_tokenizer_fixture.sh) tokenized into one
// mmap shard by `dataprep preprocess --append-eod`, once per test process, for the
// tests that train on real data. Needs the `tokenizer` ctest fixture.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "support/temp_dir.h"
#include "support/tool_runner.h"

namespace dufu::testing {

// The shard's prefix (PREFIX.bin / PREFIX.idx) and beside it a directory for index
// caches (fortunes_shard_dir() + "/cache"). Fails the calling test if preprocessing
// fails.
inline const std::string& fortunes_shard_dir() {
  static const std::unique_ptr<TempDir> dir = [] {
    auto made = std::make_unique<TempDir>();
    const CommandResult result =
        run_command(shell_quote(dataprep_tool()) + " preprocess -q --append-eod -i " +
                    shell_quote(fixture_path("fortunes.jsonl")) + " -m " + shell_quote(fixture_path("fortunes.model")) +
                    " -o " + shell_quote(made->file("fortunes")));
    EXPECT_EQ(result.exit_code, 0) << result.output;
    return made;
  }();
  return dir->path();
}

inline std::string fortunes_shard() { return fortunes_shard_dir() + "/fortunes"; }

}  // namespace dufu::testing
