// How error messages name the type of a JSON value read with simdjson ("... is an
// array, expected a string"), shared by the readers of safetensors headers and
// checkpoint state.
#pragma once

#include <simdjson.h>

namespace dufu::trainer {

inline const char* json_type_name(simdjson::dom::element_type type) {
  using simdjson::dom::element_type;
  switch (type) {
    case element_type::ARRAY: return "an array";
    case element_type::OBJECT: return "an object";
    case element_type::INT64:
    case element_type::UINT64: return "an integer";
    case element_type::DOUBLE: return "a non-integer number";
    case element_type::STRING: return "a string";
    case element_type::BOOL: return "a boolean";
    case element_type::NULL_VALUE: return "null";
  }
  return "an unknown JSON value";
}

}  // namespace dufu::trainer
