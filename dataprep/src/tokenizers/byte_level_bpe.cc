// The byte-level BPE tokenizer and its per-worker encoder.
#include "byte_level_bpe.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>

#include <algorithm>
#include <filesystem>

#include "dufu/common/error.h"
#include "piece_cache.h"
#include "tiktoken_pretokenizer.h"
#include "dufu/common/utf8.h"

namespace dufu::dataprep::tokenizers {

void check_id_range(const std::string& path, std::int64_t largest_id, std::size_t tokens) {
  if (largest_id >= static_cast<std::int64_t>(tokens) + kMaxIdGap) {
    DUFU_FAIL("'", path, "' has the id ", largest_id, " but defines only ", tokens, " tokens: dufu keeps tables by id ",
              "and refuses more than ", kMaxIdGap, " unused ids");
  }
}

void normalize_unicode(UnicodeForm form, std::string_view text, std::string* out) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* normalizer = nullptr;
  switch (form) {
    case UnicodeForm::kNFC: normalizer = icu::Normalizer2::getNFCInstance(status); break;
    case UnicodeForm::kNFD: normalizer = icu::Normalizer2::getNFDInstance(status); break;
    case UnicodeForm::kNFKC: normalizer = icu::Normalizer2::getNFKCInstance(status); break;
    case UnicodeForm::kNFKD: normalizer = icu::Normalizer2::getNFKDInstance(status); break;
  }
  if (U_FAILURE(status)) DUFU_FAIL("ICU has no Unicode normalizer: ", u_errorName(status));
  const icu::StringPiece piece(text.data(), static_cast<std::int32_t>(text.size()));
  if (normalizer->isNormalizedUTF8(piece, status) && U_SUCCESS(status)) {
    out->append(text);
    return;
  }
  status = U_ZERO_ERROR;
  icu::StringByteSink<std::string> sink(out);
  normalizer->normalizeUTF8(0, piece, sink, nullptr, status);
  if (U_FAILURE(status)) DUFU_FAIL("Unicode normalization failed: ", u_errorName(status));
}

namespace {

// Sized for non-English text, whose words are many and long: unspaced CJK clauses and
// Cyrillic words of 20-60 bytes and up to 16 tokens (the translated manual pages hold
// ~150k distinct pieces in 12 MB). 131072 slots of 112 bytes: 15 MB per encoder.
using PieceCacheForBpe = PieceCache<16, 17, 128>;

class ByteLevelBpe final : public TokenizerModel {
 public:
  explicit ByteLevelBpe(ByteLevelBpeConfig config) : config_(std::move(config)) {
    config_.model.finish(config_.token_bytes.size());
    if (config_.ignore_merges && config_.whole_tokens_built) {
      whole_tokens_ = std::move(config_.whole_tokens);
      whole_tokens_.rebind(&config_.token_bytes);
    } else if (config_.ignore_merges) {
      whole_tokens_.build(&config_.token_bytes,
                          config_.whole_token_ids.empty() ? config_.defined : config_.whole_token_ids);
    }
  }

  std::unique_ptr<TokenEncoder> make_encoder() const override;

  std::string decode(std::span<const std::int32_t> ids) const override {
    std::string bytes;
    for (const auto id : ids) bytes += token(id);
    return utf8_lossy(bytes);
  }
  std::int64_t vocab_size() const override { return static_cast<std::int64_t>(config_.token_bytes.size()); }
  std::int32_t eod_id() const override { return config_.eod_id; }
  std::string name() const override { return config_.name; }
  std::string piece(std::int32_t id) const override { return utf8_lossy(token(id)); }

  const ByteLevelBpeConfig& config() const { return config_; }
  const TokenLookup& whole_tokens() const { return whole_tokens_; }

 private:
  const std::string& token(std::int32_t id) const {
    if (id < 0 || id >= vocab_size() || !config_.defined[static_cast<std::size_t>(id)]) {
      DUFU_FAIL("token id ", id, " is not in the vocabulary of ", config_.name);
    }
    return config_.token_bytes[static_cast<std::size_t>(id)];
  }
  ByteLevelBpeConfig config_;
  TokenLookup whole_tokens_;
};

class ByteLevelBpeEncoder final : public TokenEncoder {
 public:
  ByteLevelBpeEncoder(const ByteLevelBpeConfig& config, const TokenLookup& whole_tokens)
      : config_(config), whole_tokens_(whole_tokens) {
    for (const auto& stage : config.stages) {
      matchers_.push_back(stage.splitter ? std::make_unique<RegexSplitter::Matcher>(*stage.splitter) : nullptr);
      TiktokenPattern pattern{};
      const bool hand_written = stage.splitter && stage.splitter->dialect() == RegexDialect::kTiktoken &&
                                stage.matches_are_pieces &&
                                TiktokenPretokenizer::implements(stage.splitter->pattern(), &pattern);
      pretokenizers_.push_back(hand_written ? std::make_unique<TiktokenPretokenizer>(pattern) : nullptr);
    }
    buffers_.resize(config.stages.size());
    // A prefix stage's pieces live in a buffer the next piece overwrites.
    batched_ = std::none_of(config.stages.begin(), config.stages.end(),
                            [](const PreTokenizerStage& stage) { return stage.prefix_space; });
  }

  void encode(std::string_view text, std::vector<std::int32_t>* ids) override {
    ids->clear();
    out_ = ids;
    for (const UnicodeForm form : config_.normalizers) {
      normalized_[1].clear();
      normalize_unicode(form, text, &normalized_[1]);
      normalized_[0].swap(normalized_[1]);
      text = normalized_[0];
    }
    if (!text.empty()) process(0, text);
    flush();
  }

 private:
  void process(std::size_t stage_index, std::string_view text) {
    if (stage_index == config_.stages.size()) {
      if (batched_) {
        queue(text);
      } else {
        encode_piece(text, text.size() > 1 ? hash_bytes(text) : 0);
      }
      return;
    }
    const PreTokenizerStage& stage = config_.stages[stage_index];
    if (stage.prefix_space) {
      if (!text.empty() && text.front() != ' ') {
        std::string& buffer = buffers_[stage_index];
        buffer.assign(1, ' ');
        buffer.append(text);
        process(stage_index + 1, buffer);
      } else {
        process(stage_index + 1, text);
      }
      return;
    }
    const auto next = [&](std::string_view piece) { process(stage_index + 1, piece); };
    if (pretokenizers_[stage_index] && pretokenizers_[stage_index]->split(text, next)) return;
    matchers_[stage_index]->split(text, next, stage.matches_are_pieces);
  }

  // Pieces wait in a short queue, their cache slots and whole-token slots loading
  // meanwhile: on text with many distinct words (non-English) the lookups miss the
  // CPU caches, and one at a time each waited for memory.
  void queue(std::string_view piece) {
    std::uint64_t hash = 0;
    if (piece.size() > 1) {
      hash = hash_bytes(piece);
      cache_.prefetch(hash);
      if (config_.ignore_merges) whole_tokens_.prefetch(hash);
    }
    pending_[pending_count_++] = Pending{piece, hash};
    if (pending_count_ == kBatch) flush();
  }
  void flush() {
    for (std::size_t k = 0; k < pending_count_; ++k) encode_piece(pending_[k].piece, pending_[k].hash);
    pending_count_ = 0;
  }

  void encode_piece(std::string_view piece, std::uint64_t hash) {
    if (piece.empty()) return;
    if (piece.size() == 1) {
      out_->push_back(config_.model.byte_token(static_cast<unsigned char>(piece[0])));
      return;
    }
    const bool cacheable = piece.size() <= PieceCacheForBpe::kMaxPiece;
    if (cacheable) cache_.prefetch(hash);
    if (config_.ignore_merges) {
      const std::int32_t id = whole_tokens_.find(piece, hash);
      if (id >= 0) {
        out_->push_back(id);
        return;
      }
    }
    if (cacheable) {
      std::size_t count = 0;
      if (const std::int32_t* cached = cache_.find(piece, hash, &count)) {
        out_->insert(out_->end(), cached, cached + count);
        return;
      }
    }
    const std::size_t before = out_->size();
    config_.model.encode(piece, scratch_, out_);
    if (cacheable) cache_.insert(piece, hash, out_->data() + before, out_->size() - before);
  }

  const ByteLevelBpeConfig& config_;
  const TokenLookup& whole_tokens_;
  std::vector<std::unique_ptr<RegexSplitter::Matcher>> matchers_;
  // The hand-written matcher of a stage whose pattern it implements; the stage's
  // PCRE2 matcher still takes text that is not valid UTF-8.
  std::vector<std::unique_ptr<TiktokenPretokenizer>> pretokenizers_;
  std::vector<std::string> buffers_;
  std::string normalized_[2];
  BytePairModel::Scratch scratch_;
  PieceCacheForBpe cache_;
  std::vector<std::int32_t>* out_ = nullptr;
  struct Pending {
    std::string_view piece;
    std::uint64_t hash;
  };
  static constexpr std::size_t kBatch = 16;
  bool batched_ = false;
  Pending pending_[kBatch];
  std::size_t pending_count_ = 0;
};

std::unique_ptr<TokenEncoder> ByteLevelBpe::make_encoder() const {
  return std::make_unique<ByteLevelBpeEncoder>(config_, whole_tokens_);
}

}  // namespace

std::unique_ptr<TokenizerModel> make_byte_level_bpe(ByteLevelBpeConfig config) {
  return std::make_unique<ByteLevelBpe>(std::move(config));
}

}  // namespace dufu::dataprep::tokenizers
