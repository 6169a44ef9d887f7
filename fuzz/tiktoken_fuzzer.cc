// tiktoken rank files (dataprep --tokenizer-model X.tiktoken): lines of base64 bytes
// and a rank, every byte needing a token, merges derived from the ranks, with the
// GPT-2 pre-tokenizer pattern. See tokenizer_check.h for what a loaded one must do.
#include <string>

#include "tokenizer_check.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dufu::fuzz;
  dufu::dataprep::TokenizerSpec spec;
  spec.model = write_input("ranks.tiktoken", data, size);
  spec.pattern = "gpt2";
  check_tokenizer(spec, std::string_view(reinterpret_cast<const char*>(data), size));
  return 0;
}
