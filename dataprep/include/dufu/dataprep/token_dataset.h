// What the loader and the trainer see: a random-access set of fixed-length token
// windows. CausalLMDataset and BlendedDataset are both TokenDatasets, so a blend of
// blends or a single corpus feed the same loader.
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace dufu::dataprep {

class TokenDataset {
 public:
  virtual ~TokenDataset() = default;
  // Number of samples.
  virtual std::uint64_t size() const = 0;
  // Tokens per sample: seq_length + 1 (inputs are [:-1], labels are [1:]).
  virtual std::uint64_t sample_length() const = 0;
  // Writes sample `index` (< size()) into `out` (sample_length() tokens). Thread-safe.
  virtual void get(std::uint64_t index, std::span<std::int32_t> out) const = 0;
  // One line describing the dataset, for logs.
  virtual std::string describe() const = 0;
};

}  // namespace dufu::dataprep
