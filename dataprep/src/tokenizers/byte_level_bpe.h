// Byte-level BPE behind the Tokenizer interface: what the .tiktoken, tokenizer.json
// and vocab.json + merges.txt loaders build. Text -> (normalizer) -> pre-tokenizer
// stages -> pieces -> a per-encoder cache of pieces -> BytePairModel.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "dufu/dataprep/byte_pair_encoder.h"
#include "dufu/dataprep/regex_splitter.h"
#include "dufu/dataprep/tokenizer.h"

namespace dufu::dataprep::tokenizers {

// One step of pre-tokenization, applied to every piece of the step before.
struct PreTokenizerStage {
  // HuggingFace ByteLevel's add_prefix_space: a piece not starting with ' ' gets one.
  bool prefix_space = false;
  std::unique_ptr<RegexSplitter> splitter;  // when not a prefix step
  bool matches_are_pieces = true;           // false: Split's Removed behaviour
};

// HuggingFace's Unicode normalizers (ICU's implementations of the same forms).
enum class UnicodeForm { kNFC, kNFD, kNFKC, kNFKD };

struct ByteLevelBpeConfig {
  std::string name;
  std::vector<UnicodeForm> normalizers;  // applied in order before pre-tokenization
  BytePairModel model;
  std::vector<PreTokenizerStage> stages;
  // Token bytes by id; ids that are not defined have no entry in `defined`.
  std::vector<std::string> token_bytes;
  std::vector<bool> defined;
  std::int32_t eod_id = -1;
  // A piece that is a whole token is that token, without merges: always in tiktoken
  // (encode_ordinary looks the piece up first), with ignore_merges in HuggingFace.
  // whole_tokens covers the ids of `whole_token_ids` (see make_byte_level_bpe).
  bool ignore_merges = false;
  std::vector<bool> whole_token_ids;  // empty: every defined id
};

std::unique_ptr<TokenizerModel> make_byte_level_bpe(ByteLevelBpeConfig config);

// The pieces between the loaders.
std::unique_ptr<TokenizerModel> load_tiktoken(const TokenizerSpec& spec);
std::unique_ptr<TokenizerModel> load_huggingface_json(const TokenizerSpec& spec);
std::unique_ptr<TokenizerModel> load_gpt2_vocab(const TokenizerSpec& spec);
std::unique_ptr<TokenizerModel> load_sentencepiece(const TokenizerSpec& spec);

// The pre-tokenizer patterns of tiktoken's encodings (tiktoken_ext/openai_public.py)
// and HuggingFace's ByteLevel.
extern const char* const kGpt2Pattern;
extern const char* const kCl100kPattern;
extern const char* const kO200kPattern;
extern const char* const kHuggingFaceByteLevelPattern;

// Token ids index dense tables (token bytes, merges), so memory follows the largest
// id, not the file: an id more than kMaxIdGap past the number of tokens the file
// defines is refused, naming the file (a rank file of a few lines with the rank
// 777777777 took 25 GB; found by fuzz/tiktoken_fuzzer.cc). Real vocabularies are
// dense, or nearly (HuggingFace's added tokens follow the vocabulary).
inline constexpr std::int64_t kMaxIdGap = std::int64_t{1} << 20;
void check_id_range(const std::string& path, std::int64_t largest_id, std::size_t tokens);

// `text` in Unicode normalization form `form` (ICU), appended to `out`.
void normalize_unicode(UnicodeForm form, std::string_view text, std::string* out);

// Replaces ill-formed UTF-8 by U+FFFD, one per maximal subpart (what Python's
// errors="replace" and Rust's from_utf8_lossy do).
std::string utf8_lossy(std::string_view bytes);

}  // namespace dufu::dataprep::tokenizers
