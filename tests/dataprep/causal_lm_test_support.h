// What the causal-LM dataset's tests share (causal_lm_dataset_test.cc,
// causal_lm_cache_test.cc): shards of synthetic positions, options and samples.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dufu/dataprep/causal_lm_dataset.h"
#include "dufu/dataprep/indexed_dataset.h"
#include "support/synthetic_shard.h"
#include "support/temp_dir.h"

namespace dufu::dataprep::causal_lm_testing {

using dufu::testing::TempDir;

// Lengths 1..41 in a scrambled order: short and long documents next to each other, so
// samples cross several documents and some documents hold several samples.
inline std::vector<std::uint64_t> varied_lengths(std::uint64_t count) {
  std::vector<std::uint64_t> lengths(count);
  for (std::uint64_t k = 0; k < count; ++k) lengths[k] = 1 + (k * 37 + 11) % 41;
  return lengths;
}

inline std::shared_ptr<const IndexedDataset> open_shard(const std::string& prefix, IndexImpl impl = IndexImpl::kMmap) {
  return IndexedDataset::open(prefix, impl);
}

inline std::shared_ptr<const IndexedDataset> make_shard(const TempDir& dir, const std::string& name,
                                                 const std::vector<std::uint64_t>& lengths,
                                                 IndexLayout layout = IndexLayout::kMMIDIDX,
                                                 DType dtype = DType::kInt32) {
  const std::string prefix = dir.file(name);
  dufu::testing::write_synthetic_shard(prefix, lengths, layout, dtype);
  return open_shard(prefix);
}

inline CausalLMOptions in_memory(std::uint64_t seq_length, std::optional<std::uint64_t> num_samples,
                          std::uint32_t seed, SplitSpec split = {}) {
  CausalLMOptions options;
  options.seq_length = seq_length;
  options.num_samples = num_samples;
  options.seed = seed;
  options.split = std::move(split);
  options.use_cache = false;
  return options;
}

inline SplitSpec megatron(const std::string& split, int part) {
  SplitSpec spec;
  spec.megatron_split = split;
  spec.megatron_part = part;
  return spec;
}

inline SplitSpec oslo(double start, double end) {
  SplitSpec spec;
  spec.start_weight = start;
  spec.end_weight = end;
  return spec;
}

inline std::vector<std::int32_t> sample(const TokenDataset& dataset, std::uint64_t i) {
  std::vector<std::int32_t> out(dataset.sample_length());
  dataset.get(i, out);
  return out;
}

inline CausalLMOptions cached(const TempDir& dir, std::uint64_t seq_length, std::optional<std::uint64_t> num_samples,
                       std::uint32_t seed, SplitSpec split = {}) {
  CausalLMOptions options = in_memory(seq_length, num_samples, seed, std::move(split));
  options.use_cache = true;
  options.cache_dir = dir.file("cache");
  return options;
}

inline std::vector<std::vector<std::int32_t>> all_samples(const TokenDataset& dataset) {
  std::vector<std::vector<std::int32_t>> samples;
  for (std::uint64_t i = 0; i < dataset.size(); ++i) samples.push_back(sample(dataset, i));
  return samples;
}

}  // namespace dufu::dataprep::causal_lm_testing
