// `dataprep train-tokenizer`: trains a sentencepiece model through sentencepiece's
// trainer library, fed by dufu's own readers (txt, jsonl, compressed, stdin).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dufu/dataprep/document_reader.h"

namespace dufu::dataprep {

struct TrainTokenizerOptions {
  std::vector<std::string> inputs;
  ReaderOptions reader;
  std::string model_prefix;          // writes PREFIX.model and PREFIX.vocab
  int vocab_size = 32000;
  std::string model_type = "bpe";    // bpe | unigram | char | word
  double character_coverage = 0.9995;
  std::uint64_t input_sentence_size = 2'000'000;  // sentences sampled (0 = all)
  std::uint64_t max_sentence_length = 16384;      // bytes; longer ones are skipped by spm
  int threads = 0;                   // 0 = all cores
  std::uint64_t seed = 0;            // sampling seed for reproducible models
  std::vector<std::string> extra_args;  // raw "--key=value" sentencepiece flags
};

struct TrainTokenizerStats {
  std::uint64_t documents = 0;
  std::uint64_t sentences = 0;
  std::uint64_t input_bytes = 0;
  double seconds = 0;
  std::string model_path;
  std::string vocab_path;
};

TrainTokenizerStats train_tokenizer(const TrainTokenizerOptions& options);

}  // namespace dufu::dataprep
