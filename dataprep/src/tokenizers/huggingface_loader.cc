// HuggingFace's tokenizer.json (a BPE model over ByteLevel pre-tokenization, as GPT-2,
// Llama-3 and Qwen2 write it) and GPT-2's vocab.json + merges.txt. Vocabulary strings
// are in GPT-2's byte-to-unicode alphabet and are turned back into bytes, so the
// merges run on bytes like tiktoken's. Every component is checked: one dufu does not
// implement is refused by its name rather than approximated.
#include "huggingface_loader.h"

#include <simdjson.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <unordered_map>

#include "dufu/common/json_members.h"
#include "byte_level_bpe.h"
#include "dufu/common/error.h"
#include "pretokenizer_patterns.h"

namespace dufu::dataprep::tokenizers {
namespace {

using simdjson::dom::element;
using simdjson::dom::element_type;

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others for
// U+0100 onwards in byte order. char_to_byte[code point] = byte, or -1.
const std::vector<int>& char_to_byte() {
  static const std::vector<int> table = [] {
    std::vector<int> map(512, -1);
    int next = 256;
    for (int byte = 0; byte < 256; ++byte) {
      const bool printable = (byte >= 33 && byte <= 126) || (byte >= 161 && byte <= 172) || byte >= 174;
      map[static_cast<std::size_t>(printable ? byte : next++)] = byte;
    }
    return map;
  }();
  return table;
}

std::string byte_char(int byte) {
  const auto& map = char_to_byte();
  for (std::size_t cp = 0; cp < map.size(); ++cp) {
    if (map[cp] == byte) {
      std::string text;
      if (cp < 0x80) {
        text += static_cast<char>(cp);
      } else {
        text += static_cast<char>(0xC0 | (cp >> 6));
        text += static_cast<char>(0x80 | (cp & 0x3F));
      }
      return text;
    }
  }
  return {};
}

// The bytes a vocabulary string stands for; nullopt when it has a character outside
// the byte-level alphabet (an added token such as <|begin_of_text|> in Llama-3's vocab).
std::optional<std::string> byte_level_bytes(std::string_view text) {
  std::string bytes;
  const auto& map = char_to_byte();
  for (std::size_t i = 0; i < text.size();) {
    const auto lead = static_cast<unsigned char>(text[i]);
    std::uint32_t cp = 0;
    if (lead < 0x80) {
      cp = lead;
      i += 1;
    } else if ((lead & 0xE0) == 0xC0 && i + 1 < text.size()) {
      cp = ((lead & 0x1FU) << 6) | (static_cast<unsigned char>(text[i + 1]) & 0x3FU);
      i += 2;
    } else {
      return std::nullopt;
    }
    if (cp >= map.size() || map[cp] < 0) return std::nullopt;
    bytes += static_cast<char>(map[cp]);
  }
  return bytes;
}

std::string type_name(element_type type) {
  switch (type) {
    case element_type::ARRAY: return "an array";
    case element_type::OBJECT: return "an object";
    case element_type::STRING: return "a string";
    case element_type::NULL_VALUE: return "null";
    case element_type::BOOL: return "a boolean";
    default: return "a number";
  }
}

class JsonFile {
 public:
  explicit JsonFile(std::string path) : path_(std::move(path)) {
    const auto error = parser_.load(path_).get(root_);
    if (error) DUFU_FAIL("'", path_, "' is not valid JSON: ", simdjson::error_message(error));
  }
  const element& root() const { return root_; }
  const std::string& path() const { return path_; }

  [[noreturn]] void fail(const std::string& where, const std::string& what) const {
    DUFU_FAIL("'", path_, "': ", where, " ", what);
  }
  simdjson::dom::object object(const element& value, const std::string& where) const {
    simdjson::dom::object result;
    if (value.get(result)) fail(where, "is " + type_name(value.type()) + ", not an object");
    return result;
  }
  // The last member named `key` (json_members.h), as HuggingFace reads a key given twice.
  std::optional<element> field(const element& value, const char* key) const {
    simdjson::dom::object object;
    if (value.get(object)) return std::nullopt;
    return last_member(object, key);
  }
  bool is_null_or_missing(const element& value, const char* key) const {
    const auto found = field(value, key);
    return !found || found->is_null();
  }
  std::string string(const element& value, const std::string& where) const {
    std::string_view text;
    if (value.get(text)) fail(where, "is " + type_name(value.type()) + ", not a string");
    return std::string(text);
  }
  std::string type_of(const element& value, const std::string& where) const {
    const auto type = field(value, "type");
    if (!type) fail(where, "has no \"type\"");
    return string(*type, where + ".type");
  }
  bool boolean(const element& value, const char* key, bool otherwise) const {
    const auto found = field(value, key);
    if (!found || found->is_null()) return otherwise;
    bool result = false;
    if (found->get(result)) fail(key, "is not a boolean");
    return result;
  }

 private:
  std::string path_;
  simdjson::dom::parser parser_;
  element root_;
};

// A byte-level vocabulary: string -> id, turned into token bytes by id.
struct Vocabulary {
  std::unordered_map<std::string, std::int32_t> ids;  // in the byte-level alphabet
};

void add_token(ByteLevelBpeConfig& config, std::int32_t id, std::string bytes) {
  const auto index = static_cast<std::size_t>(id);
  if (index >= config.token_bytes.size()) {
    config.token_bytes.resize(index + 1);
    config.defined.resize(index + 1, false);
  }
  config.token_bytes[index] = std::move(bytes);
  config.defined[index] = true;
}

Vocabulary read_vocab(const JsonFile& file, const element& vocab_value, const std::string& where,
                      ByteLevelBpeConfig& config) {
  Vocabulary vocab;
  const simdjson::dom::object entries = file.object(vocab_value, where);
  // A string given twice takes its last id and the id of its earlier entry stays
  // unused, as in tokenizers' vocabulary (a map filled in file order).
  for (const auto [key, value] : entries) {
    std::int64_t id = -1;
    if (value.get(id) || id < 0 || id >= (1LL << 30)) file.fail(where, "has an id that is not a small integer");
    vocab.ids.insert_or_assign(std::string(key), static_cast<std::int32_t>(id));
  }
  // The ids first: the tables they index are as large as the largest.
  std::int64_t largest_id = -1;
  for (const auto& [text, id] : vocab.ids) largest_id = std::max<std::int64_t>(largest_id, id);
  check_id_range(file.path(), largest_id, vocab.ids.size());
  // In file order, so that two strings sharing an id resolve as before: the later one.
  for (const auto [key, value] : entries) {
    const std::int64_t id = value.get_int64().value_unsafe();
    const std::string text(key);
    if (vocab.ids.at(text) != id) continue;  // given again later
    const auto bytes = byte_level_bytes(text);
    add_token(config, static_cast<std::int32_t>(id), bytes ? *bytes : text);
  }
  for (int byte = 0; byte < 256; ++byte) {
    const auto found = vocab.ids.find(byte_char(byte));
    if (found == vocab.ids.end()) {
      file.fail(where, str_cat("has no token for the byte ", byte, " ('", byte_char(byte),
                               "'); byte-level BPE needs all 256"));
    }
    config.model.set_byte_token(static_cast<unsigned char>(byte), found->second);
  }
  return vocab;
}

void add_merge(const std::string& path, const Vocabulary& vocab, ByteLevelBpeConfig& config, std::uint32_t index,
               const std::string& left, const std::string& right) {
  const auto a = vocab.ids.find(left);
  const auto b = vocab.ids.find(right);
  const auto merged = vocab.ids.find(left + right);
  if (a == vocab.ids.end() || b == vocab.ids.end() || merged == vocab.ids.end()) {
    DUFU_FAIL("'", path, "': merge ", index + 1, " '", left, " ", right, "' uses or makes a token not in the vocabulary");
  }
  config.model.add_merge(a->second, b->second, index, merged->second);
}

void split_merge_line(const std::string& path, std::size_t number, const std::string& line, std::string* left,
                      std::string* right) {
  const auto space = line.find(' ');
  if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
    DUFU_FAIL("'", path, "': merge ", number, " '", line, "' is not two tokens separated by one space");
  }
  *left = line.substr(0, space);
  *right = line.substr(space + 1);
}

PreTokenizerStage split_stage(std::string pattern, bool literal, bool matches_are_pieces) {
  PreTokenizerStage stage;
  stage.splitter = std::make_unique<RegexSplitter>(std::move(pattern), RegexDialect::kHuggingFace, literal);
  stage.matches_are_pieces = matches_are_pieces;
  return stage;
}

void add_byte_level(ByteLevelBpeConfig& config, bool add_prefix_space, bool use_regex) {
  if (add_prefix_space) {
    PreTokenizerStage prefix;
    prefix.prefix_space = true;
    config.stages.push_back(std::move(prefix));
  }
  if (use_regex) config.stages.push_back(split_stage(kHuggingFaceByteLevelPattern, false, true));
}

// Returns whether it was (or contained) ByteLevel.
bool add_pre_tokenizer(const JsonFile& file, const element& value, const std::string& where,
                       ByteLevelBpeConfig& config) {
  const std::string type = file.type_of(value, where);
  if (type == "Sequence") {
    const auto list = file.field(value, "pretokenizers");
    simdjson::dom::array array;
    if (!list || list->get(array)) file.fail(where, "is a Sequence without a \"pretokenizers\" array");
    bool byte_level = false;
    std::size_t index = 0;
    for (const element item : array) {
      if (byte_level) {
        file.fail(where, "has a pre-tokenizer after ByteLevel, which dufu does not implement");
      }
      byte_level = add_pre_tokenizer(file, item, str_cat(where, ".pretokenizers[", index++, "]"), config);
    }
    return byte_level;
  }
  if (type == "ByteLevel") {
    add_byte_level(config, file.boolean(value, "add_prefix_space", true), file.boolean(value, "use_regex", true));
    return true;
  }
  if (type == "Split") {
    const auto pattern = file.field(value, "pattern");
    if (!pattern) file.fail(where, "is a Split without a \"pattern\"");
    std::string text;
    bool literal = false;
    if (const auto regex = file.field(*pattern, "Regex")) {
      text = file.string(*regex, where + ".pattern.Regex");
    } else if (const auto string = file.field(*pattern, "String")) {
      text = file.string(*string, where + ".pattern.String");
      literal = true;
    } else {
      file.fail(where + ".pattern", "is neither {\"Regex\": ...} nor {\"String\": ...}");
    }
    if (file.boolean(value, "invert", false)) {
      file.fail(where, "is a Split with invert: true, which dufu does not implement");
    }
    const auto behavior_value = file.field(value, "behavior");
    const std::string behavior = behavior_value ? file.string(*behavior_value, where + ".behavior") : "Isolated";
    if (behavior != "Isolated" && behavior != "Removed") {
      file.fail(where, "is a Split with behavior " + behavior +
                           ", which dufu does not implement (it implements Isolated and Removed)");
    }
    config.stages.push_back(split_stage(std::move(text), literal, behavior == "Isolated"));
    return false;
  }
  file.fail(where, "is the pre-tokenizer " + type +
                       ", which dufu does not implement (it implements ByteLevel, Split and Sequence of them)");
}

void add_normalizer(const JsonFile& file, const element& value, const std::string& where,
                    ByteLevelBpeConfig& config) {
  const std::string type = file.type_of(value, where);
  if (type == "Sequence") {
    const auto list = file.field(value, "normalizers");
    simdjson::dom::array array;
    if (!list || list->get(array)) file.fail(where, "is a Sequence without a \"normalizers\" array");
    std::size_t index = 0;
    for (const element item : array) add_normalizer(file, item, str_cat(where, ".normalizers[", index++, "]"), config);
    return;
  }
  if (type == "NFC") return config.normalizers.push_back(UnicodeForm::kNFC);
  if (type == "NFD") return config.normalizers.push_back(UnicodeForm::kNFD);
  if (type == "NFKC") return config.normalizers.push_back(UnicodeForm::kNFKC);
  if (type == "NFKD") return config.normalizers.push_back(UnicodeForm::kNFKD);
  file.fail(where, "is the normalizer " + type +
                       ", which dufu does not implement (it implements NFC, NFD, NFKC, NFKD and Sequence of them)");
}

std::int32_t named_eod(const std::unordered_map<std::string, std::int32_t>& tokens) {
  for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>"}) {
    const auto found = tokens.find(name);
    if (found != tokens.end()) return found->second;
  }
  return -1;
}

// The id of the eos_token that a tokenizer_config.json beside tokenizer.json names,
// as a string or as an AddedToken's "content"; nullopt when there is no such file,
// no eos_token or a null one. Any other eos_token is refused: a silent fallback to
// <|endoftext|> would end every document with a token the model's owner did not mean.
std::optional<std::int32_t> configured_eos(const std::string& tokenizer_json,
                                           const std::unordered_map<std::string, std::int32_t>& tokens) {
  const auto path = std::filesystem::path(tokenizer_json).parent_path() / "tokenizer_config.json";
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) return std::nullopt;
  const JsonFile file(path.string());
  const auto eos = file.field(file.root(), "eos_token");
  if (!eos || eos->is_null()) return std::nullopt;
  std::string name;
  if (eos->is_string()) {
    name = file.string(*eos, "eos_token");
  } else if (const auto content = file.field(*eos, "content")) {
    name = file.string(*content, "eos_token.content");
  } else {
    file.fail("eos_token", "is " + type_name(eos->type()) + ", not a token's string or {\"content\": string}");
  }
  const auto found = tokens.find(name);
  if (found == tokens.end()) {
    file.fail("eos_token", "'" + name + "' is not a token of '" + tokenizer_json +
                               "' (neither in its vocabulary nor in its added_tokens)");
  }
  return found->second;
}

}  // namespace

std::unique_ptr<TokenizerModel> load_huggingface_json(const TokenizerSpec& spec) {
  const JsonFile file(spec.model);
  const element& root = file.root();
  const auto model = file.field(root, "model");
  if (!model) DUFU_FAIL("'", spec.model, "' is JSON but not a HuggingFace tokenizer.json (it has no \"model\"); ",
              "HINT: for GPT-2's vocab.json pass its merges.txt with `tokenizer_merges`");
  ByteLevelBpeConfig config;

  const std::string model_type = file.type_of(*model, "model");
  if (model_type != "BPE") {
    file.fail("model", "is " + model_type + ", which dufu does not implement (it implements BPE)");
  }
  if (const auto dropout = file.field(*model, "dropout"); dropout && !dropout->is_null()) {
    double value = 0;
    if (dropout->get(value) || value != 0.0) file.fail("model.dropout", "is set; dufu implements BPE without dropout");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const auto value = file.field(*model, key);
    if (value && !value->is_null() && !file.string(*value, key).empty()) {
      file.fail(str_cat("model.", key), "is set, which dufu does not implement for byte-level BPE");
    }
  }
  config.ignore_merges = file.boolean(*model, "ignore_merges", false);
  const auto vocab_value = file.field(*model, "vocab");
  if (!vocab_value) file.fail("model", "has no \"vocab\"");
  const Vocabulary vocab = read_vocab(file, *vocab_value, "model.vocab", config);

  const auto merges_value = file.field(*model, "merges");
  simdjson::dom::array merges;
  if (!merges_value || merges_value->get(merges)) file.fail("model", "has no \"merges\" array");
  config.model.reserve_merges(merges.size());
  std::uint32_t index = 0;
  std::string left, right;
  for (const element merge : merges) {
    simdjson::dom::array pair;
    if (!merge.get(pair)) {
      if (pair.size() != 2) file.fail(str_cat("model.merges[", index, "]"), "is not a pair");
      left = file.string(pair.at(0).value(), "model.merges");
      right = file.string(pair.at(1).value(), "model.merges");
    } else {
      split_merge_line(spec.model, index + 1, file.string(merge, "model.merges"), &left, &right);
    }
    add_merge(spec.model, vocab, config, index++, left, right);
  }
  if (config.ignore_merges) {
    // HuggingFace looks the byte-level piece up in the model's vocabulary.
    config.whole_token_ids.assign(config.token_bytes.size(), false);
    for (const auto& [text, id] : vocab.ids) {
      if (byte_level_bytes(text)) config.whole_token_ids[static_cast<std::size_t>(id)] = true;
    }
  }

  if (const auto normalizer = file.field(root, "normalizer"); normalizer && !normalizer->is_null()) {
    add_normalizer(file, *normalizer, "normalizer", config);
  }
  const auto pre_tokenizer = file.field(root, "pre_tokenizer");
  if (!pre_tokenizer || pre_tokenizer->is_null() ||
      !add_pre_tokenizer(file, *pre_tokenizer, "pre_tokenizer", config)) {
    file.fail("pre_tokenizer", "does not end in ByteLevel; dufu implements byte-level BPE only");
  }
  if (const auto decoder = file.field(root, "decoder"); decoder && !decoder->is_null()) {
    const std::string type = file.type_of(*decoder, "decoder");
    if (type != "ByteLevel") file.fail("decoder", "is " + type + ", which dufu does not implement (it implements ByteLevel)");
  }

  std::unordered_map<std::string, std::int32_t> named = vocab.ids;
  if (const auto added = file.field(root, "added_tokens"); added && !added->is_null()) {
    simdjson::dom::array array;
    if (added->get(array)) file.fail("added_tokens", "is not an array");
    for (const element token : array) {
      const auto id_value = file.field(token, "id");
      const auto content_value = file.field(token, "content");
      std::int64_t id = -1;
      if (!id_value || !content_value || id_value->get(id) || id < 0 || id >= (1LL << 30)) {
        file.fail("added_tokens", "has an entry without an integer id and a content");
      }
      check_id_range(spec.model, id, config.token_bytes.size() + array.size());
      const std::string content = file.string(*content_value, "added_tokens.content");
      if (!file.boolean(token, "special", false)) {
        file.fail("added_tokens", "has '" + content +
                                      "' with special: false; HuggingFace matches such tokens in the text before "
                                      "pre-tokenization, which dufu does not implement");
      }
      add_token(config, static_cast<std::int32_t>(id), content);
      named[content] = static_cast<std::int32_t>(id);
    }
  }
  config.eod_id = configured_eos(spec.model, named).value_or(named_eod(named));
  config.name = str_cat("HuggingFace byte-level BPE (", config.token_bytes.size(), " ids, ", index, " merges) from ",
                        spec.model);
  return make_byte_level_bpe(std::move(config));
}

std::unique_ptr<TokenizerModel> load_gpt2_vocab(const TokenizerSpec& spec) {
  if (spec.merges.empty()) {
    DUFU_FAIL("'", spec.model, "' is a vocab.json: pass its merges.txt with `tokenizer_merges`");
  }
  const JsonFile file(spec.model);
  ByteLevelBpeConfig config;
  const Vocabulary vocab = read_vocab(file, file.root(), "the vocabulary", config);
  std::ifstream in(spec.merges, std::ios::binary);
  if (!in) DUFU_FAIL("cannot open the merges file '", spec.merges, "'");
  std::string line, left, right;
  std::uint32_t index = 0;
  std::size_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.starts_with("#version")) continue;
    split_merge_line(spec.merges, number, line, &left, &right);
    add_merge(spec.merges, vocab, config, index++, left, right);
  }
  if (in.bad()) DUFU_FAIL("cannot read '", spec.merges, "'");
  add_byte_level(config, false, true);
  config.eod_id = named_eod(vocab.ids);
  config.name = str_cat("GPT-2 byte-level BPE (", config.token_bytes.size(), " ids, ", index, " merges) from ",
                        spec.model);
  return make_byte_level_bpe(std::move(config));
}

}  // namespace dufu::dataprep::tokenizers
