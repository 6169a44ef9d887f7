// GPT-2's vocab.json with its merges.txt (dataprep --tokenizer-model vocab.json
// --tokenizer-merges merges.txt). The input is both files: the vocabulary up to the
// first NUL byte (which JSON text cannot hold), the merges after it. See
// tokenizer_check.h for what a loaded one must do.
#include <algorithm>
#include <string>

#include "tokenizer_check.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dufu::fuzz;
  const std::uint8_t* end = data + size;
  const std::uint8_t* nul = std::find(data, end, std::uint8_t{0});
  dufu::dataprep::TokenizerSpec spec;
  spec.model = write_input("vocab.json", data, static_cast<std::size_t>(nul - data));
  const std::uint8_t* merges = nul == end ? end : nul + 1;
  spec.merges = write_input("merges.txt", merges, static_cast<std::size_t>(end - merges));
  check_tokenizer(spec, std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
