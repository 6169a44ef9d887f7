// An O_TMPFILE file written through a buffer (anonymous_file.h).
#include "dufu/dataprep/anonymous_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <utility>

#include "dufu/common/error.h"

namespace dufu::dataprep {
namespace {

constexpr std::size_t kBufferSize = std::size_t{1} << 20;

void write_all(int fd, const std::string& description, const char* bytes, std::size_t size) {
  while (size > 0) {
    const ssize_t n = ::write(fd, bytes, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) DUFU_FAIL("cannot write ", description, ": ", errno_message(n < 0 ? errno : EIO));
    bytes += n;
    size -= static_cast<std::size_t>(n);
  }
}

}  // namespace

std::optional<AnonymousFile> AnonymousFile::create(const std::string& dir, std::string description) {
  const char* refused = std::getenv("DUFU_NO_ANONYMOUS_FILES");  // fault injection for tests
  if (refused != nullptr && refused[0] != '\0' && std::string_view(refused) != "0") return std::nullopt;
  const std::string where = dir.empty() ? "." : dir;
  const int fd = ::open(where.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int error = errno;
    // EISDIR: a kernel that predates O_TMPFILE saw only its O_DIRECTORY bit.
    if (error == EOPNOTSUPP || error == EISDIR) return std::nullopt;
    DUFU_FAIL("cannot create ", description, " (an anonymous file in '", where, "'): ", errno_message(error));
  }
  return AnonymousFile(fd, std::move(description));
}

AnonymousFile::AnonymousFile(int fd, std::string description) : fd_(fd), description_(std::move(description)) {
  buffer_.resize(kBufferSize);
}

AnonymousFile::AnonymousFile(AnonymousFile&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      description_(std::move(other.description_)),
      buffer_(std::move(other.buffer_)),
      buffered_(std::exchange(other.buffered_, 0)),
      bytes_written_(other.bytes_written_) {}

AnonymousFile::~AnonymousFile() {
  if (fd_ >= 0) ::close(fd_);
}

void AnonymousFile::write(const void* data, std::size_t size) {
  const char* bytes = static_cast<const char*>(data);
  bytes_written_ += size;
  if (buffered_ + size > buffer_.size()) flush();
  if (size >= buffer_.size()) {
    write_all(fd_, description_, bytes, size);
    return;
  }
  std::memcpy(buffer_.data() + buffered_, bytes, size);
  buffered_ += size;
}

void AnonymousFile::flush() {
  write_all(fd_, description_, buffer_.data(), buffered_);
  buffered_ = 0;
}

}  // namespace dufu::dataprep
