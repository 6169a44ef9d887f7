// `dataprep preprocess`: flags, progress and the final summary.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "cli_checks.h"
#include "commands.h"
#include "flag_names.h"
#include "dufu/common/launch_environment.h"
#include "dufu/common/progress.h"
#include "dufu/dataprep/distributed_preprocess.h"
#include "dufu/dataprep/preprocess_part.h"
#include "dufu/dataprep/preprocess.h"
#include "dufu/common/human_units.h"
#include "tokenizer_flags.h"

namespace dufu::tools {
namespace {

double per_second(std::uint64_t amount, double seconds) {
  return seconds > 0 ? static_cast<double>(amount) / seconds : 0.0;
}

struct PreprocessFlags {
  dataprep::PreprocessOptions options;
  TokenizerFlags tokenizer;
  std::string impl = "mmap";
  std::string layout = "megatron";
  std::string on_error = "fail";
  std::string txt_document = "line";
  std::string stdin_format = "jsonl";
  std::string dtype;
  int eod_id = -1;
  bool quiet = false;
  std::string shard;
};

void run(PreprocessFlags& flags, const CLI::App& command) {
  auto& options = flags.options;
  options.tokenizer = flags.tokenizer.spec;
  options.impl = dataprep::parse_impl(flags.impl);
  options.layout = dataprep::parse_layout_family(flags.layout);
  options.reader.skip_bad_records = flags.on_error == "skip";
  options.reader.txt_document =
      flags.txt_document == "file" ? dataprep::TxtDocument::kFile : dataprep::TxtDocument::kLine;
  options.reader.stdin_format =
      flags.stdin_format == "txt" ? dataprep::InputFormat::kTxt : dataprep::InputFormat::kJsonl;
  if (command.count("--eod-id") > 0) options.eod_id = flags.eod_id;
  if (!flags.dtype.empty()) options.dtype = dataprep::parse_dtype(flags.dtype);

  // Under mpirun or srun the ranks work together and rank 0 alone reports.
  const LaunchEnvironment launch = detect_launch_environment();
  Progress progress("preprocess", {{"MB", 1e6}, {"docs", 1}, {"tokens", 1}},
                    ProgressOptions{.quiet = flags.quiet || launch.rank != 0});
  std::optional<dataprep::ShardSpec> shard;
  if (!flags.shard.empty()) shard = dataprep::parse_shard(flags.shard);
  const auto stats = dataprep::run_preprocess(options, shard, &progress);
  if (launch.rank != 0) return;

  if (launch.world_size > 1) {
    std::printf("preprocess: done in %.1f s with %d ranks of %d workers\n", stats.seconds, launch.world_size,
                stats.workers);
  } else {
    std::printf("preprocess: done in %.1f s with %d workers%s\n", stats.seconds, stats.workers,
                shard ? (" (part " + flags.shard + ")").c_str() : "");
  }
  std::printf("  records    %llu read\n", static_cast<unsigned long long>(stats.records));
  std::printf("  documents  %llu written, %llu empty skipped, %llu bad skipped (%s docs/s)\n",
              static_cast<unsigned long long>(stats.documents),
              static_cast<unsigned long long>(stats.empty_skipped),
              static_cast<unsigned long long>(stats.bad_skipped),
              human_count(per_second(stats.documents, stats.seconds), false).c_str());
  std::printf("  tokens     %llu (%s tokens/s), dtype %s\n",
              static_cast<unsigned long long>(stats.tokens),
              human_count(per_second(stats.tokens, stats.seconds), false).c_str(),
              std::string(dataprep::dtype_name(stats.dtype)).c_str());
  std::printf("  input      %s (%.2f MB/s); text %s\n",
              human_bytes(static_cast<double>(stats.input_bytes)).c_str(),
              per_second(stats.input_bytes, stats.seconds) / 1e6,
              human_bytes(static_cast<double>(stats.text_bytes)).c_str());
  std::printf("  output     %s in", human_bytes(static_cast<double>(stats.output_bytes)).c_str());
  for (const auto& prefix : stats.output_prefixes) std::printf(" %s.{bin,idx}", prefix.c_str());
  std::printf("\n");
  for (const auto& message : stats.first_errors) std::printf("  skipped: %s\n", with_flag_names(message).c_str());
  if (stats.bad_skipped > stats.first_errors.size()) {
    std::printf("  skipped: ... and %llu more bad records\n",
                static_cast<unsigned long long>(stats.bad_skipped - stats.first_errors.size()));
  }
}

}  // namespace

void add_preprocess_command(CLI::App& app) {
  auto flags = std::make_shared<PreprocessFlags>();
  auto* command = app.add_subcommand(
      "preprocess", "Tokenize txt/jsonl (plain, .zst, .gz or stdin), Parquet or Arrow into indexed shards");
  auto& options = flags->options;
  command->add_option("--input,-i", options.inputs,
                      "Input files, shell globs, or - for stdin (.txt: one document per line; "
                      ".jsonl: one JSON object per line; optionally .zst or .gz; .parquet and .arrow "
                      "(or their magic bytes): one document per row)")
      ->required()
      ->expected(1, -1);
  command->add_option("--output-prefix,-o", options.output_prefix,
                      "Writes PREFIX.bin/.idx (one key) or PREFIX_{key}_document.bin/.idx")
      ->required();
  add_tokenizer_flags(command, flags->tokenizer, TokenizerFlag::kRequired,
                      "to tokenize with (named with its SHA-256 in each output's PREFIX.dufu.json)");
  command->add_option("--json-keys", options.reader.json_keys,
                      "JSON keys (for Parquet and Arrow: columns) holding the text; one output per key")
      ->capture_default_str()
      ->expected(1, -1);
  command
      ->add_option("--impl", flags->impl,
                   "The reader's dataset impl the index is for: mmap writes an MMIDIDX index, lazy or "
                   "cached a TNTIDX index (the reader's --dataset-impl / --data-impl of the same name)")
      ->check(CLI::IsMember({"mmap", "lazy", "cached"}))
      ->capture_default_str();
  command
      ->add_option("--layout", flags->layout,
                   "Whose variant of that index: megatron (with a document index; Megatron-core reads "
                   "mmap, Megatron-LM's legacy reader all three) or fairseq (no document index, one "
                   "document per sequence; fairseq reads it; with lazy/cached the .bin stores id + 1 "
                   "and the dtype defaults to int32)")
      ->check(CLI::IsMember({"megatron", "fairseq"}))
      ->capture_default_str();
  command->add_flag("--append-eod", options.append_eod,
                    "Append the end-of-document id to every non-empty document");
  command->add_option("--eod-id", flags->eod_id, "End-of-document id (default: the tokenizer's own, </s> or <|endoftext|>)")
      ->check(whole_number_in(0, 2147483647));
  command->add_option("--workers,-j", options.workers, "Tokenizer threads (0 = all cores)")
      ->check(whole_number_in(0, dataprep::kMaxWorkers))
      ->capture_default_str();
  command->add_option("--on-error", flags->on_error,
                      "fail: stop and write nothing; skip: skip bad records, count and report them")
      ->check(CLI::IsMember({"fail", "skip"}))
      ->capture_default_str();
  command->add_option("--txt-document", flags->txt_document,
                      "For .txt inputs: each line (line) or each whole file (file) is a document")
      ->check(CLI::IsMember({"line", "file"}))
      ->capture_default_str();
  command->add_option("--stdin-format", flags->stdin_format, "Format of - (stdin): jsonl or txt")
      ->check(CLI::IsMember({"jsonl", "txt"}))
      ->capture_default_str();
  command
      ->add_option(
          "--dtype", flags->dtype,
          "Token dtype (default: uint16 if vocab < 65500, else int32; int32 for --layout fairseq with lazy/cached)")
      ->check(CLI::IsMember({"uint16", "int32", "uint32", "int64"}));
  command->add_option("--batch-bytes", options.batch_bytes,
                      "Text bytes per work item handed to a worker (tuning; output unchanged)")
      ->check(whole_number_in(1, dataprep::kMaxBatchBytes))
      ->capture_default_str();
  command->add_option("--max-document-bytes", options.reader.max_document_bytes,
                      "Longest document (txt line, jsonl record or whole txt file) accepted, in bytes; "
                      "a longer one is a bad record (see --on-error). Bounds memory: tokenizing takes "
                      "about 55 bytes per byte of a document")
      ->check(whole_number_in(1, std::uint64_t{1} << 32))
      ->capture_default_str();
  command->add_option("--shard", flags->shard,
                      "K/N: write only part K (from 0) of the job divided N ways, as PREFIX.part-K-of-N with a "
                      "manifest; `dataprep merge` of all N parts gives the undivided output (under mpirun or "
                      "srun the ranks divide the job themselves)");
  command->add_flag("--quiet,-q", flags->quiet, "No progress output");
  command->callback([flags, command] { run(*flags, *command); });
}

}  // namespace dufu::tools
