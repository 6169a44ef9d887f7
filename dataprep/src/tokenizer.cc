// Wraps sentencepiece's processor so that the rest of dufu sees dufu::Error and int32
// ids, and so a wrong file is reported as such instead of a protobuf parse failure.
#include "dufu/dataprep/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sys/stat.h>

#include <cerrno>

#include "dufu/common/error.h"

namespace dufu::dataprep {

Tokenizer::Tokenizer(std::string path,
                     std::unique_ptr<sentencepiece::SentencePieceProcessor> processor)
    : path_(std::move(path)), processor_(std::move(processor)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::load(const std::string& model_path) {
  struct stat info {};
  if (::stat(model_path.c_str(), &info) != 0) {
    DUFU_FAIL("cannot open tokenizer model '", model_path, "': ", errno_message(errno));
  }
  if (!S_ISREG(info.st_mode)) {
    DUFU_FAIL("tokenizer model '", model_path, "' is not a regular file");
  }
  auto processor = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const auto status = processor->Load(model_path);
  if (!status.ok()) {
    DUFU_FAIL("'", model_path, "' is not a sentencepiece model (", status.ToString(),
              "). HINT: pass the .model file written by `dataprep train-tokenizer` or "
              "spm_train, not the .vocab file");
  }
  return Tokenizer(model_path, std::move(processor));
}

void Tokenizer::encode(std::string_view text, std::vector<int>* ids) const {
  ids->clear();
  const auto status = processor_->Encode(text, ids);
  if (!status.ok()) {
    DUFU_FAIL("sentencepiece failed to encode a document: ", status.ToString());
  }
}

std::string Tokenizer::decode(std::span<const std::int32_t> ids) const {
  const std::vector<int> pieces(ids.begin(), ids.end());
  std::string text;
  const auto status = processor_->Decode(pieces, &text);
  if (!status.ok()) {
    DUFU_FAIL("sentencepiece failed to decode: ", status.ToString());
  }
  return text;
}

std::int64_t Tokenizer::vocab_size() const { return processor_->GetPieceSize(); }
int Tokenizer::eos_id() const { return processor_->eos_id(); }
int Tokenizer::bos_id() const { return processor_->bos_id(); }

std::string Tokenizer::piece(int id) const {
  if (id < 0 || id >= processor_->GetPieceSize()) {
    DUFU_FAIL("token id ", id, " is outside the vocabulary of '", path_, "' (size ",
              processor_->GetPieceSize(), ")");
  }
  return processor_->IdToPiece(id);
}

}  // namespace dufu::dataprep
