// The shared tokenizer flags (tokenizer_flags.h).
#include "tokenizer_flags.h"

namespace dufu::tools {

void add_tokenizer_flags(CLI::App* command, TokenizerFlags& flags, TokenizerFlag need, const std::string& use,
                         const std::string& found_in) {
  std::string help = "Tokenizer file " + use +
                     ": sentencepiece .model, tiktoken .tiktoken, HuggingFace tokenizer.json, or GPT-2 vocab.json "
                     "(with --tokenizer-merges)";
  if (need == TokenizerFlag::kFoundWhenLeftOut) {
    help += "; default: the one " + found_in + " records, and a given one must have the recorded contents";
  }
  // CLI11 lists every name; the old ones stay so that no command line breaks.
  CLI::Option* option = command->add_option("--tokenizer,--tokenizer-model,--model,-m", flags.spec.model, help);
  if (need == TokenizerFlag::kRequired) option->required();
  command->add_option("--tokenizer-merges", flags.spec.merges, "merges.txt of a GPT-2 vocab.json");
  command->add_option("--tokenizer-pattern", flags.spec.pattern,
                      "Pre-tokenizer of a .tiktoken file: gpt2, cl100k, o200k or a regex (default: from the file "
                      "name)");
}

}  // namespace dufu::tools
