// FileLock: an exclusive lock between processes (ranks on one node, two runs of a
// tool) through a POSIX fcntl lock on a lock file.
//
// fcntl locks belong to the process, not to the FileLock object: a second FileLock on
// the same path in the same process succeeds at once, and closing any descriptor of
// the file drops the process's lock. Use one FileLock per path per process. The
// kernel drops the lock when its process dies, however it dies.
//
// Lock files may be unlinked by their holder on release (remove_file_on_unlock). A
// process that opened the file before the unlink may then get the lock on a file that
// no longer has a name, while a newcomer creates and locks a new file under the same
// name; so after locking, every FileLock checks that the path still names the locked
// file (same device and inode) and starts over if it does not.
#include "dufu/common/file_lock.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>
#include <set>
#include <tuple>
#include <utility>

#include "dufu/common/atomic_file.h"
#include "dufu/common/error.h"

namespace dufu {

namespace {

// The files this process holds locks on. Closing any descriptor of a file drops the
// process's fcntl lock on it, so holder_pid must not open one of these. The pid is
// part of the key because a forked child inherits this set but not the locks.
using FileKey = std::tuple<pid_t, dev_t, ino_t>;
std::mutex& held_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::multiset<FileKey>& held_files() {
  static std::multiset<FileKey> held;
  return held;
}

}  // namespace

struct FileLock::Impl {
  std::string path;
  int fd = -1;
  FileKey key{};
  int cleanup_slot = -1;
  bool remove_on_unlock = false;

  ~Impl() {
    if (fd < 0) return;
    if (remove_on_unlock) ::unlink(path.c_str());
    unregister_cleanup_path(cleanup_slot);
    {
      std::lock_guard guard(held_mutex());
      const auto found = held_files().find(key);
      if (found != held_files().end()) held_files().erase(found);
    }
    // Closing the descriptor releases the lock.
    ::close(fd);
  }

  void hold(int locked_fd) {
    fd = locked_fd;
    struct stat st {};
    if (::fstat(fd, &st) == 0) key = {::getpid(), st.st_dev, st.st_ino};
    std::lock_guard guard(held_mutex());
    held_files().insert(key);
  }
};

namespace {

int open_lock_file(const std::string& path) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) DUFU_FAIL("cannot create lock file '", path, "': ", errno_message(errno));
  return fd;
}

// True if `path` still names the file open as `fd`.
bool still_named(int fd, const std::string& path) {
  struct stat by_fd {}, by_name {};
  if (::fstat(fd, &by_fd) != 0 || ::stat(path.c_str(), &by_name) != 0) return false;
  return by_fd.st_dev == by_name.st_dev && by_fd.st_ino == by_name.st_ino;
}

struct flock whole_file(short type) {
  struct flock lock {};
  lock.l_type = type;
  lock.l_whence = SEEK_SET;
  lock.l_start = 0;
  lock.l_len = 0;
  return lock;
}

// The locked descriptor, or -1 if `wait` is false and someone else holds the lock.
int acquire(const std::string& path, bool wait) {
  for (;;) {
    const int fd = open_lock_file(path);
    struct flock lock = whole_file(F_WRLCK);
    int rc;
    do {
      rc = ::fcntl(fd, wait ? F_SETLKW : F_SETLK, &lock);
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      const int error = errno;
      ::close(fd);
      if (!wait && (error == EAGAIN || error == EACCES)) return -1;
      DUFU_FAIL("cannot lock '", path, "': ", errno_message(error));
    }
    if (still_named(fd, path)) return fd;
    // Its holder removed the file after we opened it: lock whatever is there now.
    ::close(fd);
  }
}

}  // namespace

FileLock::FileLock(const std::string& lock_path) : impl_(std::make_unique<Impl>()) {
  impl_->path = lock_path;
  impl_->hold(acquire(lock_path, /*wait=*/true));
}

FileLock::FileLock(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::unique_ptr<FileLock> FileLock::try_lock(const std::string& lock_path) {
  auto impl = std::make_unique<Impl>();
  impl->path = lock_path;
  const int fd = acquire(lock_path, /*wait=*/false);
  if (fd < 0) return nullptr;
  impl->hold(fd);
  // The constructor is private, so make_unique cannot reach it.
  return std::unique_ptr<FileLock>(new FileLock(std::move(impl)));
}

int FileLock::holder_pid(const std::string& lock_path) {
  struct stat st {};
  if (::stat(lock_path.c_str(), &st) != 0) return 0;
  {
    std::lock_guard guard(held_mutex());
    if (held_files().contains(FileKey{::getpid(), st.st_dev, st.st_ino})) return static_cast<int>(::getpid());
  }
  const int fd = ::open(lock_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  struct flock probe = whole_file(F_WRLCK);
  const int rc = ::fcntl(fd, F_GETLK, &probe);
  ::close(fd);
  return rc == 0 && probe.l_type != F_UNLCK ? static_cast<int>(probe.l_pid) : 0;
}

FileLock::~FileLock() = default;

void FileLock::remove_file_on_unlock() {
  if (impl_->remove_on_unlock) return;
  impl_->remove_on_unlock = true;
  impl_->cleanup_slot = register_cleanup_path(impl_->path);
}

const std::string& FileLock::path() const { return impl_->path; }

}  // namespace dufu
