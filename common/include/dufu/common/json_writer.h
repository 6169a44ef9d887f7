// Compact JSON output for the files dufu writes for other programs to read:
// checkpoint state (state.json) and metrics (one object per line of metrics.jsonl).
// Reading JSON goes through simdjson; writing needs only this.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dufu {

// `text` as a JSON string literal: '"' and '\\' escaped, control characters as
// \n \t \r \b \f or \u00XX, DEL as \u007F; other bytes (UTF-8) unchanged. The result
// is also a valid TOML basic string.
std::string quote_json_string(std::string_view text);

// Builds one JSON value, commas placed by itself:
//   JsonWriter json;
//   json.begin_object().key("step").value(12).key("loss").value(3.5).end_object();
//   json.str()  ->  {"step":12,"loss":3.5}
// Misuse (a value where a key is due, unbalanced ends) is a programming error and
// throws through DUFU_CHECK.
class JsonWriter {
 public:
  JsonWriter& begin_object();
  JsonWriter& end_object();
  JsonWriter& begin_array();
  JsonWriter& end_array();
  JsonWriter& key(std::string_view name);
  JsonWriter& value(std::string_view text);
  JsonWriter& value(const char* text) { return value(std::string_view(text)); }
  JsonWriter& value(const std::string& text) { return value(std::string_view(text)); }
  JsonWriter& value(std::int64_t number);
  JsonWriter& value(std::uint64_t number);
  JsonWriter& value(int number) { return value(static_cast<std::int64_t>(number)); }
  JsonWriter& value(unsigned number) { return value(static_cast<std::uint64_t>(number)); }
  // Shortest digits that read back to the same double; NaN and infinities, which
  // JSON cannot express, are written as null.
  JsonWriter& value(double number);
  JsonWriter& value(bool flag);
  JsonWriter& null();

  // The text so far; complete once every begin has its end.
  const std::string& str() const { return out_; }

 private:
  void before_value();

  std::string out_;
  // One entry per open container: true for an object; whether it has a member yet.
  struct Open {
    bool is_object;
    bool has_member;
    bool key_pending;
  };
  std::vector<Open> open_;
};

}  // namespace dufu
