// `dataprep inspect`: describe a shard and optionally decode documents back to text.
#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "cli_checks.h"
#include "commands.h"
#include "dufu/common/error.h"
#include "dufu/dataprep/inspect.h"
#include "dufu/dataprep/shard_sidecar.h"
#include "dufu/dataprep/tokenizer.h"
#include "tokenizer_flags.h"

namespace dufu::tools {
namespace {

struct InspectFlags {
  std::string prefix;
  std::string impl = "mmap";
  TokenizerFlags tokenizer;
  std::vector<std::uint64_t> show;
  bool ids = false;
};

void run(const InspectFlags& flags) {
  auto dataset = dataprep::IndexedDataset::open(flags.prefix, dataprep::parse_impl(flags.impl));
  std::printf("%s", dataprep::format_summary(dataprep::summarize(*dataset)).c_str());
  // The sidecar is read once the pair is known to open: its own errors come second.
  const std::optional<dataprep::ShardSidecar> sidecar = dataprep::read_shard_sidecar(flags.prefix);
  if (sidecar) {
    std::printf("tokenizer:  %s %s\n", sidecar->tokenizer.kind.c_str(), sidecar->tokenizer.describe().c_str());
  } else {
    std::printf("tokenizer:  not recorded (no %s)\n", dataprep::sidecar_path(flags.prefix).c_str());
  }
  // Ids are printed when there is no tokenizer to decode them with; a given tokenizer
  // that is not the recorded one is refused, shown documents or not.
  const bool given = !flags.tokenizer.spec.model.empty();
  if (flags.show.empty() && !given) return;
  std::optional<dataprep::Tokenizer> tokenizer;
  if (sidecar || given) {
    std::optional<dataprep::RecordedTokenizer> recorded;
    if (sidecar) recorded = dataprep::sidecar_tokenizer(flags.prefix, *sidecar);
    tokenizer = dataprep::Tokenizer::load(
        dataprep::choose_tokenizer(flags.tokenizer.spec, recorded, "shard '" + flags.prefix + "'", ""));
  } else if (!flags.show.empty()) {
    std::fprintf(stderr, "inspect: printing ids only: shard '%s' records no tokenizer (no %s, written before dufu "
                 "recorded tokenizers); give --tokenizer FILE to decode them\n",
                 flags.prefix.c_str(), dataprep::sidecar_path(flags.prefix).c_str());
  }
  const auto& index = dataset->index();
  for (const auto document : flags.show) {
    if (document >= index.num_documents()) {
      DUFU_FAIL("document ", document, " does not exist: '", flags.prefix, "' has ",
                index.num_documents(), " documents");
    }
    std::vector<std::int32_t> tokens;
    for (auto seq = index.document_index(document); seq < index.document_index(document + 1); ++seq) {
      const auto part = dataset->sequence(seq);
      tokens.insert(tokens.end(), part.begin(), part.end());
    }
    std::printf("\n--- document %llu (%zu tokens) ---\n", static_cast<unsigned long long>(document),
                tokens.size());
    if (flags.ids || !tokenizer) {
      for (std::size_t i = 0; i < tokens.size(); ++i) std::printf(i ? " %d" : "%d", tokens[i]);
      std::printf("\n");
    }
    if (tokenizer) std::printf("%s\n", tokenizer->decode(tokens).c_str());
  }
}

}  // namespace

void add_inspect_command(CLI::App& app) {
  auto flags = std::make_shared<InspectFlags>();
  auto* command = app.add_subcommand("inspect", "Print a shard's header, counts and token statistics");
  command->add_option("prefix", flags->prefix, "Shard prefix (PREFIX.bin / PREFIX.idx)")->required();
  command->add_option("--impl", flags->impl, "How to read the .bin: mmap, lazy or cached")
      ->check(CLI::IsMember({"mmap", "lazy", "cached"}))
      ->capture_default_str();
  add_tokenizer_flags(command, flags->tokenizer, TokenizerFlag::kFoundWhenLeftOut, "to decode --show's documents with",
                      "the shard's sidecar (PREFIX.dufu.json)");
  command->add_option("--show", flags->show,
                      "Document numbers to print, decoded with the tokenizer (as ids when there is none)")
      ->check(whole_number_in(0, 9223372036854775807ULL));
  command->add_flag("--ids", flags->ids, "Also print the token ids of shown documents");
  command->callback([flags] { run(*flags); });
}

}  // namespace dufu::tools
