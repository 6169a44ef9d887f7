// config.json and the safetensors files of a HuggingFace directory (see hf_weights.h).
#include "hf_weights.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <vector>

#include <simdjson.h>

#include "dufu/common/error.h"
#include "dufu/common/json_members.h"
#include "dufu/common/read_only_file.h"
#include "json_type_name.h"

namespace dufu::trainer::hf_weights {

namespace fs = std::filesystem;

struct HfConfig::Json {
  simdjson::padded_string text;
  simdjson::dom::parser parser;
  simdjson::dom::object object;
};

HfConfig::HfConfig(std::string path, std::unique_ptr<Json> json) : path_(std::move(path)), json_(std::move(json)) {}
HfConfig::~HfConfig() = default;
HfConfig::HfConfig(HfConfig&&) noexcept = default;

namespace {

// The JSON object of `path`, kept with its parser so its views stay valid.
simdjson::dom::object parse_object(const std::string& path, simdjson::padded_string& text,
                                   simdjson::dom::parser& parser) {
  // Read through open_regular_file: simdjson's own load would wait on a FIFO.
  const std::vector<std::byte> bytes = ReadOnlyFile::open(path).read_all();
  text = simdjson::padded_string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  simdjson::dom::element root;
  if (const auto error = parser.parse(text).get(root); error) {
    DUFU_FAIL(path, ": not valid JSON (", simdjson::error_message(error), ")");
  }
  simdjson::dom::object object;
  if (root.get(object)) DUFU_FAIL(path, ": not a JSON object but ", json_type_name(root.type()));
  return object;
}

std::string shape_text(const std::vector<std::uint64_t>& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += str_cat(i > 0 ? ", " : "", shape[i]);
  return out + "]";
}

}  // namespace

HfConfig HfConfig::read(const std::string& path) {
  auto json = std::make_unique<Json>();
  json->object = parse_object(path, json->text, json->parser);
  return HfConfig(path, std::move(json));
}

bool HfConfig::has(const std::string& key) const {
  // A key given twice is its last value, as in Python's json (transformers).
  const std::optional<simdjson::dom::element> value = last_member(json_->object, key);
  return value && !value->is_null();
}

std::int64_t HfConfig::integer(const std::string& key) const {
  if (!has(key)) DUFU_FAIL(path_, ": \"", key, "\" is missing");
  return integer_or(key, 0);
}

int HfConfig::positive_int(const std::string& key) const {
  const std::int64_t value = integer(key);
  if (value < 1 || value > std::numeric_limits<int>::max()) {
    DUFU_FAIL(path_, ": \"", key, "\" is ", value, ", not a positive int");
  }
  return static_cast<int>(value);
}

std::int64_t HfConfig::integer_or(const std::string& key, std::int64_t fallback) const {
  if (!has(key)) return fallback;
  const simdjson::dom::element value = *last_member(json_->object, key);
  std::int64_t number = 0;
  if (value.get(number)) DUFU_FAIL(path_, ": \"", key, "\" is ", json_type_name(value.type()), ", not an integer");
  return number;
}

double HfConfig::number_or(const std::string& key, double fallback) const {
  if (!has(key)) return fallback;
  const simdjson::dom::element value = *last_member(json_->object, key);
  double number = 0;
  if (value.get(number)) DUFU_FAIL(path_, ": \"", key, "\" is ", json_type_name(value.type()), ", not a number");
  return number;
}

bool HfConfig::boolean_or(const std::string& key, bool fallback) const {
  if (!has(key)) return fallback;
  const simdjson::dom::element value = *last_member(json_->object, key);
  bool flag = false;
  if (value.get(flag)) DUFU_FAIL(path_, ": \"", key, "\" is ", json_type_name(value.type()), ", not a boolean");
  return flag;
}

std::string HfConfig::string_or(const std::string& key, const std::string& fallback) const {
  if (!has(key)) return fallback;
  const simdjson::dom::element value = *last_member(json_->object, key);
  std::string_view text;
  if (value.get(text)) DUFU_FAIL(path_, ": \"", key, "\" is ", json_type_name(value.type()), ", not a string");
  return std::string(text);
}

std::vector<std::string> HfConfig::strings(const std::string& key) const {
  std::vector<std::string> out;
  if (!has(key)) return out;
  const simdjson::dom::element value = *last_member(json_->object, key);
  simdjson::dom::array array;
  if (value.get(array)) DUFU_FAIL(path_, ": \"", key, "\" is ", json_type_name(value.type()), ", not an array");
  for (const simdjson::dom::element item : array) {
    std::string_view text;
    if (item.get(text)) DUFU_FAIL(path_, ": \"", key, "\" holds ", json_type_name(item.type()), ", not a string");
    out.emplace_back(text);
  }
  return out;
}

std::string HfConfig::json_text(const std::string& key) const {
  if (!has(key)) return "null";
  return simdjson::minify(*last_member(json_->object, key));
}

std::string HfConfig::member_string_or(const std::string& key, const std::string& member,
                                       const std::string& fallback) const {
  simdjson::dom::object object;
  std::string_view text;
  if (!has(key) || last_member(json_->object, key)->get(object)) return fallback;
  const std::optional<simdjson::dom::element> value = last_member(object, member);
  if (!value || value->get(text)) return fallback;
  return std::string(text);
}

HfWeights HfWeights::open(const std::string& dir) {
  HfWeights weights;
  const fs::path single = fs::path(dir) / "model.safetensors";
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  std::error_code error;
  if (fs::exists(single, error)) {
    weights.files_.push_back(safetensors::File::open(single.string()));
    weights.file_names_.push_back("model.safetensors");
    for (const safetensors::TensorView& tensor : weights.files_.back().tensors()) weights.where_[tensor.name] = 0;
    return weights;
  }
  if (!fs::exists(index, error)) {
    const bool pickle = fs::exists(fs::path(dir) / "pytorch_model.bin", error);
    DUFU_FAIL(dir, ": no model.safetensors or model.safetensors.index.json",
              pickle ? "; HINT: it has pytorch_model.bin: save the model with save_pretrained(DIR, "
                       "safe_serialization=True)"
                     : "");
  }
  simdjson::padded_string text;
  simdjson::dom::parser parser;
  const simdjson::dom::object object = parse_object(index.string(), text, parser);
  simdjson::dom::object weight_map;
  const std::optional<simdjson::dom::element> map = last_member(object, "weight_map");
  if (!map || map->get(weight_map)) {
    DUFU_FAIL(index.string(), ": \"weight_map\" is missing or not an object");
  }
  std::map<std::string, std::size_t> file_index;
  for (const auto field : weight_map) {
    std::string_view file;
    if (field.value.get(file)) DUFU_FAIL(index.string(), ": \"weight_map\" entry \"", field.key, "\" is not a string");
    // A shard's name is a file of this directory, never a path out of it.
    if (file.empty() || file.find('/') != std::string_view::npos || file == "." || file == "..") {
      DUFU_FAIL(index.string(), ": \"weight_map\" names the file \"", file, "\", not a file of the directory");
    }
    auto [it, added] = file_index.try_emplace(std::string(file), weights.files_.size());
    if (added) {
      weights.files_.push_back(safetensors::File::open((fs::path(dir) / it->first).string()));
      weights.file_names_.push_back(it->first);
    }
    const std::string name(field.key);
    if (weights.files_[it->second].find(name) == nullptr) {
      DUFU_FAIL(index.string(), ": \"weight_map\" puts \"", name, "\" in ", it->first, ", which does not hold it");
    }
    weights.where_[name] = it->second;
  }
  // A tensor in a shard but not in the map would be silently dropped.
  for (std::size_t f = 0; f < weights.files_.size(); ++f) {
    for (const safetensors::TensorView& tensor : weights.files_[f].tensors()) {
      const auto it = weights.where_.find(tensor.name);
      if (it == weights.where_.end() || it->second != f) {
        DUFU_FAIL(index.string(), ": ", weights.file_names_[f], " holds \"", tensor.name,
                  "\", which \"weight_map\" does not put there");
      }
    }
  }
  return weights;
}

std::vector<std::string> HfWeights::names() const {
  std::vector<std::string> out;
  for (const auto& [name, file] : where_) out.push_back(name);
  return out;
}

const safetensors::TensorView* HfWeights::find(const std::string& name) const {
  const auto it = where_.find(name);
  return it == where_.end() ? nullptr : files_[it->second].find(name);
}

float half_to_float(std::uint16_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits >> 15) << 31;
  const std::uint32_t exponent = (bits >> 10) & 0x1f;
  const std::uint32_t mantissa = bits & 0x3ff;
  if (exponent == 0) {  // zero or subnormal: mantissa x 2^-24, exact in a float
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign != 0 ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  return std::bit_cast<float>(sign | ((exponent - 15 + 127) << 23) | (mantissa << 13));
}

std::vector<float> HfWeights::to_float(const std::string& name, const std::vector<std::uint64_t>& shape) const {
  const safetensors::TensorView* tensor = find(name);
  if (tensor == nullptr) DUFU_FAIL("the model has no tensor \"", name, "\"");
  if (tensor->shape != shape) {
    DUFU_FAIL("tensor \"", name, "\" has shape ", shape_text(tensor->shape), ", the config gives ", shape_text(shape));
  }
  const std::size_t count = tensor->element_count();
  std::vector<float> out(count);
  const std::byte* bytes = tensor->bytes.data();
  // Element by element through memcpy: a shard written by another tool need not align
  // its tensors.
  switch (tensor->dtype) {
    case safetensors::Dtype::kF32:
      std::memcpy(out.data(), bytes, count * sizeof(float));
      break;
    case safetensors::Dtype::kBF16:
      for (std::size_t i = 0; i < count; ++i) {
        std::uint16_t bits;
        std::memcpy(&bits, bytes + 2 * i, 2);
        out[i] = std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
      }
      break;
    case safetensors::Dtype::kF16:
      for (std::size_t i = 0; i < count; ++i) {
        std::uint16_t bits;
        std::memcpy(&bits, bytes + 2 * i, 2);
        out[i] = half_to_float(bits);
      }
      break;
    default:
      DUFU_FAIL("tensor \"", name, "\" has dtype ", safetensors::dtype_name(tensor->dtype),
                "; dufu imports F32, BF16 and F16");
  }
  return out;
}

}  // namespace dufu::trainer::hf_weights
