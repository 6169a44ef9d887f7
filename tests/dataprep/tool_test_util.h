// Helpers for tests that drive the command-line tools as a user would: run a command,
// capture its output and exit status, and work in a throw-away directory.
#pragma once

#include <string>
#include <vector>

namespace dufu::testing {

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs `command` through /bin/sh.
CommandResult run_command(const std::string& command);
std::string shell_quote(const std::string& text);

// A fresh directory under /tmp, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  // Names of all entries, hidden ones included, sorted.
  std::vector<std::string> entries() const;

 private:
  std::string path_;
};

std::string read_file(const std::string& path);
void write_file(const std::string& path, const std::string& content);
bool file_exists(const std::string& path);

// Paths of the shared fixture (see tests/fixtures/make_tokenizer_fixture.sh).
std::string fixture_path(const std::string& name);
std::string dataprep_tool();

}  // namespace dufu::testing
