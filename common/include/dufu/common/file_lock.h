// An exclusive inter-process lock on a lock file (Boost.Interprocess file_lock), so
// that ranks on one node build a shared cache once while the others wait.
#pragma once

#include <memory>
#include <string>

namespace dufu {

class FileLock {
 public:
  // Creates the lock file if needed and blocks until the lock is held.
  explicit FileLock(const std::string& lock_path);
  // Returns nullptr instead of blocking when another process holds the lock.
  static std::unique_ptr<FileLock> try_lock(const std::string& lock_path);
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock();  // releases the lock

 private:
  struct Impl;
  explicit FileLock(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dufu
