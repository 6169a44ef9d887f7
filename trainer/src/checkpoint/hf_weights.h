// Reading a HuggingFace model directory for import_hf (hf_import.h): config.json with
// checked accessors whose errors name the key, and the weights of model.safetensors or
// of the shards model.safetensors.index.json names, each tensor widened to fp32 exactly.
// Internal to the trainer library.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dufu/trainer/checkpoint/safetensors.h"

namespace dufu::trainer::hf_weights {

// config.json. Every accessor throws one line naming the file and the key when the
// value has another type; a key left out gives the default transformers would use.
class HfConfig {
 public:
  static HfConfig read(const std::string& path);
  ~HfConfig();
  HfConfig(HfConfig&&) noexcept;

  const std::string& path() const { return path_; }
  bool has(const std::string& key) const;  // present and not null
  std::int64_t integer(const std::string& key) const;  // required
  int positive_int(const std::string& key) const;      // required, in [1, INT_MAX]
  std::int64_t integer_or(const std::string& key, std::int64_t fallback) const;
  double number_or(const std::string& key, double fallback) const;
  bool boolean_or(const std::string& key, bool fallback) const;
  std::string string_or(const std::string& key, const std::string& fallback) const;
  std::vector<std::string> strings(const std::string& key) const;  // an array of strings; empty when absent
  // The value of `key` as compact JSON text (for messages); "null" when absent.
  std::string json_text(const std::string& key) const;
  // The string `member` of the object `key`; `fallback` when either is absent or not
  // of that type (for messages about a value already refused).
  std::string member_string_or(const std::string& key, const std::string& member, const std::string& fallback) const;

 private:
  struct Json;
  HfConfig(std::string path, std::unique_ptr<Json> json);
  std::string path_;
  std::unique_ptr<Json> json_;
};

// The tensors of a directory, by name, across its one or several files.
class HfWeights {
 public:
  // Throws naming the directory when it has neither model.safetensors nor
  // model.safetensors.index.json (with a hint for a pytorch_model.bin), and naming
  // the index for a tensor its weight_map puts in a file that does not hold it.
  static HfWeights open(const std::string& dir);

  const std::vector<std::string>& files() const { return file_names_; }
  std::vector<std::string> names() const;  // every tensor, sorted
  bool contains(const std::string& name) const { return where_.contains(name); }
  // The tensor as fp32 (F32 copied, BF16 and F16 widened exactly). Throws naming the
  // tensor for a missing one, another shape than `shape`, or another dtype.
  std::vector<float> to_float(const std::string& name, const std::vector<std::uint64_t>& shape) const;
  // The raw tensor, for comparisons that must be exact; nullptr when absent.
  const safetensors::TensorView* find(const std::string& name) const;

 private:
  std::vector<safetensors::File> files_;
  std::vector<std::string> file_names_;
  std::map<std::string, std::size_t> where_;  // tensor name -> index into files_
};

// The float of an IEEE half's bits, exactly (subnormals, infinities and NaN included).
float half_to_float(std::uint16_t bits);

}  // namespace dufu::trainer::hf_weights
