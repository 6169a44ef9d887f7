#include "dufu/common/json_writer.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "dufu/common/error.h"

namespace dufu {

std::string quote_json_string(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        // JSON forbids raw control characters; TOML forbids DEL too, so escaping it
        // keeps the literal valid in both.
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          char escape[8];
          std::snprintf(escape, sizeof(escape), "\\u%04X", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += escape;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

void JsonWriter::before_value() {
  if (open_.empty()) {
    DUFU_CHECK(out_.empty(), "JsonWriter: a second top-level value");
    return;
  }
  Open& top = open_.back();
  if (top.is_object) {
    DUFU_CHECK(top.key_pending, "JsonWriter: a value inside an object needs a key first");
    top.key_pending = false;
  } else {
    if (top.has_member) out_ += ',';
    top.has_member = true;
  }
}

JsonWriter& JsonWriter::begin_object() {
  before_value();
  out_ += '{';
  open_.push_back({true, false, false});
  return *this;
}

JsonWriter& JsonWriter::end_object() {
  DUFU_CHECK(!open_.empty() && open_.back().is_object && !open_.back().key_pending,
             "JsonWriter: end_object without a matching begin_object");
  open_.pop_back();
  out_ += '}';
  return *this;
}

JsonWriter& JsonWriter::begin_array() {
  before_value();
  out_ += '[';
  open_.push_back({false, false, false});
  return *this;
}

JsonWriter& JsonWriter::end_array() {
  DUFU_CHECK(!open_.empty() && !open_.back().is_object, "JsonWriter: end_array without a matching begin_array");
  open_.pop_back();
  out_ += ']';
  return *this;
}

JsonWriter& JsonWriter::key(std::string_view name) {
  DUFU_CHECK(!open_.empty() && open_.back().is_object && !open_.back().key_pending,
             "JsonWriter: key \"", name, "\" outside an object or after another key");
  Open& top = open_.back();
  if (top.has_member) out_ += ',';
  top.has_member = true;
  top.key_pending = true;
  out_ += quote_json_string(name);
  out_ += ':';
  return *this;
}

JsonWriter& JsonWriter::value(std::string_view text) {
  before_value();
  out_ += quote_json_string(text);
  return *this;
}

JsonWriter& JsonWriter::value(std::int64_t number) {
  before_value();
  out_ += std::to_string(number);
  return *this;
}

JsonWriter& JsonWriter::value(std::uint64_t number) {
  before_value();
  out_ += std::to_string(number);
  return *this;
}

JsonWriter& JsonWriter::value(double number) {
  if (!std::isfinite(number)) return null();
  before_value();
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), number);
  out_.append(buffer, result.ptr);
  return *this;
}

JsonWriter& JsonWriter::value(bool flag) {
  before_value();
  out_ += flag ? "true" : "false";
  return *this;
}

JsonWriter& JsonWriter::null() {
  before_value();
  out_ += "null";
  return *this;
}

}  // namespace dufu
