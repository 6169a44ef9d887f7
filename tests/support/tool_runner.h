// Helpers for tests that drive the command-line tools as a user would: run a command,
// capture its output and exit status, and work in a throw-away directory.
#pragma once

#include <string>
#include <vector>

#include "support/temp_dir.h"

namespace dufu::testing {

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs `command` through /bin/sh.
CommandResult run_command(const std::string& command);
std::string shell_quote(const std::string& text);

// Paths of the shared fixture (see tests/fixtures/make_tokenizer_fixture.sh) and of
// the tools: the build's, or those named by DUFU_TEST_FIXTURE_DIR,
// DUFU_TEST_DATAPREP_TOOL and DUFU_TEST_TRAIN_TOOL when set (a relocated bundle).
std::string fixture_path(const std::string& name);
std::string dataprep_tool();
std::string train_tool();

}  // namespace dufu::testing
