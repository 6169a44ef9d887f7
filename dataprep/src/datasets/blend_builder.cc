// Assembles blends the way Megatron's BlendedMegatronDatasetBuilder does: the blend's
// size decides how many samples each shard's dataset must provide (with the 0.005
// surplus), and each shard's dataset is built with exactly that many.
#include "dufu/dataprep/blend_builder.h"

#include "dufu/common/error.h"
#include "dufu/dataprep/blended_dataset.h"

namespace dufu::dataprep {

BuiltBlend build_blend(const BlendConfig& config) {
  if (config.shards.empty()) DUFU_FAIL("the blend names no datasets");
  std::vector<double> raw_weights;
  for (const auto& [weight, prefix] : config.shards) raw_weights.push_back(weight);
  BuiltBlend built;
  built.weights = normalize_weights(raw_weights);

  std::vector<std::uint64_t> per_shard_samples;
  if (config.num_samples && config.shards.size() > 1) {
    per_shard_samples = blend_dataset_sizes(built.weights, *config.num_samples);
  }
  std::vector<std::shared_ptr<const TokenDataset>> parts;
  std::vector<std::string> descriptions;
  for (std::size_t i = 0; i < config.shards.size(); ++i) {
    CausalLMOptions options;
    options.seq_length = config.seq_length;
    options.seed = config.seed;
    options.order = config.order;
    options.split = config.split;
    options.cache_dir = config.cache_dir;
    options.use_cache = config.use_cache;
    options.stop = config.stop;
    if (config.num_samples) {
      options.num_samples = per_shard_samples.empty() ? *config.num_samples : per_shard_samples[i];
    }
    std::shared_ptr<const IndexedDataset> shard = IndexedDataset::open(config.shards[i].second, config.impl);
    auto part = std::make_shared<const CausalLMDataset>(std::move(shard), options);
    if (!part->cache_path().empty()) built.cache_paths.push_back(part->cache_path());
    descriptions.push_back(part->description());
    built.parts.push_back(part);
    parts.push_back(part);
  }
  if (parts.size() == 1) {
    built.dataset = parts.front();
    return built;
  }
  BlendOptions options;
  options.size = config.num_samples;
  options.cache_dir = config.cache_dir;
  options.use_cache = config.use_cache;
  options.stop = config.stop;
  // Megatron normalizes in its builder and again in BlendedDataset: passing the
  // normalized weights repeats that, so the indices match it to the last bit.
  auto blend = std::make_shared<const BlendedDataset>(parts, built.weights, descriptions, options);
  if (!blend->cache_path().empty()) built.cache_paths.push_back(blend->cache_path());
  built.dataset = std::move(blend);
  return built;
}

}  // namespace dufu::dataprep
