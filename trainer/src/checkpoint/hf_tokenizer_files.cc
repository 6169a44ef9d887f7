// The tokenizer of a HuggingFace export (hf_tokenizer_files.h). Which transformers
// class reads each kind of dufu tokenizer file so that it encodes as dufu does, i.e.
// nothing added around the text and special-token text encoded as ordinary text:
//   - sentencepiece .model -> LlamaTokenizer (slow): with legacy spacing it calls
//     sentencepiece's own encode on the text, add_bos_token/add_eos_token false add
//     nothing, split_special_tokens true keeps "</s>" in the text from becoming EOS.
//     Its files are "tokenizer.model" and tokenizer_config.json.
//   - byte-level tokenizer.json -> PreTrainedTokenizerFast over the same file.
//   - GPT-2 vocab.json + merges.txt -> GPT2Tokenizer (add_prefix_space false).
#include "hf_tokenizer_files.h"

#include <sentencepiece_processor.h>

#include <iterator>
#include <memory>
#include <string_view>

#include "dufu/common/atomic_file.h"
#include "dufu/common/error.h"
#include "dufu/common/json_writer.h"
#include "dufu/common/mapped_file.h"

namespace dufu::trainer::hf_tokenizer_files {

namespace {

using Kind = dataprep::TokenizerFileKind;

std::string path_in(const std::string& dir, const std::string& name) { return dir + "/" + name; }

void write_file(const std::string& path, std::string_view bytes) {
  AtomicFile file(path);
  file.write(bytes.data(), bytes.size());
  file.commit();
}

void copy_file(const std::string& source, const std::string& destination) {
  const MappedFile in = MappedFile::open(source);
  write_file(destination, std::string_view(reinterpret_cast<const char*>(in.data()), in.size()));
}

// A special token of tokenizer_config.json: its text, or null when the tokenizer has
// none (transformers then has none either, rather than adding a new token).
void special_token(JsonWriter& json, const char* key, const dataprep::Tokenizer& tokenizer, std::int32_t id) {
  json.key(key);
  if (id >= 0) {
    json.value(tokenizer.piece(id));
  } else {
    json.null();
  }
}

// The settings every kind shares: no clean-up of spaces on decode (dufu's decode has
// none), the model's context, special-token text in the input encoded as text.
void common_settings(JsonWriter& json, int model_max_length) {
  json.key("model_max_length").value(model_max_length);
  json.key("clean_up_tokenization_spaces").value(false);
  json.key("split_special_tokens").value(true);
}

TokenizerFiles write_sentencepiece(const std::string& dir, const dataprep::TokenizerSpec& spec,
                                   const dataprep::Tokenizer& tokenizer, int model_max_length) {
  sentencepiece::SentencePieceProcessor processor;
  const auto status = processor.Load(spec.model);
  if (!status.ok()) DUFU_FAIL("cannot load sentencepiece model '", spec.model, "': ", status.ToString());
  TokenizerFiles files;
  files.tokenizer_class = "LlamaTokenizer";
  files.bos_id = processor.bos_id();
  files.eos_id = processor.eos_id();
  files.pad_id = processor.pad_id() >= 0 ? processor.pad_id() : files.eos_id;
  // LlamaTokenizer's vocab_files_names.
  copy_file(spec.model, path_in(dir, "tokenizer.model"));
  JsonWriter json;
  json.begin_object();
  json.key("tokenizer_class").value(files.tokenizer_class);
  json.key("add_bos_token").value(false);
  json.key("add_eos_token").value(false);
  // legacy: the text goes to sentencepiece as it is (the non-legacy path strips and
  // re-adds the dummy prefix itself, and needs protobuf).
  json.key("legacy").value(true);
  special_token(json, "bos_token", tokenizer, files.bos_id);
  special_token(json, "eos_token", tokenizer, files.eos_id);
  special_token(json, "unk_token", tokenizer, processor.unk_id());
  special_token(json, "pad_token", tokenizer, files.pad_id);
  common_settings(json, model_max_length);
  json.key("sp_model_kwargs").begin_object().end_object();
  json.end_object();
  write_file(path_in(dir, "tokenizer_config.json"), json.str() + "\n");
  files.files = {"tokenizer.model", "tokenizer_config.json"};
  return files;
}

// Byte-level tokenizers: the end-of-document token is also BOS and pad, as in GPT-2.
TokenizerFiles write_byte_level(const std::string& dir, const dataprep::TokenizerSpec& spec,
                                const dataprep::Tokenizer& tokenizer, int model_max_length, Kind kind) {
  TokenizerFiles files;
  files.eos_id = tokenizer.eod_id();
  files.bos_id = files.eos_id;
  files.pad_id = files.eos_id;
  JsonWriter json;
  json.begin_object();
  if (kind == Kind::kHuggingFaceJson) {
    files.tokenizer_class = "PreTrainedTokenizerFast";
    copy_file(spec.model, path_in(dir, "tokenizer.json"));
    files.files = {"tokenizer.json"};
  } else {
    files.tokenizer_class = "GPT2Tokenizer";
    copy_file(spec.model, path_in(dir, "vocab.json"));
    copy_file(spec.merges, path_in(dir, "merges.txt"));
    files.files = {"vocab.json", "merges.txt"};
    json.key("add_prefix_space").value(false);
    json.key("errors").value("replace");
  }
  json.key("tokenizer_class").value(files.tokenizer_class);
  special_token(json, "bos_token", tokenizer, files.bos_id);
  special_token(json, "eos_token", tokenizer, files.eos_id);
  special_token(json, "unk_token", tokenizer, -1);
  special_token(json, "pad_token", tokenizer, files.pad_id);
  common_settings(json, model_max_length);
  json.end_object();
  write_file(path_in(dir, "tokenizer_config.json"), json.str() + "\n");
  files.files.push_back("tokenizer_config.json");
  return files;
}

}  // namespace

void check_exportable(const dataprep::TokenizerSpec& spec) {
  if (dataprep::tokenizer_file_kind(spec) == Kind::kTiktoken) {
    DUFU_FAIL("the tokenizer '", spec.model, "' is a tiktoken rank file, which transformers does not read; ",
              "HINT: give the same tokenizer as a HuggingFace tokenizer.json (or GPT-2's vocab.json with ",
              "--tokenizer-merges merges.txt)");
  }
}

TokenizerFiles write(const std::string& dir, const dataprep::TokenizerSpec& spec, const dataprep::Tokenizer& tokenizer,
                     int model_max_length) {
  check_exportable(spec);
  const Kind kind = dataprep::tokenizer_file_kind(spec);
  if (kind == Kind::kSentencePiece) return write_sentencepiece(dir, spec, tokenizer, model_max_length);
  return write_byte_level(dir, spec, tokenizer, model_max_length, kind);
}

}  // namespace dufu::trainer::hf_tokenizer_files
