// Text generation from a trained GPT: autoregressive sampling with temperature and
// top-k, the way `train generate` and the quickstart use it.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "dufu/trainer/model/gpt.h"

namespace dufu::trainer {

struct SamplingOptions {
  int max_new_tokens = 64;
  // Logits are divided by the temperature before the softmax; 0 picks the most
  // likely token (greedy).
  float temperature = 1.0f;
  int top_k = 0;                // sample among the k most likely tokens; 0 = all
  std::uint64_t seed = 0;       // same seed, model and prompt -> same text
  std::int32_t stop_token = -1; // stop after emitting it (e.g. EOD); -1 = never
  // Draw only among the first `drawn_vocab_size` ids: a model whose vocab_size is
  // larger than its tokenizer's (padded, as Megatron pads) has rows no piece decodes.
  // 0 = the model's vocab_size.
  int drawn_vocab_size = 0;
};

// One token drawn from the first `vocab_size` logits (the padding is never drawn)
// with the given temperature and top-k, using `rng`. Ties in top-k are broken towards
// the lower token id. Temperature 0 or top_k 1 return the most likely token (the
// lowest id among equals) without drawing. Otherwise the candidates get
// softmax(logit / temperature) in double, and one draw u = (rng() >> 11) * 2^-53 in
// [0, 1) picks the first candidate, in increasing id order, whose cumulative
// probability exceeds u: the same seed gives the same token with any standard
// library. Throws dufu::Error for a negative or non-finite temperature, a negative
// top_k, a vocab_size that is not positive or exceeds logits.size(), or a logit that
// is not finite.
std::int32_t sample_token(std::span<const float> logits, int vocab_size, float temperature, int top_k,
                          std::mt19937_64& rng);

// The prompt's continuation (new tokens only): each step runs the model on the last
// seq_length tokens of prompt + generated so far (so a prompt may be longer than
// seq_length) and samples the next token from the last position's logits with one
// std::mt19937_64 seeded with options.seed. At most max_new_tokens tokens; fewer when
// stop_token is drawn, which is then the last one returned. There is no KV cache: each
// step is a full forward over up to seq_length positions. Throws dufu::Error for an
// empty prompt, a prompt token outside [0, vocab_size), a negative max_new_tokens, a
// stop_token that is neither -1 nor in the vocabulary, a drawn_vocab_size that is
// negative or larger than the model's vocab_size, or sampling options that
// sample_token refuses.
std::vector<std::int32_t> generate(GPT& model, std::span<const std::int32_t> prompt, const SamplingOptions& options);

}  // namespace dufu::trainer
