// Streams the bytes of one input, decompressing zstd or gzip on the fly (detected by
// magic bytes, so it works for stdin too) and never holding a whole file in memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace dufu::dataprep {

enum class Compression { kNone, kZstd, kGzip };

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Reads up to `capacity` decompressed bytes; returns 0 only at the end of input.
  // Throws dufu::Error naming the input for IO errors and for corrupt or truncated
  // compressed streams.
  virtual std::size_t read(char* out, std::size_t capacity) = 0;
  // Bytes consumed from the underlying file (compressed size for compressed input).
  virtual std::uint64_t raw_bytes_read() const = 0;
  virtual Compression compression() const = 0;
  const std::string& name() const { return name_; }

 protected:
  explicit ByteSource(std::string name) : name_(std::move(name)) {}

 private:
  std::string name_;
};

// "-" reads stdin. Throws dufu::Error if the file cannot be opened, or if its name
// ends in .zst/.gz and the magic bytes disagree.
std::unique_ptr<ByteSource> open_byte_source(const std::string& path);

// Splits a ByteSource into lines ('\n' removed, a trailing '\r' kept as data) with
// line numbers starting at 1. The returned view stays valid until the next call.
// The buffer reserves `tail_padding` readable bytes past each line (simdjson needs
// them).
class LineReader {
 public:
  explicit LineReader(std::unique_ptr<ByteSource> source, std::size_t tail_padding = 64);
  bool next_line(std::string_view* line);
  std::uint64_t line_number() const { return line_number_; }
  ByteSource& source() { return *source_; }
  // The whole remaining input as one string (for --txt-document file).
  std::string read_all();

 private:
  bool fill();

  std::unique_ptr<ByteSource> source_;
  std::size_t tail_padding_;
  std::string buffer_;
  std::size_t begin_ = 0, end_ = 0;
  bool eof_ = false;
  std::uint64_t line_number_ = 0;
};

}  // namespace dufu::dataprep
