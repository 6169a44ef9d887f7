// Sampling from a GPT: the softmax in double over the real vocabulary, top-k with
// ties broken towards the lower id, and a uniform draw computed from the engine's bits
// directly, so a seed gives the same text with any standard library.
#include "dufu/trainer/run/generate.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numeric>

#include "dufu/common/error.h"

namespace dufu::trainer {
namespace {

// Uniform in [0, 1) from the top 53 bits of one draw (what std::generate_canonical
// should do, but its output is not fixed across standard libraries).
double uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

void check_sampling(std::span<const float> logits, int vocab_size, float temperature, int top_k) {
  if (vocab_size <= 0) DUFU_FAIL("sample_token: vocab_size must be positive, got ", vocab_size);
  if (static_cast<std::size_t>(vocab_size) > logits.size()) {
    DUFU_FAIL("sample_token: vocab_size ", vocab_size, " exceeds the ", logits.size(), " logits given");
  }
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) {
    DUFU_FAIL("sampling temperature must be finite and not negative, got ", temperature,
              "; HINT: 0 picks the most likely token");
  }
  if (top_k < 0) DUFU_FAIL("sampling top_k must not be negative, got ", top_k, "; HINT: 0 samples from all tokens");
  for (int i = 0; i < vocab_size; ++i) {
    if (!std::isfinite(logits[static_cast<std::size_t>(i)])) {
      DUFU_FAIL("sample_token: the logit of token ", i, " is ", logits[static_cast<std::size_t>(i)],
                "; HINT: the model's weights are probably not finite");
    }
  }
}

// The first most likely token: ties go to the lower id.
std::int32_t argmax(std::span<const float> logits, int vocab_size) {
  int best = 0;
  for (int i = 1; i < vocab_size; ++i) {
    if (logits[static_cast<std::size_t>(i)] > logits[static_cast<std::size_t>(best)]) best = i;
  }
  return best;
}

}  // namespace

std::int32_t sample_token(std::span<const float> logits, int vocab_size, float temperature, int top_k,
                          std::mt19937_64& rng) {
  check_sampling(logits, vocab_size, temperature, top_k);
  if (temperature == 0.0f || top_k == 1) return argmax(logits, vocab_size);

  // The candidates in increasing id order: every real token, or the k most likely
  // (equal logits ranked by increasing id, so the set is well defined).
  std::vector<std::int32_t> candidates(static_cast<std::size_t>(vocab_size));
  std::iota(candidates.begin(), candidates.end(), 0);
  if (top_k > 0 && top_k < vocab_size) {
    const auto k = static_cast<std::ptrdiff_t>(top_k);
    std::nth_element(candidates.begin(), candidates.begin() + (k - 1), candidates.end(),
                     [&](std::int32_t a, std::int32_t b) {
                       const float la = logits[static_cast<std::size_t>(a)];
                       const float lb = logits[static_cast<std::size_t>(b)];
                       return la > lb || (la == lb && a < b);
                     });
    candidates.resize(static_cast<std::size_t>(top_k));
    std::sort(candidates.begin(), candidates.end());
  }

  // Stable softmax of logit / temperature in double: exp(0) = 1 for the largest, so
  // the total is at least 1 and never overflows.
  double max_logit = -HUGE_VAL;
  for (const auto id : candidates) {
    max_logit = std::max(max_logit, static_cast<double>(logits[static_cast<std::size_t>(id)]));
  }
  const double t = temperature;
  std::vector<double> weights(candidates.size());
  double total = 0.0;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    weights[i] = std::exp((static_cast<double>(logits[static_cast<std::size_t>(candidates[i])]) - max_logit) / t);
    total += weights[i];
  }

  // Inverse CDF; the same additions in the same order as `total`, so only a draw that
  // rounds up to the very top falls through to the last candidate with weight.
  const double target = uniform01(rng) * total;
  double cumulative = 0.0;
  std::size_t last_positive = 0;
  for (std::size_t i = 0; i < candidates.size(); ++i) {
    if (weights[i] <= 0.0) continue;
    cumulative += weights[i];
    last_positive = i;
    if (target < cumulative) return candidates[i];
  }
  return candidates[last_positive];
}

std::vector<std::int32_t> generate(GPT& model, std::span<const std::int32_t> prompt, const SamplingOptions& options) {
  const GPTConfig& config = model.config();
  if (prompt.empty()) DUFU_FAIL("generate: the prompt is empty; HINT: give at least one token");
  for (std::size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= config.vocab_size) {
      DUFU_FAIL("generate: prompt token ", prompt[i], " at position ", i, " is outside the model's vocabulary [0, ",
                config.vocab_size, "); HINT: the tokenizer and the model's vocab_size must agree");
    }
  }
  if (options.max_new_tokens < 0)
    DUFU_FAIL("generate: max_new_tokens must not be negative, got ", options.max_new_tokens);
  if (options.stop_token < -1 || options.stop_token >= config.vocab_size) {
    DUFU_FAIL("generate: stop_token ", options.stop_token, " is neither -1 (never stop) nor in [0, ", config.vocab_size,
              ")");
  }
  if (options.drawn_vocab_size < 0 || options.drawn_vocab_size > config.vocab_size) {
    DUFU_FAIL("generate: drawn_vocab_size ", options.drawn_vocab_size, " is not in [0, ", config.vocab_size,
              "], the model's vocab_size");
  }
  const int drawn = options.drawn_vocab_size > 0 ? options.drawn_vocab_size : config.vocab_size;
  // Checks temperature and top_k before any forward, also when no token is wanted.
  const std::vector<float> no_logits(1, 0.0f);
  check_sampling(no_logits, 1, options.temperature, options.top_k);

  std::mt19937_64 rng(options.seed);
  std::vector<std::int32_t> context(prompt.begin(), prompt.end());
  std::vector<std::int32_t> generated;
  generated.reserve(static_cast<std::size_t>(options.max_new_tokens));
  const std::size_t window_max = static_cast<std::size_t>(config.seq_length);
  const std::size_t row = static_cast<std::size_t>(config.padded_vocab_size());
  // The logits are device memory: only the last position's row comes to the host.
  std::vector<float> last(row);
  for (int step = 0; step < options.max_new_tokens; ++step) {
    // No KV cache: every step reruns the model on the last seq_length tokens.
    const std::size_t window = std::min(context.size(), window_max);
    const std::span<const std::int32_t> tokens(context.data() + (context.size() - window), window);
    const int T = static_cast<int>(window);
    model.forward(tokens, {}, 1, T);
    const auto last_on_device = model.logits().subspan((window - 1) * row, row);
    model.device().download(last.data(), last_on_device.data(), last_on_device.size_bytes());
    const std::int32_t next = sample_token(last, drawn, options.temperature, options.top_k, rng);
    generated.push_back(next);
    context.push_back(next);
    if (next == options.stop_token) break;
  }
  return generated;
}

}  // namespace dufu::trainer
