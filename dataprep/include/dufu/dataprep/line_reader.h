// Lines of a ByteSource (byte_source.h), for the txt and jsonl readers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "dufu/dataprep/byte_source.h"

namespace dufu::dataprep {

// Splits a ByteSource into lines ('\n' removed, a trailing '\r' kept as data) with
// line numbers starting at 1. The returned view stays valid until the next call.
// The buffer reserves `tail_padding` readable bytes past each line (simdjson needs
// them). Memory is bounded by `max_line_bytes`: a longer line is never held whole.
class LineReader {
 public:
  static constexpr std::size_t kUnlimited = static_cast<std::size_t>(-1);
  explicit LineReader(std::unique_ptr<ByteSource> source, std::size_t tail_padding = 64,
                      std::size_t max_line_bytes = kUnlimited);
  // False at the end of input. A line longer than max_line_bytes comes back empty
  // with too_long() set, as soon as that is known (the rest of the line is then
  // skipped by the next call, reading but not keeping it).
  bool next_line(std::string_view* line);
  bool too_long() const { return too_long_; }
  std::uint64_t line_number() const { return line_number_; }
  ByteSource& source() { return *source_; }
  // The whole remaining input as one string (for --txt-document file); false, with
  // `out` cleared, as soon as it is longer than max_line_bytes.
  bool read_all(std::string* out);
  std::string read_all() {
    std::string all;
    read_all(&all);
    return all;
  }

 private:
  bool fill();
  // Discards input up to and including the next '\n'.
  void skip_rest_of_line();

  std::unique_ptr<ByteSource> source_;
  std::size_t tail_padding_;
  std::size_t max_line_bytes_;
  std::string buffer_;
  std::size_t begin_ = 0, end_ = 0;
  bool eof_ = false;
  bool too_long_ = false;
  bool skipping_ = false;
  std::uint64_t line_number_ = 0;
};

}  // namespace dufu::dataprep
