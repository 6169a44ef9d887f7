// Text generation from a trained GPT: autoregressive sampling with temperature and
// top-k, the way `train generate` and the quickstart use it.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "dufu/trainer/gpt.h"

namespace dufu::trainer {

struct SamplingOptions {
  int max_new_tokens = 64;
  // Logits are divided by the temperature before the softmax; 0 picks the most
  // likely token (greedy).
  float temperature = 1.0f;
  int top_k = 0;                // sample among the k most likely tokens; 0 = all
  std::uint64_t seed = 0;       // same seed, model and prompt -> same text
  std::int32_t stop_token = -1; // stop after emitting it (e.g. EOD); -1 = never
};

// One token drawn from the first `vocab_size` logits (the padding is never drawn)
// with the given temperature and top-k, using `rng`. Ties in top-k are broken towards
// the lower token id. Throws dufu::Error for a negative temperature or top_k.
std::int32_t sample_token(std::span<const float> logits, int vocab_size, float temperature, int top_k,
                          std::mt19937_64& rng);

// The prompt's continuation (new tokens only): each step runs the model on the last
// seq_length tokens of prompt + generated so far and samples the next token from the
// last position's logits. Throws dufu::Error for an empty prompt or a token outside
// the vocabulary.
std::vector<std::int32_t> generate(GPT& model, std::span<const std::int32_t> prompt, const SamplingOptions& options);

}  // namespace dufu::trainer
