// Tests for open_byte_source and LineReader: decompressed bytes must equal the plain
// bytes for every framing (multi-frame zstd, multi-member gzip, stdin), damaged
// streams must fail naming the file, and line splitting must match a naive split
// however the source chops its reads.
#include <gtest/gtest.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "dufu/common/error.h"
#include "support/expect_error.h"
#include "support/compression.h"
#include "support/stdin_pipe.h"
#include "support/temp_dir_test.h"
#include "dufu/dataprep/byte_source.h"
#include "dufu/dataprep/line_reader.h"

namespace dufu::dataprep {
namespace {

using dufu::testing::error_of;

namespace fs = std::filesystem;
using dufu::testing::gzip_bytes;
using dufu::testing::StdinFromPipe;
using dufu::testing::zstd_bytes;

class ByteSourceTest : public dufu::testing::TempDirTest {};

// Word soup with a deterministic generator: compressible like text, but not so
// regular that a corruption could go unnoticed.
std::string make_text(std::size_t bytes, unsigned seed = 1) {
  static const char* const kWords[] = {"the", "data", "tokens", "shard", "zstd", "gzip",
                                       "line", "caf\xc3\xa9", "\xf0\x9f\x98\x80", "model"};
  std::string text;
  std::uint64_t state = seed;
  while (text.size() < bytes) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    text += kWords[(state >> 33) % 10];
    text += (state >> 40) % 9 == 0 ? '\n' : ' ';
  }
  text.resize(bytes);
  return text;
}


std::string read_everything(ByteSource& source, std::size_t chunk = 100000) {
  std::string all, buffer(chunk, '\0');
  while (const std::size_t n = source.read(buffer.data(), buffer.size())) all.append(buffer, 0, n);
  return all;
}


TEST_F(ByteSourceTest, PlainFileLargerThanOneBlock) {
  const std::string text = make_text(3 * (1 << 20) + 12345);
  const std::string path = write("plain.txt", text);
  auto source = open_byte_source(path);
  EXPECT_EQ(source->compression(), Compression::kNone);
  EXPECT_EQ(source->name(), path);
  EXPECT_EQ(read_everything(*source, 77777), text);
  EXPECT_EQ(source->raw_bytes_read(), text.size());
  char byte;
  EXPECT_EQ(source->read(&byte, 1), 0u);
}

TEST_F(ByteSourceTest, EmptyPlainFile) {
  auto source = open_byte_source(write("empty.txt", ""));
  EXPECT_EQ(read_everything(*source), "");
  EXPECT_EQ(source->raw_bytes_read(), 0u);
}

TEST_F(ByteSourceTest, ZstdEqualsPlainInAnyChunkSize) {
  const std::string text = make_text(2'500'000);
  const std::string compressed = zstd_bytes(text);
  const std::string path = write("a.txt.zst", compressed);
  for (std::size_t chunk : {1u, 7u, 4096u, 3u << 20}) {
    if (chunk == 1) {  // byte by byte is slow: a shorter stream checks the same path
      const std::string small = make_text(30000, 5);
      auto source = open_byte_source(write("small.zst", zstd_bytes(small)));
      EXPECT_EQ(read_everything(*source, 1), small);
      continue;
    }
    auto source = open_byte_source(path);
    EXPECT_EQ(source->compression(), Compression::kZstd);
    EXPECT_EQ(read_everything(*source, chunk), text) << "chunk " << chunk;
    EXPECT_EQ(source->raw_bytes_read(), compressed.size());
  }
}

TEST_F(ByteSourceTest, ZstdSeveralFrames) {
  const std::string a = make_text(1'500'000, 1), b = make_text(10, 2), c = make_text(700'000, 3);
  auto source = open_byte_source(write("multi.zstd", zstd_bytes(a) + zstd_bytes(b) + zstd_bytes(c)));
  EXPECT_EQ(read_everything(*source), a + b + c);
}

TEST_F(ByteSourceTest, GzipEqualsPlain) {
  const std::string text = make_text(2'500'000);
  const std::string compressed = gzip_bytes(text);
  for (std::size_t chunk : {7u, 65536u, 3u << 20}) {
    auto source = open_byte_source(write("a.txt.gz", compressed));
    EXPECT_EQ(source->compression(), Compression::kGzip);
    EXPECT_EQ(read_everything(*source, chunk), text) << "chunk " << chunk;
    EXPECT_EQ(source->raw_bytes_read(), compressed.size());
  }
}

TEST_F(ByteSourceTest, GzipSeveralMembers) {
  const std::string a = make_text(1'200'000, 1), b = make_text(3, 2), c = make_text(900'000, 3);
  auto source = open_byte_source(write("multi.gz", gzip_bytes(a) + gzip_bytes(b) + gzip_bytes(c)));
  EXPECT_EQ(read_everything(*source), a + b + c);
}

TEST_F(ByteSourceTest, CompressionIsSniffedNotNamed) {
  const std::string text = make_text(5000);
  EXPECT_EQ(read_everything(*open_byte_source(write("z.bin", zstd_bytes(text)))), text);
  EXPECT_EQ(read_everything(*open_byte_source(write("g.bin", gzip_bytes(text)))), text);
}

TEST_F(ByteSourceTest, TruncatedZstdNamesTheFile) {
  const std::string compressed = zstd_bytes(make_text(1'000'000));
  const std::string path = write("cut.jsonl.zst", compressed.substr(0, compressed.size() / 2));
  EXPECT_EQ(error_of([&] { read_everything(*open_byte_source(path)); }),
            "truncated zstd stream in '" + path + "'");
  const std::string magic_only = write("magic.zst", compressed.substr(0, 4));
  EXPECT_EQ(error_of([&] { read_everything(*open_byte_source(magic_only)); }),
            "truncated zstd stream in '" + magic_only + "'");
}

TEST_F(ByteSourceTest, TruncatedGzipNamesTheFile) {
  const std::string compressed = gzip_bytes(make_text(1'000'000));
  const std::string path = write("cut.txt.gz", compressed.substr(0, compressed.size() / 2));
  EXPECT_EQ(error_of([&] { read_everything(*open_byte_source(path)); }),
            "truncated gzip stream in '" + path + "'");
  // The member is complete but its 8-byte trailer (CRC, size) is missing.
  const std::string no_trailer = write("trailer.gz", compressed.substr(0, compressed.size() - 4));
  EXPECT_EQ(error_of([&] { read_everything(*open_byte_source(no_trailer)); }),
            "truncated gzip stream in '" + no_trailer + "'");
}

TEST_F(ByteSourceTest, CorruptGzipNamesTheFile) {
  std::string compressed = gzip_bytes(make_text(1'000'000));
  for (std::size_t i = compressed.size() / 2; i < compressed.size() / 2 + 64; ++i) compressed[i] ^= 0x5A;
  const std::string path = write("bad.gz", compressed);
  const std::string message = error_of([&] { read_everything(*open_byte_source(path)); });
  EXPECT_EQ(message.rfind("corrupt gzip stream in '" + path + "': ", 0), 0u) << message;
}

TEST_F(ByteSourceTest, CorruptZstdNamesTheFile) {
  std::string compressed = zstd_bytes(make_text(1'000'000));
  for (std::size_t i = compressed.size() / 2; i < compressed.size() / 2 + 64; ++i) compressed[i] ^= 0x5A;
  const std::string path = write("bad.zst", compressed);
  const std::string message = error_of([&] { read_everything(*open_byte_source(path)); });
  EXPECT_NE(message.find("zstd stream in '" + path + "'"), std::string::npos) << message;
}

TEST_F(ByteSourceTest, NameAndMagicMustAgree) {
  const std::string plain = "{\"text\": \"not compressed\"}\n";
  const std::string zst = write("x.jsonl.zst", plain);
  EXPECT_EQ(error_of([&] { open_byte_source(zst); }), "'" + zst + "' is named .zst but is not zstd data");
  const std::string zstd = write("x.zstd", plain);
  EXPECT_EQ(error_of([&] { open_byte_source(zstd); }), "'" + zstd + "' is named .zstd but is not zstd data");
  const std::string gz = write("x.gz", plain);
  EXPECT_EQ(error_of([&] { open_byte_source(gz); }), "'" + gz + "' is named .gz but is not gzip data");
  const std::string swapped = write("y.gz", zstd_bytes(plain));
  EXPECT_EQ(error_of([&] { open_byte_source(swapped); }), "'" + swapped + "' is named .gz but is not gzip data");
  const std::string empty = write("empty.zst", "");
  EXPECT_EQ(error_of([&] { open_byte_source(empty); }), "'" + empty + "' is named .zst but is not zstd data");
}

TEST_F(ByteSourceTest, UnopenableInputs) {
  const std::string missing = dir_.file("missing.txt");
  EXPECT_EQ(error_of([&] { open_byte_source(missing); }),
            "cannot open '" + missing + "': No such file or directory");
  EXPECT_EQ(error_of([&] { open_byte_source(dir_.path()); }),
            "cannot open '" + dir_.path() + "': Is a directory");
}

// The first 4 bytes (a compression magic) reach stdin one at a time: sniffing must
// wait for all four.
TEST_F(ByteSourceTest, StdinPlainAndCompressed) {
  const std::string text = make_text(400'000);
  {
    StdinFromPipe stdin_pipe(text, 4);
    auto source = open_byte_source("-");
    EXPECT_EQ(source->name(), "<stdin>");
    EXPECT_EQ(source->compression(), Compression::kNone);
    EXPECT_EQ(read_everything(*source), text);
  }
  {
    const std::string compressed = gzip_bytes(text);
    StdinFromPipe stdin_pipe(compressed, 4);
    auto source = open_byte_source("-");
    EXPECT_EQ(source->compression(), Compression::kGzip);
    EXPECT_EQ(read_everything(*source), text);
    EXPECT_EQ(source->raw_bytes_read(), compressed.size());
  }
  {
    StdinFromPipe stdin_pipe(zstd_bytes(text), 4);
    EXPECT_EQ(read_everything(*open_byte_source("-")), text);
  }
}

// Hands out its bytes in irregular small pieces, the worst case for line splitting.
class ChoppySource : public ByteSource {
 public:
  explicit ChoppySource(std::string bytes) : ByteSource("choppy"), bytes_(std::move(bytes)) {}
  std::size_t read(char* out, std::size_t capacity) override {
    step_ = step_ * 7 % 1013 + 1;
    const std::size_t n = std::min({capacity, bytes_.size() - at_, step_});
    std::copy_n(bytes_.data() + at_, n, out);
    at_ += n;
    return n;
  }
  std::uint64_t raw_bytes_read() const override { return at_; }
  Compression compression() const override { return Compression::kNone; }

 private:
  std::string bytes_;
  std::size_t at_ = 0, step_ = 1;
};

// The oracle: split on '\n' the obvious way; a final piece without '\n' is a line.
std::vector<std::string> naive_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::string current;
  for (char c : text) {
    if (c == '\n') {
      lines.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  if (!current.empty()) lines.push_back(current);
  return lines;
}

std::vector<std::string> split_with(LineReader& reader, std::size_t padding) {
  std::vector<std::string> lines;
  std::string_view line;
  while (reader.next_line(&line)) {
    // Touch the last promised padding byte: AddressSanitizer flags it if unreadable.
    volatile char last = line.data()[line.size() + padding - 1];
    (void)last;
    lines.emplace_back(line);
    EXPECT_EQ(reader.line_number(), lines.size());
  }
  return lines;
}

TEST_F(ByteSourceTest, LinesMatchNaiveSplit) {
  const std::string huge(4 * (1 << 20) + 333, 'x');
  const std::vector<std::string> texts = {
      "",
      "\n",
      "one",
      "one\n",
      "a\r\nb\n\n\nc",
      "\n\nlast without newline",
      make_text(3'000'000, 9),
      "short\n" + huge + "\nafter\n" + huge + huge + "\n\nend",
  };
  for (const std::string& text : texts) {
    LineReader choppy(std::make_unique<ChoppySource>(text), 64);
    EXPECT_EQ(split_with(choppy, 64), naive_lines(text)) << text.substr(0, 40);
    LineReader file(open_byte_source(write("lines.txt", text)), 64);
    EXPECT_EQ(split_with(file, 64), naive_lines(text)) << text.substr(0, 40);
    std::string_view line;
    EXPECT_FALSE(file.next_line(&line));  // stays at the end
  }
}

TEST_F(ByteSourceTest, LineKeepsCarriageReturnAndCountsFromOne) {
  LineReader reader(open_byte_source(write("crlf.txt", "a\r\n\r\nb")), 64);
  std::string_view line;
  ASSERT_TRUE(reader.next_line(&line));
  EXPECT_EQ(line, "a\r");
  EXPECT_EQ(reader.line_number(), 1u);
  ASSERT_TRUE(reader.next_line(&line));
  EXPECT_EQ(line, "\r");
  ASSERT_TRUE(reader.next_line(&line));
  EXPECT_EQ(line, "b");
  EXPECT_EQ(reader.line_number(), 3u);
  EXPECT_FALSE(reader.next_line(&line));
}

TEST_F(ByteSourceTest, ReadAllReturnsTheRest) {
  const std::string text = "first\n" + make_text(2'700'000, 4);
  LineReader reader(std::make_unique<ChoppySource>(text), 64);
  std::string_view line;
  ASSERT_TRUE(reader.next_line(&line));
  EXPECT_EQ(line, "first");
  EXPECT_EQ(reader.read_all(), text.substr(6));
  EXPECT_EQ(reader.read_all(), "");

  const std::string compressed = make_text(3'100'000, 6);
  LineReader whole(open_byte_source(write("whole.zst", zstd_bytes(compressed))));
  EXPECT_EQ(whole.read_all(), compressed);
}

}  // namespace
}  // namespace dufu::dataprep
