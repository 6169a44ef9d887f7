// The model shape's fields as checkpoints record them (checkpoint_files.h).
#include <charconv>
#include <climits>
#include <string>
#include <system_error>

#include "checkpoint_files.h"
#include "dufu/common/error.h"

namespace dufu::trainer::checkpoint_files {

namespace {

int parse_int(const std::string& text, const char* name) {
  int value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) {
    DUFU_FAIL("model field ", name, ": \"", text, "\" is not an integer");
  }
  return value;
}

// The shortest text that reads back as the same float (std::to_chars' guarantee).
std::string float_text(float value) {
  char buffer[32];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, result.ptr);
}

float parse_float(const std::string& text, const char* name) {
  float value = 0.0f;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) {
    DUFU_FAIL("model field ", name, ": \"", text, "\" is not a number");
  }
  return value;
}

#define DUFU_INT_FIELD(member, always)                                                              \
  ModelField {                                                                                       \
    #member, true, always, [](const GPTConfig& c) { return std::to_string(c.member); },              \
        [](GPTConfig& c, const std::string& text) { c.member = parse_int(text, #member); }           \
  }
#define DUFU_FLOAT_FIELD(member)                                                                     \
  ModelField {                                                                                       \
    #member, false, false, [](const GPTConfig& c) { return float_text(c.member); },                  \
        [](GPTConfig& c, const std::string& text) { c.member = parse_float(text, #member); }         \
  }

const ModelField kFields[] = {
    DUFU_INT_FIELD(n_layer, true),
    DUFU_INT_FIELD(n_head, true),
    DUFU_INT_FIELD(d_model, true),
    DUFU_INT_FIELD(vocab_size, true),
    DUFU_INT_FIELD(vocab_multiple, true),
    DUFU_INT_FIELD(seq_length, true),
    {"arch", false, false, [](const GPTConfig& c) { return std::string(architecture_name(c.arch)); },
     [](GPTConfig& c, const std::string& text) { c.arch = parse_architecture(text, "model field arch"); }},
    DUFU_INT_FIELD(n_kv_head, false),
    DUFU_INT_FIELD(ffn_hidden, false),
    DUFU_FLOAT_FIELD(rope_theta),
    DUFU_FLOAT_FIELD(norm_eps),
    {"tie_embeddings", false, false, [](const GPTConfig& c) { return std::string(c.tie_embeddings ? "true" : "false"); },
     [](GPTConfig& c, const std::string& text) {
       if (text != "true" && text != "false") DUFU_FAIL("model field tie_embeddings: \"", text, "\" is not true or false");
       c.tie_embeddings = text == "true";
     }},
};

#undef DUFU_INT_FIELD
#undef DUFU_FLOAT_FIELD

}  // namespace

const std::span<const ModelField> kModelFields(kFields);

}  // namespace dufu::trainer::checkpoint_files
