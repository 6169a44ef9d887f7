// AtomicFile: write to a private temporary next to the final name and rename it into
// place only once every byte is on disk, so an interrupted or failed run never leaves
// a truncated file that a later run would take for a finished one.
#include "dufu/common/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "dufu/common/error.h"

namespace dufu {

namespace {

constexpr std::size_t kBufferSize = std::size_t{1} << 20;
// A stale temporary from an earlier process with the same pid is possible; try a
// few counters before concluding something else is wrong.
constexpr int kMaxCreateAttempts = 100;

// Shared by all threads so two AtomicFiles for one path in one process never collide.
std::atomic<std::uint64_t> temp_counter{0};

struct SplitPath {
  std::string dir;       // what to fsync after rename
  std::string prefix;    // dir + '/', or empty for a bare file name
  std::string basename;
};

SplitPath split_path(const std::string& path) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos) {
    return {".", "", path};
  }
  std::string dir = slash == 0 ? std::string("/") : path.substr(0, slash);
  return {dir, path.substr(0, slash + 1), path.substr(slash + 1)};
}

void write_all(int fd, const char* data, std::size_t size, const std::string& final_path) {
  while (size > 0) {
    const ssize_t n = ::write(fd, data, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      DUFU_FAIL("cannot write '", final_path, "': ", errno_message(errno));
    }
    if (n == 0) {
      // A regular file only does this when it cannot take more; retrying would spin.
      DUFU_FAIL("cannot write '", final_path, "': ", errno_message(ENOSPC));
    }
    data += n;
    size -= static_cast<std::size_t>(n);
  }
}

int fsync_retrying(int fd) {
  int rc;
  do {
    rc = ::fsync(fd);
  } while (rc != 0 && errno == EINTR);
  return rc;
}

// The paths the signal handlers unlink: fixed storage, so that a handler never
// allocates and never sees a half-written path (state 2 is set after the bytes).
constexpr int kCleanupSlots = 256;
constexpr std::size_t kCleanupPathMax = 4096;
constexpr int kSlotFree = 0, kSlotClaimed = 1, kSlotActive = 2;
struct CleanupSlot {
  std::atomic<int> state{kSlotFree};
  char path[kCleanupPathMax];
};
CleanupSlot cleanup_slots[kCleanupSlots];
static_assert(std::atomic<int>::is_always_lock_free, "signal handlers need lock-free atomics");

std::atomic<int> defer_depth{0};
std::atomic<int> pending_signal{0};
constexpr int kCleanupSignals[] = {SIGINT, SIGTERM, SIGHUP};

void unlink_registered_paths() noexcept {
  for (auto& slot : cleanup_slots) {
    if (slot.state.load(std::memory_order_acquire) == kSlotActive) ::unlink(slot.path);
  }
}

extern "C" void cleanup_signal_handler(int signal_number) {
  const int saved_errno = errno;
  if (defer_depth.load(std::memory_order_acquire) > 0) {
    // ~DeferCleanupSignals raises it again when the critical section is over.
    pending_signal.store(signal_number, std::memory_order_release);
    errno = saved_errno;
    return;
  }
  unlink_registered_paths();
  // End as the signal would have ended us (exit status 128 + n in a shell): the
  // signal is blocked inside its handler, so it is delivered when this returns.
  ::signal(signal_number, SIG_DFL);
  ::raise(signal_number);
  errno = saved_errno;
}

}  // namespace

int temporary_owner_pid(const std::string& file_name, const std::string& final_name) {
  const std::string head = "." + final_name + ".tmp.";
  if (file_name.size() <= head.size() || file_name.compare(0, head.size(), head) != 0) return 0;
  const char* p = file_name.c_str() + head.size();
  long pid = 0;
  const char* digits = p;
  while (*p >= '0' && *p <= '9' && pid < 100000000) pid = pid * 10 + (*p++ - '0');
  if (p == digits || *p != '.') return 0;
  const char* counter = ++p;
  while (*p >= '0' && *p <= '9') ++p;
  if (p == counter || *p != '\0') return 0;
  return static_cast<int>(pid);
}

bool process_exists(int pid) noexcept {
  if (pid <= 0) return false;
  return ::kill(pid, 0) == 0 || errno != ESRCH;
}

void install_cleanup_signal_handlers() {
  for (const int signal_number : kCleanupSignals) {
    struct sigaction current {};
    if (::sigaction(signal_number, nullptr, &current) != 0) continue;
    // A signal the parent told us to ignore (nohup, a background job) stays ignored.
    if (current.sa_handler == SIG_IGN) continue;
    struct sigaction action {};
    action.sa_handler = cleanup_signal_handler;
    sigemptyset(&action.sa_mask);
    for (const int other : kCleanupSignals) sigaddset(&action.sa_mask, other);
    action.sa_flags = SA_RESTART;
    ::sigaction(signal_number, &action, nullptr);
  }
}

void ignore_file_size_signal() noexcept { ::signal(SIGXFSZ, SIG_IGN); }

int register_cleanup_path(const std::string& path) noexcept {
  if (path.empty() || path.size() >= kCleanupPathMax) return -1;
  for (int i = 0; i < kCleanupSlots; ++i) {
    int expected = kSlotFree;
    if (cleanup_slots[i].state.compare_exchange_strong(expected, kSlotClaimed, std::memory_order_acquire)) {
      std::memcpy(cleanup_slots[i].path, path.c_str(), path.size() + 1);
      cleanup_slots[i].state.store(kSlotActive, std::memory_order_release);
      return i;
    }
  }
  return -1;
}

void unregister_cleanup_path(int slot) noexcept {
  if (slot >= 0 && slot < kCleanupSlots) cleanup_slots[slot].state.store(kSlotFree, std::memory_order_release);
}

DeferCleanupSignals::DeferCleanupSignals() noexcept { defer_depth.fetch_add(1, std::memory_order_acq_rel); }

DeferCleanupSignals::~DeferCleanupSignals() {
  if (defer_depth.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    const int signal_number = pending_signal.exchange(0, std::memory_order_acq_rel);
    if (signal_number != 0) ::raise(signal_number);
  }
}

void crash_point(const char* name) {
  const char* wanted = std::getenv("DUFU_CRASH_POINT");
  if (wanted != nullptr && std::strcmp(wanted, name) == 0) ::raise(SIGKILL);
}

void sync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) DUFU_FAIL("cannot open directory '", dir, "' to sync it: ", errno_message(errno));
  const int rc = fsync_retrying(fd);
  const int error = errno;
  ::close(fd);
  if (rc != 0 && error != EINVAL) DUFU_FAIL("cannot sync directory '", dir, "': ", errno_message(error));
}

AtomicFile::AtomicFile(std::string final_path) : final_path_(std::move(final_path)) {
  const SplitPath parts = split_path(final_path_);
  if (parts.basename.empty() || parts.basename == "." || parts.basename == "..") {
    DUFU_FAIL("cannot write '", final_path_, "': not a file name");
  }
  // A cleanup signal between creating the temporary and registering it would leave it
  // behind: the handler waits until it is registered.
  const DeferCleanupSignals registered_before_any_cleanup;
  for (int attempt = 0; attempt < kMaxCreateAttempts; ++attempt) {
    temp_path_ = str_cat(parts.prefix, '.', parts.basename, ".tmp.", ::getpid(), '.',
                         temp_counter.fetch_add(1, std::memory_order_relaxed));
    // O_EXCL: never adopt (and later rename over) a file someone else is writing.
    fd_ = ::open(temp_path_.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
    if (fd_ >= 0) break;
    if (errno != EEXIST) {
      const int error = errno;
      temp_path_.clear();
      DUFU_FAIL("cannot write '", final_path_, "': cannot create temporary in '", parts.dir,
                "': ", errno_message(error));
    }
  }
  if (fd_ < 0) {
    temp_path_.clear();
    DUFU_FAIL("cannot write '", final_path_, "': no free temporary name in '", parts.dir, "'");
  }
  cleanup_slot_ = register_cleanup_path(temp_path_);
  buffer_.resize(kBufferSize);
}

AtomicFile::AtomicFile(AtomicFile&& other) noexcept
    : final_path_(std::move(other.final_path_)),
      temp_path_(std::exchange(other.temp_path_, std::string())),
      fd_(std::exchange(other.fd_, -1)),
      cleanup_slot_(std::exchange(other.cleanup_slot_, -1)),
      prepared_(std::exchange(other.prepared_, false)),
      committed_(std::exchange(other.committed_, false)),
      buffer_(std::move(other.buffer_)),
      buffered_(std::exchange(other.buffered_, 0)),
      bytes_written_(std::exchange(other.bytes_written_, 0)) {
  // The source must not unlink our temporary when it dies; with no temp path and no
  // descriptor its destructor and discard() have nothing to do.
  other.buffer_.clear();
}

AtomicFile::~AtomicFile() { discard(); }

void AtomicFile::write(const void* data, std::size_t size) {
  DUFU_CHECK(fd_ >= 0 && !committed_, "write to '", final_path_, "' after commit, prepare or discard");
  if (size == 0) return;
  const char* bytes = static_cast<const char*>(data);
  if (buffered_ + size > buffer_.size()) {
    flush_buffer();
    if (size >= buffer_.size()) {
      // Copying a large block through the buffer would only add a memcpy.
      write_all(fd_, bytes, size, final_path_);
      bytes_written_ += size;
      return;
    }
  }
  std::memcpy(buffer_.data() + buffered_, bytes, size);
  buffered_ += size;
  bytes_written_ += size;
}

void AtomicFile::flush_buffer() {
  if (buffered_ == 0) return;
  write_all(fd_, buffer_.data(), buffered_, final_path_);
  buffered_ = 0;
}

void AtomicFile::prepare() {
  DUFU_CHECK(fd_ >= 0 && !committed_ && !prepared_, "prepare of '", final_path_,
             "' after commit, discard or prepare");
  flush_buffer();
  // Data must be durable before a rename makes it visible, or a crash could leave
  // a complete-looking name over missing blocks.
  if (fsync_retrying(fd_) != 0) {
    DUFU_FAIL("cannot write '", final_path_, "': fsync failed: ", errno_message(errno));
  }
  const int fd = std::exchange(fd_, -1);
  // Not retried on EINTR: on Linux the descriptor is gone either way.
  if (::close(fd) != 0) {
    DUFU_FAIL("cannot write '", final_path_, "': close failed: ", errno_message(errno));
  }
  prepared_ = true;
  buffer_ = std::vector<char>();
}

void AtomicFile::release() noexcept {
  unregister_cleanup_path(std::exchange(cleanup_slot_, -1));
  if (fd_ >= 0) ::close(std::exchange(fd_, -1));
  committed_ = true;
}

void AtomicFile::commit() {
  DUFU_CHECK((fd_ >= 0 || prepared_) && !committed_, "commit of '", final_path_,
             "' after commit or discard");
  if (!prepared_) prepare();
  if (::rename(temp_path_.c_str(), final_path_.c_str()) != 0) {
    DUFU_FAIL("cannot write '", final_path_, "': rename from '", temp_path_,
              "' failed: ", errno_message(errno));
  }
  committed_ = true;
  unregister_cleanup_path(std::exchange(cleanup_slot_, -1));

  // The rename itself lives in the directory; without this a crash can forget it.
  try {
    sync_directory(split_path(final_path_).dir);
  } catch (const Error& error) {
    DUFU_FAIL("cannot write '", final_path_, "': ", error.what());
  }
}

void AtomicFile::discard() noexcept {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
  if (!committed_ && !temp_path_.empty()) {
    ::unlink(temp_path_.c_str());
    temp_path_.clear();
  }
  unregister_cleanup_path(std::exchange(cleanup_slot_, -1));
  buffered_ = 0;
}

}  // namespace dufu
