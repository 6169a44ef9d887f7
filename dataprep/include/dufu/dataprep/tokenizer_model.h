// What each kind of tokenizer implements (the sentencepiece, tiktoken, tokenizer.json
// and vocab.json loaders under src/tokenizers/), and the files a tokenizer is loaded
// from. tokenizer.h's Tokenizer chooses the kind and is what the rest of dufu uses.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dufu::dataprep {

struct TokenizerSpec {
  std::string model;    // the tokenizer file
  std::string merges;   // GPT-2 merges.txt, for a vocab.json model
  // For a .tiktoken rank file: gpt2, cl100k, o200k or a regex. Empty: inferred from
  // the file name (gpt2/r50k_base/p50k_base, cl100k_base, o200k_base).
  std::string pattern;
};

// One worker's encoder. Not thread-safe: each thread makes its own. It may keep a
// bounded cache of the pieces it has seen, which never changes its output.
class TokenEncoder {
 public:
  virtual ~TokenEncoder() = default;
  // Replaces the contents of `ids` with the ids of `text`.
  virtual void encode(std::string_view text, std::vector<std::int32_t>* ids) = 0;
};

// What each kind of tokenizer implements. All methods are const and thread-safe.
class TokenizerModel {
 public:
  virtual ~TokenizerModel() = default;
  virtual std::unique_ptr<TokenEncoder> make_encoder() const = 0;
  // The implementation's own encoding of the whole text, without any dufu cache or
  // fast path (sentencepiece's Encode); by default a fresh encoder's.
  virtual void encode_uncached(std::string_view text, std::vector<std::int32_t>* ids) const {
    make_encoder()->encode(text, ids);
  }
  virtual std::string decode(std::span<const std::int32_t> ids) const = 0;
  virtual std::int64_t vocab_size() const = 0;
  virtual std::int32_t eod_id() const = 0;
  virtual std::string name() const = 0;
  virtual std::string piece(std::int32_t id) const = 0;
};

}  // namespace dufu::dataprep
