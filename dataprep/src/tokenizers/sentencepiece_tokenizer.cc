// sentencepiece models behind the Tokenizer interface: sentencepiece's own processor,
// so the ids are EncodeAsIds's.
#include <sentencepiece_processor.h>

#include "byte_level_bpe.h"
#include "dufu/common/error.h"

namespace dufu::dataprep::tokenizers {
namespace {

class SentencePiece final : public TokenizerModel {
 public:
  SentencePiece(std::string path, std::unique_ptr<sentencepiece::SentencePieceProcessor> processor)
      : path_(std::move(path)), processor_(std::move(processor)) {}

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
    return str_cat("sentencepiece (", processor_->GetPieceSize(), " pieces) from ", path_);
  }
  std::string piece(std::int32_t id) const override {
    check(id);
    return processor_->IdToPiece(id);
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
  std::string path_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
};

class SentencePieceEncoder final : public TokenEncoder {
 public:
  explicit SentencePieceEncoder(const SentencePiece& tokenizer) : tokenizer_(tokenizer) {}
  void encode(std::string_view text, std::vector<std::int32_t>* ids) override { tokenizer_.encode_plain(text, ids); }

 private:
  const SentencePiece& tokenizer_;
};

std::unique_ptr<TokenEncoder> SentencePiece::make_encoder() const {
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
              "with --tokenizer-merges");
  }
  return std::make_unique<SentencePiece>(spec.model, std::move(processor));
}

}  // namespace dufu::dataprep::tokenizers
