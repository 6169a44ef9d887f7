// Node-wide shared copies of files in POSIX shared memory (Boost.Interprocess).
// Attaching and detaching happen under an fcntl lock on a lock file, which the kernel
// releases if a process dies, so a crash cannot wedge the other ranks; the segment's
// header lists the pids attached, so a crashed user is pruned instead of keeping the
// copy alive forever. The last user to detach removes the segment and its lock file.
// A copy whose users were all killed has no one left to detach: every open() first
// sweeps the node's dufu segments and removes those whose users are all dead (or
// whose loader died), with their lock files.
#include "dufu/common/shared_file_copy.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>

#include "dufu/common/digest.h"
#include "dufu/common/error.h"
#include "dufu/common/file_lock.h"
#include "dufu/common/read_only_file.h"

namespace dufu {
namespace {

namespace bip = boost::interprocess;

constexpr std::uint64_t kMagic = 0x314d485355465544ULL;  // "DUFUSHM1"
constexpr std::uint32_t kMaxUsers = 1024;
constexpr std::uint64_t kDataOffset = 8192;  // page-aligned, past the header

struct SegmentHeader {
  std::uint64_t magic;
  std::uint64_t ready;  // 1 once the data is complete
  std::uint64_t data_size;
  std::uint32_t num_users;
  std::uint32_t overflow_users;  // attachments beyond kMaxUsers, counted but not tracked
  std::int32_t users[kMaxUsers];
};
static_assert(sizeof(SegmentHeader) <= kDataOffset);

// fcntl locks do not exclude threads of one process; this does.
std::mutex& process_mutex() {
  static std::mutex mutex;
  return mutex;
}

bool process_alive(std::int32_t pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

void prune_dead_users(SegmentHeader& header) {
  std::uint32_t kept = 0;
  for (std::uint32_t i = 0; i < header.num_users; ++i) {
    if (process_alive(header.users[i])) header.users[kept++] = header.users[i];
  }
  header.num_users = kept;
}

std::string identity_of(const std::string& path, std::uint64_t* size) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) DUFU_FAIL("cannot open '", path, "': ", errno_message(errno));
  *size = static_cast<std::uint64_t>(info.st_size);
  return str_cat(info.st_dev, ":", info.st_ino, ":", info.st_size, ":", info.st_mtim.tv_sec, ".",
                 info.st_mtim.tv_nsec);
}

std::filesystem::path lock_directory() {
  const std::filesystem::path shm("/dev/shm");
  std::error_code error;
  return std::filesystem::is_directory(shm, error) ? shm : std::filesystem::temp_directory_path();
}

std::string lock_path_for(const std::string& name) { return (lock_directory() / (name + ".lock")).string(); }

constexpr char kSegmentPrefix[] = "dufu.";
constexpr std::size_t kSegmentHexDigits = 40;

bool is_segment_name(const std::string& name) {
  const std::size_t prefix = sizeof(kSegmentPrefix) - 1;
  if (name.size() != prefix + kSegmentHexDigits || name.compare(0, prefix, kSegmentPrefix) != 0) return false;
  return name.find_first_not_of("0123456789abcdef", prefix) == std::string::npos;
}

// Under the segment's lock: true if nobody can be using `name` any more (every
// attached pid is dead and its loader finished or died), so it may be removed.
bool segment_abandoned(const std::string& name) {
  try {
    bip::shared_memory_object segment(bip::open_only, name.c_str(), bip::read_write);
    bip::offset_t size = 0;
    segment.get_size(size);
    if (size < static_cast<bip::offset_t>(sizeof(SegmentHeader))) return true;  // its creator died at once
    bip::mapped_region region(segment, bip::read_write, 0, sizeof(SegmentHeader));
    auto* header = static_cast<SegmentHeader*>(region.get_address());
    if (header->magic != kMagic || header->ready != 1) return true;  // its loader died (we hold the lock)
    prune_dead_users(*header);
    return header->num_users == 0 && header->overflow_users == 0;
  } catch (const bip::interprocess_exception&) {
    return false;  // gone already, or not ours to judge
  }
}

// Removes the node's dufu segments that no live process uses, and lock files left
// without their segment. Segments whose lock is held are in use and skipped.
// `keep` is the segment the caller is about to attach to.
void reclaim_abandoned_segments(const std::string& keep) {
  std::error_code error;
  std::filesystem::directory_iterator shm("/dev/shm", error);
  if (error) return;
  for (const auto& entry : shm) {
    std::string name = entry.path().filename().string();
    const bool lock_file = name.size() > 5 && name.compare(name.size() - 5, 5, ".lock") == 0;
    if (lock_file) name.resize(name.size() - 5);
    if (!is_segment_name(name) || name == keep) continue;
    try {
      const auto lock = FileLock::try_lock(lock_path_for(name));
      if (!lock) continue;
      std::error_code missing;
      const bool segment_exists = std::filesystem::exists(std::filesystem::path("/dev/shm") / name, missing);
      if (segment_exists && !segment_abandoned(name)) continue;  // in use: keep its lock file too
      if (segment_exists) bip::shared_memory_object::remove(name.c_str());
      lock->remove_file_on_unlock();
    } catch (const Error&) {
      // Not ours to clean (permissions): leave it.
    }
  }
}

}  // namespace

struct SharedFileCopy::Attachment {
  std::string name;
  std::string lock_path;
  bip::mapped_region region;
  SegmentHeader* header = nullptr;

  ~Attachment() {
    if (header == nullptr) return;
    try {
      std::lock_guard guard(process_mutex());
      FileLock lock(lock_path);
      const auto pid = static_cast<std::int32_t>(::getpid());
      auto* end = header->users + header->num_users;
      auto* mine = std::find(header->users, end, pid);
      if (mine != end) {
        *mine = *(end - 1);
        --header->num_users;
      } else if (header->overflow_users > 0) {
        --header->overflow_users;
      }
      prune_dead_users(*header);
      const bool last = header->num_users == 0 && header->overflow_users == 0;
      region = bip::mapped_region();
      if (last) {
        bip::shared_memory_object::remove(name.c_str());
        lock.remove_file_on_unlock();
      }
    } catch (...) {
      // Detaching must not throw from a destructor; the next user prunes us.
    }
  }
};

SharedFileCopy::SharedFileCopy(std::unique_ptr<Attachment> attachment) : attachment_(std::move(attachment)) {}
SharedFileCopy::SharedFileCopy(SharedFileCopy&&) noexcept = default;
SharedFileCopy& SharedFileCopy::operator=(SharedFileCopy&&) noexcept = default;
SharedFileCopy::~SharedFileCopy() = default;

SharedFileCopy SharedFileCopy::open(const std::string& path) {
  std::uint64_t size = 0;
  const std::string identity = identity_of(path, &size);
  auto attachment = std::make_unique<Attachment>();
  attachment->name = "dufu." + sha256_hex(identity).substr(0, 40);
  attachment->lock_path = lock_path_for(attachment->name);

  std::lock_guard guard(process_mutex());
  reclaim_abandoned_segments(attachment->name);
  FileLock lock(attachment->lock_path);
  try {
    bip::shared_memory_object segment(bip::open_or_create, attachment->name.c_str(), bip::read_write);
    bip::offset_t current = 0;
    segment.get_size(current);
    const auto total = static_cast<bip::offset_t>(kDataOffset + size);
    if (current != total) {
      segment.truncate(total);
      // Reserve the pages now: on a full /dev/shm, writing into a merely truncated
      // segment would kill the process with SIGBUS instead of failing cleanly.
      const int status = ::posix_fallocate(segment.get_mapping_handle().handle, 0, total);
      if (status != 0) {
        bip::shared_memory_object::remove(attachment->name.c_str());
        lock.remove_file_on_unlock();
        DUFU_FAIL("cannot hold a shared copy of '", path, "' (", size, " bytes) in shared memory: ",
                  errno_message(status), ". HINT: enlarge /dev/shm or read the shard with impl mmap");
      }
    }
    attachment->region = bip::mapped_region(segment, bip::read_write);
  } catch (const bip::interprocess_exception& error) {
    DUFU_FAIL("cannot create shared memory for '", path, "': ", error.what());
  }
  auto* header = static_cast<SegmentHeader*>(attachment->region.get_address());
  if (header->magic != kMagic || header->ready != 1 || header->data_size != size) {
    // New, or left half-loaded by a process that died while loading.
    std::memset(static_cast<void*>(header), 0, sizeof(SegmentHeader));
    header->magic = kMagic;
    header->data_size = size;
    try {
      const auto file = ReadOnlyFile::open(path);
      if (file.size() != size) DUFU_FAIL("'", path, "' changed size while being cached");
      auto* data = static_cast<std::byte*>(attachment->region.get_address()) + kDataOffset;
      constexpr std::uint64_t kChunk = 64ULL << 20;
      for (std::uint64_t offset = 0; offset < size; offset += kChunk) {
        file.read_exact(offset, std::min(kChunk, size - offset), data + offset);
      }
    } catch (...) {
      // Not ready, so nobody is attached: the half-loaded copy goes now.
      attachment->region = bip::mapped_region();
      bip::shared_memory_object::remove(attachment->name.c_str());
      lock.remove_file_on_unlock();
      throw;
    }
    header->ready = 1;
  }
  prune_dead_users(*header);
  if (header->num_users < kMaxUsers) {
    header->users[header->num_users++] = static_cast<std::int32_t>(::getpid());
  } else {
    ++header->overflow_users;
  }
  attachment->header = header;
  return SharedFileCopy(std::move(attachment));
}

const std::byte* SharedFileCopy::data() const {
  return static_cast<const std::byte*>(attachment_->region.get_address()) + kDataOffset;
}
std::uint64_t SharedFileCopy::size() const { return attachment_->header->data_size; }
const std::string& SharedFileCopy::segment_name() const { return attachment_->name; }

std::uint32_t SharedFileCopy::users() const {
  std::lock_guard guard(process_mutex());
  FileLock lock(attachment_->lock_path);
  prune_dead_users(*attachment_->header);
  return attachment_->header->num_users + attachment_->header->overflow_users;
}

}  // namespace dufu
