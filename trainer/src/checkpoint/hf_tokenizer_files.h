// The tokenizer part of a HuggingFace export (hf_export.h): the run's tokenizer file
// copied under the name transformers looks for, with a tokenizer_config.json naming
// the class that encodes as dufu does and the special tokens. Internal to the trainer
// library.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dufu/dataprep/tokenizer.h"

namespace dufu::trainer::hf_tokenizer_files {

struct TokenizerFiles {
  std::string tokenizer_class;
  std::vector<std::string> files;  // names written into the directory
  std::int32_t bos_id = -1;        // -1: none
  std::int32_t eos_id = -1;
  std::int32_t pad_id = -1;  // the tokenizer's pad piece, else eos (GPT-2's habit)
};

// Throws dufu::Error for a tokenizer that has no form transformers reads (a .tiktoken
// rank file), naming it with a hint; before anything is written.
void check_exportable(const dataprep::TokenizerSpec& spec);

// Writes the files of `spec` (already loaded as `tokenizer`) into `dir`, each through
// a synced temporary. `model_max_length` is the model's context. Throws dufu::Error
// naming the file on an IO failure.
TokenizerFiles write(const std::string& dir, const dataprep::TokenizerSpec& spec, const dataprep::Tokenizer& tokenizer,
                     int model_max_length);

}  // namespace dufu::trainer::hf_tokenizer_files
