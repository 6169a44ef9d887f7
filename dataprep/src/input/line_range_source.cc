// Reads the lines a byte range of a plain file owns (line_range_source.h). The first
// owned line starts after the first '\n' at or after begin - 1; the last one ends at
// the first '\n' at or after end - 1. Two neighbouring ranges compute the same point
// from the same byte, so they meet exactly.
#include "dufu/dataprep/line_range_source.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "dufu/common/error.h"

namespace dufu::dataprep {
namespace {

constexpr std::size_t kScanBlock = std::size_t{1} << 20;

}  // namespace

LineRangeSource::LineRangeSource(const std::string& path, std::uint64_t begin, std::uint64_t end)
    : ByteSource(path), begin_(begin), end_(end) {
  if (begin > end) DUFU_FAIL("internal error: byte range [", begin, ", ", end, ") of '", path, "' is reversed");
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) DUFU_FAIL("cannot open '", path, "': ", errno_message(errno));
  opened_ = FileSnapshot::of(fd_);
}

LineRangeSource::~LineRangeSource() {
  if (fd_ >= 0) ::close(fd_);
}

std::size_t LineRangeSource::read_at(std::uint64_t offset, char* out, std::size_t capacity) {
  for (;;) {
    const ssize_t n = ::pread(fd_, out, capacity, static_cast<off_t>(offset));
    if (n >= 0) return static_cast<std::size_t>(n);
    if (errno != EINTR) DUFU_FAIL("error reading '", name(), "' at byte ", offset, ": ", errno_message(errno));
  }
}

void LineRangeSource::find_first_line() {
  started_ = true;
  start_ = 0;
  if (begin_ > 0) {
    // The line that holds byte begin - 1 belongs to the range before, unless that
    // byte is its '\n'.
    std::vector<char> block(kScanBlock);
    std::uint64_t offset = begin_ - 1;
    for (;;) {
      const std::size_t n = read_at(offset, block.data(), block.size());
      if (n == 0) {
        start_ = offset;  // no line starts here before the end of the file
        break;
      }
      const void* newline = std::memchr(block.data(), '\n', n);
      if (newline != nullptr) {
        start_ = offset + static_cast<std::uint64_t>(static_cast<const char*>(newline) - block.data()) + 1;
        break;
      }
      offset += n;
    }
  }
  position_ = start_;
  done_ = start_ >= end_;
}

std::size_t LineRangeSource::read(char* out, std::size_t capacity) {
  if (!started_) find_first_line();
  if (done_ || capacity == 0) return 0;
  const bool finishing_last_line = position_ >= end_;
  const std::size_t wanted =
      finishing_last_line ? capacity : static_cast<std::size_t>(std::min<std::uint64_t>(capacity, end_ - position_));
  std::size_t n = read_at(position_, out, wanted);
  if (n == 0) {
    // The file ends here: a last line without '\n', unless the file is still growing.
    check_unchanged(fd_, opened_, name());
    done_ = true;
    return 0;
  }
  if (finishing_last_line) {
    const void* newline = std::memchr(out, '\n', n);
    if (newline != nullptr) {
      n = static_cast<std::size_t>(static_cast<const char*>(newline) - out) + 1;
      done_ = true;
    }
  } else if (position_ + n == end_ && out[n - 1] == '\n') {
    done_ = true;  // the range ends exactly at a line start
  }
  position_ += n;
  delivered_ += n;
  // The last line may have run past the end into bytes written since it was opened.
  if (done_) check_unchanged(fd_, opened_, name());
  return n;
}

std::uint64_t LineRangeSource::lines_before() {
  if (!started_) find_first_line();
  if (lines_before_ >= 0) return static_cast<std::uint64_t>(lines_before_);
  std::vector<char> block(kScanBlock);
  std::uint64_t lines = 0;
  for (std::uint64_t offset = 0; offset < start_;) {
    const std::size_t wanted = static_cast<std::size_t>(std::min<std::uint64_t>(block.size(), start_ - offset));
    const std::size_t n = read_at(offset, block.data(), wanted);
    if (n == 0) break;
    lines += static_cast<std::uint64_t>(std::count(block.data(), block.data() + n, '\n'));
    offset += n;
  }
  lines_before_ = static_cast<std::int64_t>(lines);
  return lines;
}

bool is_uncompressed_file(const std::string& path) {
  return open_byte_source(path)->compression() == Compression::kNone;
}

}  // namespace dufu::dataprep
