// Chooses the tokenizer implementation from the file given to --tokenizer-model.
#include "dufu/dataprep/tokenizer.h"

#include <sys/stat.h>

#include <cerrno>
#include <fstream>

#include "dufu/common/error.h"
#include "huggingface_loader.h"
#include "sentencepiece_tokenizer.h"
#include "tiktoken_loader.h"

namespace dufu::dataprep {

namespace {

bool ends_with(const std::string& text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The first non-blank byte of the file (JSON starts with '{'); 0 for what is not a
// regular file, which is not opened (a FIFO would wait for a writer): Tokenizer::load
// refuses it by name.
char first_non_blank(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0 || !S_ISREG(info.st_mode)) return 0;
  std::ifstream in(path, std::ios::binary);
  char c = 0;
  while (in.get(c)) {
    if (c != ' ' && c != '\t' && c != '\n' && c != '\r') return c;
  }
  return 0;
}

bool starts_with_utf8_bom(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char head[3] = {};
  return in.read(head, 3) && head[0] == '\xEF' && head[1] == '\xBB' && head[2] == '\xBF';
}

}  // namespace

TokenizerFileKind tokenizer_file_kind(const TokenizerSpec& spec) {
  if (ends_with(spec.model, ".tiktoken")) return TokenizerFileKind::kTiktoken;
  // A .json that does not start with '{' is still JSON: its reader says what is wrong.
  if (first_non_blank(spec.model) == '{' || ends_with(spec.model, ".json")) {
    // tokenizer.json has a "model"; vocab.json is a flat map and needs merges.txt.
    return spec.merges.empty() ? TokenizerFileKind::kHuggingFaceJson : TokenizerFileKind::kGpt2Vocab;
  }
  return TokenizerFileKind::kSentencePiece;
}

Tokenizer Tokenizer::load(const TokenizerSpec& spec) {
  struct stat info {};
  if (::stat(spec.model.c_str(), &info) != 0) {
    DUFU_FAIL("cannot open tokenizer model '", spec.model, "': ", errno_message(errno));
  }
  if (!S_ISREG(info.st_mode)) DUFU_FAIL("tokenizer model '", spec.model, "' is not a regular file");
  // Said here, before a reader guesses the kind from the first bytes and mistakes them.
  if (info.st_size == 0) DUFU_FAIL("tokenizer model '", spec.model, "' is empty (0 bytes)");
  if (starts_with_utf8_bom(spec.model)) {
    DUFU_FAIL("tokenizer model '", spec.model, "' starts with a UTF-8 byte-order mark, which JSON does not allow ",
              "(HuggingFace tokenizers and Python's json refuse it too); HINT: remove its first 3 bytes");
  }
  const TokenizerFileKind kind = tokenizer_file_kind(spec);
  if (!spec.pattern.empty() && kind != TokenizerFileKind::kTiktoken) {
    DUFU_FAIL("`tokenizer_pattern` is for .tiktoken rank files; '", spec.model, "' is not one");
  }
  switch (kind) {
    case TokenizerFileKind::kTiktoken:
      return Tokenizer(spec.model, tokenizers::load_tiktoken(spec));
    case TokenizerFileKind::kGpt2Vocab:
      return Tokenizer(spec.model, tokenizers::load_gpt2_vocab(spec));
    case TokenizerFileKind::kHuggingFaceJson:
      return Tokenizer(spec.model, tokenizers::load_huggingface_json(spec));
    case TokenizerFileKind::kSentencePiece:
      break;
  }
  if (!spec.merges.empty()) {
    DUFU_FAIL("`tokenizer_merges` goes with a GPT-2 vocab.json; '", spec.model, "' is not JSON");
  }
  return Tokenizer(spec.model, tokenizers::load_sentencepiece(spec));
}

}  // namespace dufu::dataprep
