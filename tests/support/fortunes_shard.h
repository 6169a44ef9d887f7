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

// The training config the parallel-layout tests share: 6 steps of a 4-layer model on
// the shard, global batch 8 of micro-batches of 2 (so dp 1, 2 and 4 all divide it),
// evaluations and checkpoints at steps 3 and 6.
inline std::string fortunes_layout_config_toml() {
  return "[model]\nn_layer = 4\nn_head = 2\nd_model = 64\nvocab_size = 2000\nseq_length = 32\n"
         "[data]\nblend = \"" +
         fortunes_shard() + "\"\ncache_dir = \"" + fortunes_shard_dir() + "/cache" +
         "\"\nsplit = \"90,10,0\"\nworkers = 1\n"
         "[train]\nmicro_batch = 2\nglobal_batch = 8\nsteps = 6\nthreads = 1\n"
         "[optim]\nlr = 3e-3\nmin_lr = 3e-4\nwarmup_steps = 2\n"
         "[eval]\ninterval = 3\nbatches = 2\n"
         "[checkpoint]\ninterval = 3\nkeep = 3\n";
}

}  // namespace dufu::testing
