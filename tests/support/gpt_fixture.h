// What the model-level tests (checkpoint, tensor- and pipeline-parallel, the PyTorch
// comparison, generation, training) build their models and data from: a small GPT
// configuration, a random next-token batch and random floats, each the same for the
// same arguments on every rank and every run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <random>
#include <span>
#include <vector>

#include "dufu/trainer/model/gpt.h"

namespace dufu::testing {

// The sizes of a test's GPT, every one given by the test (nothing from GPT-2's
// defaults), named at the call: small_gpt_config({.n_layer = 2, .n_head = 4, ...}).
struct GPTSizes {
  int n_layer;
  int n_head;
  int d_model;
  int vocab_size;
  int vocab_multiple;
  int seq_length;
};

inline trainer::GPTConfig small_gpt_config(const GPTSizes& sizes) {
  trainer::GPTConfig config;
  config.n_layer = sizes.n_layer;
  config.n_head = sizes.n_head;
  config.d_model = sizes.d_model;
  config.vocab_size = sizes.vocab_size;
  config.vocab_multiple = sizes.vocab_multiple;
  config.seq_length = sizes.seq_length;
  return config;
}

// B rows of T tokens and their targets, row-major.
struct TokenBatch {
  std::vector<std::int32_t> tokens;
  std::vector<std::int32_t> targets;
};

// Language-model data: one stream of B x (T + 1) tokens drawn uniformly from
// [0, vocab_size) by std::mt19937(seed), cut into B rows of T + 1; a row's tokens are
// its first T, its targets the next token of each. The targets at the positions
// `ignored` (row-major indices) are -1, so a test covers the mean over the rest.
inline TokenBatch next_token_batch(int B, int T, int vocab_size, std::uint32_t seed,
                                   std::initializer_list<std::size_t> ignored) {
  std::mt19937 engine(seed);
  std::vector<std::int32_t> stream(static_cast<std::size_t>(B * (T + 1)));
  for (auto& token : stream) token = static_cast<std::int32_t>(engine() % static_cast<std::uint32_t>(vocab_size));
  TokenBatch batch;
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      batch.tokens.push_back(stream[static_cast<std::size_t>(b * (T + 1) + t)]);
      batch.targets.push_back(stream[static_cast<std::size_t>(b * (T + 1) + t + 1)]);
    }
  }
  for (const std::size_t position : ignored) batch.targets[position] = -1;
  return batch;
}

// Overwrites `values`, in order, with draws of std::uniform_real_distribution(low,
// high) from std::mt19937(seed).
inline void fill_uniform(std::span<float> values, std::uint32_t seed, float low, float high) {
  std::mt19937 engine(seed);
  std::uniform_real_distribution<float> uniform(low, high);
  for (float& value : values) value = uniform(engine);
}

// n floats as fill_uniform draws them.
inline std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float low, float high) {
  std::vector<float> values(n);
  fill_uniform(values, seed, low, high);
  return values;
}

}  // namespace dufu::testing
