// The one tokenizer interface of dufu: preprocess, inspect, sample and `train
// generate` see only this. Tokenizer::load picks the implementation from the file:
//   - a sentencepiece `.model` (BPE, unigram, char, word);
//   - a tiktoken rank file (`*.tiktoken`, lines of "base64-bytes rank") with a
//     pre-tokenizer pattern: gpt2, cl100k, o200k or any regex;
//   - a HuggingFace `tokenizer.json` with a BPE model over byte-level pre-tokenization
//     (ByteLevel, optionally after Split(regex), as GPT-2, Llama-3 and Qwen2 write it);
//   - GPT-2's `vocab.json` with its `merges.txt`.
// A component the file uses that dufu does not implement is refused by name.
// Special tokens in the text are encoded as ordinary text (tiktoken's
// encode_ordinary); nothing is added around the text (no BOS, no template).
// TokenizerModel (tokenizer_model.h) is what each kind implements.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dufu/dataprep/tokenizer_model.h"

namespace dufu::dataprep {

// What kind of tokenizer file a spec names, by the rule Tokenizer::load follows: a
// .tiktoken name, else JSON (its first non-blank byte '{') is a vocab.json when merges
// are given and a tokenizer.json otherwise, else a sentencepiece model. It only looks;
// load() is what refuses a file or a combination.
enum class TokenizerFileKind { kSentencePiece, kTiktoken, kHuggingFaceJson, kGpt2Vocab };
TokenizerFileKind tokenizer_file_kind(const TokenizerSpec& spec);

// A loaded tokenizer: a cheap-to-copy handle; all methods are const and thread-safe.
class Tokenizer {
 public:
  // Throws dufu::Error naming the file when it is missing, not a tokenizer, or uses a
  // component dufu does not implement.
  static Tokenizer load(const TokenizerSpec& spec);
  static Tokenizer load(const std::string& model_path) {
    return load(TokenizerSpec{.model = model_path, .merges = {}, .pattern = {}});
  }

  // A worker's encoder, with its own cache: make one per thread.
  std::unique_ptr<TokenEncoder> make_encoder() const { return model_->make_encoder(); }
  // One-off encoding through a fresh encoder (no cache kept between calls).
  void encode(std::string_view text, std::vector<std::int32_t>* ids) const { make_encoder()->encode(text, ids); }
  // Without dufu's caches and fast paths: for tests and benchmarks.
  void encode_uncached(std::string_view text, std::vector<std::int32_t>* ids) const {
    model_->encode_uncached(text, ids);
  }
  // Ids outside the vocabulary are refused. Byte-level tokens that split a character
  // decode to U+FFFD, as tiktoken's and HuggingFace's decoders do.
  std::string decode(std::span<const std::int32_t> ids) const { return model_->decode(ids); }
  // One more than the largest id the tokenizer defines (Megatron's dtype rule uses it).
  std::int64_t vocab_size() const { return model_->vocab_size(); }
  // The tokenizer's own end-of-document id (<|endoftext|>, </s>, ...), -1 when none.
  std::int32_t eod_id() const { return model_->eod_id(); }
  std::int32_t eos_id() const { return eod_id(); }
  // e.g. "tiktoken cl100k (100277 ids) from cl100k_base.tiktoken", for logs.
  std::string name() const { return model_->name(); }
  // The text of one token, for messages.
  std::string piece(std::int32_t id) const { return model_->piece(id); }
  const std::string& path() const { return path_; }

 private:
  Tokenizer(std::string path, std::shared_ptr<const TokenizerModel> model)
      : path_(std::move(path)), model_(std::move(model)) {}
  std::string path_;
  std::shared_ptr<const TokenizerModel> model_;
};

}  // namespace dufu::dataprep
