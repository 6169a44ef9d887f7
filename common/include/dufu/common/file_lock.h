// An exclusive inter-process lock on a lock file (a POSIX fcntl lock), so that ranks
// on one node build a shared cache once while the others wait, and two writers of
// one output cannot both run.
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
  // The pid of a process holding the lock on `lock_path` right now (this process's,
  // if it holds it), or 0 if none does or the file does not exist. For messages
  // only: the answer can be stale at once.
  static int holder_pid(const std::string& lock_path);
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  ~FileLock();  // releases the lock

  // Makes the release unlink the lock file first (while still holding the lock), so
  // lock files do not pile up; the file is also unlinked if SIGINT/SIGTERM/SIGHUP end
  // the process (see install_cleanup_signal_handlers). Every FileLock re-checks after
  // locking that the path still names the file it locked, and starts over if not, so
  // a lock file removed under a waiter cannot let two processes in.
  void remove_file_on_unlock();

  const std::string& path() const;

 private:
  struct Impl;
  explicit FileLock(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dufu
