// The lines of one byte range of a plain (uncompressed) file, so that one large file
// can be read by several processes at once. A range [begin, end) owns the lines that
// start inside it: it skips the partial line at its start (the previous range owns
// it) and reads past its end to finish its last line. Ranges that tile a file thus
// deliver every line exactly once, whatever the cut points, which is what keeps the
// output of a divided job identical to the undivided one.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "dufu/dataprep/byte_source.h"

namespace dufu::dataprep {

class LineRangeSource final : public ByteSource {
 public:
  // Throws dufu::Error naming the file if it cannot be opened or is compressed.
  LineRangeSource(const std::string& path, std::uint64_t begin, std::uint64_t end);
  ~LineRangeSource() override;

  // Throws at the end of the range when the file changed since it was opened
  // (check_unchanged): its last line may then run into bytes still being written.
  std::size_t read(char* out, std::size_t capacity) override;
  // The bytes of the owned lines delivered so far: ranges that tile a file sum to its
  // size, as the whole file read at once would count.
  std::uint64_t raw_bytes_read() const override { return delivered_; }
  Compression compression() const override { return Compression::kNone; }

  // Lines of the file before the first owned line, for absolute line numbers in
  // messages. Counted on first use (a scan of the file up to there), so a run without
  // bad records never pays for it.
  std::uint64_t lines_before();

 private:
  std::size_t read_at(std::uint64_t offset, char* out, std::size_t capacity);
  void find_first_line();

  int fd_ = -1;
  FileSnapshot opened_;
  std::uint64_t begin_, end_;
  std::uint64_t position_ = 0;  // next file offset to deliver
  std::uint64_t start_ = 0;     // offset of the first owned line
  bool started_ = false;
  bool done_ = false;
  std::uint64_t delivered_ = 0;
  std::int64_t lines_before_ = -1;
};

// True if the file's bytes are not zstd or gzip (by magic, as open_byte_source sees
// them): only such files can be cut into ranges. Throws if it cannot be opened or is
// mislabelled.
bool is_uncompressed_file(const std::string& path);

}  // namespace dufu::dataprep
