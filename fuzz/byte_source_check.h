// The zstd and gzip targets' shared check: a ByteSource must give the same bytes and
// the same verdict (end of input or dufu::Error) whatever read sizes its caller uses,
// since the decoders keep state across reads (output left inside the decoder, a
// member or frame that ends exactly at a block boundary). Large reads stop after
// kMaxOutput bytes (three full 1 MiB reads and more), small ones after
// kMaxSmallReadOutput, which bounds the time a decompression bomb can take.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dufu/dataprep/byte_source.h"
#include "fuzz_input.h"

namespace dufu::fuzz {

inline constexpr std::size_t kMaxOutput = std::size_t{3} << 20;
inline constexpr std::size_t kMaxSmallReadOutput = std::size_t{256} << 10;

enum class Outcome { kEnd, kError, kTooLong };

struct ReadResult {
  Outcome outcome = Outcome::kEnd;
  std::string bytes;
  std::string error;
};

// Reads `path` to its end (or `limit` bytes) in reads of `chunk` bytes.
inline ReadResult read_source(const std::string& path, dataprep::Compression expected, std::size_t chunk,
                              std::size_t limit) {
  ReadResult result;
  std::vector<char> buffer(chunk);
  try {
    std::unique_ptr<dataprep::ByteSource> source = dataprep::open_byte_source(path);
    fuzz_require(source->compression() == expected, "the source's compression is not the one its name says");
    for (;;) {
      const std::size_t n = source->read(buffer.data(), buffer.size());
      fuzz_require(n <= buffer.size(), "read returned more bytes than asked for");
      if (n == 0) break;
      result.bytes.append(buffer.data(), n);
      if (result.bytes.size() > limit) {
        result.bytes.resize(limit);
        result.outcome = Outcome::kTooLong;
        return result;
      }
    }
    // Once at the end, the source stays there.
    fuzz_require(source->read(buffer.data(), buffer.size()) == 0, "read after the end returned bytes");
  } catch (const dufu::InternalError& e) {
    finding(e.what());
  } catch (const dufu::Error& e) {
    result.outcome = Outcome::kError;
    result.error = e.what();
  }
  return result;
}

// The same input read in 1 MiB reads and in small ones (1..61 bytes, by input size)
// must agree. Returns the large-read result for further checks.
inline ReadResult check_read_sizes_agree(const std::string& path, dataprep::Compression expected,
                                         std::size_t input_size) {
  ReadResult large = read_source(path, expected, std::size_t{1} << 20, kMaxOutput);
  ReadResult small = read_source(path, expected, 1 + input_size % 61, kMaxSmallReadOutput);
  if (small.outcome == Outcome::kTooLong) {
    // The small reads stopped early. A large read that failed may have dropped what
    // it decoded in its last call; otherwise it got at least as far.
    fuzz_require(large.outcome == Outcome::kError || large.bytes.size() >= small.bytes.size(),
                 "small reads gave more bytes than large ones");
    const std::size_t common = std::min(large.bytes.size(), small.bytes.size());
    fuzz_require(large.bytes.compare(0, common, small.bytes, 0, common) == 0,
                 "large and small reads gave different bytes");
    return large;
  }
  fuzz_require(large.outcome != Outcome::kTooLong, "large reads gave more bytes than small ones");
  if (large.outcome != small.outcome) {
    const auto describe = [](const ReadResult& read) {
      return read.outcome == Outcome::kError ? "refused (" + read.error + ")"
             : read.outcome == Outcome::kEnd ? "read to the end, " + std::to_string(read.bytes.size()) + " bytes"
                                               : std::string("too long");
    };
    finding("large and small reads disagree: large reads " + describe(large) + ", small reads " + describe(small));
  }
  fuzz_require(large.bytes == small.bytes || large.outcome == Outcome::kError,
               "large and small reads gave different bytes");
  return large;
}

}  // namespace dufu::fuzz
