// An in-memory copy of a file that every process on the node shares: the bytes live
// in POSIX shared memory named after the file's identity (device, inode, size,
// mtime), so eight ranks caching one shard hold one copy, not eight. The segment is
// removed when the last process using it lets go; processes that died without
// letting go are noticed (their pids are gone) and no longer count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

namespace dufu {

class SharedFileCopy {
 public:
  // Attaches to the node's copy of `path`, loading it first if no process has.
  // Throws dufu::Error naming the path if the file cannot be read or the shared
  // memory cannot be had (e.g. /dev/shm too small).
  static SharedFileCopy open(const std::string& path);
  SharedFileCopy(SharedFileCopy&&) noexcept;
  SharedFileCopy& operator=(SharedFileCopy&&) noexcept;
  ~SharedFileCopy();  // detaches; the last user removes the segment

  const std::byte* data() const;
  std::uint64_t size() const;
  // The shared-memory object's name (under /dev/shm), for tests and logs.
  const std::string& segment_name() const;
  // Processes attached to the segment right now (dead ones excluded).
  std::uint32_t users() const;

 private:
  struct Attachment;
  explicit SharedFileCopy(std::unique_ptr<Attachment> attachment);
  std::unique_ptr<Attachment> attachment_;
};

}  // namespace dufu
