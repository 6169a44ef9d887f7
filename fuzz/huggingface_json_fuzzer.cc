// HuggingFace tokenizer.json files (dataprep --tokenizer-model tokenizer.json): a BPE
// model with its vocabulary and merges (pairs or "a b" strings), ByteLevel and Split
// pre-tokenizers (user regexes, compiled by PCRE2), added tokens. See
// tokenizer_check.h for what a loaded one must do.
#include <string>

#include "tokenizer_check.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dufu::fuzz;
  dufu::dataprep::TokenizerSpec spec;
  spec.model = write_input("hf/tokenizer.json", data, size);
  check_tokenizer(spec, std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
