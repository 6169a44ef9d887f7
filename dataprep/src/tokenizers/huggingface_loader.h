// Loads HuggingFace's tokenizer.json (a BPE model over byte-level pre-tokenization)
// and GPT-2's vocab.json + merges.txt.
#pragma once

#include <memory>

#include "dufu/dataprep/tokenizer_model.h"

namespace dufu::dataprep::tokenizers {

// Throws dufu::Error naming the file and, for a component dufu does not implement,
// the component.
std::unique_ptr<TokenizerModel> load_huggingface_json(const TokenizerSpec& spec);
// spec.model is the vocab.json, spec.merges the merges.txt.
std::unique_ptr<TokenizerModel> load_gpt2_vocab(const TokenizerSpec& spec);

}  // namespace dufu::dataprep::tokenizers
