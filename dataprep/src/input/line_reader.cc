// Splits a ByteSource into lines inside one reusable buffer, so a line reaches the
// JSON parser without being copied and with the readable padding simdjson requires.
// A line longer than the limit is reported as soon as the limit is passed and then
// skipped in place, so no input (not even /dev/zero) makes the buffer grow past it.
#include "dufu/dataprep/line_reader.h"

#include <algorithm>
#include <cstring>

namespace dufu::dataprep {
namespace {

constexpr std::size_t kReadSize = std::size_t{1} << 20;
// Below this much free space a read is not worth a syscall or decoder call: make room.
constexpr std::size_t kMinRead = kReadSize / 2;

}  // namespace

LineReader::LineReader(std::unique_ptr<ByteSource> source, std::size_t tail_padding, std::size_t max_line_bytes)
    : source_(std::move(source)), tail_padding_(tail_padding), max_line_bytes_(max_line_bytes) {}

bool LineReader::next_line(std::string_view* line) {
  too_long_ = false;
  if (skipping_) skip_rest_of_line();
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
        ++line_number_;
        begin_ += length + 1;
        if (length > max_line_bytes_) {
          too_long_ = true;
          *line = std::string_view();
        } else {
          *line = std::string_view(start, length);
        }
        return true;
      }
      scanned = available;
    }
    if (scanned > max_line_bytes_) {
      // Over the limit with no end in sight: report it now, skip the rest later.
      ++line_number_;
      too_long_ = true;
      skipping_ = true;
      begin_ = end_;
      *line = std::string_view();
      return true;
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

void LineReader::skip_rest_of_line() {
  for (;;) {
    if (begin_ < end_) {
      const char* start = buffer_.data() + begin_;
      const void* newline = std::memchr(start, '\n', end_ - begin_);
      if (newline != nullptr) {
        begin_ += static_cast<std::size_t>(static_cast<const char*>(newline) - start) + 1;
        break;
      }
      begin_ = end_;
    }
    if (!fill()) break;
  }
  skipping_ = false;
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
  const std::size_t needed = end_ + kMinRead + tail_padding_;
  if (buffer_.size() < needed) {
    // Doubling keeps the cost of very long lines linear; the buffer never shrinks, so
    // later lines reuse its capacity. It never grows much past the longest line
    // allowed: next_line stops a line as soon as it is longer.
    std::size_t size = std::max(buffer_.size() * 2, kReadSize + tail_padding_);
    while (size < needed) size *= 2;
    if (max_line_bytes_ != kUnlimited) {
      size = std::max(std::min(size, max_line_bytes_ + kReadSize + tail_padding_), needed);
    }
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

bool LineReader::read_all(std::string* out) {
  std::string& all = *out;
  all.assign(buffer_.data() + begin_, end_ - begin_);
  begin_ = end_;
  std::size_t used = all.size();
  while (!eof_ && used <= max_line_bytes_) {
    if (all.size() - used < kMinRead) {
      std::size_t size = std::max(2 * all.size(), used + kReadSize);
      if (max_line_bytes_ != kUnlimited) size = std::min(size, std::max(max_line_bytes_ + 1, used + kMinRead));
      all.resize(size);
    }
    const std::size_t n = source_->read(all.data() + used, all.size() - used);
    if (n == 0) eof_ = true;
    used += n;
  }
  if (used > max_line_bytes_) {
    all.clear();
    all.shrink_to_fit();
    return false;
  }
  all.resize(used);
  return true;
}

}  // namespace dufu::dataprep
