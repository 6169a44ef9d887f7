// `train generate`: text from a checkpoint, to see what a run has learnt. The prompt
// is encoded with the run's tokenizer, continued by trainer::generate, and
// printed together with its continuation on stdout; what was loaded goes to stderr.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "cli_checks.h"
#include "commands.h"
#include "dufu/dataprep/tokenizer_record.h"
#include "dufu/common/error.h"
#include "dufu/dataprep/tokenizer.h"
#include "dufu/trainer/checkpoint/checkpoint.h"
#include "dufu/trainer/checkpoint/run_tokenizer.h"
#include "dufu/trainer/model/gpt.h"
#include "dufu/trainer/run/generate.h"
#include "tokenizer_flags.h"

namespace dufu::tools {
namespace {

struct GenerateFlags {
  std::string checkpoint;
  TokenizerFlags tokenizer;
  std::string prompt;
  int max_tokens = 64;
  float temperature = 0.8f;
  int top_k = 40;
  std::uint64_t seed = 0;
  int samples = 1;
};

// A checkpoint directory, or the newest usable checkpoint of a run directory.
std::string resolve_checkpoint(const std::string& path) {
  std::error_code error;
  if (!std::filesystem::exists(path, error)) {
    DUFU_FAIL("--checkpoint '", path, "' does not exist; HINT: give a run directory or one of its ",
              "checkpoints/step_<N> directories");
  }
  const auto found = trainer::find_usable_checkpoint(path);
  if (!found) {
    DUFU_FAIL("no checkpoint in '", path, "': it has no checkpoints/step_<N> directory; HINT: train longer ",
              "than checkpoint.interval steps, or give another run");
  }
  return *found;
}

// The text the continuation adds to the prompt. Decoding prompt and continuation
// together keeps the space that sentencepiece attaches to the first new word; if the
// decoded prompt is not a prefix of that (it always is for BPE and unigram models)
// the continuation is decoded on its own.
std::string continuation_text(const dataprep::Tokenizer& tokenizer, const std::vector<std::int32_t>& prompt,
                              const std::vector<std::int32_t>& generated) {
  std::vector<std::int32_t> all = prompt;
  all.insert(all.end(), generated.begin(), generated.end());
  const std::string whole = tokenizer.decode(all);
  const std::string head = tokenizer.decode(prompt);
  if (whole.compare(0, head.size(), head) == 0) return whole.substr(head.size());
  return tokenizer.decode(generated);
}

void run(const GenerateFlags& flags) {
  if (flags.samples < 1) DUFU_FAIL("--samples must be at least 1, got ", flags.samples);
  if (flags.max_tokens < 0) DUFU_FAIL("--max-tokens must not be negative, got ", flags.max_tokens);
  const std::string checkpoint = resolve_checkpoint(flags.checkpoint);
  const trainer::TrainingState state = trainer::read_checkpoint_state(checkpoint);
  const dataprep::TokenizerSpec spec =
      dataprep::choose_tokenizer(flags.tokenizer.spec, trainer::checkpoint_tokenizer(checkpoint, state),
                                 "checkpoint '" + checkpoint + "'",
                                 "its run's shards had no sidecar, or it was written before dufu recorded tokenizers");
  const auto tokenizer = dataprep::Tokenizer::load(spec);
  // The model's ids are the tokenizer's: with fewer the prompt's ids would mean
  // nothing to the model. More is padding (Megatron pads the vocabulary), never drawn.
  if (tokenizer.vocab_size() > state.model.vocab_size) {
    DUFU_FAIL("the tokenizer '", spec.model, "' has ", tokenizer.vocab_size(), " pieces but the model in '",
              checkpoint, "' has vocab_size ", state.model.vocab_size,
              ", too few for its ids; HINT: use the tokenizer the run's data was tokenized with");
  }
  trainer::GPT model(state.model);
  trainer::load_checkpoint(checkpoint, model, nullptr);
  std::fprintf(stderr, "checkpoint %s: step %lld, %d layers, %d heads, d_model %d, vocab %d, seq_length %d\n",
               checkpoint.c_str(), static_cast<long long>(state.step), state.model.n_layer, state.model.n_head,
               state.model.d_model, state.model.vocab_size, state.model.seq_length);

  std::vector<int> encoded;
  tokenizer.encode(flags.prompt, &encoded);
  const std::vector<std::int32_t> prompt(encoded.begin(), encoded.end());
  if (prompt.empty()) DUFU_FAIL("--prompt '", flags.prompt, "' encodes to no tokens; HINT: give some text");

  trainer::SamplingOptions options;
  options.max_new_tokens = flags.max_tokens;
  options.temperature = flags.temperature;
  options.top_k = flags.top_k;
  // End of document ends the sample (only if the model can produce that id).
  const int eos = tokenizer.eos_id();
  options.stop_token = eos >= 0 && eos < state.model.vocab_size ? eos : -1;
  options.drawn_vocab_size = static_cast<int>(tokenizer.vocab_size());
  for (int sample = 0; sample < flags.samples; ++sample) {
    options.seed = flags.seed + static_cast<std::uint64_t>(sample);
    std::vector<std::int32_t> generated = trainer::generate(model, prompt, options);
    const bool stopped = !generated.empty() && generated.back() == options.stop_token;
    if (stopped) generated.pop_back();
    if (flags.samples > 1) {
      std::printf("%s--- sample %d of %d (seed %llu) ---\n", sample ? "\n" : "", sample + 1, flags.samples,
                  static_cast<unsigned long long>(options.seed));
    }
    std::printf("%s%s\n", flags.prompt.c_str(), continuation_text(tokenizer, prompt, generated).c_str());
    if (stopped) std::printf("[end of document]\n");
    std::fflush(stdout);
  }
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto flags = std::make_shared<GenerateFlags>();
  auto* command = app.add_subcommand(
      "generate",
      "Continue a prompt with a checkpoint's model (sample i uses seed + i; a drawn end-of-document token ends "
      "the sample)");
  command->add_option("--checkpoint,-c", flags->checkpoint, "Checkpoint directory, or a run directory (its newest)")
      ->required();
  add_tokenizer_flags(command, flags->tokenizer, TokenizerFlag::kFoundWhenLeftOut,
                      "the run's data was tokenized with", "the checkpoint's state.json");
  command->add_option("--prompt,-p", flags->prompt, "Text to continue")->required();
  command->add_option("--max-tokens,-n", flags->max_tokens, "New tokens per sample at most")->capture_default_str();
  command->add_option("--temperature,-t", flags->temperature, "Softmax temperature; 0 = always the most likely")
      ->capture_default_str();
  command->add_option("--top-k,-k", flags->top_k, "Sample among the k most likely tokens; 0 = all")
      ->capture_default_str();
  command->add_option("--seed", flags->seed, "Random seed: same seed, checkpoint and prompt give the same text")
      ->check(whole_number_in(0, std::numeric_limits<std::uint64_t>::max()))
      ->capture_default_str();
  command->add_option("--samples", flags->samples, "Number of samples")->capture_default_str();
  command->callback([flags] { run(*flags); });
}

}  // namespace dufu::tools
