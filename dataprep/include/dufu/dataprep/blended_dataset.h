// A weighted mix of datasets (Megatron's BlendedDataset, OSLO's DatasetBlender):
// sample s comes from the dataset whose share is furthest behind its weight, so in
// every prefix of the blend no dataset is a whole sample ahead of its weight (with
// three or more datasets one can lag by somewhat more than a sample). Algorithm:
// docs/index-algorithms.md, Blending. The two index arrays are cached like the causal-LM
// indices.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dufu/dataprep/token_dataset.h"

namespace dufu::dataprep {

// "0.7 prefixA 0.3 prefixB" (Megatron's --data-path form) -> [(0.7, A), (0.3, B)];
// a single prefix without weight means weight 1. Throws on odd token counts,
// non-numeric or non-positive weights.
std::vector<std::pair<double, std::string>> parse_blend_spec(const std::string& spec);

// Weights / sum, in float64 like Megatron.
std::vector<double> normalize_weights(const std::vector<double>& weights);

// Samples each dataset must provide for a blend of `size`: ceil(ceil(size·w)·1.005).
std::vector<std::uint64_t> blend_dataset_sizes(const std::vector<double>& normalized_weights,
                                               std::uint64_t size);

struct BlendIndices {
  std::vector<std::int16_t> dataset_index;
  std::vector<std::int64_t> dataset_sample_index;
};
// Megatron's greedy blending over `size` samples (at most 32766 datasets).
BlendIndices build_blend_indices(const std::vector<double>& normalized_weights, std::uint64_t size,
                                 const std::atomic<bool>* stop = nullptr);
// Exhaustive blending: weights = dataset sizes, a dataset drops out once used up;
// the blend has sum(sizes) samples.
BlendIndices build_exhaustive_blend_indices(const std::vector<std::uint64_t>& sizes,
                                            const std::atomic<bool>* stop = nullptr);

struct BlendOptions {
  std::optional<std::uint64_t> size;  // none = exhaustive
  std::string cache_dir;              // empty = default_index_cache_dir()
  bool use_cache = true;
  // Set from another thread to stop building the indices (the Python package's Ctrl-C);
  // the build then fails with "building the indices was stopped" and caches nothing.
  const std::atomic<bool>* stop = nullptr;
};

class BlendedDataset : public TokenDataset {
 public:
  // All datasets must have the same sample_length. `cache_descriptions` are the
  // datasets' own canonical descriptions (part of the blend's cache key; may be empty
  // when use_cache is false). The weights are normalized here, as Megatron's
  // BlendedDataset does even when its builder already normalized them; with
  // options.size empty the blend is exhaustive and `weights` (may be empty) is unused.
  BlendedDataset(std::vector<std::shared_ptr<const TokenDataset>> datasets, std::vector<double> weights,
                 std::vector<std::string> cache_descriptions, BlendOptions options);
  ~BlendedDataset() override;

  std::uint64_t size() const override;
  std::uint64_t sample_length() const override;
  void get(std::uint64_t index, std::span<std::int32_t> out) const override;
  std::string describe() const override;

  // Which dataset and which of its samples blend sample `index` is.
  std::pair<std::int16_t, std::int64_t> source_of(std::uint64_t index) const;
  const std::vector<double>& weights() const { return weights_; }
  std::size_t num_datasets() const { return datasets_.size(); }
  const std::string& cache_path() const { return cache_path_; }

 private:
  struct Arrays;
  std::vector<std::shared_ptr<const TokenDataset>> datasets_;
  std::vector<double> weights_;
  std::string description_;
  std::string cache_path_;
  std::unique_ptr<Arrays> arrays_;
};

}  // namespace dufu::dataprep
