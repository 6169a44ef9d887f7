// Descriptor-based reading with EINTR and short-read handling in one place.
#include "dufu/common/read_only_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>
#include <vector>

#include "dufu/common/error.h"

namespace dufu {

ReadOnlyFile::ReadOnlyFile(std::string path, int fd, std::uint64_t size)
    : path_(std::move(path)), fd_(fd), size_(size) {}

ReadOnlyFile::ReadOnlyFile(ReadOnlyFile&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)), size_(other.size_) {}

ReadOnlyFile& ReadOnlyFile::operator=(ReadOnlyFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = other.size_;
  }
  return *this;
}

ReadOnlyFile::~ReadOnlyFile() {
  if (fd_ >= 0) ::close(fd_);
}

int open_regular_file(const std::string& path, std::uint64_t* size) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer; the
  // flag is dropped again once the file is known to be regular.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) DUFU_FAIL("cannot open '", path, "': ", errno_message(errno));
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    const int error = errno;
    ::close(fd);
    DUFU_FAIL("cannot stat '", path, "': ", errno_message(error));
  }
  if (S_ISDIR(info.st_mode)) {
    ::close(fd);
    DUFU_FAIL("cannot open '", path, "': Is a directory");
  }
  // A FIFO, a device (/dev/zero) or a socket would never end, or never start.
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    DUFU_FAIL("cannot open '", path, "': not a regular file");
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) != 0) {
    const int error = errno;
    ::close(fd);
    DUFU_FAIL("cannot open '", path, "': ", errno_message(error));
  }
  if (size != nullptr) *size = static_cast<std::uint64_t>(info.st_size);
  return fd;
}

ReadOnlyFile ReadOnlyFile::open(const std::string& path) {
  std::uint64_t size = 0;
  const int fd = open_regular_file(path, &size);
  return ReadOnlyFile(path, fd, size);
}

void ReadOnlyFile::read_exact(std::uint64_t offset, std::uint64_t size, std::byte* out) const {
  while (size > 0) {
    const ssize_t n = ::pread(fd_, out, size, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      DUFU_FAIL("cannot read '", path_, "' at byte ", offset, ": ", errno_message(errno));
    }
    if (n == 0) DUFU_FAIL("'", path_, "' ended early at byte ", offset, " (truncated while open?)");
    out += n;
    offset += static_cast<std::uint64_t>(n);
    size -= static_cast<std::uint64_t>(n);
  }
}

std::vector<std::byte> ReadOnlyFile::read_all() const {
  std::vector<std::byte> bytes(static_cast<std::size_t>(size_));
  read_exact(0, size_, bytes.data());
  return bytes;
}

void read_in_blocks(const std::string& path, const std::function<void(const char* data, std::size_t size)>& consume) {
  const int fd = open_regular_file(path, nullptr);
  std::vector<char> block(std::size_t{1} << 20);
  try {
    for (;;) {
      const ssize_t n = ::read(fd, block.data(), block.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) DUFU_FAIL("error reading '", path, "': ", errno_message(errno));
      if (n == 0) break;
      consume(block.data(), static_cast<std::size_t>(n));
    }
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
}

}  // namespace dufu
