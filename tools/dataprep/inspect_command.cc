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
#include "dufu/dataprep/tokenizer.h"

namespace dufu::tools {
namespace {

struct InspectFlags {
  std::string prefix;
  std::string impl = "mmap";
  std::string model;
  std::string merges;
  std::string pattern;
  std::vector<std::uint64_t> show;
  bool ids = false;
};

void run(const InspectFlags& flags) {
  auto dataset = dataprep::IndexedDataset::open(flags.prefix, dataprep::parse_impl(flags.impl));
  std::printf("%s", dataprep::format_summary(dataprep::summarize(*dataset)).c_str());
  if (flags.show.empty()) return;
  std::optional<dataprep::Tokenizer> tokenizer;
  if (!flags.model.empty()) {
    tokenizer = dataprep::Tokenizer::load(
        dataprep::TokenizerSpec{.model = flags.model, .merges = flags.merges, .pattern = flags.pattern});
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
  command->add_option("--model,-m", flags->model,
                      "Tokenizer to decode documents with (sentencepiece .model, .tiktoken, tokenizer.json, vocab.json)");
  command->add_option("--tokenizer-merges", flags->merges, "merges.txt of a GPT-2 vocab.json");
  command->add_option("--tokenizer-pattern", flags->pattern, "Pre-tokenizer of a .tiktoken file (gpt2, cl100k, o200k, REGEX)");
  command->add_option("--show", flags->show, "Document numbers to print (decoded with --model)")
      ->check(whole_number_in(0, 9223372036854775807ULL));
  command->add_flag("--ids", flags->ids, "Also print the token ids of shown documents");
  command->callback([flags] { run(*flags); });
}

}  // namespace dufu::tools
