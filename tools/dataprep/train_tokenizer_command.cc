// `dataprep train-tokenizer`: train a sentencepiece model from txt/jsonl inputs.
#include <cstdio>
#include <string>
#include <vector>

#include "cli_checks.h"
#include "commands.h"
#include "dufu/dataprep/train_tokenizer.h"
#include "dufu/common/human_units.h"

namespace dufu::tools {
namespace {

struct TrainTokenizerFlags {
  dataprep::TrainTokenizerOptions options;
  std::string txt_document = "line";
  std::string on_error = "fail";
};

void run(TrainTokenizerFlags& flags) {
  auto& options = flags.options;
  options.reader.txt_document =
      flags.txt_document == "file" ? dataprep::TxtDocument::kFile : dataprep::TxtDocument::kLine;
  options.reader.skip_bad_records = flags.on_error == "skip";
  std::fprintf(stderr, "train-tokenizer: training a %d-piece %s model (this takes a while)...\n",
               options.vocab_size, options.model_type.c_str());
  const auto stats = dataprep::train_tokenizer(options);
  std::printf("train-tokenizer: done in %.1f s\n", stats.seconds);
  std::printf("  input      %llu documents, %llu sentences, %s\n",
              static_cast<unsigned long long>(stats.documents),
              static_cast<unsigned long long>(stats.sentences),
              human_bytes(static_cast<double>(stats.input_bytes)).c_str());
  std::printf("  model      %s\n  vocab      %s\n", stats.model_path.c_str(), stats.vocab_path.c_str());
}

}  // namespace

void add_train_tokenizer_command(CLI::App& app) {
  auto flags = std::make_shared<TrainTokenizerFlags>();
  auto& options = flags->options;
  auto* command = app.add_subcommand(
      "train-tokenizer", "Train a sentencepiece model from txt/jsonl inputs (plain, .zst, .gz)");
  command->add_option("--input,-i", options.inputs, "Input files, globs, or - for stdin")
      ->required()
      ->expected(1, -1);
  command->add_option("--model-prefix,--output-prefix,-o", options.model_prefix,
                      "Writes PREFIX.model and PREFIX.vocab (also --output-prefix, as in preprocess and merge)")
      ->required();
  command->add_option("--vocab-size", options.vocab_size, "Number of pieces")
      ->check(whole_number_in(1, 2147483647))
      ->capture_default_str();
  command->add_option("--model-type", options.model_type, "bpe, unigram, char or word")
      ->check(CLI::IsMember({"bpe", "unigram", "char", "word"}))
      ->capture_default_str();
  command->add_option("--json-keys", options.reader.json_keys, "JSON keys holding the text")
      ->capture_default_str()
      ->expected(1, -1);
  command->add_option("--txt-document", flags->txt_document, "line or file (see preprocess)")
      ->check(CLI::IsMember({"line", "file"}))
      ->capture_default_str();
  command->add_option("--on-error", flags->on_error, "fail or skip bad records")
      ->check(CLI::IsMember({"fail", "skip"}))
      ->capture_default_str();
  command->add_option("--character-coverage", options.character_coverage,
                      "Fraction of characters covered by the model")
      ->capture_default_str();
  command->add_option("--input-sentence-size", options.input_sentence_size,
                      "Sentences sampled for training (0 = all)")
      ->check(whole_number_in(0, 2147483647))
      ->capture_default_str();
  command->add_option("--threads", options.threads, "Trainer threads (0 = all cores)")
      ->check(whole_number_in(0, 1024))
      ->capture_default_str();
  command->add_option("--seed", options.seed, "Seed of sentence sampling")
      ->check(whole_number_in(0, 4294967295))
      ->capture_default_str();
  command->add_option("--max-document-bytes", options.reader.max_document_bytes,
                      "Longest document (txt line, jsonl record or whole txt file) accepted, in bytes")
      ->check(whole_number_in(1, std::uint64_t{1} << 32))
      ->capture_default_str();
  command->add_option("--spm-arg", options.extra_args,
                      "Extra sentencepiece trainer flag, e.g. --spm-arg=--byte_fallback=true");
  command->callback([flags] { run(*flags); });
}

}  // namespace dufu::tools
