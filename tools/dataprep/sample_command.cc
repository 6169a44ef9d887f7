// `dataprep sample`: what the trainer will see from a blend: the proportions the blend
// achieves against its weights, and a few samples decoded back to text.
#include <cstdio>
#include <optional>
#include <vector>

#include "blend_flags.h"
#include "cli_checks.h"
#include "commands.h"
#include "dufu/dataprep/blend_builder.h"
#include "dufu/dataprep/blended_dataset.h"
#include "dufu/dataprep/shard_sidecar.h"
#include "dufu/dataprep/tokenizer.h"
#include "tokenizer_flags.h"

namespace dufu::tools {
namespace {

struct SampleFlags {
  BlendFlags blend;
  TokenizerFlags tokenizer;
  std::uint64_t count = 3;
  std::uint64_t first = 0;
  std::uint64_t proportions_over = 0;
  bool ids = false;
};

void print_proportions(const dataprep::BuiltBlend& built, std::uint64_t over) {
  const auto* blend = dynamic_cast<const dataprep::BlendedDataset*>(built.dataset.get());
  const std::uint64_t total = over == 0 ? built.dataset->size() : std::min(over, built.dataset->size());
  std::vector<std::uint64_t> counts(built.parts.size(), 0);
  for (std::uint64_t i = 0; i < total; ++i) ++counts[blend ? blend->source_of(i).first : 0];
  std::printf("proportions over the first %llu samples:\n", static_cast<unsigned long long>(total));
  std::printf("  %-8s %-8s %-10s %s\n", "weight", "achieved", "samples", "dataset");
  for (std::size_t d = 0; d < built.parts.size(); ++d) {
    std::printf("  %-8.4f %-8.4f %-10llu %s\n", built.weights[d],
                total ? static_cast<double>(counts[d]) / static_cast<double>(total) : 0.0,
                static_cast<unsigned long long>(counts[d]), built.parts[d]->describe().c_str());
  }
}

void run(const SampleFlags& flags) {
  const dataprep::BlendConfig config = flags.blend.to_config();
  const auto built = dataprep::build_blend(config);
  print_proportions(built, flags.proportions_over);
  std::optional<dataprep::Tokenizer> tokenizer;
  std::vector<std::string> prefixes;
  for (const auto& shard : config.shards) prefixes.push_back(shard.second);
  const dataprep::ShardsTokenizer recorded = dataprep::shards_tokenizer(prefixes);
  if (recorded.recorded || !flags.tokenizer.spec.model.empty()) {
    tokenizer = dataprep::Tokenizer::load(
        dataprep::choose_tokenizer(flags.tokenizer.spec, recorded.recorded, "the blend's shards", ""));
  } else {
    std::fprintf(stderr, "sample: printing ids only: no shard of the blend records its tokenizer (no "
                 "PREFIX.dufu.json, written before dufu recorded tokenizers); give --tokenizer FILE to decode "
                 "them\n");
  }
  const auto* blend = dynamic_cast<const dataprep::BlendedDataset*>(built.dataset.get());
  std::vector<std::int32_t> tokens(built.dataset->sample_length());
  const std::uint64_t end = std::min(built.dataset->size(), flags.first + flags.count);
  for (std::uint64_t i = flags.first; i < end; ++i) {
    built.dataset->get(i, tokens);
    const int source = blend ? blend->source_of(i).first : 0;
    std::printf("\n--- sample %llu (dataset %d, %zu tokens) ---\n", static_cast<unsigned long long>(i), source,
                tokens.size());
    if (flags.ids || !tokenizer) {
      for (std::size_t t = 0; t < tokens.size(); ++t) std::printf(t ? " %d" : "%d", tokens[t]);
      std::printf("\n");
    }
    if (tokenizer) std::printf("%s\n", tokenizer->decode(tokens).c_str());
  }
}

}  // namespace

void add_sample_command(CLI::App& app) {
  auto flags = std::make_shared<SampleFlags>();
  auto* command = app.add_subcommand(
      "sample", "Print a blend's achieved proportions and decode a few of its samples");
  add_blend_flags(command, flags->blend);
  add_tokenizer_flags(command, flags->tokenizer, TokenizerFlag::kFoundWhenLeftOut, "to decode samples with",
                      "the shards' sidecars (PREFIX.dufu.json)");
  command->add_option("--count,-n", flags->count, "Samples to print")
      ->check(whole_number_in(0, 9223372036854775807ULL))
      ->capture_default_str();
  command->add_option("--first", flags->first, "Index of the first sample to print")
      ->check(whole_number_in(0, 9223372036854775807ULL))
      ->capture_default_str();
  command->add_option("--proportions-over", flags->proportions_over,
                      "Count proportions over this many leading samples (0 = all)")
      ->check(whole_number_in(0, 9223372036854775807ULL))
      ->capture_default_str();
  command->add_flag("--ids", flags->ids, "Also print token ids");
  command->callback([flags] { run(*flags); });
}

}  // namespace dufu::tools
