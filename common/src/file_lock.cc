// FileLock: an exclusive lock between processes (ranks on one node) through
// Boost.Interprocess, so one rank builds a shared cache while the others wait.
//
// Boost uses POSIX fcntl locks on Linux. Those belong to the process, not to the
// FileLock object: a second FileLock on the same path in the same process succeeds
// at once, and closing any descriptor of the file drops the process's lock. Use one
// FileLock per path per process.
#include "dufu/common/file_lock.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include <boost/interprocess/exceptions.hpp>
#include <boost/interprocess/sync/file_lock.hpp>

#include "dufu/common/error.h"

namespace dufu {

namespace bip = boost::interprocess;

struct FileLock::Impl {
  std::string path;
  bip::file_lock lock;
};

namespace {

std::string describe(const bip::interprocess_exception& e) {
  const int native = e.get_native_error();
  return native != 0 ? errno_message(native) : std::string(e.what());
}

// Boost's file_lock needs an existing file. Done before any lock is taken, because
// closing this descriptor later would silently release an fcntl lock.
void create_lock_file(const std::string& path) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    DUFU_FAIL("cannot create lock file '", path, "': ", errno_message(errno));
  }
  ::close(fd);
}

bip::file_lock open_lock(const std::string& path) {
  create_lock_file(path);
  try {
    return bip::file_lock(path.c_str());
  } catch (const bip::interprocess_exception& e) {
    DUFU_FAIL("cannot open lock file '", path, "': ", describe(e));
  }
}

}  // namespace

FileLock::FileLock(const std::string& lock_path)
    : impl_(std::make_unique<Impl>(Impl{lock_path, open_lock(lock_path)})) {
  try {
    impl_->lock.lock();
  } catch (const bip::interprocess_exception& e) {
    DUFU_FAIL("cannot lock '", lock_path, "': ", describe(e));
  }
}

FileLock::FileLock(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::unique_ptr<FileLock> FileLock::try_lock(const std::string& lock_path) {
  auto impl = std::make_unique<Impl>(Impl{lock_path, open_lock(lock_path)});
  bool locked = false;
  try {
    locked = impl->lock.try_lock();
  } catch (const bip::interprocess_exception& e) {
    DUFU_FAIL("cannot lock '", lock_path, "': ", describe(e));
  }
  if (!locked) return nullptr;
  // The constructor is private, so make_unique cannot reach it.
  return std::unique_ptr<FileLock>(new FileLock(std::move(impl)));
}

FileLock::~FileLock() {
  if (!impl_) return;
  try {
    impl_->lock.unlock();
  } catch (const bip::interprocess_exception&) {
    // Closing the descriptor (in the file_lock destructor) releases it anyway.
  }
}

}  // namespace dufu
