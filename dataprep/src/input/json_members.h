// The one rule for JSON objects with a key given twice, shared by dufu's JSON readers
// (jsonl records, tokenizer.json, vocab.json, tokenizer_config.json): the last member
// wins, as in the readers whose results dufu must reproduce (Python's json, which
// Megatron's preprocess_data.py and transformers use, and HuggingFace tokenizers'
// serde_json). simdjson keeps every member and its at_key() returns the first, so the
// readers look members up through this instead.
#pragma once

#include <simdjson.h>

#include <optional>
#include <string_view>

namespace dufu::dataprep {

// The value of the last member of `object` named `key` (compared unescaped), if any.
inline std::optional<simdjson::dom::element> last_member(const simdjson::dom::object& object,
                                                         std::string_view key) {
  std::optional<simdjson::dom::element> found;
  for (const simdjson::dom::key_value_pair member : object) {
    if (member.key == key) found = member.value;
  }
  return found;
}

}  // namespace dufu::dataprep
