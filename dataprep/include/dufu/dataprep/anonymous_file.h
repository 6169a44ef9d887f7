// A file without a name, made in a given directory with O_TMPFILE: the kernel frees
// it when its last descriptor closes, so a process that dies however it dies (mpirun's
// SIGKILL, the OOM killer) leaves nothing of it behind. The parts of a divided
// preprocess job are written into these where the file system has them, since only
// the job reads a part, and only from the process that wrote it. File systems without
// O_TMPFILE (some NFS versions, kernels before 3.11) are reported by create(), so the
// caller can fall back to named files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dufu::dataprep {

class AnonymousFile {
 public:
  // An empty anonymous file in `dir` (empty: the working directory) that messages call
  // `description`. std::nullopt where the file system cannot make one (EOPNOTSUPP,
  // EISDIR), and wherever the environment sets DUFU_NO_ANONYMOUS_FILES (not 0), so
  // tests can take the named path of callers; any other failure throws dufu::Error
  // naming the directory.
  static std::optional<AnonymousFile> create(const std::string& dir, std::string description);

  AnonymousFile(const AnonymousFile&) = delete;
  AnonymousFile& operator=(const AnonymousFile&) = delete;
  AnonymousFile(AnonymousFile&& other) noexcept;
  AnonymousFile& operator=(AnonymousFile&&) = delete;
  ~AnonymousFile();  // closes it, and the kernel frees its blocks

  // Buffered append; throws dufu::Error naming the description (e.g. disk full).
  void write(const void* data, std::size_t size);
  template <typename T>
  void write_value(const T& value) {
    write(&value, sizeof(T));
  }
  // Writes out the buffer: afterwards fd() reads every byte written. No fsync: the
  // file dies with the process, so nothing depends on it surviving a crash.
  void flush();

  std::uint64_t bytes_written() const { return bytes_written_; }
  int fd() const { return fd_; }
  const std::string& description() const { return description_; }

 private:
  AnonymousFile(int fd, std::string description);

  int fd_ = -1;
  std::string description_;
  std::vector<char> buffer_;
  std::size_t buffered_ = 0;
  std::uint64_t bytes_written_ = 0;
};

}  // namespace dufu::dataprep
