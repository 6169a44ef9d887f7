// Recording a tokenizer by its files' digests, and choosing the tokenizer a tool reads
// ids with from its flag and the record (tokenizer_record.h).
#include "dufu/dataprep/tokenizer_record.h"

#include <openssl/evp.h>
#include <simdjson.h>
#include <sys/stat.h>

#include <array>
#include <cerrno>
#include <filesystem>
#include <memory>

#include "dufu/common/digest.h"
#include "dufu/common/error.h"
#include "dufu/common/json_writer.h"
#include "dufu/common/read_only_file.h"

namespace dufu::dataprep {
namespace {

namespace fs = std::filesystem;

std::string short_digest(const std::string& sha256) { return sha256.substr(0, 12); }

TokenizerFileRecord record_file(const std::string& given) {
  struct stat info {};
  if (::stat(given.c_str(), &info) != 0) DUFU_FAIL("cannot open tokenizer file '", given, "': ", errno_message(errno));
  TokenizerFileRecord file;
  std::error_code error;
  const fs::path absolute = fs::absolute(given, error);
  file.path = error ? given : absolute.lexically_normal().string();
  file.file = fs::path(given).filename().string();
  // The one digest of tokenizer files dufu has, the part manifests' too.
  file.sha256 = sha256_of_file(given);
  file.bytes = static_cast<std::uint64_t>(info.st_size);
  return file;
}

void write_file(JsonWriter& json, const TokenizerFileRecord& file) {
  json.begin_object()
      .key("file").value(file.file)
      .key("path").value(file.path)
      .key("sha256").value(file.sha256)
      .key("bytes").value(file.bytes)
      .end_object();
}

class RecordReader {
 public:
  explicit RecordReader(std::string where) : where_(std::move(where)) {}

  std::string text(simdjson::dom::object object, const char* key) const {
    std::string_view value;
    if (object.at_key(key).get_string().get(value)) fail(key, " is missing or not a string");
    return std::string(value);
  }
  TokenizerFileRecord file(simdjson::dom::object object, const char* key) const {
    simdjson::dom::object member;
    if (object.at_key(key).get_object().get(member)) fail(key, " is missing or not an object");
    TokenizerFileRecord file;
    file.file = text(member, "file");
    file.path = text(member, "path");
    file.sha256 = text(member, "sha256");
    if (file.sha256.size() != 64 || file.sha256.find_first_not_of("0123456789abcdef") != std::string::npos) {
      fail(key, ".sha256 is not a SHA-256 (64 lower-case hex digits)");
    }
    if (member.at_key("bytes").get_uint64().get(file.bytes)) fail(key, ".bytes is missing or not a size");
    if (file.file.empty() || file.file.find('/') != std::string::npos || file.file == "." || file.file == "..") {
      fail(key, ".file '", file.file, "' is not a file name");
    }
    return file;
  }
  template <typename... Parts>
  [[noreturn]] void fail(Parts&&... parts) const {
    DUFU_FAIL(where_, ": the tokenizer's ", std::forward<Parts>(parts)...);
  }

 private:
  std::string where_;
};

// Throws when the file at `path` is missing or not the recorded one.
void check_recorded_file(const TokenizerFileRecord& file, const std::string& path, const RecordedTokenizer& recorded) {
  std::error_code error;
  if (!fs::exists(path, error)) {
    DUFU_FAIL("the tokenizer '", path, "' that ", recorded.recorded_by,
              " records is missing; HINT: give --tokenizer with that file (SHA-256 ", short_digest(file.sha256),
              "...)");
  }
  const std::string now = sha256_of_file(path);
  if (now != file.sha256) {
    DUFU_FAIL("the tokenizer '", path, "' changed since ", recorded.recorded_by, " recorded it (SHA-256 now ",
              short_digest(now), "..., recorded ", short_digest(file.sha256),
              "...); HINT: give --tokenizer with the file the ids were made with");
  }
}

}  // namespace

std::string sha256_of_file(const std::string& path) {
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> context(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!context || EVP_DigestInit_ex(context.get(), EVP_sha256(), nullptr) != 1) {
    DUFU_FAIL("cannot start a SHA-256 digest of '", path, "'");
  }
  read_in_blocks(path, [&context](const char* data, std::size_t size) {
    EVP_DigestUpdate(context.get(), data, size);
  });
  std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
  unsigned length = 0;
  EVP_DigestFinal_ex(context.get(), digest.data(), &length);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned i = 0; i < length; ++i) {
    hex += kHex[digest[i] >> 4];
    hex += kHex[digest[i] & 15];
  }
  return hex;
}

std::string tokenizer_kind_name(TokenizerFileKind kind) {
  switch (kind) {
    case TokenizerFileKind::kSentencePiece:
      return "sentencepiece";
    case TokenizerFileKind::kTiktoken:
      return "tiktoken";
    case TokenizerFileKind::kHuggingFaceJson:
      return "tokenizer.json";
    case TokenizerFileKind::kGpt2Vocab:
      return "vocab.json";
  }
  return "unknown";
}

std::string TokenizerRecord::identity_sha256() const {
  std::string identity = str_cat("model ", model.sha256);
  if (merges) identity += str_cat(" merges ", merges->sha256);
  identity += str_cat(" pattern ", pattern);
  return sha256_hex(identity);
}

std::string TokenizerRecord::describe() const {
  std::string text = str_cat("'", model.path, "' (SHA-256 ", short_digest(model.sha256), "...");
  if (merges) text += str_cat(", merges '", merges->path, "' ", short_digest(merges->sha256), "...");
  if (!pattern.empty()) text += str_cat(", pattern ", pattern);
  return text + ")";
}

TokenizerRecord record_tokenizer(const TokenizerSpec& spec) {
  TokenizerRecord record;
  record.kind = tokenizer_kind_name(tokenizer_file_kind(spec));
  record.model = record_file(spec.model);
  if (!spec.merges.empty()) record.merges = record_file(spec.merges);
  record.pattern = spec.pattern;
  return record;
}

void write_tokenizer_record(JsonWriter& json, const TokenizerRecord& record) {
  json.begin_object().key("kind").value(record.kind).key("model");
  write_file(json, record.model);
  if (record.merges) {
    json.key("merges");
    write_file(json, *record.merges);
  }
  json.key("pattern").value(record.pattern).end_object();
}

TokenizerRecord parse_tokenizer_record(std::string_view json, const std::string& where) {
  const RecordReader reader(where);
  simdjson::dom::parser parser;
  simdjson::dom::object object;
  if (parser.parse(json.data(), json.size(), /*realloc_if_needed=*/true).get_object().get(object)) {
    reader.fail("record is not a JSON object");
  }
  TokenizerRecord record;
  record.kind = reader.text(object, "kind");
  record.model = reader.file(object, "model");
  simdjson::dom::element merges;
  if (!object.at_key("merges").get(merges)) record.merges = reader.file(object, "merges");
  record.pattern = reader.text(object, "pattern");
  return record;
}

TokenizerSpec choose_tokenizer(const TokenizerSpec& given, const std::optional<RecordedTokenizer>& recorded,
                               const std::string& subject, const std::string& why_none) {
  if (!recorded) {
    if (given.model.empty()) DUFU_FAIL(subject, " records no tokenizer (", why_none, "): give --tokenizer FILE");
    return given;
  }
  const TokenizerRecord& record = recorded->record;
  if (given.model.empty()) {
    check_recorded_file(record.model, recorded->model_path, *recorded);
    if (record.merges) check_recorded_file(*record.merges, recorded->merges_path, *recorded);
    return TokenizerSpec{.model = recorded->model_path, .merges = recorded->merges_path, .pattern = record.pattern};
  }
  // The flag's files must hold the recorded contents: ids mean pieces of one vocabulary.
  TokenizerSpec spec = given;
  const auto refuse = [&](const std::string& what, const std::string& given_path, const std::string& given_sha,
                          const std::string& recorded_path, const std::string& recorded_sha) {
    DUFU_FAIL(what, " '", given_path, "' (SHA-256 ", short_digest(given_sha), "...) is not the one ",
              recorded->recorded_by, " records, '", recorded_path, "' (SHA-256 ", short_digest(recorded_sha),
              "...): the ids of ", subject, " are that tokenizer's");
  };
  const std::string model_sha = sha256_of_file(given.model);
  if (model_sha != record.model.sha256) {
    refuse("the tokenizer", given.model, model_sha, recorded->model_path, record.model.sha256);
  }
  if (record.merges) {
    if (spec.merges.empty()) {
      check_recorded_file(*record.merges, recorded->merges_path, *recorded);
      spec.merges = recorded->merges_path;
    } else if (const std::string merges_sha = sha256_of_file(spec.merges); merges_sha != record.merges->sha256) {
      refuse("the merges", spec.merges, merges_sha, recorded->merges_path, record.merges->sha256);
    }
  }
  if (spec.pattern.empty()) {
    spec.pattern = record.pattern;
  } else if (!record.pattern.empty() && spec.pattern != record.pattern) {
    DUFU_FAIL("--tokenizer-pattern ", spec.pattern, " is not the pattern ", recorded->recorded_by, " records, ",
              record.pattern, ": the ids of ", subject, " were made with that one");
  }
  return spec;
}

}  // namespace dufu::dataprep
