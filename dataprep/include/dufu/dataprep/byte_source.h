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

// What a regular file was when it was opened, to tell at its end whether it changed
// while it was read: a file still being written ends in a line cut short, which a
// txt reader would otherwise take for a whole document.
struct FileSnapshot {
  bool regular = false;  // only regular files are compared (not pipes or stdin from one)
  std::uint64_t bytes = 0;
  std::int64_t mtime_ns = 0;
  static FileSnapshot of(int fd);
};
// Throws dufu::Error naming `name` when the file behind `fd` is no longer what
// `opened` saw (its size or modification time).
void check_unchanged(int fd, const FileSnapshot& opened, const std::string& name);

// "-" reads stdin. Throws dufu::Error if the file cannot be opened, or if its name
// ends in .zst/.gz and the magic bytes disagree; its read() throws at the end of a
// regular file that changed since it was opened (check_unchanged).
std::unique_ptr<ByteSource> open_byte_source(const std::string& path);

// Splits a ByteSource into lines ('\n' removed, a trailing '\r' kept as data) with
// line numbers starting at 1. The returned view stays valid until the next call.
// The buffer reserves `tail_padding` readable bytes past each line (simdjson needs
// them). Memory is bounded by `max_line_bytes`: a longer line is never held whole.
class LineReader {
 public:
  static constexpr std::size_t kUnlimited = static_cast<std::size_t>(-1);
  explicit LineReader(std::unique_ptr<ByteSource> source, std::size_t tail_padding = 64,
                      std::size_t max_line_bytes = kUnlimited);
  // False at the end of input. A line longer than max_line_bytes comes back empty
  // with too_long() set, as soon as that is known (the rest of the line is then
  // skipped by the next call, reading but not keeping it).
  bool next_line(std::string_view* line);
  bool too_long() const { return too_long_; }
  std::uint64_t line_number() const { return line_number_; }
  ByteSource& source() { return *source_; }
  // The whole remaining input as one string (for --txt-document file); false, with
  // `out` cleared, as soon as it is longer than max_line_bytes.
  bool read_all(std::string* out);
  std::string read_all() {
    std::string all;
    read_all(&all);
    return all;
  }

 private:
  bool fill();
  // Discards input up to and including the next '\n'.
  void skip_rest_of_line();

  std::unique_ptr<ByteSource> source_;
  std::size_t tail_padding_;
  std::size_t max_line_bytes_;
  std::string buffer_;
  std::size_t begin_ = 0, end_ = 0;
  bool eof_ = false;
  bool too_long_ = false;
  bool skipping_ = false;
  std::uint64_t line_number_ = 0;
};

}  // namespace dufu::dataprep
