// Loads a tiktoken rank file (*.tiktoken) with its pre-tokenizer pattern.
#pragma once

#include <memory>

#include "dufu/dataprep/tokenizer_model.h"

namespace dufu::dataprep::tokenizers {

// spec.pattern names gpt2, cl100k or o200k, or is a regex; empty, it is inferred from
// the file name. Throws dufu::Error naming the file.
std::unique_ptr<TokenizerModel> load_tiktoken(const TokenizerSpec& spec);

}  // namespace dufu::dataprep::tokenizers
