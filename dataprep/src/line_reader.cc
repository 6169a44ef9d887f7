// Splits a ByteSource into lines inside one reusable buffer, so a line reaches the
// JSON parser without being copied and with the readable padding simdjson requires.
#include <algorithm>
#include <cstring>

#include "dufu/dataprep/byte_source.h"

namespace dufu::dataprep {
namespace {

constexpr std::size_t kReadSize = std::size_t{1} << 20;
// Below this much free space a read is not worth a syscall or decoder call: make room.
constexpr std::size_t kMinRead = kReadSize / 2;

}  // namespace

LineReader::LineReader(std::unique_ptr<ByteSource> source, std::size_t tail_padding)
    : source_(std::move(source)), tail_padding_(tail_padding) {}

bool LineReader::next_line(std::string_view* line) {
  // Bytes after begin_ already known to hold no '\n': a line longer than one read is
  // scanned once, not once per refill.
  std::size_t scanned = 0;
  for (;;) {
    const std::size_t available = end_ - begin_;
    if (available > scanned) {
      const char* start = buffer_.data() + begin_;
      const void* newline = std::memchr(start + scanned, '\n', available - scanned);
      if (newline != nullptr) {
        const std::size_t length = static_cast<std::size_t>(static_cast<const char*>(newline) - start);
        *line = std::string_view(start, length);
        begin_ += length + 1;
        ++line_number_;
        return true;
      }
      scanned = available;
    }
    if (!fill()) {
      if (end_ == begin_) return false;
      // The last line may lack its '\n'; the padding is still inside the buffer.
      *line = std::string_view(buffer_.data() + begin_, end_ - begin_);
      begin_ = end_;
      ++line_number_;
      return true;
    }
  }
}

bool LineReader::fill() {
  if (eof_) return false;
  // Move the unfinished line to the front: it is short unless a line is huge, and a
  // huge line is moved only before the buffer doubles.
  if (begin_ == end_) {
    begin_ = end_ = 0;
  } else if (begin_ > 0) {
    std::memmove(buffer_.data(), buffer_.data() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  if (buffer_.size() < end_ + kMinRead + tail_padding_) {
    // Doubling keeps the cost of very long lines linear; the buffer never shrinks, so
    // later lines reuse its capacity.
    std::size_t size = std::max(buffer_.size() * 2, kReadSize + tail_padding_);
    while (size < end_ + kMinRead + tail_padding_) size *= 2;
    buffer_.resize(size);
  }
  const std::size_t n = source_->read(buffer_.data() + end_, buffer_.size() - tail_padding_ - end_);
  if (n == 0) {
    eof_ = true;
    return false;
  }
  end_ += n;
  return true;
}

std::string LineReader::read_all() {
  std::string all(buffer_.data() + begin_, end_ - begin_);
  begin_ = end_;
  std::size_t used = all.size();
  while (!eof_) {
    if (all.size() - used < kMinRead) all.resize(std::max(2 * all.size(), used + kReadSize));
    const std::size_t n = source_->read(all.data() + used, all.size() - used);
    if (n == 0) eof_ = true;
    used += n;
  }
  all.resize(used);
  return all;
}

}  // namespace dufu::dataprep
