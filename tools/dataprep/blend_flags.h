// The flags that describe a blend (shards, split, seq length, samples, seed, cache),
// shared by `dataprep build-index` and `dataprep sample` so both mean the same thing.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "dufu/dataprep/blend_builder.h"
#include "dufu/dataprep/causal_lm_dataset.h"

namespace dufu::tools {

struct BlendFlags {
  std::string data_path;
  std::string impl = "mmap";
  std::uint64_t seq_length = dataprep::kDefaultSeqLength;
  std::uint64_t num_samples = 0;  // 0 = one epoch / exhaustive
  std::uint32_t seed = dataprep::kDefaultSeed;
  std::string split = "969,30,1";
  std::string split_part = "train";
  std::string cache_dir;

  dataprep::BlendConfig to_config() const;
};

void add_blend_flags(CLI::App* command, BlendFlags& flags);

}  // namespace dufu::tools
