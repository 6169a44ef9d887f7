// What the fuzz targets (fuzz/, scripts/fuzz.sh) found in libdufu_dataprep, each as
// the smallest input that shows it, so that the normal suites keep it fixed.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dufu/common/error.h"
#include "dufu/dataprep/byte_source.h"
#include "dufu/dataprep/document_reader.h"
#include "dufu/dataprep/tokenizer.h"
#include "support/expect_error.h"
#include "support/temp_dir_test.h"

namespace dufu::dataprep {
namespace {

using dufu::testing::expect_error;

class FuzzRegressionTest : public dufu::testing::TempDirTest {};

std::string read_in_chunks(const std::string& path, std::size_t chunk) {
  const std::unique_ptr<ByteSource> source = open_byte_source(path);
  std::string all, buffer(chunk, '\0');
  while (const std::size_t n = source->read(buffer.data(), buffer.size())) all.append(buffer, 0, n);
  return all;
}

std::string little_endian(std::uint64_t value, int bytes) {
  std::string out;
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((value >> (8 * i)) & 0xFF);
  return out;
}

// A zstd block header: last-block flag, type raw, size.
std::string raw_block_header(std::size_t size, bool last) { return little_endian(size << 3 | (last ? 1 : 0), 3); }

// zstd_source_fuzzer: a frame whose header declares 35 bytes of content, whose only
// block is an empty last block, with the checksum of empty content. zstd's streaming
// decoder ends such a frame without an error when its output buffer is smaller than
// the declared size (its one-shot path, taken for larger buffers, refuses it), so
// the source read it as a valid empty stream in small reads and refused it in large
// ones.
TEST_F(FuzzRegressionTest, ZstdFrameEndingBeforeItsDeclaredSizeIsRefusedForAnyReadSize) {
  const std::string frame("\x28\xb5\x2f\xfd\x24\x23\x01\x00\x00\x99\xe9\xd8\x51", 13);
  const std::string path = write("input.jsonl.zst", frame);
  for (const std::size_t chunk : {std::size_t{1}, std::size_t{14}, std::size_t{1} << 20}) {
    expect_error([&] { read_in_chunks(path, chunk); }, {path, "corrupt zstd stream"});
  }
}

// zstd_source_fuzzer: a frame declaring a 1 KiB window (window descriptor 0) whose
// compressed block repeats "abcabcabc\n" with match offsets reaching 2000 bytes back.
// The format forbids offsets past the window; libzstd's one-shot ZSTD_decompress,
// which holds the whole output, decodes it anyway, its streaming decoder (and the
// zstd tool) report corruption. The source streams, so it must refuse it too, for
// any read size, rather than read what a different reader of the same file refuses.
TEST_F(FuzzRegressionTest, ZstdMatchesBeyondTheDeclaredWindowAreRefusedForAnyReadSize) {
  const std::string frame(
      "\x28\xb5\x2f\xfd\x04\x00\x6d\x00\x00\x20\x61\x62\x63\x0a\x02\x00\xc3\xb7\x7c\x21\xe6\x86\x9c\xb0\x2c\x98", 26);
  const std::string path = write("input.jsonl.zst", frame);
  for (const std::size_t chunk : {std::size_t{1}, std::size_t{100}, std::size_t{1} << 20}) {
    expect_error([&] { read_in_chunks(path, chunk); }, {path, "corrupt zstd stream"});
  }
}

// The same through the document reader, whose reads are 1 MiB: a frame that declares
// 1.5 MiB of records but ends after its first 100 KB of whole records (an empty last
// block, no checksum) must not read as those records, a silently truncated input.
TEST_F(FuzzRegressionTest, ZstdFrameHoldingLessThanItDeclaresStopsTheDocumentReader) {
  const std::size_t declared = 1536 * 1024;
  const std::string record = "{\"text\": \"a line of the corpus\"}\n";
  std::string text;
  while (text.size() < 100000) text += record;
  const std::size_t held = text.size();  // one raw block holds at most 128 KiB
  std::string frame("\x28\xb5\x2f\xfd", 4);
  frame += '\x80';  // frame header: a 4-byte content size, no single segment, no checksum
  frame += '\x50';  // window 1 MiB
  frame += little_endian(declared, 4);
  frame += raw_block_header(held, false) + text + raw_block_header(0, true);
  const std::string path = write("corpus.jsonl.zst", frame);

  DocumentReader reader({path}, ReaderOptions{});
  Document document;
  expect_error(
      [&] {
        while (reader.next(&document)) {
        }
      },
      {path, "corrupt zstd stream", "declares 1572864 bytes of content but holds " + std::to_string(held)});
}

// tiktoken_fuzzer: a rank file whose first line is "AA== 777777777" (the other
// lines the 256 single bytes) made the loader allocate a table of 777777778 token
// strings, 25 GB, before anything else was checked. Ids index tables, so an id far
// past the number of tokens the file defines is refused.
TEST_F(FuzzRegressionTest, TiktokenRankFarPastTheTokensOfTheFileIsRefused) {
  static const char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string ranks = "AA== 777777777\n";
  for (int byte = 1; byte < 256; ++byte) {
    ranks += kBase64[byte >> 2];
    ranks += kBase64[(byte & 3) << 4];
    ranks += "== " + std::to_string(byte) + "\n";
  }
  const std::string path = write("ranks.tiktoken", ranks);
  expect_error([&] { Tokenizer::load(TokenizerSpec{.model = path, .merges = {}, .pattern = "gpt2"}); },
               {path, "777777777", "defines only 256 tokens"});
}

// The rank file's own refusals, each naming the file: the same bytes at two ranks
// (both ranks named), a line that is not "base64 rank" (its line number), a rank
// with trailing characters; a last line without its newline is a line.
TEST_F(FuzzRegressionTest, TiktokenRankFileRefusalsNameTheFileAndTheLine) {
  static const char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string bytes;
  for (int byte = 0; byte < 256; ++byte) {
    bytes += kBase64[byte >> 2];
    bytes += kBase64[(byte & 3) << 4];
    bytes += "== " + std::to_string(byte) + "\n";
  }
  const auto load = [](const std::string& path) {
    return Tokenizer::load(TokenizerSpec{.model = path, .merges = {}, .pattern = "gpt2"});
  };
  // "YWI=" is "ab": rank 256 and, again, rank 300.
  const std::string twice = write("twice.tiktoken", bytes + "YWI= 256\nYWI= 300\n");
  expect_error([&] { load(twice); }, {twice, "same token bytes at two ranks (256 and 300)"});
  const std::string no_rank = write("no_rank.tiktoken", bytes + "YWI=\n");
  expect_error([&] { load(no_rank); }, {no_rank + ":257", "not a tiktoken rank line"});
  const std::string trailing = write("trailing.tiktoken", bytes + "YWI= 256x\n");
  expect_error([&] { load(trailing); }, {trailing + ":257", "not a tiktoken rank line"});
  const std::string negative = write("negative.tiktoken", bytes + "YWI= -3\n");
  expect_error([&] { load(negative); }, {negative + ":257", "not a tiktoken rank line"});
  const std::string last = write("last.tiktoken", bytes + "YWI= 256");
  std::vector<std::int32_t> ids;
  load(last).encode("ab", &ids);
  EXPECT_EQ(ids, (std::vector<std::int32_t>{256}));
}

// The same for HuggingFace's tokenizer.json: a vocabulary id, or an added token's,
// far past the tokens the file defines.
TEST_F(FuzzRegressionTest, HuggingFaceIdFarPastTheTokensOfTheFileIsRefused) {
  const std::string vocab_id = write("vocab_id.tokenizer.json",
      R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 900000000}, "merges": []},)"
      R"( "pre_tokenizer": {"type": "ByteLevel"}})");
  expect_error([&] { Tokenizer::load(vocab_id); }, {vocab_id, "900000000", "defines only 2 tokens"});
  // GPT-2's byte-level alphabet: printable bytes stand for themselves, the others for
  // U+0100 onwards, in order.
  std::string vocab;
  int shifted = 0;
  for (int byte = 0; byte < 256; ++byte) {
    const bool printable = (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || byte >= 0xAE;
    const int code = printable ? byte : 0x100 + shifted++;
    std::string character;
    if (code < 0x80) {
      character = static_cast<char>(code);
    } else {
      character += static_cast<char>(0xC0 | (code >> 6));
      character += static_cast<char>(0x80 | (code & 0x3F));
    }
    if (character == "\"" || character == "\\") character = "\\" + character;
    vocab += (byte == 0 ? "\"" : ", \"") + character + "\": " + std::to_string(byte);
  }
  const std::string added_id = write("added_id.tokenizer.json",
      R"({"model": {"type": "BPE", "vocab": {)" + vocab + R"(}, "merges": []},)"
      R"( "pre_tokenizer": {"type": "ByteLevel"},)"
      R"( "added_tokens": [{"id": 800000000, "content": "<|endoftext|>", "special": true}]})");
  expect_error([&] { Tokenizer::load(added_id); }, {added_id, "800000000", "defines only 257 tokens"});
}

// txt_reader_fuzzer: a .txt input whose first bytes are 0xFFFFFFFF (the Arrow IPC
// stream's continuation marker) was taken for an Arrow file, so its lines were not
// read as lines. A name that says txt is txt; only names that say nothing are looked
// into (and those bytes then are Arrow's, Parquet's at both ends).
TEST_F(FuzzRegressionTest, ATxtInputThatStartsLikeAnArrowStreamIsStillTxt) {
  const std::string marker = "\xff\xff\xff\xff";
  const std::string txt = write("input.txt", marker + " first\nsecond line\n");
  EXPECT_EQ(detect_input_format_of_file(txt, InputFormat::kJsonl), InputFormat::kTxt);
  ReaderOptions options;
  options.skip_bad_records = true;
  DocumentReader reader({txt}, options);
  Document document;
  ASSERT_TRUE(reader.next(&document));
  EXPECT_EQ(document.fields.at(0), "second line");
  EXPECT_FALSE(reader.next(&document));
  EXPECT_EQ(reader.bad_records(), 1u);  // the first line: invalid UTF-8
  // The same bytes under a name that says nothing, and Parquet's magic at both ends.
  EXPECT_EQ(detect_input_format_of_file(write("part-00000", marker + " first\n"), InputFormat::kJsonl),
            InputFormat::kArrow);
  EXPECT_EQ(detect_input_format_of_file(write("part-00001", "PAR1 rows PAR1"), InputFormat::kJsonl),
            InputFormat::kParquet);
  EXPECT_EQ(detect_input_format_of_file(write("part-00002.txt", "PAR1 rows PAR1"), InputFormat::kJsonl),
            InputFormat::kTxt);
  EXPECT_EQ(detect_input_format_of_file(write("notes", "PAR1 but text"), InputFormat::kJsonl), InputFormat::kTxt);
}

}  // namespace
}  // namespace dufu::dataprep
