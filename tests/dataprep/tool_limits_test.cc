// Absurd values and unbounded inputs given to `dataprep` (issue 15): each ends in one
// line on stderr naming what and where, exit status 1, nothing left behind, and
// memory that stays bounded whatever the input (/dev/zero, one huge line).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/synthetic_shard.h"
#include "support/temp_dir.h"
#include "support/tool_runner.h"
#include "tool_process.h"

namespace dufu::testing {
namespace {

namespace fs = std::filesystem;

std::string model() { return fixture_path("fortunes.model"); }

// RSS allowed to a run that must not hold a huge document: the tokenizer, a 16 MiB
// line buffer and the pipeline are a few tens of MB (more under the sanitizers).
constexpr long kBoundedRssKb = (kSanitized ? 768L : 256L) * 1024;
// What a run of an unbounded build would take before being stopped.
constexpr rlim_t kAddressSpaceGuard = rlim_t{4} << 30;

std::size_t lines_of(const std::string& text) {
  std::size_t lines = 0;
  for (const char c : text) lines += c == '\n' ? 1 : 0;
  return lines + (!text.empty() && text.back() != '\n' ? 1 : 0);
}

// One line on stderr, exit 1, no crash and no CLI11 or C++ runtime wording.
void expect_one_line_error(const ToolResult& result, const std::vector<std::string>& needles) {
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_EQ(lines_of(result.output), 1U) << result.output;
  EXPECT_EQ(result.output.rfind("dataprep: error: ", 0), 0U) << result.output;
  EXPECT_LT(result.output.size(), 400U) << result.output;
  for (const auto& forbidden : {"terminate called", "unexpected error", "bad_alloc", "Run with --help"}) {
    EXPECT_EQ(result.output.find(forbidden), std::string::npos) << result.output;
  }
  for (const auto& needle : needles) {
    EXPECT_NE(result.output.find(needle), std::string::npos) << "lacks \"" << needle << "\": " << result.output;
  }
}

class ToolLimits : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::create_directories(dir_.file("out"));
    std::ifstream in(fixture_path("fortunes.jsonl"), std::ios::binary);
    std::ofstream out(corpus(), std::ios::binary);
    std::string line;
    for (int i = 0; i < 50 && std::getline(in, line); ++i) out << line << '\n';
  }

  std::string corpus() const { return dir_.file("corpus.jsonl"); }
  std::string out(const std::string& name = "corpus") const { return dir_.file("out/" + name); }

  ToolResult preprocess(const std::vector<std::string>& extra, const ToolOptions& options = {}) {
    std::vector<std::string> arguments{"preprocess", "-q", "-m", model()};
    arguments.insert(arguments.end(), extra.begin(), extra.end());
    return run_tool(arguments, options);
  }

  bool out_is_empty() const { return fs::is_empty(dir_.file("out")); }

  TempDir dir_;
};

// 5. Far too many workers: refused with the limit, before any file is made (it used
// to end in "terminate called without an active exception" and leave a temporary).
TEST_F(ToolLimits, TooManyWorkersAreRefusedWithTheLimit) {
  const ToolResult result = preprocess({"-i", corpus(), "-o", out(), "--workers", "100000"});
  expect_one_line_error(result, {"--workers", "100000", "1024"});
  EXPECT_TRUE(out_is_empty());
  // The most that is allowed works (fewer under the sanitizers, where a thread is slow to start).
  EXPECT_EQ(preprocess({"-i", corpus(), "-o", out(), "--workers", kSanitized ? "64" : "1024"}).exit_code, 0);
}

// 8. An endless line (/dev/zero has no '\n') stops at the limit, which the message
// names, in bounded memory.
TEST_F(ToolLimits, DevZeroStopsAtTheDocumentLimitInBoundedMemory) {
  const ToolResult result = preprocess({"-i", "/dev/zero", "-o", out()}, {.address_space_limit = kAddressSpaceGuard});
  expect_one_line_error(result, {"/dev/zero:1", "16777216 bytes", "--max-document-bytes"});
  EXPECT_LT(result.max_rss_kb, kBoundedRssKb);
  EXPECT_TRUE(out_is_empty());
}

// The same through a pipe (head -c of /dev/zero, one 200 MB line) with a lower limit.
TEST_F(ToolLimits, AHugeLineFromAPipeStopsAtTheDocumentLimit) {
  ToolResult result;
  {
    // sh runs head and dataprep; wait4 on sh reports the largest of them.
    const std::string command = "head -c 200000000 /dev/zero | DUFU_LOG_LEVEL=warn " + shell_quote(dataprep_under_test()) +
                                " preprocess -q -i - --stdin-format txt --max-document-bytes 1000000 -m " +
                                shell_quote(model()) + " -o " + shell_quote(out());
    int status = 0;
    rusage usage{};
    const pid_t pid = ::fork();
    if (pid == 0) {
      if (!kSanitized) {
        const rlimit limit{kAddressSpaceGuard, kAddressSpaceGuard};
        ::setrlimit(RLIMIT_AS, &limit);
      }
      ::execl("/bin/sh", "sh", "-c", (command + " 2>" + shell_quote(dir_.file("stderr"))).c_str(),
              static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ASSERT_EQ(::wait4(pid, &status, 0, &usage), pid);
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    result.max_rss_kb = usage.ru_maxrss;
    result.output = read_all(dir_.file("stderr"));
  }
  expect_one_line_error(result, {"<stdin>:1", "1000000 bytes", "--max-document-bytes"});
  EXPECT_LT(result.max_rss_kb, kBoundedRssKb);
  EXPECT_TRUE(out_is_empty());
}

// With --on-error skip, a document over the limit is skipped, counted and reported
// with its line, and the documents around it are kept.
TEST_F(ToolLimits, AHugeDocumentIsSkippedWithOnErrorSkip) {
  const std::string input = dir_.file("huge.jsonl");
  {
    std::ofstream file(input, std::ios::binary);
    file << "{\"text\": \"before\"}\n{\"text\": \"" << std::string(30'000'000, 'x') << "\"}\n{\"text\": \"after\"}\n";
  }
  const ToolResult skipped = preprocess({"-i", input, "-o", out(), "--on-error", "skip", "--max-document-bytes", "4000000"},
                                        {.address_space_limit = kAddressSpaceGuard});
  EXPECT_EQ(skipped.exit_code, 0) << skipped.output;
  EXPECT_NE(skipped.output.find("2 written"), std::string::npos) << skipped.output;
  EXPECT_NE(skipped.output.find("1 bad skipped"), std::string::npos) << skipped.output;
  EXPECT_NE(skipped.output.find(input + ":2: line longer than 4000000 bytes"), std::string::npos) << skipped.output;
  EXPECT_LT(skipped.max_rss_kb, kBoundedRssKb);

  // Without skip (and the default limit) the run stops at that line, before tokenizing it.
  const ToolResult failed = preprocess({"-i", input, "-o", out("other")}, {.address_space_limit = kAddressSpaceGuard});
  expect_one_line_error(failed, {input + ":2", "16777216"});
  EXPECT_LT(failed.max_rss_kb, kBoundedRssKb);
}

// A whole-file document (--txt-document file) has the same limit.
TEST_F(ToolLimits, AWholeFileDocumentHasTheLimitToo) {
  const std::string input = dir_.file("big.txt");
  write_all(input, std::string(3'000'000, 'y'));
  const ToolResult result =
      preprocess({"-i", input, "-o", out(), "--txt-document", "file", "--max-document-bytes", "1000000"});
  expect_one_line_error(result, {input, "1000000 bytes", "--max-document-bytes"});
}

// 10. Numbers that do not fit, or are not numbers, are refused in a few words (CLI11's
// own range check printed the largest double, 309 digits, and exited 105).
TEST_F(ToolLimits, BadNumbersAreOneLineErrors) {
  const std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>> cases{
      {{"--workers", "-5"}, {"--workers", "'-5'", "0 to 1024"}},
      {{"--workers", "1e300"}, {"--workers", "'1e300'"}},
      {{"--batch-bytes", "0"}, {"--batch-bytes", "1 to 1073741824"}},
      {{"--batch-bytes", "99999999999999999999999999"}, {"--batch-bytes", "out of range"}},
      {{"--max-document-bytes", "-1"}, {"--max-document-bytes"}},
      {{"--eod-id", "-3", "--append-eod"}, {"--eod-id", "'-3'"}},
  };
  for (const auto& [flags, needles] : cases) {
    SCOPED_TRACE(flags[0] + " " + flags[1]);
    std::vector<std::string> arguments{"-i", corpus(), "-o", out()};
    arguments.insert(arguments.end(), flags.begin(), flags.end());
    expect_one_line_error(preprocess(arguments), needles);
  }
  EXPECT_TRUE(out_is_empty());
  // CLI11's other errors are one line with status 1 as well.
  expect_one_line_error(run_tool({"preprocess", "-i", corpus()}), {"--output-prefix"});
  expect_one_line_error(run_tool({"no-such-command"}), {"no-such-command"});
}

// 10. A sample count that wrapped around (-2 read as 18446744073709551614), and sizes
// that do not fit in memory ("not enough memory for X (needs N)", not bad_alloc).
TEST_F(ToolLimits, SampleCountsThatWrapOrDoNotFitAreRefused) {
  write_synthetic_shard(out("shard"), std::vector<std::uint64_t>(100, 50));
  const std::string cache = dir_.file("cache");
  expect_one_line_error(run_tool({"build-index", "-d", out("shard"), "--num-samples", "-2", "--cache-dir", cache}),
                        {"--num-samples", "'-2'"});
  expect_one_line_error(run_tool({"build-index", "-d", out("shard"), "--num-samples", "18446744073709551614",
                                  "--cache-dir", cache}),
                        {"--num-samples", "out of range"});
  expect_one_line_error(run_tool({"sample", "-d", out("shard"), "--count", "-1", "--cache-dir", cache}), {"--count"});
  expect_one_line_error(run_tool({"build-index", "-d", out("shard"), "--seq-length", "99999999999999999999999",
                                  "--cache-dir", cache}),
                        {"--seq-length", "out of range"});
  // 2e11 samples of 16 tokens over 5000 tokens: 640 million epochs of 100 documents.
  const ToolResult huge = run_tool({"build-index", "-d", out("shard"), "--seq-length", "16", "--num-samples",
                                    "200000000000", "--cache-dir", cache},
                                   {.address_space_limit = kAddressSpaceGuard, .environment = {"DUFU_LOG_LEVEL=warn"}});
  expect_one_line_error(huge, {"not enough memory for the document index", "needs"});
  // Nothing is left in the cache: no half-built key, no lock file.
  EXPECT_TRUE(!fs::exists(cache) || fs::is_empty(cache));
}

// 10. An --eod-id outside the vocabulary, an output prefix that names a directory and a
// JSON key given twice are refused before anything is written.
TEST_F(ToolLimits, InconsistentPreprocessFlagsAreRefused) {
  expect_one_line_error(preprocess({"-i", corpus(), "-o", out(), "--append-eod", "--eod-id", "2000"}),
                        {"--eod-id 2000", model(), "2000 pieces"});
  expect_one_line_error(preprocess({"-i", corpus(), "-o", out(), "--eod-id", "5000"}), {"--eod-id 5000"});
  expect_one_line_error(preprocess({"-i", corpus(), "-o", dir_.file("out/")}),
                        {dir_.file("out/"), "does not end in a file name"});
  expect_one_line_error(preprocess({"-i", corpus(), "-o", out(), "--json-keys", "text", "text"}),
                        {"'text'", "twice", "--json-keys"});
  EXPECT_TRUE(out_is_empty());
  // The largest id is accepted.
  EXPECT_EQ(preprocess({"-i", corpus(), "-o", out(), "--append-eod", "--eod-id", "1999"}).exit_code, 0);
}

}  // namespace
}  // namespace dufu::testing
