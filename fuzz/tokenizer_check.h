// The tokenizer targets' shared check: a tokenizer that loads must encode text into
// ids inside its vocabulary that decode without an error, and a worker's encoder,
// which caches the pieces it has seen, must give the same ids as a fresh one (the
// cache never changes the output). The text is fixed prose, code and scripts plus the
// input itself made UTF-8 (documents reach the tokenizer validated).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dufu/dataprep/tokenizer.h"
#include "fuzz_input.h"
#include "dufu/common/utf8.h"  // utf8_lossy

namespace dufu::fuzz {

inline void check_tokenizer(const dataprep::TokenizerSpec& spec, std::string_view input) {
  std::optional<dataprep::Tokenizer> tokenizer;
  if (!refused_cleanly_or_parsed([&] { tokenizer.emplace(dataprep::Tokenizer::load(spec)); })) return;
  fuzz_require(tokenizer->vocab_size() > 0, "a tokenizer loaded with an empty vocabulary");
  fuzz_require(tokenizer->eod_id() < tokenizer->vocab_size(), "the end-of-document id is outside the vocabulary");
  (void)tokenizer->name();

  const std::string texts[] = {
      "The quick brown fox's 12 jumps, don't they?  \n\tcaf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e "
      "\xd0\xbf\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82 \xf0\x9f\x98\x80<|endoftext|>",
      "int main() {\n    return x[i] + 0x1F;\n}\n",
      utf8_lossy(input.substr(0, 4096)),
  };
  const std::unique_ptr<dataprep::TokenEncoder> encoder = tokenizer->make_encoder();
  std::vector<std::int32_t> ids, again, fresh;
  for (int round = 0; round < 2; ++round) {
    for (const std::string& text : texts) {
      encoder->encode(text, &ids);
      for (const std::int32_t id : ids) {
        fuzz_require(id >= 0 && id < tokenizer->vocab_size(), "an encoded id is outside the vocabulary");
        (void)tokenizer->piece(id);
      }
      tokenizer->encode(text, &fresh);
      fuzz_require(ids == fresh, "the encoder's cache changed its output");
      (void)tokenizer->decode(ids);
    }
  }
}

}  // namespace dufu::fuzz
