// The gzip byte source (dataprep's .gz inputs): corrupt and truncated members,
// concatenated members (`cat a.gz b.gz`), zlib headers and trailing bytes. The shared
// read-size check applies: the same bytes and verdict for any read size.
#include <string>

#include "byte_source_check.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dufu::fuzz;
  const std::string path = write_input("input.txt.gz", data, size);
  check_read_sizes_agree(path, dufu::dataprep::Compression::kGzip, size);
  return 0;
}
