// A loaded sentencepiece model. Encoding is const and safe to call from several
// threads at once, so the preprocessing workers share one Tokenizer.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace dufu::dataprep {

class Tokenizer {
 public:
  // Throws dufu::Error naming the path if it is missing or not a sentencepiece model.
  static Tokenizer load(const std::string& model_path);
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Same ids as sentencepiece's EncodeAsIds; appends to `ids` after clearing it.
  void encode(std::string_view text, std::vector<int>* ids) const;
  std::string decode(std::span<const std::int32_t> ids) const;
  std::int64_t vocab_size() const;
  // -1 when the model has no such piece.
  int eos_id() const;
  int bos_id() const;
  std::string piece(int id) const;
  const std::string& path() const { return path_; }

 private:
  Tokenizer(std::string path, std::unique_ptr<sentencepiece::SentencePieceProcessor> processor);
  std::string path_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
};

}  // namespace dufu::dataprep
