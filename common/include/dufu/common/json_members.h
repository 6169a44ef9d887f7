// The one rule for JSON objects with a key given twice, shared by dufu's readers of
// JSON that other tools write (jsonl records, tokenizer.json, vocab.json,
// tokenizer_config.json, HuggingFace's config.json and safetensors index): the last member
// wins, as in the readers whose results dufu must reproduce (Python's json, which
// Megatron's preprocess_data.py and transformers use, and HuggingFace tokenizers'
// serde_json). simdjson keeps every member and its at_key() returns the first, so the
// readers look members up through this instead. Header-only: common does not link
// simdjson; its users (dataprep, trainer) do.
#pragma once

#include <simdjson.h>

#include <optional>
#include <string_view>

namespace dufu {

// The value of the last member of `object` named `key` (compared unescaped), if any.
inline std::optional<simdjson::dom::element> last_member(const simdjson::dom::object& object,
                                                         std::string_view key) {
  std::optional<simdjson::dom::element> found;
  for (const simdjson::dom::key_value_pair member : object) {
    if (member.key == key) found = member.value;
  }
  return found;
}

}  // namespace dufu
