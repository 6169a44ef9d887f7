// What the fuzz targets (fuzz/, scripts/fuzz.sh) found in libdufu_dataprep, each as
// the smallest input that shows it, so that the normal suites keep it fixed.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "dufu/common/error.h"
#include "dufu/dataprep/byte_source.h"
#include "dufu/dataprep/document_reader.h"
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

// The same through the document reader, whose reads are 1 MiB: a frame that declares
// 1.5 MiB of records but ends after its first 100 KB of whole records (an empty last
// block, no checksum) was read as those records, a silently truncated input.
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

}  // namespace
}  // namespace dufu::dataprep
