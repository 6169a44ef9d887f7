// The tokenizer flags of every dufu command that reads a tokenizer, declared once so
// they mean and say the same everywhere:
//   --tokenizer FILE        (also --tokenizer-model, --model and -m, the names older
//                            commands used, so no command line breaks)
//   --tokenizer-merges FILE merges.txt of a GPT-2 vocab.json
//   --tokenizer-pattern P   pre-tokenizer of a .tiktoken file: gpt2, cl100k, o200k, REGEX
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "dufu/dataprep/tokenizer.h"

namespace dufu::tools {

struct TokenizerFlags {
  dataprep::TokenizerSpec spec;  // model empty: --tokenizer not given
};

// Whether a command needs the flag, or finds the tokenizer itself when it is left out.
enum class TokenizerFlag { kRequired, kFoundWhenLeftOut };

// Adds the three flags to `command`. `use` says what the command does with the
// tokenizer ("to tokenize the inputs with"), `found_in` where it looks when the flag is
// left out ("the shard's sidecar"); empty for a required flag.
void add_tokenizer_flags(CLI::App* command, TokenizerFlags& flags, TokenizerFlag need, const std::string& use,
                         const std::string& found_in = "");

}  // namespace dufu::tools
