// Parsing of the blend flags into a BlendConfig.
#include "blend_flags.h"

#include "cli_checks.h"
#include "dufu/common/error.h"
#include "dufu/dataprep/blended_dataset.h"

namespace dufu::tools {

dataprep::BlendConfig BlendFlags::to_config() const {
  dataprep::BlendConfig config;
  config.shards = dataprep::parse_blend_spec(data_path);
  config.impl = dataprep::parse_impl(impl);
  config.seq_length = seq_length;
  if (num_samples > 0) config.num_samples = num_samples;
  config.seed = seed;
  config.split.megatron_split = split;
  if (split_part == "train") {
    config.split.megatron_part = 0;
  } else if (split_part == "valid") {
    config.split.megatron_part = 1;
  } else if (split_part == "test") {
    config.split.megatron_part = 2;
  } else {
    DUFU_FAIL("unknown split part '", split_part, "': use train, valid or test");
  }
  config.cache_dir = cache_dir;
  return config;
}

void add_blend_flags(CLI::App* command, BlendFlags& flags) {
  command->add_option("--data-path,-d", flags.data_path,
                      "Blend in Megatron's form: \"0.7 prefixA 0.3 prefixB\" (or one prefix)")
      ->required();
  command->add_option("--impl", flags.impl, "How shards are read: mmap, lazy or cached")
      ->check(CLI::IsMember({"mmap", "lazy", "cached"}))
      ->capture_default_str();
  // Megatron stores the sequence length (plus one) and sample counts in int32/int64.
  command->add_option("--seq-length", flags.seq_length, "Tokens per sample (each sample holds one more)")
      ->check(whole_number_in(1, 2147483646))
      ->capture_default_str();
  command->add_option("--num-samples", flags.num_samples,
                      "Samples of the blend (0: one epoch of every shard, exhaustive blend)")
      ->check(whole_number_in(0, 9223372036854775807ULL))
      ->capture_default_str();
  command->add_option("--seed", flags.seed, "Shuffle seed (Megatron's default 1234)")
      ->check(whole_number_in(0, 4294967295ULL))
      ->capture_default_str();
  command->add_option("--split", flags.split, "Megatron split of each shard's documents, e.g. 969,30,1")
      ->capture_default_str();
  command->add_option("--split-part", flags.split_part, "Which part of the split: train, valid or test")
      ->check(CLI::IsMember({"train", "valid", "test"}))
      ->capture_default_str();
  command->add_option("--cache-dir", flags.cache_dir,
                      "Index cache directory (default: $DUFU_CACHE_DIR or ~/.cache/dufu)");
}

}  // namespace dufu::tools
