// Implementation of the tool-driving test helpers.
#include "support/tool_runner.h"

#include <sys/wait.h>

#include <array>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <stdexcept>

namespace dufu::testing {

CommandResult run_command(const std::string& command) {
  CommandResult result;
  const std::string full = command + " 2>&1";
  FILE* pipe = ::popen(full.c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("popen failed for: " + command);
  std::array<char, 4096> buffer{};
  std::size_t count = 0;
  while ((count = std::fread(buffer.data(), 1, buffer.size(), pipe)) > 0) {
    result.output.append(buffer.data(), count);
  }
  const int status = ::pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

std::string shell_quote(const std::string& text) {
  std::string quoted = "'";
  for (const char c : text) {
    if (c == '\'') {
      quoted += "'\\''";
    } else {
      quoted += c;
    }
  }
  return quoted + "'";
}

namespace {

// The build's paths are compiled in; a relocated copy of the programs (the GPU bundle
// of scripts/gpu_bundle.sh, run on another machine) names its own through these.
std::string build_path_or_override(const char* override_variable, const char* build_path) {
  const char* value = std::getenv(override_variable);
  return value != nullptr && *value != '\0' ? value : build_path;
}

}  // namespace

std::string fixture_path(const std::string& name) {
  return build_path_or_override("DUFU_TEST_FIXTURE_DIR", DUFU_FIXTURE_DIR) + "/" + name;
}

std::string dataprep_tool() { return build_path_or_override("DUFU_TEST_DATAPREP_TOOL", DUFU_DATAPREP_TOOL); }
std::string train_tool() { return build_path_or_override("DUFU_TEST_TRAIN_TOOL", DUFU_TRAIN_TOOL); }

}  // namespace dufu::testing
