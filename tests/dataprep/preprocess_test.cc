// End-to-end tests of `dataprep preprocess`, `merge`, `inspect` and
// `train-tokenizer` on a real corpus (Debian's fortunes), against independent
// references: sentencepiece's own encoders (python3-sentencepiece and spm_encode) and
// a re-expression of Megatron-LM's preprocess_data.py writer.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "dufu/dataprep/indexed_dataset.h"
#include "support/tool_runner.h"

namespace dufu::testing {
namespace {

using Documents = std::vector<std::vector<std::int32_t>>;

std::string model() { return fixture_path("fortunes.model"); }
std::string corpus_jsonl() { return fixture_path("fortunes.jsonl"); }
std::string corpus_txt() { return fixture_path("fortunes.txt"); }

CommandResult preprocess(const std::string& arguments) {
  return run_command(shell_quote(dataprep_tool()) + " preprocess --quiet --tokenizer-model " +
                     shell_quote(model()) + " " + arguments);
}

void expect_success(const CommandResult& result) {
  ASSERT_EQ(result.exit_code, 0) << result.output;
}

Documents read_documents(const std::string& prefix,
                         dataprep::IndexImpl impl = dataprep::IndexImpl::kMmap) {
  const auto dataset = dataprep::IndexedDataset::open(prefix, impl);
  Documents documents;
  const auto& index = dataset->index();
  for (std::uint64_t d = 0; d < index.num_documents(); ++d) {
    std::vector<std::int32_t> tokens;
    for (auto s = index.document_index(d); s < index.document_index(d + 1); ++s) {
      const auto part = dataset->sequence(s);
      tokens.insert(tokens.end(), part.begin(), part.end());
    }
    documents.push_back(std::move(tokens));
  }
  return documents;
}

Documents parse_id_lines(const std::string& text) {
  Documents documents;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    std::istringstream ids(line);
    std::vector<std::int32_t> document;
    int id = 0;
    while (ids >> id) document.push_back(id);
    documents.push_back(std::move(document));
  }
  return documents;
}

Documents python_reference(const std::string& input, const std::string& flags) {
  const auto result = run_command(std::string(DUFU_REFERENCE_PYTHON) + " " +
                                  shell_quote(std::string(DUFU_SOURCE_DIR) +
                                              "/tests/reference/spm_encode_reference.py") +
                                  " " + shell_quote(model()) + " " + shell_quote(input) + " " +
                                  flags + " 2>/dev/null");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  return parse_id_lines(result.output);
}

void expect_same_documents(const Documents& actual, const Documents& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (std::size_t i = 0; i < actual.size(); ++i) {
    ASSERT_EQ(actual[i], expected[i]) << "document " << i;
  }
}

void expect_same_files(const std::string& a, const std::string& b) {
  const auto left = read_all(a);
  const auto right = read_all(b);
  EXPECT_EQ(left.size(), right.size()) << a << " vs " << b;
  EXPECT_TRUE(left == right) << a << " and " << b << " differ";
}

TEST(Preprocess, JsonlTokensEqualSentencepieceWithEod) {
  TempDir dir;
  expect_success(preprocess("--input " + shell_quote(corpus_jsonl()) + " --output-prefix " +
                            dir.file("out") + " --append-eod"));
  const auto expected = python_reference(corpus_jsonl(), "--append-eod");
  ASSERT_GT(expected.size(), 10000U);
  expect_same_documents(read_documents(dir.file("out")), expected);
}

TEST(Preprocess, JsonlTokensEqualSentencepieceWithoutEod) {
  TempDir dir;
  expect_success(preprocess("--input " + shell_quote(corpus_jsonl()) + " --output-prefix " +
                            dir.file("out")));
  expect_same_documents(read_documents(dir.file("out")), python_reference(corpus_jsonl(), ""));
}

TEST(Preprocess, TxtTokensEqualSpmEncode) {
  TempDir dir;
  expect_success(preprocess("--input " + shell_quote(corpus_txt()) + " --output-prefix " +
                            dir.file("out")));
  const auto spm = run_command("spm_encode --model=" + shell_quote(model()) +
                               " --output_format=id < " + shell_quote(corpus_txt()) +
                               " 2>/dev/null");
  ASSERT_EQ(spm.exit_code, 0) << spm.output;
  const auto expected = parse_id_lines(spm.output);
  ASSERT_GT(expected.size(), 10000U);
  expect_same_documents(read_documents(dir.file("out")), expected);
}

TEST(Preprocess, MmapOutputIsByteIdenticalToMegatron) {
  TempDir dir;
  expect_success(preprocess("--input " + shell_quote(corpus_jsonl()) + " --output-prefix " +
                            dir.file("dufu") + " --append-eod --impl mmap"));
  const auto reference = run_command(
      std::string(DUFU_REFERENCE_PYTHON) + " " +
      shell_quote(std::string(DUFU_SOURCE_DIR) + "/tests/reference/megatron_preprocess.py") + " " +
      shell_quote(model()) + " " + shell_quote(corpus_jsonl()) + " " + dir.file("megatron") +
      " --append-eod");
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  expect_same_files(dir.file("dufu.bin"), dir.file("megatron.bin"));
  expect_same_files(dir.file("dufu.idx"), dir.file("megatron.idx"));
}

TEST(Preprocess, WorkerCountDoesNotChangeBytes) {
  TempDir dir;
  for (const int workers : {1, 2, 5}) {
    expect_success(preprocess("--input " + shell_quote(corpus_jsonl()) + " --output-prefix " +
                              dir.file("w" + std::to_string(workers)) +
                              " --append-eod --batch-bytes 3000 --workers " +
                              std::to_string(workers)));
  }
  for (const char* name : {"w2", "w5"}) {
    expect_same_files(dir.file("w1.bin"), dir.file(std::string(name) + ".bin"));
    expect_same_files(dir.file("w1.idx"), dir.file(std::string(name) + ".idx"));
  }
}

TEST(Preprocess, CompressedAndStdinInputsGiveTheSameBytes) {
  TempDir dir;
  ASSERT_EQ(run_command("zstd -q -o " + dir.file("c.jsonl.zst") + " " + shell_quote(corpus_jsonl()))
                .exit_code,
            0);
  ASSERT_EQ(run_command("gzip -c " + shell_quote(corpus_jsonl()) + " > " + dir.file("c.jsonl.gz"))
                .exit_code,
            0);
  expect_success(preprocess("--input " + shell_quote(corpus_jsonl()) + " --output-prefix " +
                            dir.file("plain") + " --append-eod"));
  expect_success(preprocess("--input " + dir.file("c.jsonl.zst") + " --output-prefix " +
                            dir.file("zst") + " --append-eod"));
  expect_success(preprocess("--input " + dir.file("c.jsonl.gz") + " --output-prefix " +
                            dir.file("gz") + " --append-eod"));
  expect_success(run_command("cat " + dir.file("c.jsonl.zst") + " | " +
                             shell_quote(dataprep_tool()) + " preprocess --quiet --input - " +
                             "--tokenizer-model " + shell_quote(model()) + " --output-prefix " +
                             dir.file("stdin") + " --append-eod"));
  for (const char* name : {"zst", "gz", "stdin"}) {
    expect_same_files(dir.file("plain.bin"), dir.file(std::string(name) + ".bin"));
    expect_same_files(dir.file("plain.idx"), dir.file(std::string(name) + ".idx"));
  }
}

TEST(Preprocess, GlobsExpandInSortedOrder) {
  TempDir dir;
  write_all(dir.file("part-b.txt"), "second file\n");
  write_all(dir.file("part-a.txt"), "first file\n");
  expect_success(preprocess("--input " + shell_quote(dir.file("part-*.txt")) + " --output-prefix " +
                            dir.file("out")));
  const auto documents = read_documents(dir.file("out"));
  ASSERT_EQ(documents.size(), 2U);
  expect_success(preprocess("--input " + dir.file("part-a.txt") + " --output-prefix " +
                            dir.file("a")));
  EXPECT_EQ(documents[0], read_documents(dir.file("a"))[0]);
}

TEST(Preprocess, MergeEqualsPreprocessingTheConcatenation) {
  TempDir dir;
  ASSERT_EQ(run_command("head -n 6000 " + shell_quote(corpus_jsonl()) + " > " + dir.file("a.jsonl") +
                        " && tail -n +6001 " + shell_quote(corpus_jsonl()) + " > " +
                        dir.file("b.jsonl"))
                .exit_code,
            0);
  for (const std::string impl : {"mmap", "lazy"}) {
    const std::string flags = " --append-eod --impl " + impl;
    expect_success(preprocess("--input " + dir.file("a.jsonl") + " --output-prefix " +
                              dir.file(impl + "_a") + flags));
    expect_success(preprocess("--input " + dir.file("b.jsonl") + " --output-prefix " +
                              dir.file(impl + "_b") + flags));
    expect_success(preprocess("--input " + dir.file("a.jsonl") + " " + dir.file("b.jsonl") +
                              " --output-prefix " + dir.file(impl + "_whole") + flags));
    expect_success(run_command(shell_quote(dataprep_tool()) + " merge --impl " + impl + " " +
                               dir.file(impl + "_a") + " " + dir.file(impl + "_b") +
                               " --output-prefix " + dir.file(impl + "_merged")));
    expect_same_files(dir.file(impl + "_whole.bin"), dir.file(impl + "_merged.bin"));
    expect_same_files(dir.file(impl + "_whole.idx"), dir.file(impl + "_merged.idx"));
  }
}

TEST(Preprocess, LazyAndCachedWriteTntidxWithTheSameTokens) {
  TempDir dir;
  for (const std::string impl : {"mmap", "lazy", "cached"}) {
    expect_success(preprocess("--input " + shell_quote(corpus_jsonl()) + " --output-prefix " +
                              dir.file(impl) + " --append-eod --impl " + impl));
  }
  EXPECT_EQ(read_all(dir.file("lazy.idx")).substr(0, 8), std::string("TNTIDX\0\0", 8));
  EXPECT_EQ(read_all(dir.file("mmap.idx")).substr(0, 9), std::string("MMIDIDX\0\0", 9));
  expect_same_files(dir.file("mmap.bin"), dir.file("lazy.bin"));
  expect_same_files(dir.file("lazy.idx"), dir.file("cached.idx"));
  const auto expected = read_documents(dir.file("mmap"));
  expect_same_documents(read_documents(dir.file("lazy"), dataprep::IndexImpl::kLazy), expected);
  expect_same_documents(read_documents(dir.file("cached"), dataprep::IndexImpl::kCached), expected);
}

TEST(Preprocess, SeveralJsonKeysWriteOneShardPerKey) {
  TempDir dir;
  write_all(dir.file("in.jsonl"),
             "{\"title\": \"A title\", \"text\": \"Some body text.\"}\n"
             "{\"title\": \"Another\", \"text\": \"More text here.\"}\n");
  expect_success(preprocess("--input " + dir.file("in.jsonl") + " --json-keys title text " +
                            "--output-prefix " + dir.file("out")));
  EXPECT_TRUE(file_exists(dir.file("out_title_document.idx")));
  EXPECT_TRUE(file_exists(dir.file("out_text_document.bin")));
  EXPECT_FALSE(file_exists(dir.file("out.bin")));
  EXPECT_EQ(read_documents(dir.file("out_title_document")).size(), 2U);
  EXPECT_EQ(read_documents(dir.file("out_text_document")).size(), 2U);
}

TEST(Preprocess, EmptyDocumentsAreSkippedAndCounted) {
  TempDir dir;
  write_all(dir.file("in.txt"), "first line\n\nthird line\n\n");
  const auto result = run_command(shell_quote(dataprep_tool()) + " preprocess --quiet --input " +
                                  dir.file("in.txt") + " --tokenizer-model " + shell_quote(model()) +
                                  " --output-prefix " + dir.file("out") + " --append-eod");
  expect_success(result);
  EXPECT_NE(result.output.find("2 written, 2 empty skipped"), std::string::npos) << result.output;
  EXPECT_EQ(read_documents(dir.file("out")).size(), 2U);
}

struct BadInput {
  std::string name;        // test name
  std::string file;        // input file name
  std::string content;     // its bytes (empty: created by `make`)
  std::string make;        // shell command creating it in the directory, if any
  std::string expected;    // substring of the error message
};

void PrintTo(const BadInput& bad, std::ostream* out) { *out << bad.name; }

class PreprocessBadInput : public ::testing::TestWithParam<BadInput> {};

TEST_P(PreprocessBadInput, FailsNamingThePlaceAndWritesNothing) {
  const auto& bad = GetParam();
  TempDir dir;
  if (!bad.content.empty()) write_all(dir.file(bad.file), bad.content);
  if (!bad.make.empty()) {
    ASSERT_EQ(run_command("cd " + dir.path() + " && " + bad.make).exit_code, 0);
  }
  const auto before = dir.list();
  const auto result = preprocess("--input " + dir.file(bad.file) + " --output-prefix " +
                                 dir.file("out") + " --append-eod");
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find(bad.expected), std::string::npos)
      << "expected '" << bad.expected << "' in: " << result.output;
  EXPECT_EQ(dir.list(), before) << "output or temporary files were left behind";
}

const std::string kCorruptGzip =
    "gzip -c " + shell_quote("/usr/share/games/fortunes/computers") +
    " > bad.txt.gz && printf 'XXXXXXXXXXXXXXXX' | dd of=bad.txt.gz bs=1 seek=200 conv=notrunc 2>/dev/null";

INSTANTIATE_TEST_SUITE_P(
    AllKinds, PreprocessBadInput,
    ::testing::Values(
        BadInput{"MalformedJson", "bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"broken\"\n", "",
                 "bad.jsonl:2: malformed JSON"},
        BadInput{"MissingKey", "bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"ok\"}\n{\"body\": \"x\"}\n",
                 "", "bad.jsonl:3: missing key 'text'"},
        BadInput{"NonStringValue", "bad.jsonl", "{\"text\": 42}\n", "", "bad.jsonl:1: key 'text'"},
        BadInput{"NotAnObject", "bad.jsonl", "[\"text\"]\n", "", "bad.jsonl:1: expected a JSON object"},
        BadInput{"InvalidUtf8Json", "bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": \"\xff\xfe\"}\n", "",
                 "bad.jsonl:2"},
        BadInput{"InvalidUtf8Txt", "bad.txt", "fine\nalso fine\nbroken \xc3\x28 here\n", "",
                 "bad.txt:3: invalid UTF-8"},
        BadInput{"TruncatedZstd", "bad.jsonl.zst", "",
                 "zstd -q -c " + shell_quote("/usr/share/games/fortunes/computers") +
                     " > full.zst && head -c 20000 full.zst > bad.jsonl.zst && rm full.zst",
                 "bad.jsonl.zst"},
        BadInput{"TruncatedGzip", "bad.txt.gz", "",
                 "gzip -c " + shell_quote("/usr/share/games/fortunes/computers") +
                     " > full.gz && head -c 20000 full.gz > bad.txt.gz && rm full.gz",
                 "truncated gzip stream in"},
        BadInput{"CorruptGzip", "bad.txt.gz", "", kCorruptGzip, "bad.txt.gz"},
        BadInput{"MissingFile", "missing.jsonl", "", "true", "cannot open"}),
    [](const auto& info) { return info.param.name; });

TEST(Preprocess, ModelThatIsNotSentencepieceIsRefused) {
  TempDir dir;
  write_all(dir.file("in.txt"), "hello\n");
  write_all(dir.file("fake.model"), "this is not a model\n");
  const auto result = run_command(shell_quote(dataprep_tool()) + " preprocess --quiet --input " +
                                  dir.file("in.txt") + " --tokenizer-model " + dir.file("fake.model") +
                                  " --output-prefix " + dir.file("out"));
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("is not a sentencepiece model"), std::string::npos) << result.output;
  EXPECT_FALSE(file_exists(dir.file("out.bin")));
  EXPECT_FALSE(file_exists(dir.file("out.idx")));
}

// Issue 26: a pre-tokenizer pattern that gives up on a document (PCRE2's match limit,
// reached here by backtracking over a run of 'a's) said so without naming the input
// line, and one worker of several hit it long after that line was read.
TEST(Preprocess, APatternThatGivesUpOnADocumentNamesItsLine) {
  TempDir dir;
  static const char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string ranks;
  for (int byte = 0; byte < 256; ++byte) {
    ranks += kBase64[byte >> 2];
    ranks += kBase64[(byte & 3) << 4];
    ranks += "== " + std::to_string(byte) + "\n";
  }
  write_all(dir.file("bytes.tiktoken"), ranks);
  std::string lines;
  for (int line = 1; line < 2000; ++line) lines += "line " + std::to_string(line) + "\n";
  write_all(dir.file("in.txt"), lines + std::string(40, 'a') + "c\nlast\n");
  for (const std::string& input : {dir.file("in.txt"), std::string("<stdin>")}) {
    const std::string from = input == "<stdin>" ? "--stdin-format txt -i - < " + shell_quote(dir.file("in.txt"))
                                                : "-i " + shell_quote(input);
    const CommandResult result = run_command(
        shell_quote(dataprep_tool()) + " preprocess -q -j 4 --batch-bytes 64 " + from + " -o " +
        shell_quote(dir.file("out")) + " -m " + shell_quote(dir.file("bytes.tiktoken")) +
        " --tokenizer-pattern '(a+)+$' 2>&1");
    EXPECT_EQ(result.exit_code, 1) << result.output;
    EXPECT_NE(result.output.find("dataprep: error: " + input +
                                 ":2000: pre-tokenizer pattern '(a+)+$' failed to match: match limit exceeded"),
              std::string::npos)
        << result.output;
    EXPECT_FALSE(file_exists(dir.file("out.bin")));
  }
}

TEST(Preprocess, OnErrorSkipCountsAndReportsBadRecords) {
  TempDir dir;
  write_all(dir.file("in.jsonl"),
             "{\"text\": \"good one\"}\n{\"text\": 1}\nnot json\n{\"text\": \"good two\"}\n");
  const auto result = preprocess("--input " + dir.file("in.jsonl") + " --output-prefix " +
                                 dir.file("out") + " --on-error skip");
  expect_success(result);
  EXPECT_NE(result.output.find("2 bad skipped"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("in.jsonl:2"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("in.jsonl:3"), std::string::npos) << result.output;
  EXPECT_EQ(read_documents(dir.file("out")).size(), 2U);
}

TEST(Inspect, PrintsCountsAndDecodesADocument) {
  TempDir dir;
  write_all(dir.file("in.txt"), "The quick brown fox jumps over the lazy dog.\nSecond line.\n");
  expect_success(preprocess("--input " + dir.file("in.txt") + " --output-prefix " + dir.file("out")));
  const auto result = run_command(shell_quote(dataprep_tool()) + " inspect " + dir.file("out") +
                                  " --model " + shell_quote(model()) + " --show 0");
  expect_success(result);
  EXPECT_NE(result.output.find("MMIDIDX"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("uint16"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("The quick brown fox jumps over the lazy dog."), std::string::npos)
      << result.output;
}

TEST(TrainTokenizer, TrainsFromCompressedJsonlAndRefusesBadInput) {
  TempDir dir;
  ASSERT_EQ(run_command("head -n 3000 " + shell_quote(corpus_jsonl()) + " | zstd -q -o " +
                        dir.file("small.jsonl.zst"))
                .exit_code,
            0);
  expect_success(run_command(shell_quote(dataprep_tool()) + " train-tokenizer --input " +
                             dir.file("small.jsonl.zst") + " --model-prefix " + dir.file("tok") +
                             " --vocab-size 500"));
  EXPECT_TRUE(file_exists(dir.file("tok.model")));
  EXPECT_TRUE(file_exists(dir.file("tok.vocab")));
  // The trained model encodes like any sentencepiece model.
  expect_success(run_command("echo hello world | spm_encode --model=" + dir.file("tok.model")));

  write_all(dir.file("bad.jsonl"), "{\"text\": \"fine\"}\n{oops\n");
  const auto result = run_command(shell_quote(dataprep_tool()) + " train-tokenizer --input " +
                                  dir.file("bad.jsonl") + " --model-prefix " + dir.file("bad") +
                                  " --vocab-size 50");
  EXPECT_NE(result.exit_code, 0);
  EXPECT_NE(result.output.find("bad.jsonl:2"), std::string::npos) << result.output;
  EXPECT_FALSE(file_exists(dir.file("bad.model")));
}

// Issue 41: a build without Arrow's libraries (the ThreadSanitizer build, or
// DUFU_PARQUET=OFF) still reads everything else, and refuses a Parquet input in one
// line that says what is missing and how to get it; with them, table_input_test
// checks the reading.
TEST(PreprocessWithoutArrow, AParquetInputIsRefusedInOneLineSayingWhatIsMissing) {
  if (DUFU_TEST_HAVE_ARROW) GTEST_SKIP() << "this build reads Parquet and Arrow (table_input_test checks it)";
  TempDir dir;
  write_all(dir.file("a.parquet"), "PAR1 not really PAR1");
  const CommandResult run = preprocess("-i " + shell_quote(dir.file("a.parquet")) + " -o " + dir.file("out") + " 2>&1");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find("this build of dufu reads no Parquet or Arrow files"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("scripts/setup_arrow.sh"), std::string::npos) << run.output;
  EXPECT_FALSE(std::filesystem::exists(dir.file("out.bin")));
}

}  // namespace
}  // namespace dufu::testing
