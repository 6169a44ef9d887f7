// A file opened for reading by descriptor, for code that must not map it (lazy shards
// on filesystems where mmap is slow or refused) or that reads it whole. Closes on
// destruction; every failure is a dufu::Error naming the path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dufu {

// Opens `path` for reading and returns the descriptor (its size in `size` when not
// null). Every file dufu opens by name goes through here (or MappedFile::open): what
// is not a regular file (a FIFO, /dev/zero, a socket) is refused, "cannot open
// '<path>': not a regular file", instead of read forever or waited on.
int open_regular_file(const std::string& path, std::uint64_t* size);

class ReadOnlyFile {
 public:
  // Throws dufu::Error naming the path for a missing, unreadable or directory path, or
  // one that is not a regular file (open_regular_file).
  static ReadOnlyFile open(const std::string& path);
  ReadOnlyFile(ReadOnlyFile&& other) noexcept;
  ReadOnlyFile& operator=(ReadOnlyFile&& other) noexcept;
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;
  ~ReadOnlyFile();

  // Size when opened.
  std::uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  int descriptor() const { return fd_; }

  // Reads exactly `size` bytes at `offset` (pread: safe from several threads);
  // a file that ends early is an error.
  void read_exact(std::uint64_t offset, std::uint64_t size, std::byte* out) const;
  std::vector<std::byte> read_all() const;

 private:
  ReadOnlyFile(std::string path, int fd, std::uint64_t size);
  std::string path_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

// Reads the file at `path` from start to end in blocks of up to 1 MiB, handing each to
// `consume` (for digests and copies of files of any size, without holding them whole).
void read_in_blocks(const std::string& path, const std::function<void(const char* data, std::size_t size)>& consume);

}  // namespace dufu
