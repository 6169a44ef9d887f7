// Loads a sentencepiece .model behind the Tokenizer interface.
#pragma once

#include <memory>

#include "dufu/dataprep/tokenizer_model.h"

namespace dufu::dataprep::tokenizers {

// Throws dufu::Error naming the file when sentencepiece cannot load it.
std::unique_ptr<TokenizerModel> load_sentencepiece(const TokenizerSpec& spec);

}  // namespace dufu::dataprep::tokenizers
