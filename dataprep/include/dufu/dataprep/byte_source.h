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

}  // namespace dufu::dataprep
