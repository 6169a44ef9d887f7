// `dataprep merge`: concatenate shards with correct document indices.
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"
#include "dufu/common/human_units.h"
#include "dufu/dataprep/merge.h"

namespace dufu::tools {
namespace {

struct MergeFlags {
  std::vector<std::string> inputs;
  std::string output_prefix;
  std::string impl = "mmap";
};

void run(const MergeFlags& flags, const CLI::App& command) {
  // Parts of a divided preprocess job keep their job's layout unless told otherwise.
  std::optional<dataprep::IndexLayout> layout;
  if (command.count("--impl") > 0) layout = dataprep::layout_for_impl(dataprep::parse_impl(flags.impl));
  const auto stats = dataprep::merge_datasets(flags.inputs, flags.output_prefix, layout);
  std::printf("merge: %zu shards -> %s.{bin,idx}: %llu documents, %llu sequences, %llu tokens, %s\n",
              flags.inputs.size(), flags.output_prefix.c_str(),
              static_cast<unsigned long long>(stats.documents),
              static_cast<unsigned long long>(stats.sequences),
              static_cast<unsigned long long>(stats.tokens),
              human_bytes(static_cast<double>(stats.output_bytes)).c_str());
  if (stats.parts > 0) {
    std::printf("  the %llu parts of one preprocess job: %llu records read, %llu empty and %llu bad skipped\n",
                static_cast<unsigned long long>(stats.parts), static_cast<unsigned long long>(stats.records),
                static_cast<unsigned long long>(stats.empty_skipped),
                static_cast<unsigned long long>(stats.bad_skipped));
  }
}

}  // namespace

void add_merge_command(CLI::App& app) {
  auto flags = std::make_shared<MergeFlags>();
  auto* command = app.add_subcommand(
      "merge", "Concatenate shards of one dtype (any layout) into one, keeping document indices");
  command->add_option("inputs", flags->inputs, "Input shard prefixes, in order")
      ->required()
      ->expected(1, -1);
  command->add_option("--output-prefix,-o", flags->output_prefix, "Output shard prefix")->required();
  command
      ->add_option("--impl", flags->impl,
                   "Output layout: mmap (MMIDIDX) or lazy/cached (TNTIDX); parts of a divided preprocess "
                   "job default to their job's")
      ->check(CLI::IsMember({"mmap", "lazy", "cached"}))
      ->capture_default_str();
  command->callback([flags, command] { run(*flags, *command); });
}

}  // namespace dufu::tools
