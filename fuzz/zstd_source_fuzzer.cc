// The zstd byte source (dataprep's .zst inputs): corrupt, truncated, concatenated and
// skippable frames. Besides the shared read-size check, a stream the source reads to
// its end must be what libzstd's one-shot decoder makes of the same bytes, and one it
// refuses must be refused by that decoder too.
#include <zstd.h>

#include <string>

#include "byte_source_check.h"

namespace {

// True if libzstd's streaming decoder, given all input and room for 64 KiB of output
// at a time, reports an error before the input ends.
bool streaming_decoder_refuses(const std::uint8_t* data, std::size_t size) {
  ZSTD_DStream* stream = ZSTD_createDStream();
  std::string output(64 << 10, '\0');
  ZSTD_inBuffer in{data, size, 0};
  bool refused = false;
  while (!refused) {
    ZSTD_outBuffer out{output.data(), output.size(), 0};
    const std::size_t status = ZSTD_decompressStream(stream, &out, &in);
    refused = ZSTD_isError(status);
    if (in.pos == in.size && out.pos < out.size) break;
  }
  ZSTD_freeDStream(stream);
  return refused;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dufu::fuzz;
  const std::string path = write_input("input.jsonl.zst", data, size);
  const ReadResult read = check_read_sizes_agree(path, dufu::dataprep::Compression::kZstd, size);
  if (read.outcome == Outcome::kTooLong) return 0;
  // The streaming decoder refuses windows above 128 MiB, which the one-shot one,
  // given the whole output buffer, does not need.
  if (read.error.find("too much memory") != std::string::npos) return 0;
  // An empty file has no magic and is refused; ZSTD_decompress takes it for no frames.
  if (size == 0) return 0;

  // A refused stream is decoded into a small buffer: one that needs more is refused
  // by ZSTD_decompress too (dstSize_tooSmall), which leaves long streams unchecked.
  constexpr std::size_t kRefusedCheckBytes = 64 << 10;
  std::string reference(read.outcome == Outcome::kEnd ? read.bytes.size() + 1 : kRefusedCheckBytes, '\0');
  const std::size_t n = ZSTD_decompress(reference.data(), reference.size(), data, size);
  if (read.outcome == Outcome::kEnd) {
    fuzz_require(!ZSTD_isError(n), "the source read a stream to its end that ZSTD_decompress refuses");
    reference.resize(n);
    fuzz_require(reference == read.bytes, "the source and ZSTD_decompress decode different bytes");
  } else if (!ZSTD_isError(n)) {
    // The one-shot decoder, holding the whole output, follows match offsets past the
    // frame's declared window, which the format forbids and libzstd's streaming
    // decoder (the zstd tool's) refuses as corruption: only that decoder's verdict
    // is binding on a source that streams.
    fuzz_require(streaming_decoder_refuses(data, size), "the source refused a stream that libzstd decodes");
  }
  return 0;
}
