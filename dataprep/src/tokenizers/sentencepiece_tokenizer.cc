// sentencepiece models behind the Tokenizer interface: sentencepiece's own processor,
// so the ids are EncodeAsIds's, with a fast path where the model allows one.
//
// The fast path, for BPE models: with sentencepiece's default normalizer (dummy prefix, extra
// whitespace removed, spaces escaped as U+2581) the normalized text is "▁word▁word..."
// with one "▁" where the text had a run of spaces, and when no piece of the
// vocabulary has a "▁" after its first byte, no token crosses a "▁": the ids of a
// text are the ids of its words (between spaces, and the tabs, newlines and carriage
// returns the model's normalizer turns into spaces) encoded one by one, each by
// sentencepiece's own Encode (BPE merges by piece score within the word: nothing
// outside it matters; unigram's Viterbi does not qualify, its float sums over the
// whole text break near-ties differently). A per-worker cache from word to ids then skips every
// repeated word (code repeats each distinct word ~2.6 times, prose ~17 times), and a
// missed word of ASCII bytes the normalizer leaves alone goes through dufu's copy of
// sentencepiece's BPE merge loop (sentencepiece_word_bpe.h), the rest through Encode. The
// conditions are read from the model's NormalizerSpec, TrainerSpec and pieces; when
// one fails, the encoder is plain Encode, and the log says so once.
//
// The second fast path, for BPE models without normalization rules that keep extra
// whitespace (trained as Llama 2's and Mistral's were: normalization_rule_name=identity,
// remove_extra_whitespaces=false, allow_whitespace_only_pieces, split_digits, byte
// fallback): the text is cut where no piece of the vocabulary can span
// (sentencepiece_segments.h says why that is exact), and each part goes through the same
// kind of cache, then the merge loop's encode_segment, then the Encode of a copy of the
// model without the dummy prefix.
#include "sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>

#include <array>

#include "byte_level_bpe.h"
#include "dufu/common/error.h"
#include "dufu/common/log.h"
#include "piece_cache.h"
#include "sentencepiece_segments.h"
#include "sentencepiece_word_bpe.h"

namespace dufu::dataprep::tokenizers {
namespace {

// The few fields of sentencepiece's ModelProto the fast path depends on, read from
// the serialized model with a minimal protobuf wire-format reader.
struct ModelFacts {
  int model_type = 1;  // UNIGRAM=1, BPE=2, WORD=3, CHAR=4
  bool split_by_whitespace = true;
  bool treat_whitespace_as_suffix = false;
  bool allow_whitespace_only_pieces = false;
  bool byte_fallback = false;
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;
  bool escape_whitespaces = true;
  std::string inner_space_piece;  // a piece with "▁" after its first byte, if any
  bool user_defined_pieces = false;
  std::string charsmap;  // NormalizerSpec.precompiled_charsmap
};

class WireReader {
 public:
  explicit WireReader(std::string_view bytes) : bytes_(bytes) {}
  bool done() const { return at_ >= bytes_.size(); }
  // The next field: its number, wire type, and its value (varint or bytes).
  bool next(std::uint32_t* field, std::uint32_t* type, std::uint64_t* varint, std::string_view* data) {
    std::uint64_t key = 0;
    if (!read_varint(&key)) return false;
    *field = static_cast<std::uint32_t>(key >> 3);
    *type = static_cast<std::uint32_t>(key & 7);
    switch (*type) {
      case 0: return read_varint(varint);
      case 1: return skip(8);
      case 5: return skip(4);
      case 2: {
        std::uint64_t length = 0;
        if (!read_varint(&length) || length > bytes_.size() - at_) return false;
        *data = bytes_.substr(at_, length);
        at_ += length;
        return true;
      }
      default: return false;
    }
  }

 private:
  bool read_varint(std::uint64_t* value) {
    *value = 0;
    for (int shift = 0; shift < 64 && at_ < bytes_.size(); shift += 7) {
      const auto byte = static_cast<unsigned char>(bytes_[at_++]);
      *value |= static_cast<std::uint64_t>(byte & 0x7F) << shift;
      if (byte < 0x80) return true;
    }
    return false;
  }
  bool skip(std::size_t count) {
    if (count > bytes_.size() - at_) return false;
    at_ += count;
    return true;
  }
  std::string_view bytes_;
  std::size_t at_ = 0;
};

bool read_model_facts(std::string_view model, ModelFacts* facts) {
  static constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581
  WireReader reader(model);
  std::uint32_t field = 0, type = 0;
  std::uint64_t varint = 0;
  std::string_view data;
  while (!reader.done()) {
    if (!reader.next(&field, &type, &varint, &data)) return false;
    if (type != 2) continue;
    WireReader inner(data);
    std::uint32_t f = 0, t = 0;
    std::uint64_t v = 0;
    std::string_view d;
    while (!inner.done()) {
      if (!inner.next(&f, &t, &v, &d)) return false;
      if (field == 1 && f == 1 && t == 2) {  // SentencePiece.piece
        if (d.find(kSpace, 1) != std::string_view::npos && facts->inner_space_piece.empty()) {
          facts->inner_space_piece = std::string(d);
        }
      } else if (field == 1 && f == 3 && t == 0) {      // SentencePiece.type
        if (v == 4) facts->user_defined_pieces = true;  // USER_DEFINED
      } else if (field == 3 && f == 2 && t == 2) {
        facts->charsmap = std::string(d);
      } else if (field == 2 && t == 0) {  // TrainerSpec
        if (f == 3) facts->model_type = static_cast<int>(v);
        if (f == 22) facts->split_by_whitespace = v != 0;
        if (f == 24) facts->treat_whitespace_as_suffix = v != 0;
        if (f == 26) facts->allow_whitespace_only_pieces = v != 0;
        if (f == 35) facts->byte_fallback = v != 0;
      } else if (field == 3 && t == 0) {  // NormalizerSpec
        if (f == 3) facts->add_dummy_prefix = v != 0;
        if (f == 4) facts->remove_extra_whitespaces = v != 0;
        if (f == 5) facts->escape_whitespaces = v != 0;
      }
    }
  }
  return true;
}

// Empty when the cuts of sentencepiece_segments.h are exact for this model; else why not.
std::string why_no_cuts(const ModelFacts& facts) {
  if (facts.model_type != 2) return "the model is not BPE";
  if (!facts.charsmap.empty()) return "the normalizer has rules";
  if (facts.remove_extra_whitespaces) return "remove_extra_whitespaces is true";
  if (!facts.escape_whitespaces) return "escape_whitespaces is false";
  if (facts.treat_whitespace_as_suffix) return "treat_whitespace_as_suffix is true";
  // Matched before the characters, and by the normalizer too: left to Encode.
  if (facts.user_defined_pieces) return "the model has user-defined symbols";
  return {};
}

// Empty when the word cache is exact for this model; else why not.
std::string why_no_word_cache(const ModelFacts& facts) {
  if (facts.model_type == 1) {
    // Measured: on translated manual pages a word's pieces differ in a few documents.
    return "unigram's Viterbi sums float scores over the whole text, so near-ties between a word's "
           "segmentations are broken by the words before it";
  }
  if (facts.model_type != 2) return "the model is not BPE";
  if (!facts.split_by_whitespace) return "split_by_whitespace is false";
  if (facts.treat_whitespace_as_suffix) return "treat_whitespace_as_suffix is true";
  if (facts.allow_whitespace_only_pieces) return "allow_whitespace_only_pieces is true";
  if (!facts.add_dummy_prefix) return "add_dummy_prefix is false";
  if (!facts.remove_extra_whitespaces) return "remove_extra_whitespaces is false";
  if (!facts.escape_whitespaces) return "escape_whitespaces is false";
  if (!facts.inner_space_piece.empty()) return "the piece '" + facts.inner_space_piece + "' spans a word boundary";
  return {};
}

class SentencePiece final : public TokenizerModel {
 public:
  SentencePiece(std::string path, std::unique_ptr<sentencepiece::SentencePieceProcessor> processor)
      : path_(std::move(path)), processor_(std::move(processor)) {
    ModelFacts facts;
    const bool facts_read = read_model_facts(processor_->serialized_model_proto(), &facts);
    if (facts_read && why_no_cuts(facts).empty()) {
      const std::string failure = set_up_cuts(facts);
      if (failure.empty()) return;
      DUFU_LOG_INFO("tokenizer", "sentencepiece model '", path_, "': plain Encode without cuts, because ", failure);
      cuts_.reset();
      word_bpe_.reset();
    }
    const std::string reason = facts_read ? why_no_word_cache(facts) : "its ModelProto could not be read";
    word_cache_ = reason.empty();
    if (word_cache_) {
      separators_.fill(false);
      separators_[' '] = true;
      // Control characters the model's normalizer turns into a space as it does ' '
      // (nmt_nfkc does, for tab, newline and carriage return): words end there too.
      // Tested on the model itself: alone it encodes to nothing, and between, before or
      // after other text, once, twice or next to a space, as a space would.
      std::vector<std::int32_t> a, b;
      const std::pair<const char*, const char*> around[] = {{"a", "b"}, {"", "x"}, {"x", ""}, {"(", ")"}, {"1", "2"}};
      for (const char c : {'\t', '\n', '\r', '\v', '\f'}) {
        encode_plain(std::string(1, c), &a);
        bool space = a.empty();
        for (const auto& [before, after] : around) {
          for (const std::string& run : {std::string(1, c), std::string(2, c), std::string(1, c) + " "}) {
            encode_plain(before + run + after, &a);
            encode_plain(std::string(before) + " " + after, &b);
            space = space && a == b;
          }
        }
        separators_[static_cast<unsigned char>(c)] = space;
      }
      if (facts.user_defined_pieces) {
        DUFU_LOG_INFO("tokenizer", "sentencepiece model '", path_,
                      "': missed words through sentencepiece's Encode, because it has user-defined symbols");
      } else {
        word_bpe_ = std::make_unique<SentencePieceWordBpe>(*processor_, facts.charsmap);
      }
    } else {
      DUFU_LOG_INFO("tokenizer", "sentencepiece model '", path_, "': plain Encode without the word cache, because ",
                    reason);
    }
  }
  bool word_cache() const { return word_cache_; }
  const SentencePieceCuts* cuts() const { return cuts_.get(); }
  bool dummy_prefix() const { return dummy_prefix_; }
  // The id of the part that is this one byte alone, or -1 (see set_up_cuts).
  std::int32_t single_byte_id(unsigned char byte) const { return single_byte_ids_[byte]; }
  // A part's ids through sentencepiece: the model without its dummy prefix.
  void encode_part_plain(std::string_view part, std::vector<std::int32_t>* ids) const {
    ids->clear();
    const auto status = part_processor_->Encode(part, ids);
    if (!status.ok()) DUFU_FAIL("sentencepiece failed to encode a document: ", status.ToString());
  }
  const std::array<bool, 256>& separators() const { return separators_; }
  const SentencePieceWordBpe* word_bpe() const { return word_bpe_.get(); }

  std::unique_ptr<TokenEncoder> make_encoder() const override;

  std::string decode(std::span<const std::int32_t> ids) const override {
    for (const auto id : ids) check(id);
    const std::vector<int> pieces(ids.begin(), ids.end());
    std::string text;
    const auto status = processor_->Decode(pieces, &text);
    if (!status.ok()) DUFU_FAIL("sentencepiece failed to decode: ", status.ToString());
    return text;
  }
  std::int64_t vocab_size() const override { return processor_->GetPieceSize(); }
  std::int32_t eod_id() const override { return processor_->eos_id(); }
  std::string name() const override {
    return str_cat("sentencepiece (", processor_->GetPieceSize(), " pieces", word_cache_ ? ", word cache" : "",
                   cuts_ ? ", cut where no piece spans, part cache" : "", ") from ", path_);
  }
  std::string piece(std::int32_t id) const override {
    check(id);
    return processor_->IdToPiece(id);
  }

  void encode_uncached(std::string_view text, std::vector<std::int32_t>* ids) const override {
    encode_plain(text, ids);
  }
  void encode_plain(std::string_view text, std::vector<std::int32_t>* ids) const {
    ids->clear();
    const auto status = processor_->Encode(text, ids);
    if (!status.ok()) DUFU_FAIL("sentencepiece failed to encode a document: ", status.ToString());
  }

 private:
  void check(std::int32_t id) const {
    if (id < 0 || id >= processor_->GetPieceSize()) {
      DUFU_FAIL("token id ", id, " is outside the vocabulary of '", path_, "' (size ", processor_->GetPieceSize(),
                ")");
    }
  }
  // Empty when the cut path is ready; else why not.
  std::string set_up_cuts(const ModelFacts& facts) {
    cuts_ = std::make_unique<SentencePieceCuts>(*processor_, /*unknown_runs_join=*/!facts.byte_fallback);
    dummy_prefix_ = facts.add_dummy_prefix;
    // The same model with add_dummy_prefix false: a second NormalizerSpec (field 3)
    // holding only add_dummy_prefix (its field 3) = 0, which protobuf merges into the
    // first when it parses the model.
    part_processor_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
    const std::string no_dummy_prefix("\x1A\x02\x18\x00", 4);
    const auto status =
        part_processor_->LoadFromSerializedProto(processor_->serialized_model_proto() + no_dummy_prefix);
    // (A model whose self-test samples assume the dummy prefix fails its self-test here.)
    if (!status.ok()) return "sentencepiece could not reload it without its dummy prefix: " + status.ToString();
    word_bpe_ = std::make_unique<SentencePieceWordBpe>(*processor_, facts.charsmap, /*identity_normalizer=*/true,
                                                       facts.byte_fallback);
    // Parts of one byte (a newline, a bracket) skip the cache.
    std::vector<std::int32_t> ids;
    for (int byte = 0; byte < 0x80; ++byte) {
      single_byte_ids_[byte] = -1;
      encode_part_plain(std::string(1, static_cast<char>(byte)), &ids);
      if (ids.size() == 1) single_byte_ids_[byte] = ids[0];
    }
    for (int byte = 0x80; byte < 256; ++byte) single_byte_ids_[byte] = -1;
    return {};
  }

  std::string path_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> part_processor_;  // cuts_ only
  std::unique_ptr<SentencePieceCuts> cuts_;  // null: not the cut path
  bool dummy_prefix_ = true;
  std::array<std::int32_t, 256> single_byte_ids_{};
  bool word_cache_ = false;
  std::array<bool, 256> separators_{};  // bytes that end a word
  std::unique_ptr<SentencePieceWordBpe> word_bpe_;  // null: every missed word through Encode
};

class SentencePieceEncoder final : public TokenEncoder {
 public:
  explicit SentencePieceEncoder(const SentencePiece& tokenizer) : tokenizer_(tokenizer) {}
  void encode(std::string_view text, std::vector<std::int32_t>* ids) override { tokenizer_.encode_plain(text, ids); }

 private:
  const SentencePiece& tokenizer_;
};

// The fast path: words (text between separators) through the cache, each missed word
// through the BPE merge loop where it applies, else sentencepiece's Encode. (Encoding a document's missed words together, in one
// Encode of "miss1 miss2 ..." split back at the pieces that start with "▁", measured
// slower than one call per word: sentencepiece's BPE costs more per byte on longer
// input.)
class WordCacheEncoder final : public TokenEncoder {
 public:
  explicit WordCacheEncoder(const SentencePiece& tokenizer) : tokenizer_(tokenizer) {}

  void encode(std::string_view text, std::vector<std::int32_t>* ids) override {
    ids->clear();
    const auto& separator = tokenizer_.separators();
    for (std::size_t at = 0; at < text.size();) {
      if (separator[static_cast<unsigned char>(text[at])]) {
        ++at;
        continue;
      }
      std::size_t end = at + 1;
      while (end < text.size() && !separator[static_cast<unsigned char>(text[end])]) ++end;
      encode_word(text.substr(at, end - at), ids);
      at = end;
    }
  }

 private:
  static constexpr std::size_t kMaxIds = 15;

  void encode_word(std::string_view word, std::vector<std::int32_t>* ids) {
    const bool cacheable = word.size() <= PieceCache<kMaxIds>::kMaxPiece;
    std::uint64_t hash = 0;
    if (cacheable) {
      hash = hash_bytes(word);
      std::size_t count = 0;
      if (const std::int32_t* cached = cache_.find(word, hash, &count)) {
        ids->insert(ids->end(), cached, cached + count);
        return;
      }
    }
    const SentencePieceWordBpe* word_bpe = tokenizer_.word_bpe();
    if (word_bpe == nullptr || !word_bpe->encode(word, &word_ids_)) tokenizer_.encode_plain(word, &word_ids_);
    ids->insert(ids->end(), word_ids_.begin(), word_ids_.end());
    if (cacheable) cache_.insert(word, hash, word_ids_.data(), word_ids_.size());
  }

  const SentencePiece& tokenizer_;
  PieceCache<kMaxIds> cache_;
  std::vector<std::int32_t> word_ids_;
};

// The cut path: the text's parts (sentencepiece_segments.h) through the cache, a missed
// part through encode_segment where it applies, else through Encode without the dummy
// prefix; the first part is encoded with a space in front, the dummy prefix's "▁".
class PartCacheEncoder final : public TokenEncoder {
 public:
  explicit PartCacheEncoder(const SentencePiece& tokenizer) : tokenizer_(tokenizer), cuts_(*tokenizer.cuts()) {}

  void encode(std::string_view text, std::vector<std::int32_t>* ids) override {
    ids->clear();
    if (text.empty()) return;  // sentencepiece adds no dummy prefix to nothing
    std::size_t start = 0;
    for (std::size_t at = 1; at < text.size(); ++at) {
      if (!cuts_.cut_between(static_cast<unsigned char>(text[at - 1]), static_cast<unsigned char>(text[at]))) {
        continue;
      }
      encode_part(text.substr(start, at - start), start == 0, ids);
      start = at;
    }
    encode_part(text.substr(start), start == 0, ids);
  }

 private:
  static constexpr std::size_t kMaxIds = 15;

  void encode_part(std::string_view part, bool first, std::vector<std::int32_t>* ids) {
    if (first && tokenizer_.dummy_prefix()) {
      first_part_.assign(1, ' ');
      first_part_.append(part);
      part = first_part_;
    } else if (part.size() == 1) {
      if (const auto id = tokenizer_.single_byte_id(static_cast<unsigned char>(part[0])); id >= 0) {
        ids->push_back(id);
        return;
      }
    }
    const bool cacheable = part.size() <= PieceCache<kMaxIds>::kMaxPiece;
    std::uint64_t hash = 0;
    if (cacheable) {
      hash = hash_bytes(part);
      std::size_t count = 0;
      if (const std::int32_t* cached = cache_.find(part, hash, &count)) {
        ids->insert(ids->end(), cached, cached + count);
        return;
      }
    }
    if (!tokenizer_.word_bpe()->encode_segment(part, &part_ids_)) tokenizer_.encode_part_plain(part, &part_ids_);
    ids->insert(ids->end(), part_ids_.begin(), part_ids_.end());
    if (cacheable) cache_.insert(part, hash, part_ids_.data(), part_ids_.size());
  }

  const SentencePiece& tokenizer_;
  const SentencePieceCuts& cuts_;
  PieceCache<kMaxIds> cache_;
  std::vector<std::int32_t> part_ids_;
  std::string first_part_;
};

std::unique_ptr<TokenEncoder> SentencePiece::make_encoder() const {
  if (cuts_) return std::make_unique<PartCacheEncoder>(*this);
  if (word_cache_) return std::make_unique<WordCacheEncoder>(*this);
  return std::make_unique<SentencePieceEncoder>(*this);
}

}  // namespace

std::unique_ptr<TokenizerModel> load_sentencepiece(const TokenizerSpec& spec) {
  auto processor = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto status = processor->Load(spec.model);
  if (!status.ok()) {
    DUFU_FAIL("'", spec.model, "' is not a sentencepiece model (", status.ToString(),
              "). HINT: pass the .model file written by `dataprep train-tokenizer` or spm_train, not the .vocab "
              "file; other tokenizers: a .tiktoken rank file, a HuggingFace tokenizer.json, or a GPT-2 vocab.json "
              "with `tokenizer_merges`");
  }
  return std::make_unique<SentencePiece>(spec.model, std::move(processor));
}

}  // namespace dufu::dataprep::tokenizers
