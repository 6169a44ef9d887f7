// Builds what a trainer reads from a blend spec: one CausalLMDataset per shard of the
// blend (sized so the blend never runs past any of them) mixed by a BlendedDataset,
// or the single CausalLMDataset when the blend has one shard. Shared by
// `dataprep build-index`, `dataprep sample` and the trainer, so all three see the
// same samples from the same caches.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dufu/dataprep/causal_lm_dataset.h"
#include "dufu/dataprep/index.h"
#include "dufu/dataprep/token_dataset.h"

namespace dufu::dataprep {

struct BlendConfig {
  // (weight, shard prefix) pairs, e.g. from parse_blend_spec("0.7 A 0.3 B").
  std::vector<std::pair<double, std::string>> shards;
  IndexImpl impl = IndexImpl::kMmap;
  std::uint64_t seq_length = kDefaultSeqLength;
  std::optional<std::uint64_t> num_samples;  // none: one epoch of each shard, exhaustive blend
  std::uint32_t seed = kDefaultSeed;
  DataOrder order = DataOrder::kMegatron;  // every part's (the blend's own index is prefix-stable)
  SplitSpec split;
  std::string cache_dir;  // empty = default_index_cache_dir()
  bool use_cache = true;
  const std::atomic<bool>* stop = nullptr;  // stops every part's and the blend's index building
};

struct BuiltBlend {
  std::shared_ptr<const TokenDataset> dataset;
  // The parts, in blend order, and their normalized weights.
  std::vector<std::shared_ptr<const CausalLMDataset>> parts;
  std::vector<double> weights;
  std::vector<std::string> cache_paths;  // every cache directory used
};

BuiltBlend build_blend(const BlendConfig& config);

}  // namespace dufu::dataprep
