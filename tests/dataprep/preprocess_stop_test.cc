// PreprocessOptions::stop (the Python package's Ctrl-C): set before the run or while
// it writes, the run throws at its next batch and the previous pair is left byte for
// byte, with no temporary or lock file beside it.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "dufu/common/progress.h"
#include "dufu/dataprep/preprocess.h"
#include "support/expect_error.h"
#include "support/temp_dir.h"
#include "support/tool_runner.h"

namespace dufu::testing {
namespace {

std::map<std::string, std::string> files_in(const std::string& directory) {
  std::map<std::string, std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(directory)) {
    files[entry.path().filename().string()] = read_all(entry.path().string());
  }
  return files;
}

TEST(PreprocessStop, LeavesThePreviousPairAndNothingElse) {
  TempDir dir;
  dataprep::PreprocessOptions options;
  options.inputs = {fixture_path("fortunes.jsonl")};
  options.output_prefix = dir.file("out");
  options.tokenizer.model = fixture_path("fortunes.model");
  options.workers = 2;
  dataprep::preprocess(options, nullptr);
  const auto before = files_in(dir.path());
  ASSERT_EQ(before.size(), 3U);  // the pair and its sidecar (out.dufu.json)

  options.batch_bytes = 4096;
  std::atomic<bool> stop{true};
  options.stop = &stop;
  expect_error([&] { dataprep::preprocess(options, nullptr); }, {"stopped"});
  EXPECT_EQ(files_in(dir.path()), before);

  // Stopped once the first batches are written.
  stop = false;
  Progress progress("test", {{"bytes", 1}, {"docs", 1}, {"tokens", 1}}, ProgressOptions{.quiet = true});
  std::atomic<bool> returned{false};
  std::thread stopper([&] {
    while (progress.value(1) == 0 && !returned) std::this_thread::yield();
    stop = true;
  });
  expect_error([&] { dataprep::preprocess(options, &progress); }, {"stopped"});
  returned = true;
  stopper.join();
  EXPECT_EQ(files_in(dir.path()), before);
}

// The library's refusals name the options as PreprocessOptions and the Python package
// spell them (`workers`), not the dataprep tool's flags (--workers): a Python caller
// reads the names it passed; the tool says its flags (tool_limits_test.cc).
TEST(PreprocessOptionsErrors, NameTheOptionsNotTheFlags) {
  TempDir dir;
  dataprep::PreprocessOptions options;
  options.inputs = {fixture_path("fortunes.jsonl")};
  options.output_prefix = dir.file("out");
  options.tokenizer.model = fixture_path("fortunes.model");
  const auto refused = [](const dataprep::PreprocessOptions& bad, const std::vector<std::string>& words) {
    const std::string message = expect_error([&] { dataprep::preprocess(bad, nullptr); }, words);
    EXPECT_EQ(message.find("--"), std::string::npos) << message;
  };
  dataprep::PreprocessOptions bad = options;
  bad.workers = 100000;
  refused(bad, {"`workers` 100000", "1024"});
  bad = options;
  bad.batch_bytes = 0;
  refused(bad, {"`batch_bytes` 0"});
  bad = options;
  bad.eod_id = 5000;
  refused(bad, {"`eod_id` 5000"});
  bad = options;
  bad.reader.json_keys = {"text", "text"};
  refused(bad, {"'text'", "twice", "`json_keys`"});
  bad = options;
  bad.tokenizer.pattern = "cl100k";
  refused(bad, {"`tokenizer_pattern`"});
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

}  // namespace
}  // namespace dufu::testing
