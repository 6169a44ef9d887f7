// Issue 41: Parquet and Arrow IPC inputs of `dataprep preprocess`. pyarrow writes the
// inputs (tests/reference/parquet_inputs.py: every codec, plain and dictionary
// encodings, every text type, IPC file and stream formats) and beside them a jsonl of
// the same documents; each input must give the jsonl's bytes exactly. Then the bad
// records (nulls, invalid UTF-8) under --on-error fail and skip, the refusals (missing
// column, a column that is not text, a truncated file, a FIFO), and jobs divided at
// row groups (--shard K/N merged, mpirun), byte for byte against one process.
// (A build without Arrow refuses such inputs in one line: preprocess_test checks it.)
#include <sys/stat.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "support/temp_dir.h"
#include "support/tool_runner.h"

namespace dufu::testing {
namespace {

bool build_has_arrow() { return DUFU_TEST_HAVE_ARROW != 0; }

CommandResult preprocess(const std::string& arguments) {
  return run_command(shell_quote(dataprep_tool()) + " preprocess --quiet --tokenizer-model " +
                     shell_quote(fixture_path("fortunes.model")) + " " + arguments + " 2>&1");
}

// Every file in `dir` (names only), to see that a refused run leaves nothing.
std::vector<std::string> listing(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

class TableInputTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!build_has_arrow()) return;
    inputs_ = new TempDir();
    const CommandResult written =
        run_command(std::string(DUFU_ARROW_PYTHON) + " " + shell_quote(std::string(DUFU_SOURCE_DIR) +
                                                                       "/tests/reference/parquet_inputs.py") +
                    " " + shell_quote(fixture_path("fortunes.jsonl")) + " " + shell_quote(inputs_->path()) + " 2>&1");
    ASSERT_EQ(written.exit_code, 0) << written.output;
  }
  static void TearDownTestSuite() {
    delete inputs_;
    inputs_ = nullptr;
  }
  void SetUp() override {
    if (!build_has_arrow()) GTEST_SKIP() << "this build has no Arrow: " << DUFU_TEST_ARROW_MISSING;
  }

  static std::string input(const std::string& name) { return shell_quote(inputs_->file(name)); }
  std::string out(const std::string& name) const { return dir_.file(name); }

  // The outputs of both keys of `prefix` (shard and sidecar) hold the bytes of `expected`'s.
  static void expect_same_outputs(const std::string& prefix, const std::string& expected, const std::string& what) {
    for (const char* key : {"_text_document", "_title_document"}) {
      for (const char* extension : {".bin", ".idx", ".dufu.json"}) {
        const std::string got = prefix + key + extension;
        ASSERT_TRUE(std::filesystem::exists(got)) << what << ": no " << got;
        EXPECT_TRUE(read_all(got) == read_all(expected + key + extension)) << what << ": " << key << extension
                                                                           << " differs";
      }
    }
  }

  static TempDir* inputs_;
  TempDir dir_;
};

TempDir* TableInputTest::inputs_ = nullptr;

TEST_F(TableInputTest, EveryCodecEncodingTextTypeAndIpcFormatGivesTheJsonlsBytes) {
  const std::string keys = " --json-keys text title";
  const CommandResult reference = preprocess("-i " + input("expected.jsonl") + keys + " -o " + out("ref"));
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  for (const std::string name :
       {"codec-none.parquet", "codec-snappy.parquet", "codec-zstd.parquet", "codec-gzip.parquet", "codec-lz4.parquet",
        "codec-brotli.parquet", "plain-encoding.parquet", "dictionary-type.parquet", "large-string.parquet",
        "binary.parquet", "string-view.parquet", "one-row-group.parquet", "file.arrow", "stream.arrow",
        "stream-zstd.arrow", "not-named.bin"}) {
    const CommandResult run = preprocess("-i " + input(name) + keys + " -o " + out(name));
    ASSERT_EQ(run.exit_code, 0) << name << ": " << run.output;
    EXPECT_NE(run.output.find("records    700 read"), std::string::npos) << name << ": " << run.output;
    expect_same_outputs(out(name), out("ref"), name);
  }
  // A file with the schema and no rows is an empty jsonl.
  const CommandResult no_rows = preprocess("-i " + input("expected-empty.jsonl") + keys + " -o " + out("ref-empty"));
  ASSERT_EQ(no_rows.exit_code, 0) << no_rows.output;
  const CommandResult empty = preprocess("-i " + input("empty.parquet") + keys + " -o " + out("empty"));
  ASSERT_EQ(empty.exit_code, 0) << empty.output;
  expect_same_outputs(out("empty"), out("ref-empty"), "empty.parquet");
}

TEST_F(TableInputTest, GlobsOfManyFilesGiveTheSameBytesForAnyWorkers) {
  // Six files of 25 row groups each, as one jsonl of six copies.
  std::string six_copies;
  for (int i = 0; i < 6; ++i) six_copies += read_all(inputs_->file("expected.jsonl"));
  write_all(out("six.jsonl"), six_copies);
  const std::string keys = " --json-keys text title";
  const CommandResult reference = preprocess("-i " + shell_quote(out("six.jsonl")) + keys + " -o " + out("ref"));
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  for (const char* workers : {"1", "3"}) {
    const std::string prefix = out(std::string("glob-") + workers);
    const CommandResult run =
        preprocess("-i " + shell_quote(inputs_->file("codec-*.parquet")) + keys + " --workers " + workers + " -o " + prefix);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    expect_same_outputs(prefix, out("ref"), std::string("workers ") + workers);
  }
}

TEST_F(TableInputTest, NullsAndInvalidUtf8AreBadRecordsNamedByRowAndRowGroup) {
  const std::vector<std::string> before = listing(dir_.path());
  const CommandResult nulls = preprocess("-i " + input("with-nulls.parquet") + " -o " + out("n"));
  EXPECT_EQ(nulls.exit_code, 1) << nulls.output;
  EXPECT_NE(nulls.output.find("with-nulls.parquet: row 5 (row group 0): null in column 'text'"), std::string::npos)
      << nulls.output;
  const CommandResult utf8 = preprocess("-i " + input("bad-utf8.parquet") + " -o " + out("u"));
  EXPECT_EQ(utf8.exit_code, 1) << utf8.output;
  EXPECT_NE(utf8.output.find("bad-utf8.parquet: row 3 (row group 0): invalid UTF-8 in column 'text'"),
            std::string::npos)
      << utf8.output;
  EXPECT_EQ(listing(dir_.path()), before) << "a refused run left files";

  // Skipped: the documents of the other rows, exactly; both nulls counted (the second
  // in row group 1).
  const std::string keys = " --json-keys text title";
  const CommandResult reference =
      preprocess("-i " + input("expected-without-nulls.jsonl") + keys + " -o " + out("ref"));
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  const CommandResult skipped =
      preprocess("-i " + input("with-nulls.parquet") + keys + " --on-error skip -o " + out("skipped"));
  ASSERT_EQ(skipped.exit_code, 0) << skipped.output;
  EXPECT_NE(skipped.output.find("2 bad skipped"), std::string::npos) << skipped.output;
  EXPECT_NE(skipped.output.find("row 40 (row group 1): null in column 'text'"), std::string::npos) << skipped.output;
  expect_same_outputs(out("skipped"), out("ref"), "nulls skipped");
}

TEST_F(TableInputTest, WhatCannotBeReadIsRefusedInOneLineNamingTheFile) {
  const std::vector<std::string> before = listing(dir_.path());
  const auto expect_refused = [&](const std::string& arguments, const std::string& message) {
    const CommandResult run = preprocess(arguments + " -o " + out("x"));
    EXPECT_EQ(run.exit_code, 1) << arguments << ": " << run.output;
    EXPECT_NE(run.output.find(message), std::string::npos) << arguments << ": " << run.output;
    EXPECT_EQ(listing(dir_.path()), before) << arguments << ": a refused run left files";
  };
  expect_refused("-i " + input("codec-zstd.parquet") + " --json-keys body",
                 "codec-zstd.parquet: no column 'body' (its columns: text, id, url, score, title, meta)");
  expect_refused("-i " + input("file.arrow") + " --json-keys body",
                 "file.arrow: no column 'body' (its columns: text, id, title)");
  expect_refused("-i " + input("ints.parquet"), "ints.parquet: column 'text' holds int64, not text");
  expect_refused("-i " + input("zero-bytes.parquet"), "zero-bytes.parquet: not a readable Parquet file");
  expect_refused("-i " + input("corrupt-footer.parquet"), "corrupt-footer.parquet: not a readable Parquet file");
  expect_refused("-i " + input("corrupt-page.parquet"), "corrupt-page.parquet: row group 3: ");
  const std::string whole = read_all(inputs_->file("codec-snappy.parquet"));
  TempDir scratch;
  write_all(scratch.file("truncated.parquet"), whole.substr(0, whole.size() / 2));
  expect_refused("-i " + shell_quote(scratch.file("truncated.parquet")),
                 "truncated.parquet: not a readable Parquet file");
  const std::string stream = read_all(inputs_->file("stream.arrow"));
  write_all(scratch.file("truncated.arrow"), stream.substr(0, stream.size() / 2));
  expect_refused("-i " + shell_quote(scratch.file("truncated.arrow")), "truncated.arrow: record batch ");
  ASSERT_EQ(::mkfifo(scratch.file("fifo.parquet").c_str(), 0600), 0);
  expect_refused("-i " + shell_quote(scratch.file("fifo.parquet")), "fifo.parquet': not a regular file");
}

// A job divided among parts cuts a Parquet file between row groups (each part reads
// the row groups that start in its byte range) and keeps an Arrow file whole; the
// merged parts, and mpirun's ranks, write the one process's bytes.
TEST_F(TableInputTest, DividedJobsCutParquetAtRowGroupsAndWriteTheOneProcessBytes) {
  const std::string inputs = "-i " + input("codec-none.parquet") + " " + input("stream.arrow") + " " +
                             input("codec-zstd.parquet") + " --json-keys text title";
  const CommandResult single = preprocess(inputs + " -o " + out("single"));
  ASSERT_EQ(single.exit_code, 0) << single.output;
  for (const int parts : {2, 3, 5}) {
    for (int k = 0; k < parts; ++k) {
      const std::string prefix = out("sharded-" + std::to_string(parts));
      const CommandResult part =
          preprocess(inputs + " --shard " + std::to_string(k) + "/" + std::to_string(parts) + " -o " + prefix);
      ASSERT_EQ(part.exit_code, 0) << part.output;
    }
    for (const char* key : {"_text_document", "_title_document"}) {
      std::string list;
      for (int k = parts - 1; k >= 0; --k) {
        list += " " + shell_quote(out("sharded-" + std::to_string(parts)) + key + ".part-" + std::to_string(k) +
                                  "-of-" + std::to_string(parts));
      }
      const std::string merged = out("merged-" + std::to_string(parts)) + key;
      const CommandResult merge =
          run_command(shell_quote(dataprep_tool()) + " merge" + list + " -o " + shell_quote(merged) + " 2>&1");
      ASSERT_EQ(merge.exit_code, 0) << merge.output;
      EXPECT_TRUE(read_all(merged + ".bin") == read_all(out("single") + key + ".bin")) << parts << " parts " << key;
      EXPECT_TRUE(read_all(merged + ".idx") == read_all(out("single") + key + ".idx")) << parts << " parts " << key;
    }
  }
  // The first Parquet file (25 row groups) was cut: part 1 of 3 covers a byte range of
  // it, not all of it; the Arrow stream went whole to one part.
  const std::string manifest = read_all(out("sharded-3") + "_text_document.part-1-of-3.manifest");
  EXPECT_NE(manifest.find("codec-none.parquet\",\"whole\":false"), std::string::npos) << manifest;
  EXPECT_EQ(manifest.find("stream.arrow\",\"whole\":false"), std::string::npos) << manifest;

  const CommandResult ranks = run_command(std::string(DUFU_MPIRUN) + " -np 3 " + shell_quote(dataprep_tool()) +
                                          " preprocess --quiet --tokenizer-model " +
                                          shell_quote(fixture_path("fortunes.model")) + " " + inputs + " -o " +
                                          out("ranks") + " 2>&1");
  ASSERT_EQ(ranks.exit_code, 0) << ranks.output;
  expect_same_outputs(out("ranks"), out("single"), "3 ranks");
}

}  // namespace
}  // namespace dufu::testing
