// Issue 26: the ranks of `dataprep preprocess` under mpirun must have been started
// alike. An MPMD command line gives one rank other options, and a tokenizer path that
// names another file on another node gives it another vocabulary: each rank would
// then write its part its own way and the joined shard be corrupt, with exit status
// 0. The ranks compare every option that decides the bytes, the tokenizer's SHA-256,
// the inputs and the output before anything is written: one error line naming the
// option, no output or temporary, the previous pair untouched.
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "support/temp_dir.h"
#include "support/tool_runner.h"

namespace {

using dufu::testing::CommandResult;
using dufu::testing::fixture_path;
using dufu::testing::read_all;
using dufu::testing::run_command;
using dufu::testing::shell_quote;
using dufu::testing::TempDir;
using dufu::testing::write_all;

std::string tool() { return shell_quote(dufu::testing::dataprep_tool()); }

// Lines [first, first + count) of a fixture file.
std::string lines_of(const std::string& name, std::size_t first, std::size_t count) {
  const std::string all = read_all(fixture_path(name));
  std::size_t begin = 0;
  for (std::size_t i = 0; i < first && begin != std::string::npos; ++i) begin = all.find('\n', begin) + 1;
  std::size_t end = begin;
  for (std::size_t i = 0; i < count && end < all.size(); ++i) end = all.find('\n', end) + 1;
  return all.substr(begin, end - begin);
}

std::size_t count_of(const std::string& text, const std::string& part) {
  std::size_t count = 0;
  for (std::size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++count;
  return count;
}

class RankAgreement : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(in_);
    std::filesystem::create_directories(out_);
    write_all(in_ + "/a.jsonl", lines_of("fortunes.jsonl", 0, 400));
    write_all(in_ + "/b.jsonl", lines_of("fortunes.jsonl", 400, 400));
    // The pair an earlier job wrote, which a refused job must leave as it is.
    const CommandResult earlier = run_command(tool() + " " + flags() + " 2>&1");
    ASSERT_EQ(earlier.exit_code, 0) << earlier.output;
    earlier_bin_ = read_all(prefix_ + ".bin");
    earlier_idx_ = read_all(prefix_ + ".idx");
  }

  std::string flags(const std::string& model = fixture_path("fortunes.model"), const std::string& input = "*.jsonl",
                    const std::string& prefix = "") const {
    return "preprocess -i " + shell_quote(in_ + "/" + input) + " -o " +
           shell_quote(prefix.empty() ? prefix_ : prefix) + " -m " + shell_quote(model) + " -j 1 -q";
  }

  // Rank 0 started with `rank0` and rank 1 with `rank1` (arguments of dataprep).
  static CommandResult mpmd(const std::string& rank0, const std::string& rank1) {
    return run_command(std::string("timeout -k 5 120 ") + DUFU_MPIRUN + " -np 1 " + tool() + " " + rank0 +
                       " : -np 1 " + tool() + " " + rank1 + " 2>&1");
  }

  void expect_refused(const CommandResult& run, const std::string& difference) const {
    EXPECT_EQ(run.exit_code, 1) << run.output;
    EXPECT_EQ(count_of(run.output, "dataprep: error: "), 1u) << run.output;
    EXPECT_NE(run.output.find("dataprep: error: the ranks were not started alike: " + difference), std::string::npos)
        << run.output;
    EXPECT_NE(run.output.find(" on rank 0 (rank 1 of 2 differs from rank 0); HINT: give every rank the same options "
                              "and the same files\n"),
              std::string::npos)
        << run.output;
    EXPECT_EQ(dir_listing(), (std::set<std::string>{"corpus.bin", "corpus.idx", "corpus.dufu.json"}));
    EXPECT_TRUE(read_all(prefix_ + ".bin") == earlier_bin_) << "the earlier .bin changed";
    EXPECT_TRUE(read_all(prefix_ + ".idx") == earlier_idx_) << "the earlier .idx changed";
  }

  std::set<std::string> dir_listing() const {
    std::set<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(out_)) names.insert(entry.path().filename().string());
    return names;
  }

  TempDir dir_;
  std::string in_ = dir_.file("in");
  std::string out_ = dir_.file("out");
  std::string prefix_ = out_ + "/corpus";
  std::string earlier_bin_, earlier_idx_;
};

struct Case {
  std::string rank0_extra, rank1_extra, difference;
};

TEST_F(RankAgreement, ADtypeOrEodGivenToOneRankOnlyStopsTheJobBeforeAnythingIsWritten) {
  const std::vector<Case> cases = {
      {"", "--dtype int32", "--dtype is 'int32' on rank 1 but 'uint16' (from the vocabulary size) on rank 0"},
      {"", "--append-eod", "--append-eod is 'given' on rank 1 but 'not given' on rank 0"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.rank1_extra);
    expect_refused(mpmd(flags() + " " + c.rank0_extra, flags() + " " + c.rank1_extra), c.difference);
  }
}

TEST_F(RankAgreement, AnEodIdOrDocumentLimitGivenToOneRankOnlyStopsTheJobBeforeAnythingIsWritten) {
  const std::vector<Case> cases = {
      {"--append-eod", "--append-eod --eod-id 5", "--eod-id is '5' on rank 1 but '2' on rank 0"},
      {"", "--max-document-bytes 100000", "--max-document-bytes is '100000' on rank 1 but '16777216' on rank 0"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.rank1_extra);
    expect_refused(mpmd(flags() + " " + c.rank0_extra, flags() + " " + c.rank1_extra), c.difference);
  }
}

TEST_F(RankAgreement, AnotherTokenizerInputOrOutputOnOneRankStopsTheJobBeforeAnythingIsWritten) {
  // A tokenizer of its own (a tiktoken file of the 256 bytes) on rank 1, as a
  // node-local path naming another file would give it.
  static const char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string ranks;
  for (int byte = 0; byte < 256; ++byte) {
    ranks += kBase64[byte >> 2];
    ranks += kBase64[(byte & 3) << 4];
    ranks += "== " + std::to_string(byte) + "\n";
  }
  const std::string other_model = dir_.file("gpt2.tiktoken");
  write_all(other_model, ranks);
  const CommandResult tokenizer = mpmd(flags(), flags(other_model));
  expect_refused(tokenizer, "the SHA-256 of --tokenizer-model is '");
  EXPECT_NE(tokenizer.output.find("' (" + other_model + ") on rank 1 but '"), std::string::npos) << tokenizer.output;

  const std::string model = fixture_path("fortunes.model");
  expect_refused(mpmd(flags(), flags(model, "*.jsonl", out_ + "/other")),
                 "--output-prefix is '" + out_ + "/other' on rank 1 but '" + prefix_ + "' on rank 0");
  expect_refused(mpmd(flags(), flags(model, "a.jsonl")),
                 "--input (expanded) is '" + in_ + "/a.jsonl' on rank 1 but '" + in_ + "/a.jsonl " + in_ +
                     "/b.jsonl' on rank 0");
}

TEST_F(RankAgreement, ACopyOfTheTokenizerUnderAnotherPathIsTheSameTokenizer) {
  const std::string copy = dir_.file("copy.model");
  std::filesystem::copy_file(fixture_path("fortunes.model"), copy);
  const CommandResult same = mpmd(flags(), flags(copy));
  ASSERT_EQ(same.exit_code, 0) << same.output;
  EXPECT_TRUE(read_all(prefix_ + ".bin") == earlier_bin_) << "two ranks wrote other tokens than one process";
  EXPECT_TRUE(read_all(prefix_ + ".idx") == earlier_idx_) << "two ranks wrote another index than one process";
}

}  // namespace
