// Byte-level BPE behind the Tokenizer interface: what the .tiktoken, tokenizer.json
// and vocab.json + merges.txt loaders (tiktoken_loader.h, huggingface_loader.h) build. Text -> (normalizer) -> pre-tokenizer
// stages -> pieces -> a per-encoder cache of pieces -> BytePairModel.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "byte_pair_encoder.h"
#include "dufu/dataprep/tokenizer_model.h"
#include "regex_splitter.h"

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
  // The lookup of whole_token_ids when the loader has built it already (tiktoken's
  // rank lookup is the same table): built again otherwise.
  TokenLookup whole_tokens;
  bool whole_tokens_built = false;
};

std::unique_ptr<TokenizerModel> make_byte_level_bpe(ByteLevelBpeConfig config);

// Token ids index dense tables (token bytes, merges), so memory follows the largest
// id, not the file: an id more than kMaxIdGap past the number of tokens the file
// defines is refused, naming the file, because otherwise a rank file of a few lines
// with one rank near 10^9 would make tables of tens of gigabytes. Real vocabularies
// are dense, or nearly (HuggingFace's added tokens follow the vocabulary).
inline constexpr std::int64_t kMaxIdGap = std::int64_t{1} << 20;
void check_id_range(const std::string& path, std::int64_t largest_id, std::size_t tokens);

// `text` in Unicode normalization form `form` (ICU), appended to `out`.
void normalize_unicode(UnicodeForm form, std::string_view text, std::string* out);

}  // namespace dufu::dataprep::tokenizers
