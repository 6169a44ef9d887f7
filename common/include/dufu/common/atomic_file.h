// An output file that appears under its final name only when complete: bytes go to a
// temporary name in the same directory, commit() flushes, fsyncs and renames, and a
// file that is destroyed without commit() removes its temporary. A failed run never
// leaves a half-written file under the final name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dufu {

// fsyncs a directory so that renames and creations inside it survive a crash. File
// systems that cannot sync directories (EINVAL) are accepted: the entries are then as
// durable as they allow. Throws dufu::Error naming the directory when it cannot be
// opened or synced.
void sync_directory(const std::string& dir);

class AtomicFile {
 public:
  // Creates "<dir>/.<name>.tmp.<pid>.<n>" next to final_path. Throws dufu::Error.
  explicit AtomicFile(std::string final_path);
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  AtomicFile(AtomicFile&& other) noexcept;
  AtomicFile& operator=(AtomicFile&&) = delete;
  ~AtomicFile();  // removes the temporary unless committed

  // Buffered append; throws dufu::Error (e.g. disk full) naming the final path.
  void write(const void* data, std::size_t size);
  template <typename T>
  void write_value(const T& value) {
    write(&value, sizeof(T));
  }
  std::uint64_t bytes_written() const { return bytes_written_; }

  // Flushes, fsyncs, renames to the final name and fsyncs the directory.
  void commit();
  // Removes the temporary now (also done by the destructor).
  void discard() noexcept;

  const std::string& final_path() const { return final_path_; }
  const std::string& temp_path() const { return temp_path_; }

 private:
  void flush_buffer();

  std::string final_path_;
  std::string temp_path_;
  int fd_ = -1;
  bool committed_ = false;
  std::vector<char> buffer_;
  std::size_t buffered_ = 0;
  std::uint64_t bytes_written_ = 0;
};

}  // namespace dufu
